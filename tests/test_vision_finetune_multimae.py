"""MultiMAE's fine-tuning protocol (issue 32 item 3): the ConvNeXt segmentation head against a hand-written
MultiMAE ConvNeXt adapter on the same weights, the berHu depth loss against its closed form, both reachable from
``robust-pretrain-finetune-dense``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from test_recipe_pretrain import single_thread
from test_vision_finetune import checkpoint, finetune  # noqa: F401  (checkpoint: a module-scoped fixture)
from tiny_vision import IMAGE, PATCH, tiny_config
from torch.nn import functional as F
from transformers import AutoModelForSemanticSegmentation

from robust_pretrain.cli import UsageError
from robust_pretrain.vision.multimae.heads import MultiMAEForDepthEstimation, MultiMAEForSemanticSegmentation
from robust_pretrain.vision.multimae.losses import depth_loss

NUM_LABELS, HEAD_DIM, PREDS = 3, 32, 4  # 4 predictions per patch: 2 x 2 sub-pixels of 8 channels


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


def convnext_model(**overrides) -> MultiMAEForSemanticSegmentation:
    torch.manual_seed(0)
    config = tiny_config(
        num_labels=NUM_LABELS,
        semseg_head="convnext",
        convnext_head_dim=HEAD_DIM,
        convnext_preds_per_patch=PREDS,
        convnext_num_blocks=2,
        **overrides,
    )
    return MultiMAEForSemanticSegmentation(config).double().eval()


def multimae_convnext_adapter(weights: dict, tokens: torch.Tensor, grid: int, blocks: int) -> torch.Tensor:
    """MultiMAE's ConvNeXtAdapter on ``tokens`` (B, N, D): the encoder's last layer, the input modalities' patch
    tokens concatenated per patch. Linear to HEAD_DIM; per patch, PREDS groups of HEAD_DIM / PREDS channels laid out
    as a 2 x 2 square of sub-pixels (first group top left, row-major); ConvNeXt blocks (7x7 depthwise conv, LayerNorm
    over channels, Linear x4, GELU, Linear, residual); 1x1 conv to the classes."""
    projected = tokens @ weights["head.projection.weight"].T + weights["head.projection.bias"]
    batch, channels, side = tokens.shape[0], HEAD_DIM // PREDS, int(PREDS**0.5)
    x = torch.zeros(batch, channels, grid * side, grid * side, dtype=tokens.dtype)
    for patch in range(grid * grid):
        row, col = divmod(patch, grid)
        for sub in range(PREDS):
            sub_row, sub_col = divmod(sub, side)
            x[:, :, row * side + sub_row, col * side + sub_col] = projected[
                :, patch, sub * channels : (sub + 1) * channels
            ]
    for index in range(blocks):
        name = f"head.blocks.{index}"
        y = F.conv2d(
            x, weights[f"{name}.depthwise.weight"], weights[f"{name}.depthwise.bias"], padding=3, groups=channels
        )
        y = y.permute(0, 2, 3, 1)
        y = F.layer_norm(y, (channels,), weights[f"{name}.norm.weight"], weights[f"{name}.norm.bias"], eps=1e-6)
        y = F.gelu(y @ weights[f"{name}.expand.weight"].T + weights[f"{name}.expand.bias"])
        y = y @ weights[f"{name}.project.weight"].T + weights[f"{name}.project.bias"]
        x = x + y.permute(0, 3, 1, 2)
    return F.conv2d(x, weights["head.classifier.weight"], weights["head.classifier.bias"])


def test_convnext_head_computes_multimae_s_adapter() -> None:
    """RGB and depth in: each patch's two last-layer tokens (before the final norm) concatenated, rgb first; the
    logits are the adapter's, upsampled bilinearly to the label size."""
    model = convnext_model(finetune_modalities=["rgb", "depth"])
    with torch.no_grad():
        for parameter in model.head.parameters():  # unit-scale weights: every step shows in the output
            parameter.normal_(std=0.5)
    g = torch.Generator().manual_seed(1)
    rgb = torch.randn(2, 3, IMAGE, IMAGE, generator=g, dtype=torch.float64)
    depth = 1 + 3 * torch.rand(2, 1, IMAGE, IMAGE, generator=g, dtype=torch.float64)
    labels = torch.randint(0, NUM_LABELS, (2, 24, 24), generator=g)
    with torch.no_grad():
        out = model(pixel_values=rgb, depth=depth, labels=labels, output_hidden_states=True)
        last = out.hidden_states[-1][:, 1:]  # after the global token
    grid = IMAGE // PATCH
    tokens = torch.cat([last[:, : grid * grid], last[:, grid * grid :]], dim=-1)
    expected = multimae_convnext_adapter(dict(model.state_dict()), tokens, grid, blocks=2)
    assert expected.shape[-2:] == (2 * grid, 2 * grid)  # stride PATCH / 2 before the upsampling
    expected = F.interpolate(expected, size=(24, 24), mode="bilinear", align_corners=False)
    torch.testing.assert_close(out.logits, expected, rtol=1e-10, atol=1e-10)
    loss = F.cross_entropy(expected, labels)
    assert float(out.loss) == pytest.approx(float(loss), rel=1e-6)  # the model takes it in float32


