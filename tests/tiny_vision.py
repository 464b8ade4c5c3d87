"""Tiny MM-MAE configurations and hand-built batches for the vision model and head tests."""

from __future__ import annotations

import torch

from robust_pretrain.vision.multimae.configuration_multimae import ModalitySpec, MultiMAEConfig

IMAGE, PATCH, NUM_CLASSES = 16, 4, 5
NUM_PATCHES = (IMAGE // PATCH) ** 2


def tiny_config(**overrides) -> MultiMAEConfig:
    settings = dict(
        modalities=[
            ModalitySpec("rgb", "rgb"),
            ModalitySpec("depth", "depth"),
            ModalitySpec("semseg", "semseg", num_classes=NUM_CLASSES),
        ],
        image_size=IMAGE,
        patch_size=PATCH,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        class_embed_dim=8,
        decoder_hidden_size=16,
        decoder_num_hidden_layers=1,
        decoder_num_attention_heads=2,
        decoder_intermediate_size=32,
        neck_hidden_sizes=[8, 8, 16, 16],
        fusion_hidden_size=16,
    )
    settings.update(overrides)
    return MultiMAEConfig(**settings)


def fixed_budget_masks(batch: int, modalities: list[str], visible: int, seed: int) -> dict[str, torch.Tensor]:
    """Per sample exactly ``visible`` visible patches over all ``modalities`` (True = hidden), at random."""
    g = torch.Generator().manual_seed(seed)
    flat = torch.ones(batch, len(modalities) * NUM_PATCHES, dtype=torch.bool)
    for row in range(batch):
        flat[row, torch.randperm(flat.shape[1], generator=g)[:visible]] = False
    return {f"mask_{name}": flat[:, i * NUM_PATCHES : (i + 1) * NUM_PATCHES] for i, name in enumerate(modalities)}


def random_batch(
    batch: int = 2, seed: int = 0, modalities: tuple[str, ...] = ("rgb", "depth", "semseg"), visible: int = 12
) -> dict[str, torch.Tensor]:
    """Collator-style batch: rgb (B,3,H,W), depth (B,1,H,W) metres with ~20% invalid zeros, semseg (B,H,W) with
    ~10% ignore (255), and fixed-budget masks."""
    g = torch.Generator().manual_seed(seed)
    values = {
        "rgb": torch.randn(batch, 3, IMAGE, IMAGE, generator=g),
        "depth": (0.5 + 4 * torch.rand(batch, 1, IMAGE, IMAGE, generator=g))
        * (torch.rand(batch, 1, IMAGE, IMAGE, generator=g) > 0.2),
        "semseg": torch.where(
            torch.rand(batch, IMAGE, IMAGE, generator=g) < 0.1,
            255,
            torch.randint(0, NUM_CLASSES, (batch, IMAGE, IMAGE), generator=g),
        ),
    }
    out = {name: values[name] for name in modalities}
    out.update(fixed_budget_masks(batch, list(modalities), visible, seed + 1))
    return out


class BatchExamples(torch.utils.data.Dataset):
    """The rows of a batch (such as :func:`random_batch`'s) as a map-style dataset of examples."""

    def __init__(self, batch: dict[str, torch.Tensor]) -> None:
        self.batch = batch

    def __len__(self) -> int:
        return len(self.batch["rgb"])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {key: value[index] for key, value in self.batch.items()}
