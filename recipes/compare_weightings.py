"""Compare weighting strategies over seeds (``python recipes/compare_weightings.py ...``); see
robust_pretrain.pretraining.compare."""

from robust_pretrain.pretraining.compare import main

if __name__ == "__main__":
    raise SystemExit(main())
