"""Depth fine-tuning losses over the valid pixels: L1 and MultiMAE's berHu."""

from __future__ import annotations

import torch

BERHU_FRACTION = 0.2  # berHu threshold: this fraction of the batch's largest absolute error (MultiMAE's)
BERHU_MIN_THRESHOLD = 1e-5  # and at least this (MultiMAE's)


def depth_loss(kind: str, predicted: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean loss over the ``valid`` pixels (0 when there is none) of ``predicted`` against ``labels`` (same shape).

    ``"l1"``: ``|x|`` for the error ``x``. ``"berhu"`` (reverse Huber, MultiMAE's NYUv2 depth loss): ``|x|`` where
    ``|x| < c``, else ``(x^2 + c^2) / (2c)``, with ``c = max(0.2 * max|x|, 1e-5)`` over the valid pixels of the whole
    batch (of one process), no gradient through ``c``."""
    error = torch.where(valid, predicted - torch.where(valid, labels, torch.zeros_like(labels)), 0.0)
    absolute = error.abs()
    if kind == "berhu":
        threshold = (BERHU_FRACTION * absolute.max()).detach().clamp_min(BERHU_MIN_THRESHOLD)
        absolute = torch.where(absolute < threshold, absolute, (error**2 + threshold**2) / (2 * threshold))
    return (absolute * valid).sum() / valid.sum().clamp_min(1)
