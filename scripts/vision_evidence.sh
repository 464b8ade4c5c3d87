#!/usr/bin/env bash
# Evidence for the README's vision table: MM-MAE pre-training with average vs minimax weighting (vision demo config,
# 2 seeds), then the dense suite (semseg, depth, classification; 2 fine-tuning seeds) on the 4 checkpoints and a
# random-init row (the same architecture without pre-training) (primary: 2 fine-tuning epochs; secondary check: 8
# epochs), then the tables in benchmarks/results/vision_evidence_v1.{md,json}.
# About 45-60 minutes on 2 CPU cores shared with other jobs. Protocol: scripts/vision_evidence_protocol.md.
#
#   bash scripts/vision_evidence.sh [OUT]          (OUT defaults to outputs/vision-evidence)
#
# Environment: COMPARE (pre-training runs, default outputs/vision-compare), PY (python), NOTES (markdown file added
# under the wall times, e.g. where runs were reused). Reruns reuse finished pre-training runs (compare_weightings) and
# finished suite cells (same settings), so the tables can be regenerated in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/vision-evidence}
COMPARE=${COMPARE:-outputs/vision-compare}
PY=${PY:-.venv/bin/python}
source scripts/evidence_common.sh

run pretraining "$PY" recipes/compare_weightings.py --config recipes/configs/vision_demo.yaml \
  --strategies average minimax --seeds 42 43 --output_dir "$COMPARE" -- --disable_tqdm true

run scenes "$PY" scripts/vision_evidence.py scenes "$OUT/scenes" --num_train 512 --num_eval 256 \
  --scene_seed 0 --scene_size 64

RANDOM_INIT="random-init:$COMPARE/average/seed-42"  # the demo architecture, no pre-training (protocol addendum)
suite() {  # suite NAME EPOCHS
  run "$1" "$PY" recipes/glue_suite.py --family dense \
    --checkpoints "$COMPARE/minimax/seed-42" "$COMPARE/minimax/seed-43" "$COMPARE/average/seed-43" "$RANDOM_INIT" \
    --baseline "$COMPARE/average/seed-42" --tasks semseg depth classification --seeds 42 43 \
    --dataset_name "$OUT/scenes" --train_split downstream_train --eval_split downstream_test \
    --column_mapping rgb=rgb depth=depth semseg=semseg label=label id=id --num_labels 7 \
    --neck_hidden_sizes 8 16 32 64 --fusion_hidden_size 32 \
    --learning_rate 1e-3 --layer_decay 0.75 --weight_decay 0.05 --warmup_steps 0.1 --lr_scheduler_type cosine \
    --per_device_train_batch_size 16 --num_train_epochs "$2" --per_device_eval_batch_size 64 \
    --disable_tqdm true --report_to none --output_dir "$OUT/$1"
}
suite suite 2
suite suite-8ep 8

"$PY" scripts/evidence_tables.py --family dense --baseline average --compare "$COMPARE" \
  --title "Vision evidence: average vs minimax MM-MAE pre-training on the generated scenes" \
  --suite "Downstream: dense suite, 2 fine-tuning epochs (primary)" "$OUT/suite" \
  --suite "Downstream, secondary check: 8 fine-tuning epochs" "$OUT/suite-8ep" \
  --timings "$OUT/timings.txt" --commands "$OUT/commands.txt" --protocol scripts/vision_evidence_protocol.md \
  --label "$RANDOM_INIT" "random init (no pre-training)" ${NOTES:+--notes "$NOTES"} \
  --out benchmarks/results/vision_evidence_v1
"$PY" scripts/vision_evidence.py random-init --out benchmarks/results/vision_evidence_v1 \
  --suite "Primary: 2 fine-tuning epochs" "$OUT/suite" --suite "Secondary check: 8 fine-tuning epochs" "$OUT/suite-8ep"
echo "wrote benchmarks/results/vision_evidence_v1.md and .json"
