"""Task-robust MM-MAE pre-training over image modalities (``accelerate launch recipes/pretrain_multimae.py ...``); see
robust_pretrain.pretraining.multimae."""

from robust_pretrain.pretraining.multimae.recipe import main

if __name__ == "__main__":
    raise SystemExit(main())
