"""Does worst-case or learned domain mixing beat a static mixture on these domains? See
robust_pretrain.pretraining.decide.recipe."""

from robust_pretrain.pretraining.decide.recipe import main

if __name__ == "__main__":
    raise SystemExit(main())
