"""The shipped vision metric modules equal independent references (random inputs with ignore regions) and hand-worked
cases; they load offline by path (conftest sets HF_HUB_OFFLINE=1 and a private HF_HOME)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from robust_pretrain.vision.metrics import VISION_METRIC_PATHS, load_vision_metric

IGNORE = 255


def _semseg_reference(predictions, references, num_labels: int) -> dict:
    """Confusion matrix filled pixel by pixel, IoU = diag / (row + column - diag)."""
    confusion = np.zeros((num_labels, num_labels))
    for prediction, reference in zip(predictions, references, strict=True):
        for predicted, true in zip(np.ravel(prediction), np.ravel(reference), strict=True):
            if true != IGNORE:
                confusion[true, predicted] += 1
    intersection = np.diag(confusion)
    union = confusion.sum(axis=0) + confusion.sum(axis=1) - intersection
    per_class_iou = [intersection[c] / union[c] if union[c] else math.nan for c in range(num_labels)]
    present = [iou for iou in per_class_iou if not math.isnan(iou)]
    return {
        "mean_iou": sum(present) / len(present),
        "pixel_accuracy": intersection.sum() / confusion.sum(),
        "per_class_iou": per_class_iou,
    }


def _random_label_maps(rng: np.random.Generator, num_labels: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Images of different sizes, ~20% ignored pixels, noisy predictions; the last class never occurs, the one
    before it only in predictions."""
    predictions, references = [], []
    for height, width in [(7, 9), (5, 4), (12, 6)]:
        reference = rng.integers(0, num_labels - 2, (height, width))
        prediction = np.where(
            rng.random((height, width)) < 0.6, reference, rng.integers(0, num_labels - 1, reference.shape)
        )
        reference[rng.random((height, width)) < 0.2] = IGNORE
        predictions.append(prediction)
        references.append(reference)
    return predictions, references


def test_semseg_matches_confusion_matrix_reference_with_ignore_regions() -> None:
    rng = np.random.default_rng(0)
    num_labels = 6
    predictions, references = _random_label_maps(rng, num_labels)
    result = load_vision_metric("semseg").compute(
        predictions=predictions, references=references, num_labels=num_labels, ignore_index=IGNORE
    )
    expected = _semseg_reference(predictions, references, num_labels)
    assert result["mean_iou"] == pytest.approx(expected["mean_iou"], abs=1e-12)
    assert result["pixel_accuracy"] == pytest.approx(expected["pixel_accuracy"], abs=1e-12)
    np.testing.assert_allclose(result["per_class_iou"], expected["per_class_iou"], atol=1e-12, equal_nan=True)
    assert math.isnan(result["per_class_iou"][-1])  # absent from both: NaN, left out of the mean
    assert result["per_class_iou"][-2] == 0.0  # predicted only: IoU 0, counted in the mean
    assert 0.2 < result["mean_iou"] < 0.8  # informative sample


def test_semseg_ignores_predictions_on_ignored_pixels_and_accumulates_batches() -> None:
    rng = np.random.default_rng(1)
    predictions, references = _random_label_maps(rng, 6)
    metric = load_vision_metric("semseg")
    whole = metric.compute(predictions=predictions, references=references, num_labels=6)
    changed = [
        np.where(reference == IGNORE, 4, prediction)
        for prediction, reference in zip(predictions, references, strict=True)
    ]
    metric.add_batch(predictions=changed[:1], references=references[:1])
    metric.add_batch(predictions=changed[1:], references=references[1:])
    batched = metric.compute(num_labels=6)
    assert batched["mean_iou"] == pytest.approx(whole["mean_iou"], abs=1e-12)
    np.testing.assert_allclose(batched["per_class_iou"], whole["per_class_iou"], equal_nan=True)


