"""Domain-robust causal-LM pre-training (``accelerate launch recipes/pretrain_causal_lm.py ...``); see
robust_pretrain.pretraining.causal_lm."""

from robust_pretrain.pretraining.causal_lm.recipe import main

if __name__ == "__main__":
    raise SystemExit(main())
