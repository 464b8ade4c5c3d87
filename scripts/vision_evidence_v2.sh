#!/usr/bin/env bash
# Vision evidence v2 (issue 32 item 4): MM-MAE pre-training with the shipped vision demo defaults, average vs minimax,
# pre-training seeds 42 43 44, then per seed the dense suite (semseg, depth, classification; fine-tuning seed = the
# pre-training seed) on both runs and on random init, then the tables paired by pre-training seed in
# benchmarks/results/vision_evidence.{md,json}. Protocol and decision rule (fixed before any run; the fine-tuning
# schedule by its pilot): scripts/vision_evidence_v2_protocol.md. About 15-20 min per seed on the shared 2-core machine.
#
#   bash scripts/vision_evidence_v2.sh [OUT]       (OUT defaults to outputs/vision-evidence-v2)
#
# Environment: PY (python), SEEDS (default 42 43 44), STATE (default benchmarks/results/vision_evidence_state),
# RESULTS (default benchmarks/results/vision_evidence). Resumable within a session (finished pre-training runs and
# suite cells are reused) and across sessions: every 2 minutes and after each seed the small result files of finished
# runs and cells are saved to $STATE (commit it after each seed); a seed whose results are all in $STATE is not run
# again, and the tables are computed from $STATE alone.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/vision-evidence-v2}
PY=${PY:-.venv/bin/python}
SEEDS=${SEEDS:-42 43 44}
STATE=${STATE:-benchmarks/results/vision_evidence_state}
RESULTS=${RESULTS:-benchmarks/results/vision_evidence}
# The fine-tuning schedule fixed by the pilot (protocol addendum), for every cell.
FT_EPOCHS=16
FT_LR=1e-3
HELPER=scripts/vision_evidence_v2.py
mkdir -p "$OUT"
"$PY" "$HELPER" restore "$OUT" "$STATE"
source scripts/evidence_common.sh

if [ ! -f "$OUT/scenes/downstream_test.parquet" ]; then
  run scenes "$PY" scripts/vision_evidence.py scenes "$OUT/scenes" --num_train 512 --num_eval 256 \
    --scene_seed 0 --scene_size 64 || exit 1
fi
"$PY" "$HELPER" shares "$OUT/scenes" "$STATE"

(while sleep 120; do "$PY" "$HELPER" save "$OUT" "$STATE" > /dev/null; done) &
saver=$!
trap 'kill "$saver" 2>/dev/null' EXIT

for seed in $SEEDS; do
  if "$PY" "$HELPER" complete "$STATE" "$seed"; then
    continue  # finished in an earlier session: its results are in $STATE
  fi
  run "pretraining-$seed" "$PY" recipes/compare_weightings.py --config recipes/configs/vision_demo.yaml \
    --strategies average minimax --seeds "$seed" --output_dir "$OUT/pretraining" -- --disable_tqdm true \
    || { echo "pre-training seed $seed failed: see $OUT/pretraining-$seed.log" >&2; exit 1; }
  run "suite-$seed" "$PY" recipes/glue_suite.py --family dense \
    --checkpoints "$OUT/pretraining/average/seed-$seed" "$OUT/pretraining/minimax/seed-$seed" \
    "random-init:$OUT/pretraining/average/seed-$seed" --tasks semseg depth classification --seeds "$seed" \
    --dataset_name "$OUT/scenes" --train_split downstream_train --eval_split downstream_test \
    --column_mapping rgb=rgb depth=depth semseg=semseg label=label id=id --num_labels 7 \
    --neck_hidden_sizes 8 16 32 64 --fusion_hidden_size 32 \
    --learning_rate "$FT_LR" --layer_decay 0.75 --weight_decay 0.05 --warmup_steps 0.1 --lr_scheduler_type cosine \
    --per_device_train_batch_size 16 --num_train_epochs "$FT_EPOCHS" --per_device_eval_batch_size 64 \
    --disable_tqdm true --report_to none --output_dir "$OUT/suite/seed-$seed" \
    || { echo "suite seed $seed failed: see $OUT/suite-$seed.log" >&2; "$PY" "$HELPER" save "$OUT" "$STATE"; exit 1; }
  "$PY" "$HELPER" save "$OUT" "$STATE"
  "$PY" "$HELPER" complete "$STATE" "$seed"
done
"$PY" "$HELPER" save "$OUT" "$STATE"
# shellcheck disable=SC2086  # SEEDS is a list
"$PY" "$HELPER" tables "$STATE" --seeds $SEEDS --out "$RESULTS"
