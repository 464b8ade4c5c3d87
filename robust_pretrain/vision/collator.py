"""MultiMAE-style modality masking: a fixed visible-token budget per sample, split across modalities by Dirichlet(α)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from robust_pretrain.seeding import SharedEpoch, keyed_rng

DEFAULT_MODALITIES = ("rgb", "depth", "semseg")


@dataclass
class ModalityMaskCollator:
    """Stack processed examples and draw which patches of each modality the encoder sees.

    Per sample, the modalities it has share exactly ``num_visible_tokens`` visible patches: proportions
    ``p ~ Dirichlet(alpha, ..., alpha)`` over those modalities, turned into integer counts by largest remainders
    (ties broken at random) and capped at the number of patches of a modality (the excess goes to the others, in
    proportion to ``p``); each modality then shows a uniformly random subset of that many patches. Statistics:
    ``E[count_m] = num_visible_tokens / M`` for every modality; ``alpha = inf`` splits evenly (counts differ by at
    most one); ``alpha -> 0`` gives samples that see a single modality; ``alpha = 1`` is uniform over the simplex.

    Input: examples from :class:`~robust_pretrain.vision.MultiMAEImageProcessor` (dicts of tensors or arrays:
    ``rgb`` (3,H,W), ``depth`` (1,H,W), ``semseg`` (H,W), any subset; other keys are dropped). Output: the stacked
    tensor of every modality present in the batch and ``mask_<name>``, bool ``(B, (H/p)*(W/p))``, True = hidden.
    A modality absent from the whole batch has neither key (an absent task). A modality absent from only some
    examples is filled with its entry in ``fill_values`` (an invalid value: no loss target) and fully hidden for
    them, so those examples spend their budget on the modalities they have; without a fill value it is an error.

    Randomness: each example draws from ``robust_pretrain.seeding.keyed_rng`` with ``(seed, epoch, key)``,
    ``key`` = the example's ``key_column`` value if it has one, else a hash of its modality tensors. Masks thus do
    not depend on workers, processes, batch composition or a resume; ``set_epoch`` changes them per epoch, also in
    persistent workers (``robust_pretrain.seeding.SetEpochCallback`` calls it for a ``Trainer``).
    Identical examples without ids draw identical masks.
    """

    num_visible_tokens: int
    patch_size: int | tuple[int, int]
    alpha: float = 1.0
    modalities: Sequence[str] = DEFAULT_MODALITIES
    fill_values: Mapping[str, float] = field(default_factory=lambda: {"depth": 0.0, "semseg": 255})
    key_column: str = "id"
    seed: int = 0
    _epoch: SharedEpoch = field(default_factory=SharedEpoch, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.num_visible_tokens < 1:
            raise ValueError(f"num_visible_tokens must be >= 1, got {self.num_visible_tokens}")
        if not self.alpha > 0:
            raise ValueError(f"alpha must be > 0 (math.inf for an even split), got {self.alpha}")
        patch = (self.patch_size, self.patch_size) if isinstance(self.patch_size, int) else tuple(self.patch_size)
        if len(patch) != 2 or min(patch) < 1:
            raise ValueError(f"patch_size must be a positive int or (height, width), got {self.patch_size}")
        self.patch_size = patch
        if not self.modalities or len(set(self.modalities)) != len(self.modalities):
            raise ValueError(f"modalities must be distinct names, got {list(self.modalities)}")
        self.modalities = tuple(self.modalities)

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Draw the masks of ``epoch`` from now on, also in running DataLoader workers."""
        self._epoch.set(epoch)

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if not features:
            raise ValueError("cannot collate an empty batch")
        present = [name for name in self.modalities if any(f.get(name) is not None for f in features)]
        if not present:
            raise ValueError(f"no example of the batch has any of the modalities {list(self.modalities)}")
        tensors = {name: self._stack(name, features) for name in present}
        has = np.array([[f.get(name) is not None for name in present] for f in features])
        num_patches = self._num_patches(tensors)
        masks = np.ones((len(features), len(present), num_patches), dtype=bool)
        epoch = self.epoch
        for row, example in enumerate(features):
            key = example.get(self.key_column)
            if key is None:
                key = [example[name] for name in present if example.get(name) is not None]
            masks[row] = self.sample_masks(keyed_rng(self.seed, epoch, key), has[row], num_patches)
        batch = dict(tensors)
        for index, name in enumerate(present):
            batch[f"mask_{name}"] = torch.from_numpy(masks[:, index])
        return batch

    def sample_masks(self, rng: np.random.Generator, has: np.ndarray, num_patches: int) -> np.ndarray:
        """Hidden-patch masks ``(len(has), num_patches)`` for one sample having the modalities flagged in ``has``."""
        available = int(has.sum()) * num_patches
        if self.num_visible_tokens > available:
            raise ValueError(
                f"num_visible_tokens={self.num_visible_tokens} exceeds the {available} patches of a sample with "
                f"{int(has.sum())} modalities of {num_patches} patches; lower it or use larger images"
            )
        if math.isinf(self.alpha):
            proportions = has / has.sum()
        else:
            proportions = np.zeros(len(has))
            proportions[has] = rng.dirichlet(np.full(int(has.sum()), self.alpha))
        counts = split_budget(proportions, self.num_visible_tokens, np.where(has, num_patches, 0), rng)
        ranks = rng.random((len(has), num_patches)).argsort(axis=1).argsort(axis=1)
        return ranks >= counts[:, None]

    def _stack(self, name: str, features: Sequence[Mapping[str, Any]]) -> torch.Tensor:
        values = [None if f.get(name) is None else _as_tensor(f[name]) for f in features]
        reference = next(v for v in values if v is not None)
        for row, value in enumerate(values):
            if value is not None and value.shape != reference.shape:
                raise ValueError(
                    f"modality {name!r} has shape {tuple(value.shape)} in example {row} but {tuple(reference.shape)} "
                    "in another; resize all examples to one size with the image processor"
                )
        if any(v is None for v in values):
            if name not in self.fill_values:
                raise ValueError(
                    f"modality {name!r} is missing from some examples of the batch and has no fill value; give all "
                    f"or none of them this modality, or set fill_values[{name!r}] to an invalid (loss-free) value"
                )
            filler = torch.full_like(reference, self.fill_values[name])
            values = [filler if v is None else v for v in values]
        return torch.stack(values)

    def _num_patches(self, tensors: Mapping[str, torch.Tensor]) -> int:
        patch_h, patch_w = self.patch_size
        sizes = {name: tuple(t.shape[-2:]) for name, t in tensors.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"modalities differ in size {sizes}; the image processor makes them one common size")
        height, width = next(iter(sizes.values()))
        if height < patch_h or width < patch_w or height % patch_h or width % patch_w:
            raise ValueError(
                f"images of {height}x{width} pixels do not tile into {patch_h}x{patch_w} patches; resize them to a "
                "multiple of the patch size"
            )
        return (height // patch_h) * (width // patch_w)


def _as_tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))


def split_budget(proportions: np.ndarray, budget: int, caps: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Integer counts summing to ``budget``, proportional to ``proportions``, each at most its cap.

    Largest remainders with random tie-breaking; a capped entry's excess is re-split over the others in proportion
    (uniformly if their proportions are all 0). ``budget`` must not exceed ``caps.sum()``.
    """
    if budget > caps.sum():
        raise ValueError(f"a budget of {budget} does not fit under caps summing to {int(caps.sum())}")
    counts = np.zeros(len(proportions), dtype=np.int64)
    free = caps > 0
    remaining = budget
    while remaining > 0:
        weights = np.where(free, proportions, 0.0)
        if weights.sum() <= 0:
            weights = free.astype(float)
        target = weights / weights.sum() * remaining
        share = np.floor(target).astype(np.int64)
        leftover = remaining - int(share.sum())
        order = np.lexsort((rng.random(len(target)), -(target - share)))
        share[order[:leftover]] += 1
        share = np.minimum(share, caps - counts)
        counts += share
        remaining -= int(share.sum())
        free &= counts < caps
    return counts