def test_semseg_hand_computed() -> None:
    # Kept pixels (reference, prediction): (0,0) (0,1) (1,1) (1,1) (2,1); the 255 pixel is left out.
    # class 0: TP 1, FN 1 -> 1/2; class 1: TP 2, FP 2 -> 2/4; class 2: FN 1 -> 0; class 3 absent -> NaN.
    result = load_vision_metric("semseg").compute(
        predictions=[[[0, 1, 1], [1, 0, 1]]], references=[[[0, 0, 1], [1, IGNORE, 2]]], num_labels=4
    )
    assert result["mean_iou"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert result["pixel_accuracy"] == pytest.approx(3 / 5)
    np.testing.assert_allclose(result["per_class_iou"], [0.5, 0.5, 0.0, math.nan], equal_nan=True)


@pytest.mark.parametrize(
    ("prediction", "reference", "message"),
    [
        ([[0, 7]], [[0, 1]], "image 0: prediction label 7 is outside"),
        ([[0, 1]], [[-1, 1]], "image 0: reference label -1 is outside"),
        ([[0, 1, 1]], [[0, 1]], r"prediction shape \(1, 3\) differs from reference shape \(1, 2\)"),
        ([[0, 1]], [[IGNORE, IGNORE]], "no pixel to evaluate"),
    ],
)
def test_semseg_rejects_bad_input(prediction, reference, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_vision_metric("semseg").compute(predictions=[prediction], references=[reference], num_labels=3)


def test_semseg_requires_num_labels() -> None:
    with pytest.raises(ValueError, match="pass num_labels="):
        load_vision_metric("semseg").compute(predictions=[[[0]]], references=[[[0]]])


def _depth_reference(predictions, references, min_depth: float, max_depth: float | None, crop) -> dict[str, float]:
    """NYUv2 protocol written pixel by pixel: errors per image over valid pixels, then the mean over images."""
    per_image = []
    for prediction, reference in zip(predictions, references, strict=True):
        top, bottom, left, right = crop or (0, len(reference), 0, len(reference[0]))
        pairs = []
        for row in range(top, bottom):
            for column in range(left, right):
                true = float(reference[row][column])
                if math.isfinite(true) and true > min_depth and (max_depth is None or true < max_depth):
                    predicted = max(float(prediction[row][column]), min_depth)
                    pairs.append((predicted if max_depth is None else min(predicted, max_depth), true))
        ratios = [max(p / t, t / p) for p, t in pairs]
        per_image.append(
            {
                "delta1": sum(r < 1.25 for r in ratios) / len(pairs),
                "delta2": sum(r < 1.25**2 for r in ratios) / len(pairs),
                "delta3": sum(r < 1.25**3 for r in ratios) / len(pairs),
                "abs_rel": sum(abs(p - t) / t for p, t in pairs) / len(pairs),
                "rmse": math.sqrt(sum((p - t) ** 2 for p, t in pairs) / len(pairs)),
                "log10": sum(abs(math.log10(p) - math.log10(t)) for p, t in pairs) / len(pairs),
            }
        )
    return {name: sum(errors[name] for errors in per_image) / len(per_image) for name in per_image[0]}


def _random_depth_maps(rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Depths in (0.5, 12) m with missing values (0 and NaN), values beyond the 10 m cap, and predictions that are
    noisy, sometimes non-positive or beyond the cap."""
    predictions, references = [], []
    for height, width in [(9, 11), (12, 10)]:
        reference = rng.uniform(0.5, 12.0, (height, width)).astype(np.float32)
        reference[rng.random((height, width)) < 0.15] = 0.0
        reference[rng.random((height, width)) < 0.05] = np.nan
        prediction = (np.nan_to_num(reference, nan=3.0) * rng.lognormal(0.0, 0.3, (height, width))).astype(np.float32)
        prediction[rng.random((height, width)) < 0.05] = -1.0
        predictions.append(prediction)
        references.append(reference)
    return predictions, references


@pytest.mark.parametrize(
    ("options", "crop"),
    [({}, None), ({"max_depth": None}, None), ({"crop": (2, 8, 1, 9), "min_depth": 0.7}, (2, 8, 1, 9))],
)
def test_depth_matches_pixelwise_reference(options: dict, crop) -> None:
    predictions, references = _random_depth_maps(np.random.default_rng(2))
    result = load_vision_metric("depth").compute(predictions=predictions, references=references, **options)
    min_depth, max_depth = options.get("min_depth", 1e-3), options.get("max_depth", 10.0)
    # the module receives float32 maps; the reference reads the same float32 values
    expected = _depth_reference(predictions, references, min_depth, max_depth, crop)
    assert set(result) == set(expected)
    for name, value in expected.items():
        assert result[name] == pytest.approx(value, rel=1e-6), name
    assert 0.3 < result["delta1"] < 0.9  # informative sample


def test_depth_hand_computed() -> None:
    # image 1: valid (pred, gt) = (1, 1), (2.6, 2), (2, 4); gt 0 is missing. Ratios 1, 1.3, 2.
    # image 2: (pred, gt) = (1, 2); gt 12 is beyond the 10 m cap, the prediction 15 would be clipped to 10.
    result = load_vision_metric("depth").compute(
        predictions=[[[1.0, 2.6], [2.0, 5.0]], [[1.0, 15.0]]], references=[[[1.0, 2.0], [4.0, 0.0]], [[2.0, 12.0]]]
    )
    first = {
        "delta1": 1 / 3,
        "delta2": 2 / 3,
        "delta3": 2 / 3,  # 2 is not below 1.25^3 = 1.953
        "abs_rel": (0.0 + 0.6 / 2 + 2 / 4) / 3,
        "rmse": math.sqrt((0.0 + 0.6**2 + 2**2) / 3),
        "log10": (math.log10(1.3) + math.log10(2)) / 3,
    }
    second = {"delta1": 0.0, "delta2": 0.0, "delta3": 0.0, "abs_rel": 0.5, "rmse": 1.0, "log10": math.log10(2)}
    for name in first:
        assert result[name] == pytest.approx((first[name] + second[name]) / 2, rel=1e-6), name


def test_depth_clips_predictions_to_the_cap() -> None:
    result = load_vision_metric("depth").compute(predictions=[[[15.0, 0.0]]], references=[[[5.0, 2e-3]]])
    # pairs after clipping to [1e-3, 10]: (10, 5) and (1e-3, 2e-3)
    assert result["abs_rel"] == pytest.approx((1.0 + 0.5) / 2)
    assert result["rmse"] == pytest.approx(math.sqrt((25 + 1e-6) / 2))


def test_depth_eigen_crop_on_nyu_frames() -> None:
    reference = np.full((480, 640), 3.0, dtype=np.float32)
    prediction = np.full((480, 640), 9.0, dtype=np.float32)
    prediction[45:471, 41:601] = 3.0  # exact inside the Eigen crop, 3x too deep outside it
    metric = load_vision_metric("depth")
    cropped = metric.compute(predictions=[prediction], references=[reference], crop="eigen")
    assert cropped["delta1"] == 1.0 and cropped["abs_rel"] == 0.0 and cropped["rmse"] == 0.0
    full = metric.compute(predictions=[prediction], references=[reference])
    assert full["delta1"] == pytest.approx(426 * 560 / (480 * 640))
    assert full["abs_rel"] == pytest.approx(2.0 * (1 - 426 * 560 / (480 * 640)))


@pytest.mark.parametrize(
    ("prediction", "reference", "options", "message"),
    [
        ([[1.0, 2.0]], [[0.0, 11.0]], {}, r"image 0: no valid reference pixel"),
        ([[1.0, 2.0]], [[1.0, float("nan")]], {"crop": (0, 1, 1, 2)}, r"image 0: no valid reference pixel"),
        ([[1.0, float("nan")]], [[1.0, 2.0]], {}, "image 0: the prediction contains NaN"),
        ([[1.0, 2.0]], [[1.0, 2.0]], {"crop": "eigen"}, "crop='eigen' needs 480 x 640"),
        ([[1.0, 2.0]], [[1.0, 2.0]], {"crop": "garg"}, "crop must be None, 'eigen' or"),
        ([[1.0, 2.0]], [[1.0]], {}, r"prediction shape \(1, 2\) differs from reference shape \(1, 1\)"),
    ],
)
def test_depth_rejects_bad_input(prediction, reference, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_vision_metric("depth").compute(predictions=[prediction], references=[reference], **options)


def test_classification_matches_sorting_reference_with_ties() -> None:
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 4, (300, 7)).astype(np.float32)  # few distinct values: many ties
    labels = rng.integers(0, 7, 300)
    result = load_vision_metric("classification").compute(predictions=scores, references=labels, top_k=(1, 2, 5))
    order = np.argsort(-scores, axis=1, kind="stable")  # highest score first, ties by lower class id
    for k in (1, 2, 5):
        expected = np.mean([label in row[:k] for row, label in zip(order, labels, strict=True)])
        assert result[f"top{k}_accuracy"] == pytest.approx(expected, abs=1e-12)
    assert result["top1_accuracy"] == pytest.approx(np.mean(scores.argmax(axis=1) == labels))
    assert 0.1 < result["top1_accuracy"] < result["top2_accuracy"] < result["top5_accuracy"] < 1.0


def test_classification_hand_computed_and_default_keys() -> None:
    scores = [[0.1, 0.5, 0.4], [1.0, 1.0, 0.0], [0.2, 0.3, 0.5], [0.0, 0.0, 3.0]]
    # label ranks: 1 (after class 1), 1 (tie with class 0, lower id first), 2, 0
    result = load_vision_metric("classification").compute(predictions=scores, references=[2, 1, 0, 2], top_k=(1, 2))
    assert result == {"top1_accuracy": pytest.approx(1 / 4), "top2_accuracy": pytest.approx(3 / 4)}
    six_classes = np.eye(6)[[0, 1, 2, 3, 4, 5]]
    result = load_vision_metric("classification").compute(predictions=six_classes, references=[0, 1, 2, 3, 4, 0])
    assert result == {"top1_accuracy": pytest.approx(5 / 6), "top5_accuracy": pytest.approx(1.0)}


@pytest.mark.parametrize(
    ("references", "options", "message"),
    [
        ([0, 3], {}, "label 3 is outside the 3 scored classes"),
        ([0, 1], {"top_k": (1, 5)}, r"top_k=5 needs 1 <= k <= 3"),
    ],
)
def test_classification_rejects_bad_input(references, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_vision_metric("classification").compute(
            predictions=[[0.0, 1.0, 2.0]] * 2, references=references, **options
        )


def test_load_vision_metric_names() -> None:
    assert sorted(VISION_METRIC_PATHS) == ["classification", "depth", "semseg"]
    with pytest.raises(ValueError, match="unknown vision metric 'miou'"):
        load_vision_metric("miou")
