"""A modality's values as MM-MAE reads them: depth maps normalised over their valid pixels (and mapped back to
metres), class ids checked against the classes."""

from __future__ import annotations

import torch

from .configuration_multimae import DEPTH_TRIM, DEPTH_VARIANCE_EPS, ModalitySpec


def prepare_depth(spec: ModalitySpec, depth: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A depth modality's values as the model sees and reconstructs them, for ``depth`` (B, C, H, W): the values
    (invalid pixels 0), the valid-pixel mask (positive, finite, at most ``spec.max_depth``) and each image's mean and
    standard deviation (B, 1, 1, 1) that map the values back to depth units, ``values * std + mean``: 0 and 1 for
    ``spec.depth_normalization`` ``"none"``; for ``"standardize"`` those of the valid pixels (a constant image keeps
    1); for ``"standardize_trimmed"`` :func:`trimmed_depth_statistics`."""
    valid = (depth > 0) & torch.isfinite(depth)
    if spec.max_depth is not None:
        valid = valid & (depth <= spec.max_depth)
    zero = torch.zeros((), dtype=depth.dtype, device=depth.device)
    values = torch.where(valid, depth, zero)
    mean, std = torch.zeros_like(depth[:, :1, :1, :1]), torch.ones_like(depth[:, :1, :1, :1])
    if spec.depth_normalization == "standardize":
        count = valid.sum(dim=(1, 2, 3), keepdim=True).clamp_min(1)
        mean = values.sum(dim=(1, 2, 3), keepdim=True) / count
        variance = torch.where(valid, (values - mean) ** 2, zero).sum(dim=(1, 2, 3), keepdim=True) / count
        std = torch.where(variance > 0, variance.sqrt(), torch.ones_like(variance))
    elif spec.depth_normalization == "standardize_trimmed":
        mean, std = trimmed_depth_statistics(values, valid)
    if spec.depth_normalization != "none":
        values = torch.where(valid, (values - mean) / std, zero)
    return values, valid, mean, std


def trimmed_depth_statistics(values: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MultiMAE's robust depth statistics per image of ``values`` (B, C, H, W) over its ``valid`` pixels: the mean
    and ``sqrt(variance + DEPTH_VARIANCE_EPS)`` (unbiased variance) of the sorted valid values of ranks
    ``floor(DEPTH_TRIM * n)`` to ``floor((1 - DEPTH_TRIM) * n) - 1``, each (B, 1, 1, 1). Where that leaves no value
    (n < 2) every valid value counts (mean 0 without any); a single value has variance 0."""
    flat_valid = valid.flatten(1)
    count = flat_valid.sum(dim=1, keepdim=True)
    infinity = torch.tensor(float("inf"), dtype=values.dtype, device=values.device)
    ordered = torch.sort(torch.where(flat_valid, values.flatten(1), infinity), dim=1).values
    ordered = torch.where(torch.isfinite(ordered), ordered, torch.zeros_like(ordered))
    rank = torch.arange(ordered.shape[1], device=values.device)[None]
    low, high = (count * DEPTH_TRIM).long(), (count * (1 - DEPTH_TRIM)).long()
    kept = (rank >= low) & (rank < high)
    kept = torch.where(high > low, kept, rank < count)
    kept_count = kept.sum(dim=1, keepdim=True)
    mean = (ordered * kept).sum(dim=1, keepdim=True) / kept_count.clamp_min(1)
    variance = (((ordered - mean) * kept) ** 2).sum(dim=1, keepdim=True) / (kept_count - 1).clamp_min(1)
    shape = (-1, 1, 1, 1)
    return mean.view(shape), (variance + DEPTH_VARIANCE_EPS).sqrt().view(shape)


def check_class_ids(ids: torch.Tensor, num_classes: int, ignore_index: int, what: str) -> None:
    """Refuse class ``ids`` outside ``0..num_classes-1`` other than ``ignore_index``; the error names ``what`` holds
    them (an input, a target, the labels)."""
    bad = (ids != ignore_index) & ((ids < 0) | (ids >= num_classes))
    if bad.any():
        values = sorted(set(ids[bad].unique().tolist()))[:5]
        raise ValueError(
            f"{what}: class ids {values} are outside 0..{num_classes - 1} (and not the ignore index {ignore_index})"
        )
