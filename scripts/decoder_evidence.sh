#!/usr/bin/env bash
# Evidence for the decoder workflow: natural mixture vs robust mixture (robust-pretrain-mixture: reference -> group_dro
# proxy on the excess loss -> domain_weights.json -> main run) on UD-EWT's five genres with the decoder_demo config,
# 2 seeds, then the per-domain held-out perplexity tables in benchmarks/results/decoder_evidence.{md,json}.
# Protocol: scripts/decoder_evidence_protocol.md.
#
#   bash scripts/decoder_evidence.sh [OUT]       (OUT defaults to outputs/decoder-evidence)
#
# Environment: PY (python), SEEDS (default "42 43"), EXTRA (options added to every stage, e.g. "--max_steps 4" for a
# smoke test), RESULTS (where the tables go, default benchmarks/results/decoder_evidence). Resumable: a rerun reuses
# every finished stage (robust-pretrain-mixture) and an interrupted stage resumes from its last checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/decoder-evidence}
PY=${PY:-.venv/bin/python}
SEEDS=${SEEDS:-42 43}
RESULTS=${RESULTS:-benchmarks/results/decoder_evidence}
source scripts/evidence_common.sh

for seed in $SEEDS; do
  # shellcheck disable=SC2086  # EXTRA is a list of options
  run "mixture-seed-$seed" "$PY" recipes/domain_mixture.py --output_dir "$OUT/seed-$seed" \
    --config decoder_demo --seed "$seed" --disable_tqdm true \
    --proxy_objective group_dro --proxy_excess held_out --proxy_sampling natural --dro_step_size 0.01 \
    ${EXTRA:-}  # the protocol's proxy
done

"$PY" scripts/decoder_evidence_tables.py --runs "$OUT" --seeds $SEEDS --timings "$OUT/timings.txt" \
  --commands "$OUT/commands.txt" --out "$RESULTS"
echo "wrote $RESULTS.md and .json"
