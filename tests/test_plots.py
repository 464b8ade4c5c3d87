"""One colour rule per modality (robust_pretrain.reporting.plots): class ids, depth and RGB look the same everywhere."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import matplotlib
import numpy as np
import pytest
from matplotlib.colors import Normalize, to_rgba
from PIL import Image

from robust_pretrain.reporting.plots import (
    class_colour,
    class_map_style,
    depth_style,
    plot_predictions,
    rgb_image,
)

matplotlib.use("Agg")


def drawn_colour(style: dict, value: float) -> tuple[float, ...]:
    """The colour ``imshow(..., **style)`` gives a pixel of ``value`` (NaN: the 'bad' colour)."""
    cmap = style["cmap"] if not isinstance(style["cmap"], str) else matplotlib.colormaps[style["cmap"]]
    if np.isnan(value):
        return tuple(cmap.get_bad())
    return tuple(cmap(Normalize(style["vmin"], style["vmax"])(value)))


@pytest.mark.parametrize("num_classes", [3, 13, 40])
def test_a_class_has_one_colour_whatever_the_number_of_classes(num_classes: int) -> None:
    style = class_map_style(num_classes)
    for class_id in range(num_classes):
        assert drawn_colour(style, class_id) == class_colour(class_id)
    assert class_colour(2) == matplotlib.colormaps["tab20"](2) and class_colour(22) == class_colour(2)
    assert drawn_colour(style, np.nan) == to_rgba("white")  # ignored pixels


def test_depth_scale_spans_the_targets_valid_pixels() -> None:
    target = np.array([[0.0, 2.0], [np.nan, 5.0]])  # 0 and NaN: invalid
    style = depth_style(target)
    assert (style["vmin"], style["vmax"]) == (2.0, 5.0)
    assert drawn_colour(style, 2.0) == matplotlib.colormaps["viridis"](0.0)
    assert drawn_colour(style, np.nan) == to_rgba("white")
    assert (depth_style(np.zeros((2, 2)))["vmin"], depth_style(np.zeros((2, 2)))["vmax"]) == (0.0, 1.0)


def test_rgb_is_mapped_back_with_the_processors_mean_and_std() -> None:
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.5]
    pixel = np.array([0.1, 0.9, 0.3])  # the image to recover, per channel
    normalised = ((pixel - mean) / std)[:, None, None] * np.ones((3, 2, 2))
    assert np.allclose(rgb_image(normalised, mean, std)[0, 0], pixel)
    assert rgb_image(np.full((3, 1, 1), 100.0), mean, std).max() == 1.0  # clipped


def test_prediction_figure_draws_classes_in_their_colour(tmp_path: Path) -> None:
    """The target panel of a semseg ``predictions.png`` shows class 1 in ``class_colour(1)`` and ignored pixels
    white."""
    processor = SimpleNamespace(image_mean=[0.0, 0.0, 0.0], image_std=[1.0, 1.0, 1.0])
    labels = np.ones((1, 16, 16), dtype=np.int64)
    labels[0, :, 8:] = 255  # right half ignored
    path = plot_predictions(
        "semseg", np.zeros((1, 3, 16, 16)), labels, labels, processor, ["a", "b", "c"], 255, tmp_path / "p.png"
    )
    pixels = np.asarray(Image.open(path).convert("RGB")).reshape(-1, 3)
    expected = np.round(np.array(class_colour(1)[:3]) * 255)
    assert (np.abs(pixels - expected).max(axis=1) <= 1).sum() > 5000  # the left halves of both panels
