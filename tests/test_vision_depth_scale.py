"""Depth in the pre-training loss (issue 18 item 4): MultiMAE's per-image standardised depth, the depth cap, and a
default objective whose task weights do not follow the depth unit (the same PNGs read as metres or centimetres)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from test_recipe_multimae import FOLDER, argv, write_folder
from test_recipe_pretrain import single_thread
from tiny_vision import IMAGE, NUM_CLASSES, PATCH, random_batch, tiny_config

from robust_pretrain.pretraining import multimae as recipe
from robust_pretrain.vision.configuration_multimae import ModalitySpec
from robust_pretrain.vision.modeling_multimae import MultiMAEForPreTraining


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


def depth_model(normalization: str = "standardize", max_depth: float | None = None) -> MultiMAEForPreTraining:
    modalities = [
        ModalitySpec("rgb", "rgb"),
        ModalitySpec("depth", "depth", depth_normalization=normalization, max_depth=max_depth),
        ModalitySpec("semseg", "semseg", num_classes=NUM_CLASSES),
    ]
    torch.manual_seed(0)
    return MultiMAEForPreTraining(tiny_config(modalities=modalities)).eval()


def hidden_pixels(mask: torch.Tensor) -> np.ndarray:
    grid = mask.view(-1, IMAGE // PATCH, IMAGE // PATCH).numpy()
    return grid.repeat(PATCH, 1).repeat(PATCH, 2)


def test_standardised_depth_loss_matches_a_hand_computation() -> None:
    """Per image: valid = positive and <= max_depth; the target is (depth - mean) / std over the valid pixels
    (population std); the loss is L1 against it over the hidden valid pixels; predictions come back in metres."""
    model = depth_model("standardize", max_depth=3.5)
    batch = random_batch(batch=3, seed=4)
    with torch.no_grad():
        out = model(**batch)
    depth, predicted = batch["depth"][:, 0].numpy().astype(np.float64), out.predictions["depth"][:, 0].numpy()
    errors, count = [], 0
    for image, prediction, hidden in zip(depth, predicted, hidden_pixels(batch["mask_depth"]), strict=True):
        valid = (image > 0) & (image <= 3.5)
        mean, std = image[valid].mean(), image[valid].std()
        scored = valid & hidden
        errors.append(np.abs((prediction[scored] - mean) / std - (image[scored] - mean) / std))
        count += int(scored.sum())
    assert 0 < count < int(hidden_pixels(batch["mask_depth"]).sum())  # the cap and the zeros removed pixels
    assert out.task_counts["depth"] == count
    assert float(out.task_losses["depth"]) == pytest.approx(float(np.concatenate(errors).mean()), rel=1e-4)


def test_the_cap_removes_far_pixels_from_input_and_loss() -> None:
    """Raw depth with max_depth 2: exactly what the model computes when those pixels are 0 (= no measurement)."""
    batch = random_batch(batch=2, seed=1)
    far = batch["depth"] > 2.0
    assert far.any()
    capped = depth_model("none", max_depth=2.0)
    with torch.no_grad():
        out = capped(**batch)
        reference = depth_model("none")(**{**batch, "depth": batch["depth"].masked_fill(far, 0.0)})
    for name in ("rgb", "depth", "semseg"):
        assert float(out.task_losses[name]) == pytest.approx(float(reference.task_losses[name]), rel=1e-6)
        assert out.task_counts[name] == reference.task_counts[name]


@pytest.mark.parametrize("normalization", ["standardize", "none"])
def test_only_standardised_depth_is_unit_free(normalization: str) -> None:
    """The same frames in metres and in centimetres (cap scaled with them): standardised, every task loss is the
    same; raw, the depth loss grows 100-fold."""
    batch = random_batch(batch=2, seed=2)
    in_metres = depth_model(normalization, max_depth=4.0)
    in_centimetres = depth_model(normalization, max_depth=400.0)
    with torch.no_grad():
        metres = in_metres(**batch)
        centimetres = in_centimetres(**{**batch, "depth": batch["depth"] * 100})
    assert centimetres.task_counts == metres.task_counts
    ratio = float(centimetres.task_losses["depth"] / metres.task_losses["depth"])
    if normalization == "standardize":
        for name in ("rgb", "depth", "semseg"):
            assert float(centimetres.task_losses[name]) == pytest.approx(float(metres.task_losses[name]), rel=1e-5)
        torch.testing.assert_close(centimetres.predictions["depth"], metres.predictions["depth"] * 100)
    else:
        assert ratio > 10


def recipe_weights(tmp_path: Path, name: str, unit_per_metre: float, *options: str) -> dict[str, float]:
    """Task weights after 4 minimax steps on the PNG folder, its 16-bit depth (millimetres) read in a unit of
    ``1 / unit_per_metre`` metres, with the cap at 10 m in that unit."""
    depth_scale, max_depth = 1000 / unit_per_metre, 10 * unit_per_metre
    units = ("--depth_scale", str(depth_scale), "--max_depth", str(max_depth))
    result = recipe.run(
        argv(tmp_path / name, "--image_folder", str(tmp_path / "data"), *FOLDER, "--max_steps", "4", *units, *options)
    )
    return result["report"]["final_weights"]


@pytest.mark.slow
def test_recipe_default_weights_do_not_follow_the_depth_unit(tmp_path: Path) -> None:
    """The recipe's default objective (minimax on standardised depth): the same PNGs read as metres or as
    centimetres give the same task weights after 4 steps; with raw depth they do not (issue 18's 0/1/0)."""
    write_folder(tmp_path / "data", "train", [f"a{i}" for i in range(8)])
    write_folder(tmp_path / "data", "test", ["b0", "b1"])
    metres = recipe_weights(tmp_path, "m", 1.0)
    centimetres = recipe_weights(tmp_path, "cm", 100.0)
    assert metres == pytest.approx(centimetres, abs=1e-4)
    assert max(metres.values()) < 0.9  # no collapse onto one task
    raw_metres = recipe_weights(tmp_path, "raw-m", 1.0, "--depth_normalization", "none")
    raw_centimetres = recipe_weights(tmp_path, "raw-cm", 100.0, "--depth_normalization", "none")
    assert raw_centimetres["depth"] > raw_metres["depth"] + 0.1
