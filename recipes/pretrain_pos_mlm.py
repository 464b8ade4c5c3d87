"""Task-robust PoS-MLM pre-training (``accelerate launch recipes/pretrain_pos_mlm.py ...``); see
robust_pretrain.pretraining.pos_mlm."""

from robust_pretrain.pretraining.pos_mlm.recipe import main

if __name__ == "__main__":
    raise SystemExit(main())
