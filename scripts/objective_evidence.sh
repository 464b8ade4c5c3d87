#!/usr/bin/env bash
# The objective experiment of issue 18 item 6 (protocol: scripts/objective_evidence_protocol.md), resumable: every
# run goes through robust-pretrain-compare, which reuses a run finished with the same settings and resumes an
# interrupted one from its last checkpoint; re-running this script after an interruption continues where it stopped.
#
#   scripts/objective_evidence.sh            # the full experiment: N = 1000 steps per arm, reference 4 N
# Environment:
#   OBJECTIVE_STEPS    steps per arm N (default 1000, the demo's budget); the reference trains 4 N
#   OBJECTIVE_SEEDS    seeds of the arms (default "42 43")
#   OBJECTIVE_OUT      where the runs go (default outputs/objective_evidence)
#   OBJECTIVE_RESULTS  prefix of the results (default benchmarks/results/objective_evidence)
#   OBJECTIVE_EXTRA    options added to every run (e.g. a smoke test's "--max_train_samples 64 --warmup_steps 0")
#   PYTHON             the interpreter (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
STEPS=${OBJECTIVE_STEPS:-1000}
SEEDS=${OBJECTIVE_SEEDS:-42 43}
OUT=${OBJECTIVE_OUT:-outputs/objective_evidence}
RESULTS=${OBJECTIVE_RESULTS:-benchmarks/results/objective_evidence}
read -r -a EXTRA <<< "${OBJECTIVE_EXTRA:-}"
read -r -a SEED_LIST <<< "$SEEDS"
CONFIG=recipes/configs/demo.yaml
REFERENCE="$OUT/reference/proportional/seed-42"
compare=("$PYTHON" -m robust_pretrain.pretraining.compare --config "$CONFIG")

commands=(
  "${compare[*]} --strategies proportional --seeds 42 --output_dir $OUT/reference -- --max_steps $((4 * STEPS)) ${EXTRA[*]}"
  "${compare[*]} --strategies proportional average minimax --sweep alpha_auto=false,true --seeds $SEEDS --output_dir $OUT/arms -- --max_steps $STEPS ${EXTRA[*]}"
  "${compare[*]} --strategies minimax group_dro --seeds $SEEDS --output_dir $OUT/excess -- --max_steps $STEPS --loss_normalization excess --reference_run $REFERENCE ${EXTRA[*]}"
)
# 1. the reference: proportional, 4 N steps, same model size
"${compare[@]}" --strategies proportional --seeds 42 --output_dir "$OUT/reference" \
  -- --max_steps $((4 * STEPS)) "${EXTRA[@]}"
# 2. proportional, average, minimax raw alpha=1 (the paper) and minimax with automatic alpha
"${compare[@]}" --strategies proportional average minimax --sweep alpha_auto=false,true --seeds "${SEED_LIST[@]}" \
  --output_dir "$OUT/arms" -- --max_steps "$STEPS" "${EXTRA[@]}"
# 3. minimax and group_dro on the excess over the reference run (its provenance is checked by --reference_run)
"${compare[@]}" --strategies minimax group_dro --seeds "${SEED_LIST[@]}" --output_dir "$OUT/excess" \
  -- --max_steps "$STEPS" --loss_normalization excess --reference_run "$REFERENCE" "${EXTRA[@]}"
# 4. scores (raw, excess over the reference, regret against proportional), decision rule, frontier
command_options=()
for command in "${commands[@]}"; do command_options+=(--command "$command"); done
"$PYTHON" scripts/objective_evidence.py --runs "$OUT" --seeds "${SEED_LIST[@]}" --output "$RESULTS" \
  "${command_options[@]}"
