"""The patch grid of an image: cutting images into patches and back, and the fixed 2D sine-cosine position
embeddings of the grid (shared by the MM-MAE encoder, its decoders and the ViT export)."""

from __future__ import annotations

import functools

import torch
from transformers.models.vit_mae.modeling_vit_mae import build_2d_sinusoidal_position_embedding


@functools.lru_cache(maxsize=32)
def _sincos_table(grid_height: int, grid_width: int, dim: int) -> torch.Tensor:
    return build_2d_sinusoidal_position_embedding(grid_height, grid_width, embed_dim=dim)


def sincos_position_embedding(
    grid_height: int, grid_width: int, dim: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """Fixed 2D sine-cosine embeddings ``(grid_height * grid_width, dim)`` of a row-major patch grid."""
    return _sincos_table(grid_height, grid_width, dim).to(device=device, dtype=dtype)


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B, N, patch_size**2 * C)``, patches row-major, values ordered (row, column, channel)."""
    batch, channels, height, width = images.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    patches = images.reshape(batch, channels, grid_h, patch_size, grid_w, patch_size)
    return patches.permute(0, 2, 4, 3, 5, 1).reshape(batch, grid_h * grid_w, patch_size * patch_size * channels)


def unpatchify(patches: torch.Tensor, patch_size: int, grid_height: int, grid_width: int) -> torch.Tensor:
    """Inverse of :func:`patchify`: ``(B, N, patch_size**2 * C)`` -> ``(B, C, H, W)``."""
    batch = patches.shape[0]
    channels = patches.shape[-1] // (patch_size * patch_size)
    images = patches.reshape(batch, grid_height, grid_width, patch_size, patch_size, channels)
    return images.permute(0, 5, 1, 3, 2, 4).reshape(batch, channels, grid_height * patch_size, grid_width * patch_size)
