#!/usr/bin/env bash
# The update order's effect on the decoder demo's held-out per-domain losses (issue 38 item 2): the decoder demo
# (minimax, alpha 1, 600 steps) once per seed and order (--weight_update alternating | simultaneous), paired by seed,
# then scripts/order_evidence.py writes each domain's, the worst domain's and the mean's paired difference
# simultaneous - alternating with its 95 % t-interval (df = seeds - 1). The difference is reported whatever it is;
# no decision rides on it (alternating stays the default).
#
#   bash scripts/order_evidence.sh [RUNS]     (RUNS defaults to outputs/order_runs; finished runs are reused)
#
# Environment: PY (python, default .venv/bin/python), SEEDS (default 42 43 44 45), RESULTS (default
# benchmarks/results/order_evidence).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-outputs/order_runs}
PY=${PY:-.venv/bin/python}
SEEDS=${SEEDS:-42 43 44 45}
RESULTS=${RESULTS:-benchmarks/results/order_evidence}
mkdir -p "$RUNS"
for seed in $SEEDS; do
  for order in alternating simultaneous; do
    run="$RUNS/${order}_$seed"
    [ -f "$run/eval_results.json" ] && continue
    echo "+ robust-pretrain-causal-lm --config decoder_demo --seed $seed --weight_update $order" \
      "--output_dir $run --save_strategy no" | tee -a "$RUNS/commands.txt"
    start=$(date +%s)
    "$(dirname "$PY")/robust-pretrain-causal-lm" --config decoder_demo --seed "$seed" \
      --weight_update "$order" --output_dir "$run" --save_strategy no --disable_tqdm true > "$run.log" 2>&1
    echo "${order}_$seed $(( $(date +%s) - start )) s" >> "$RUNS/timings.txt"
  done
done
"$PY" scripts/order_evidence.py --runs "$RUNS" --out "$RESULTS"
