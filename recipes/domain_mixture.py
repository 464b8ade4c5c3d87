"""The domain-mixture workflow: reference -> proxy -> domain_weights.json -> main run; see
robust_pretrain.pretraining.mixture."""

from robust_pretrain.pretraining.mixture import main

if __name__ == "__main__":
    raise SystemExit(main())
