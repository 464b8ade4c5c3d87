import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from processes import checkout_env

from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor, MultiMAETransform

WIDTH, HEIGHT = 48, 36  # 4:3, like NYUv2
MARKER = (30, 12, 6)  # left, top, side: a square at x 30..35, y 12..17
OUT = 24


def marked_example(depth_scale: int = 1) -> dict:
    """RGB grey with a red square, depth 5 m with the square at 2 m, classes 1 with the square class 3.

    ``depth_scale`` stores depth at 1/depth_scale resolution (same aspect)."""
    left, top, side = MARKER
    rgb = np.full((HEIGHT, WIDTH, 3), 128, np.uint8)
    rgb[top : top + side, left : left + side] = (255, 0, 0)
    semseg = np.ones((HEIGHT, WIDTH), np.uint8)
    semseg[top : top + side, left : left + side] = 3
    depth = np.full((HEIGHT // depth_scale, WIDTH // depth_scale), 5000, np.uint16)
    s = depth_scale
    depth[top // s : (top + side) // s, left // s : (left + side) // s] = 2000
    return {"rgb": Image.fromarray(rgb), "depth": Image.fromarray(depth), "semseg": Image.fromarray(semseg)}


def centroid(mask: np.ndarray) -> np.ndarray:
    rows, cols = np.nonzero(mask)
    return np.array([cols.mean(), rows.mean()])


def marker_masks(out: dict) -> dict:
    red = out["rgb"][0] > 1.5  # normalised red channel: 255 -> 1.99, 128 -> 0.07
    return {"rgb": red, "depth": (out["depth"][0] > 0) & (out["depth"][0] < 3.5), "semseg": out["semseg"] == 3}


@pytest.mark.parametrize("depth_scale", [1, 2])
def test_crop_and_flip_move_the_marker_identically_in_all_modalities(depth_scale):
    processor = MultiMAEImageProcessor(size=OUT, crop_scale=(0.5, 1.0))
    example = marked_example(depth_scale)
    seen, flips = 0, 0
    for seed in range(40):
        out = processor.process_example(example, train=True, rng=np.random.default_rng(seed))
        replay = np.random.default_rng(seed)  # the same draws, to predict where the marker must go
        left, top, right, bottom = processor.random_crop_box(WIDTH, HEIGHT, replay)
        flipped = replay.random() < 0.5
        masks = marker_masks(out)
        if masks["semseg"].sum() < 4 or masks["semseg"].shape != (OUT, OUT):
            continue
        fully_inside = (
            left * WIDTH <= MARKER[0]
            and right * WIDTH >= MARKER[0] + MARKER[2]
            and top * HEIGHT <= MARKER[1]
            and bottom * HEIGHT >= MARKER[1] + MARKER[2]
        )
        centres = {name: centroid(mask) for name, mask in masks.items()}
        assert np.abs(centres["rgb"] - centres["semseg"]).max() < 0.75
        assert np.abs(centres["depth"] - centres["semseg"]).max() < 0.75 * depth_scale
        if fully_inside:
            seen += 1
            flips += flipped
            marker_centre = np.array([MARKER[0] + MARKER[2] / 2, MARKER[1] + MARKER[2] / 2])
            expected = (marker_centre / [WIDTH, HEIGHT] - [left, top]) / [right - left, bottom - top] * OUT - 0.5
            if flipped:
                expected[0] = OUT - 1 - expected[0]
            assert np.abs(centres["semseg"] - expected).max() < 0.75
    assert seen >= 10 and 0 < flips < seen  # both flipped and unflipped crops were checked


def test_crop_statistics_follow_the_settings():
    processor = MultiMAEImageProcessor(size=OUT)
    rng = np.random.default_rng(0)
    boxes = np.array([processor.random_crop_box(640, 480, rng) for _ in range(2000)])
    widths, heights = (boxes[:, 2] - boxes[:, 0]) * 640, (boxes[:, 3] - boxes[:, 1]) * 480
    area, aspect = widths * heights / (640 * 480), widths / heights
    assert (boxes >= 0).all() and (boxes <= 1).all()
    assert 0.2 - 1e-9 <= area.min() < 0.21 and 0.95 < area.max() <= 1 + 1e-9
    assert aspect.min() >= 0.75 - 1e-9 and aspect.max() <= 4 / 3 + 1e-9
    # A full-image crop is the evaluation view, flipped with probability flip_probability.
    full = MultiMAEImageProcessor(size=OUT, flip_probability=0.3, crop_scale=(1.0, 1.0), crop_ratio=(4 / 3, 4 / 3))
    example = marked_example()
    evaluated = full.process_example(example, train=False)["semseg"]
    outcomes = []
    for seed in range(300):
        trained = full.process_example(example, train=True, rng=np.random.default_rng(seed))["semseg"]
        assert np.array_equal(trained, evaluated) or np.array_equal(trained, evaluated[:, ::-1])
        outcomes.append(not np.array_equal(trained, evaluated))
    assert abs(np.mean(outcomes) - 0.3) < 0.08


def test_evaluation_resizes_the_whole_image_deterministically():
    processor = MultiMAEImageProcessor(size={"height": 18, "width": 24})
    out = processor.process_example(marked_example(), train=False)
    assert out["rgb"].shape == (3, 18, 24) and out["depth"].shape == (1, 18, 24) and out["semseg"].shape == (18, 24)
    # The marker covers x 30..35, y 12..17 of 48x36: x 15..17, y 6..8 at half size.
    assert np.array_equal(np.argwhere(out["semseg"] == 3)[[0, -1]], [[6, 15], [8, 17]])
    marker_depth = out["depth"][0][out["semseg"] == 3]  # bilinear between valid pixels: 2 m inside, blended edges
    assert np.isclose(out["depth"][0, 7, 16], 2.0) and (marker_depth >= 2.0).all() and (marker_depth < 5.0).all()
    assert np.isclose(out["depth"][0, 0, 0], 5.0)
    red = np.array([1.0, 0.0, 0.0])
    assert np.allclose(out["rgb"][:, 7, 16], (red - processor.image_mean) / processor.image_std, atol=1e-6)


def test_depth_is_not_interpolated_across_invalid_pixels():
    depth = np.zeros((32, 32), np.uint16)
    depth[:, 16:] = 3000  # left half invalid, right half 3 m
    depth[5, 20] = 0  # an isolated hole
    processor = MultiMAEImageProcessor(size=12)
    out = processor.process_example({"depth": Image.fromarray(depth)}, train=False)["depth"][0]
    assert out.dtype == np.float32
    valid = out > 0
    assert np.allclose(out[valid], 3.0)  # no blending with the invalid zeros
    assert not valid[:, :6].any() and valid[:, 6:].sum() >= 12 * 6 - 1
    ramp = np.tile(np.linspace(1.0, 4.0, 32, dtype=np.float32), (32, 1))
    ramp[:, :8] = np.nan  # non-finite = invalid; float arrays are metres
    out = processor.process_example({"depth": ramp}, train=False)["depth"][0]
    assert not (out[:, :3] > 0).any() and (out[:, 3:] > 0).all()
    assert out[out > 0].min() >= ramp[:, 8].min() - 1e-6 and out.max() <= 4.0


def test_depth_units_follow_depth_scale():
    depth = np.full((8, 8), 5000, np.uint16)
    as_mm = MultiMAEImageProcessor(size=8).process_example({"depth": Image.fromarray(depth)})["depth"]
    as_tum = MultiMAEImageProcessor(size=8, depth_scale=5000).process_example({"depth": depth})["depth"]
    assert np.allclose(as_mm, 5.0) and np.allclose(as_tum, 1.0)


def test_class_maps_use_nearest_neighbour():
    classes = np.zeros((30, 30), np.uint8)
    classes[:, 10:20], classes[:, 20:] = 7, 200
    out = MultiMAEImageProcessor(size=13, ignore_index=200).process_example(
        {"semseg": Image.fromarray(classes)}, train=True, rng=np.random.default_rng(0)
    )["semseg"]
    assert out.dtype == np.int64 and set(np.unique(out)) <= {0, 7, 200}


def test_rgb_inputs_of_any_layout_are_converted():
    processor = MultiMAEImageProcessor(size=(5, 6), image_mean=(0, 0, 0), image_std=(1, 1, 1))
    colour = np.random.default_rng(0).integers(0, 256, (5, 6, 3), dtype=np.uint8)
    reference = processor.process_example({"rgb": Image.fromarray(colour)})["rgb"]
    assert np.allclose(reference, colour.transpose(2, 0, 1) / 255, atol=1e-6)
    rgba = np.concatenate([colour, np.full((5, 6, 1), 7, np.uint8)], axis=-1)
    for variant in (Image.fromarray(rgba), rgba, colour.transpose(2, 0, 1), colour / 255.0):
        assert np.allclose(processor.process_example({"rgb": variant})["rgb"], reference, atol=1e-6)
    gray = processor.process_example({"rgb": Image.fromarray(colour[..., 0])})["rgb"]
    assert np.allclose(gray, colour[..., 0] / 255, atol=1e-6)  # replicated to 3 channels


def test_batch_call_returns_stacked_tensors():
    import torch

    examples = [marked_example() for _ in range(3)]
    processor = MultiMAEImageProcessor(size=OUT)
    out = processor(
        [e["rgb"] for e in examples],
        depth=[e["depth"] for e in examples],
        train=True,
        generators=[np.random.default_rng(i) for i in range(3)],
    )
    assert set(out) == {"rgb", "depth"}
    assert out["rgb"].shape == (3, 3, OUT, OUT) and out["rgb"].dtype == torch.float32
    assert out["depth"].shape == (3, 1, OUT, OUT)
    single = processor(examples[0]["rgb"], return_tensors="np")
    assert single["rgb"].shape == (1, 3, OUT, OUT) and isinstance(single["rgb"], np.ndarray)


@pytest.mark.slow
def test_saved_as_preprocessor_config_and_loaded_by_auto_class(tmp_path):
    processor = MultiMAEImageProcessor(
        size={"height": 32, "width": 48}, crop_scale=(0.3, 0.9), depth_scale=5000, num_classes=13, ignore_index=0
    )
    processor.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert saved["image_processor_type"] == "MultiMAEImageProcessor" and saved["depth_scale"] == 5000
    # A fresh interpreter: `import robust_pretrain` alone must make AutoImageProcessor find the class.
    script = (
        "import robust_pretrain, json, sys\n"
        "from transformers import AutoImageProcessor\n"
        f"p = AutoImageProcessor.from_pretrained({str(tmp_path)!r})\n"
        "print(json.dumps([type(p).__name__, p.size, list(p.crop_scale), p.depth_scale, p.num_classes, "
        "p.ignore_index]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=checkout_env(), capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [
        "MultiMAEImageProcessor",
        {"height": 32, "width": 48},
        [0.3, 0.9],
        5000.0,
        13,
        0,
    ]
    assert MultiMAEImageProcessor.from_pretrained(tmp_path).to_dict() == processor.to_dict()


def test_dataset_transform_is_keyed_by_id_and_epoch():
    import datasets

    example = marked_example()
    rows = {"id": ["a", "b"], "rgb": [example["rgb"]] * 2, "semseg": [example["semseg"]] * 2, "label": [1, 0]}
    dataset = datasets.Dataset.from_dict(rows)
    transform = MultiMAETransform(MultiMAEImageProcessor(size=OUT), train=True, seed=3)
    dataset.set_transform(transform)
    first = dataset[0]
    assert set(first) == {"id", "rgb", "semseg", "label"} and first["label"] == 1
    assert first["rgb"].shape == (3, OUT, OUT) and first["semseg"].shape == (OUT, OUT)
    assert np.array_equal(dataset[0]["semseg"], first["semseg"])  # reproducible
    assert not np.array_equal(dataset[1]["semseg"], first["semseg"])  # another id, another crop
    transform.set_epoch(1)
    assert not np.array_equal(dataset[0]["semseg"], first["semseg"])
    evaluation = MultiMAETransform(MultiMAEImageProcessor(size=OUT), train=False)
    dataset.set_transform(evaluation)
    assert np.array_equal(dataset[0]["semseg"], dataset[1]["semseg"])


@pytest.mark.parametrize(
    ("example", "options", "message"),
    [
        (
            {"rgb": np.zeros((36, 48, 3), np.uint8), "semseg": np.zeros((48, 36), np.uint8)},
            {},
            "different aspect ratios",
        ),
        ({"semseg": np.full((8, 8), 9, np.uint8)}, {"num_classes": 5}, r"class ids \[9\] outside 0..4"),
        ({"depth": np.zeros((8, 8), np.uint16)}, {}, "depth map has no valid pixel"),
        ({"depth": Image.new("L", (8, 8), 3)}, {}, "depth image has mode 'L'"),
        ({"semseg": Image.new("RGB", (8, 8))}, {}, "not a colour rendering"),
        ({"semseg": np.full((8, 8), 0.5)}, {}, "non-integer values"),
        ({"rgb": np.zeros((8, 8, 2))}, {}, "1, 3 or 4 channels"),
        ({"rgb": Image.new("I;16", (8, 8))}, {}, "a depth or class map"),
        ({"label": 3}, {}, "none of the modalities"),
    ],
)
def test_bad_examples_are_reported_by_name(example, options, message):
    processor = MultiMAEImageProcessor(size=8, **options)
    with pytest.raises(ValueError, match=message) as error:
        processor.process_example(example, name="scene-17")
    assert "scene-17" in str(error.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"crop_scale": (0.0, 1.0)}, "crop_scale"),
        ({"crop_ratio": (2.0, 1.0)}, "crop_ratio"),
        ({"flip_probability": 2.0}, "flip_probability"),
        ({"depth_scale": 0}, "depth_scale"),
        ({"num_classes": 0}, "num_classes"),
    ],
)
def test_bad_settings_are_reported(options, message):
    with pytest.raises(ValueError, match=message):
        MultiMAEImageProcessor(**options)
