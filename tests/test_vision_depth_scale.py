"""Depth in the pre-training loss (issue 18 item 4): MultiMAE's per-image standardised depth, the depth cap, and a
default objective whose task weights do not follow the depth unit (the same PNGs read as metres or centimetres)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_recipe_multimae import FOLDER, argv, write_folder
from test_recipe_pretrain import single_thread
from tiny_vision import IMAGE, NUM_CLASSES, PATCH, random_batch, tiny_config

from robust_pretrain.pretraining.multimae import recipe
from robust_pretrain.vision.multimae.configuration_multimae import ModalitySpec
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor
from robust_pretrain.vision.multimae.modality_values import prepare_depth
from robust_pretrain.vision.multimae.pretraining import MultiMAEForPreTraining


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


def statistics(values: np.ndarray, normalization: str) -> tuple[float, float]:
    """Mean and scale of an image's valid depth values: all of them and the population std (``standardize``), or
    MultiMAE's: the sorted values of ranks floor(0.1 n) .. floor(0.9 n) - 1, unbiased variance + 1e-6."""
    if normalization == "standardize":
        return values.mean(), values.std()
    kept = np.sort(values)[int(0.1 * len(values)) : int(0.9 * len(values))]
    return kept.mean(), np.sqrt(kept.var(ddof=1) + 1e-6)


@pytest.mark.parametrize("normalization", ["standardize", "standardize_trimmed"])
def test_standardised_depth_loss_matches_a_hand_computation(normalization: str) -> None:
    """Per image: valid = positive and <= max_depth; the target is (depth - mean) / std over the valid pixels; the
    loss is L1 against it over the hidden valid pixels; predictions come back in metres."""
    model = depth_model(normalization, max_depth=3.5)
    batch = random_batch(batch=3, seed=4)
    with torch.no_grad():
        out = model(**batch)
    depth, predicted = batch["depth"][:, 0].numpy().astype(np.float64), out.predictions["depth"][:, 0].numpy()
    errors, count = [], 0
    for image, prediction, hidden in zip(depth, predicted, hidden_pixels(batch["mask_depth"]), strict=True):
        valid = (image > 0) & (image <= 3.5)
        mean, std = statistics(image[valid], normalization)
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


def nyu_frame(seed: int) -> np.ndarray:
    """A 480 x 640 uint16 depth map in millimetres as NYUv2 / Kinect store them: two walls and a floor at 1.2-4.5 m,
    about 8 % holes (0 = no measurement), a window seen through at 8-9.5 m (valid under the 10 m cap), a few 12 m
    pixels and Kinect's 65535 (beyond the cap: invalid)."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[0:480, 0:640]
    depth = np.where(rows > 300, 1200 + 6 * (480 - rows), 3000 + 2.3 * np.abs(cols - 320)) + rng.normal(
        0, 15, rows.shape
    )
    depth[40:140, 400:560] = rng.uniform(8000, 9500, (100, 160))
    depth[rng.random(rows.shape) < 0.08] = 0
    depth[rng.random(rows.shape) < 0.002] = 12000
    depth[0:3, 0:50] = 65535
    return np.clip(np.round(depth), 0, 65535).astype(np.uint16)


def test_trimmed_standardisation_of_nyu_format_depth_maps(tmp_path: Path) -> None:
    """16-bit millimetre PNGs, read as the recipes read them (metres, zeros invalid), capped at 10 m: the model's
    input values are MultiMAE's robust standardisation computed by hand; the trimming matters on such frames (the
    window inflates the plain std)."""
    processor = MultiMAEImageProcessor()
    frames = []
    for seed in (0, 1):
        path = tmp_path / f"{seed}.png"
        Image.fromarray(nyu_frame(seed)).save(path)
        with Image.open(path) as image:
            assert image.mode in ("I;16", "I")
            frames.append(processor.decode_example({"depth": image})["depth"])
    depth = torch.tensor(np.stack(frames)[:, None], dtype=torch.float32)
    spec = ModalitySpec("depth", "depth", depth_normalization="standardize_trimmed", max_depth=10.0)
    values, valid, mean, std = prepare_depth(spec, depth)
    for image in range(2):
        metres = np.stack(frames)[image].astype(np.float32).astype(np.float64)
        measured = (metres > 0) & (metres <= 10.0)
        assert not measured.all() and len(metres[measured]) % 10  # holes and far pixels; rank bounds not on a tie
        expected_mean, expected_std = statistics(metres[measured], "standardize_trimmed")
        assert float(mean[image]) == pytest.approx(expected_mean, rel=1e-6)
        assert float(std[image]) == pytest.approx(expected_std, rel=1e-5)
        expected = np.where(measured, (metres - expected_mean) / expected_std, 0.0)
        np.testing.assert_allclose(values[image, 0].numpy(), expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(valid[image, 0].numpy(), measured)
        assert metres[measured].std() > 1.2 * expected_std


def test_trimmed_statistics_of_nearly_empty_images_are_finite() -> None:
    """One valid pixel: mean = that value, variance 0; none: mean 0 (the values are all 0, nothing is scored)."""
    depth = torch.zeros(2, 1, 4, 4)
    depth[0, 0, 1, 2] = 3.0
    values, valid, mean, std = prepare_depth(
        ModalitySpec("d", "depth", depth_normalization="standardize_trimmed"), depth
    )
    assert mean.flatten().tolist() == [3.0, 0.0] and std.flatten().tolist() == pytest.approx([1e-3, 1e-3])
    assert torch.isfinite(values).all() and not values.any() and int(valid.sum()) == 1


@pytest.mark.parametrize("normalization", ["standardize", "standardize_trimmed", "none"])
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
    if normalization != "none":
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
