#!/usr/bin/env bash
# The rare-domains experiment of issue 37 item 4 (protocol and rule: scripts/rare_domains_protocol.md): per regime with
# room by the natural-only pilot (benchmarks/results/rare_domains_pilot.json), robust-pretrain-decide with the arms
# natural / sampling_control (baseline) / stratified / unimax / minimax / minimax_capped / doremi, 8 paired seeds, the
# pilot's max_steps, 4 readings over training.
#
#   bash scripts/rare_domains.sh [OUT]       (OUT defaults to outputs/rare-domains)
#
# Environment: PY (python), SEEDS (default 42-49), REGIMES (default: every regime the pilot found with room), EXTRA
# (options added to every run, e.g. "--max_steps 8" for a smoke test), RESULTS (default
# benchmarks/results/rare_domains), STATE (default benchmarks/results/rare_domains_state). Resumable within a session
# (finished cells reused, an interrupted one resumes) and across sessions (finished cells' JSON saved to $STATE every 2
# minutes and after every invocation: commit them; restored at the start of the next).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/rare-domains}
PY=${PY:-.venv/bin/python}
SEEDS=${SEEDS:-42 43 44 45 46 47 48 49}
PILOT=benchmarks/results/rare_domains_pilot.json
RESULTS=${RESULTS:-benchmarks/results/rare_domains}
STATE=${STATE:-benchmarks/results/rare_domains_state}
REGIMES=${REGIMES:-$("$PY" -c "import json; print(' '.join(r['regime'] for r in json.load(open('$PILOT'))['regimes'] if r['has_room']))")}
source scripts/evidence_common.sh
mkdir -p "$(dirname "$RESULTS")"

for regime in $REGIMES; do
  steps=$("$PY" -c "import json; print(next(r['max_steps'] for r in json.load(open('$PILOT'))['regimes'] if r['regime'] == '$regime'))")
  "$PY" scripts/rare_domains_data.py --regime "$regime" --out "$OUT"
  # shellcheck disable=SC2086  # SEEDS and EXTRA are lists
  decide_regime "$regime" "$PY" recipes/decide_mixing.py --output_dir "$OUT/$regime" \
    --arms natural sampling_control stratified unimax minimax minimax_capped doremi --baseline sampling_control \
    --seeds $SEEDS --endpoint worst_domain_loss --margin 0.05 --confidence 0.95 --epoch_cap 4 --readings 4 \
    --train_file "$OUT/$regime-train.jsonl" --validation_file "$OUT/$regime-test.jsonl" --domain_column domain \
    --max_steps "$steps" --disable_tqdm true ${EXTRA:-} || exit $?
done
echo "wrote ${RESULTS}_*.{md,json,png}"