def test_convnext_head_saves_loads_and_starts_from_a_pretraining_checkpoint(checkpoint: Path, tmp_path: Path) -> None:  # noqa: F811
    model = convnext_model()
    model.save_pretrained(tmp_path / "seg")
    loaded = AutoModelForSemanticSegmentation.from_pretrained(tmp_path / "seg").double().eval()
    assert isinstance(loaded.head, type(model.head)) and not hasattr(loaded, "neck")
    rgb = torch.randn(1, 3, IMAGE, IMAGE, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(pixel_values=rgb).logits, model(pixel_values=rgb).logits)
    assert model.head_modules() == ["head"]
    from_checkpoint, info = MultiMAEForSemanticSegmentation.from_pretrained(
        checkpoint, semseg_head="convnext", convnext_head_dim=HEAD_DIM, output_loading_info=True
    )
    assert info["missing_keys"] and all(key.startswith("head.") for key in info["missing_keys"])


def berhu_by_hand(predicted: np.ndarray, labels: np.ndarray, valid: np.ndarray) -> float:
    """|x| if |x| <= c else (x^2 + c^2) / (2c), c = 0.2 max |x| over the batch's valid pixels; mean over them."""
    x = (predicted - labels)[valid]
    c = 0.2 * np.abs(x).max()
    return float(np.where(np.abs(x) <= c, np.abs(x), (x**2 + c**2) / (2 * c)).mean())


def test_berhu_matches_its_closed_form_with_one_threshold_per_batch() -> None:
    """Two images whose largest errors differ tenfold (a per-image threshold would give another value); invalid
    pixels (0 and NaN labels, with large predictions there) change neither the threshold nor the mean; no gradient
    flows through the threshold."""
    g = torch.Generator().manual_seed(0)
    labels = 1 + 3 * torch.rand(2, 6, 6, generator=g, dtype=torch.float64)
    predicted = (
        labels + torch.randn(2, 6, 6, generator=g, dtype=torch.float64) * torch.tensor([1.0, 0.1])[:, None, None]
    )
    labels[0, 0, :3], labels[1, 2, 2] = 0.0, float("nan")
    predicted.data[0, 0, :3] = 100.0
    valid = (labels > 0) & torch.isfinite(labels)
    predicted.requires_grad_(True)
    loss = depth_loss("berhu", predicted, labels, valid)
    expected = berhu_by_hand(predicted.detach().numpy(), labels.numpy(), valid.numpy())
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)
    loss.backward()
    x = (predicted - labels).detach()
    c = 0.2 * float(x[valid].abs().max())
    gradient = torch.where(x.abs() <= c, x.sign(), x / c) * valid / int(valid.sum())
    torch.testing.assert_close(predicted.grad, torch.nan_to_num(gradient), rtol=1e-12, atol=1e-12)
    l1 = depth_loss("l1", predicted.detach(), labels, valid)
    assert float(l1) == pytest.approx(float(x[valid].abs().mean()), rel=1e-12)


def test_depth_model_uses_the_configured_loss() -> None:
    torch.manual_seed(0)
    model = MultiMAEForDepthEstimation(tiny_config(depth_loss="berhu")).double().eval()
    rgb = torch.randn(2, 3, IMAGE, IMAGE, dtype=torch.float64)
    labels = (0.5 + 4 * torch.rand(2, IMAGE, IMAGE, dtype=torch.float64)) * (torch.rand(2, IMAGE, IMAGE) > 0.2)
    with torch.no_grad():
        out = model(pixel_values=rgb, labels=labels)
    valid = labels.numpy() > 0
    assert float(out.loss) == pytest.approx(
        berhu_by_hand(out.predicted_depth.numpy(), labels.numpy(), valid), rel=1e-10
    )


def test_the_recipe_reaches_both_options(checkpoint: Path, tmp_path: Path) -> None:  # noqa: F811
    finetune(checkpoint, "semseg", tmp_path / "seg", "--semseg_head", "convnext", "--convnext_head_dim", "64")
    saved = json.loads((tmp_path / "seg" / "config.json").read_text())
    assert (saved["semseg_head"], saved["convnext_head_dim"]) == ("convnext", 64)
    finetune(checkpoint, "depth", tmp_path / "depth", "--depth_loss", "berhu", "--max_steps", "1")
    assert json.loads((tmp_path / "depth" / "config.json").read_text())["depth_loss"] == "berhu"
    with pytest.raises(UsageError, match="--depth_loss applies to --task depth, not semseg"):
        finetune(checkpoint, "semseg", tmp_path / "bad", "--depth_loss", "berhu")
