#!/usr/bin/env bash
# The imbalanced-domain experiment of issue 28 item 4: robust-pretrain-decide on two regimes (EWT genres + Python
# standard-library code at ~3 %; EWT genres with email cut to ~2.6 %), arms natural / sampling_control (baseline) /
# minimax / group_dro / doremi, 8 paired seeds, 600 steps. Protocol and decision rule: scripts/decide_evidence_protocol.md.
#
#   bash scripts/decide_evidence.sh [OUT]       (OUT defaults to outputs/decide-evidence)
#
# Environment: PY (python), SEEDS (default 42-49), REGIMES (default "python rare_email"), EXTRA (options added to
# every run, e.g. "--max_steps 4" for a smoke test), RESULTS (default benchmarks/results/decide_evidence), STATE
# (default benchmarks/results/decide_evidence_state). Resumable within a session (finished cells reused, an
# interrupted one resumes) and across sessions: the finished cells' JSON files are saved to $STATE every 2 minutes
# and after every invocation (commit them), and restored at the start of the next.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/decide-evidence}
PY=${PY:-.venv/bin/python}
SEEDS=${SEEDS:-42 43 44 45 46 47 48 49}
REGIMES=${REGIMES:-python rare_email}
RESULTS=${RESULTS:-benchmarks/results/decide_evidence}
STATE=${STATE:-benchmarks/results/decide_evidence_state}
source scripts/evidence_common.sh
mkdir -p "$(dirname "$RESULTS")"

for regime in $REGIMES; do
  "$PY" scripts/decide_evidence_data.py --regime "$regime" --out "$OUT/$regime.jsonl"
  # shellcheck disable=SC2086  # SEEDS and EXTRA are lists
  decide_regime "$regime" "$PY" recipes/decide_mixing.py --output_dir "$OUT/$regime" \
    --arms natural sampling_control minimax group_dro doremi --baseline sampling_control --seeds $SEEDS \
    --endpoint worst_domain_loss --margin 0.1 --confidence 0.95 \
    --train_file "$OUT/$regime.jsonl" --domain_column domain --validation_split_percentage 15 \
    --max_steps 600 --disable_tqdm true ${EXTRA:-} || exit $?
done
echo "wrote ${RESULTS}_*.{md,json,png}"
