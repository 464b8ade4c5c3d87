"""Depth and semantic-segmentation pseudo-labels for an RGB dataset (``python recipes/pseudo_label.py ...``); see
robust_pretrain.vision.pseudo_label."""

from robust_pretrain.vision.pseudo_label import main

if __name__ == "__main__":
    raise SystemExit(main())
