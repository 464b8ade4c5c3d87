"""MultiMAE's ConvNeXt semantic-segmentation head (its ``ConvNeXtAdapter``), an alternative to the DPT head."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class ConvNeXtBlock(nn.Module):
    """An isotropic ConvNeXt block as MultiMAE uses it (no layer scale, no stochastic depth): 7x7 depthwise
    convolution, LayerNorm over channels, 1x1 expansion to 4x the channels, GELU, 1x1 projection, residual."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, kernel_size=7, padding=3, groups=channels)
        self.norm = nn.LayerNorm(channels, eps=1e-6)
        self.expand = nn.Linear(channels, 4 * channels)
        self.project = nn.Linear(4 * channels, channels)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``features`` (B, C, H, W) -> (B, C, H, W)."""
        hidden = self.norm(self.depthwise(features).permute(0, 2, 3, 1))
        return features + self.project(F.gelu(self.expand(hidden))).permute(0, 3, 1, 2)


class ConvNeXtSegmentationHead(nn.Module):
    """MultiMAE's ConvNeXt adapter: each patch's token (the input modalities' tokens concatenated) is projected to
    ``head_dim`` values, read as ``preds_per_patch`` sub-pixels (a square of side ``sqrt(preds_per_patch)``) of
    ``head_dim / preds_per_patch`` channels, then ``num_blocks`` ConvNeXt blocks and a 1x1 convolution to the class
    logits, at ``patch_size / sqrt(preds_per_patch)`` pixels per sub-pixel (the caller upsamples)."""

    def __init__(self, in_dim: int, head_dim: int, preds_per_patch: int, num_blocks: int, num_labels: int) -> None:
        super().__init__()
        self.side = round(preds_per_patch**0.5)
        self.channels = head_dim // preds_per_patch
        self.projection = nn.Linear(in_dim, head_dim)
        self.blocks = nn.Sequential(*[ConvNeXtBlock(self.channels) for _ in range(num_blocks)])
        self.classifier = nn.Conv2d(self.channels, num_labels, kernel_size=1)

    def forward(self, tokens: torch.Tensor, grid_height: int, grid_width: int) -> torch.Tensor:
        """``tokens`` (B, grid_height * grid_width, in_dim), row-major patches -> logits (B, num_labels,
        grid_height * side, grid_width * side)."""
        batch, side = tokens.shape[0], self.side
        values = self.projection(tokens).view(batch, grid_height, grid_width, side, side, self.channels)
        features = values.permute(0, 5, 1, 3, 2, 4).reshape(batch, self.channels, grid_height * side, grid_width * side)
        return self.classifier(self.blocks(features))
