"""Monocular depth metrics (NYUv2 protocol) as an ``evaluate`` module, shipped with robust-pretrain for offline use.

Usage: ``evaluate.load("<path to this folder>").compute(predictions=..., references=...)`` with one depth map in
metres (H x W, any size, equal for a prediction and its reference) per image.

Returns ``delta1``, ``delta2``, ``delta3`` (share of pixels with max(pred/gt, gt/pred) < 1.25, 1.25², 1.25³),
``abs_rel`` (mean |pred - gt| / gt), ``rmse`` (sqrt of mean (pred - gt)², metres) and ``log10``
(mean |log10 pred - log10 gt|).

Protocol (as in the evaluation code of BTS and AdaBins for NYUv2):

- only valid pixels count: reference finite and ``min_depth < gt < max_depth`` (``max_depth=None``: no cap; NaN,
  zero or negative references mark missing depth);
- ``crop`` restricts the evaluation to a window: ``"eigen"`` is the Eigen et al. (2014) crop of the 480 x 640 NYUv2
  frames, rows 45:471 and columns 41:601; or ``(top, bottom, left, right)`` in pixels, Python slice semantics;
- predictions are clipped to [min_depth, max_depth] (so a non-positive prediction cannot break the logarithm);
  a NaN prediction is an error;
- each metric is computed per image over its valid pixels, then averaged over images.

An image without any valid pixel is a ``ValueError`` naming the image.
"""

import datasets
import evaluate
import numpy as np

_INPUTS = """
Args:
    predictions: predicted depth maps in metres, one H x W float array (or nested list) per image.
    references: ground-truth depth maps in metres, same shapes; NaN or <= min_depth marks a missing value.
    min_depth: smallest valid depth (default 1e-3).
    max_depth: depth cap, references at or beyond it are left out (default 10.0, NYUv2); None for no cap.
    crop: None, "eigen" (480 x 640 frames) or (top, bottom, left, right) pixel bounds.
Returns:
    delta1, delta2, delta3, abs_rel, rmse, log10: floats, per-image values averaged over images.
"""

_DEPTH_MAP = datasets.Sequence(datasets.Sequence(datasets.Value("float32")))
EIGEN_CROP = (45, 471, 41, 601)
EIGEN_FRAME_SHAPE = (480, 640)
_THRESHOLD = 1.25


class DepthMetric(evaluate.Metric):
    """δ1-δ3, AbsRel, RMSE and log10 over valid pixels, per image and averaged over images."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="Depth estimation metrics, NYUv2 protocol (robust-pretrain, offline).",
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": _DEPTH_MAP, "references": _DEPTH_MAP}),
        )

    def _compute(
        self,
        predictions,
        references,
        min_depth: float = 1e-3,
        max_depth: float | None = 10.0,
        crop: str | tuple[int, int, int, int] | None = None,
    ) -> dict[str, float]:
        if max_depth is not None and max_depth <= min_depth:
            raise ValueError(f"depth metric: max_depth={max_depth} must exceed min_depth={min_depth}")
        per_image = []
        for index, (prediction, reference) in enumerate(zip(predictions, references, strict=True)):
            prediction = _depth_map(prediction, index, "prediction")
            reference = _depth_map(reference, index, "reference")
            if prediction.shape != reference.shape:
                raise ValueError(
                    f"depth metric: image {index}: prediction shape {prediction.shape} differs from reference shape "
                    f"{reference.shape}"
                )
            if np.isnan(prediction).any():
                raise ValueError(f"depth metric: image {index}: the prediction contains NaN")
            valid = np.isfinite(reference) & (reference > min_depth)
            if max_depth is not None:
                valid &= reference < max_depth
            valid &= _crop_mask(crop, reference.shape, index)
            if not valid.any():
                raise ValueError(
                    f"depth metric: image {index}: no valid reference pixel (finite, > min_depth={min_depth}, "
                    f"< max_depth={max_depth}, inside crop={crop!r})"
                )
            per_image.append(_image_errors(np.clip(prediction[valid], min_depth, max_depth), reference[valid]))
        if not per_image:
            raise ValueError("depth metric: no image to evaluate")
        return {name: float(np.mean([errors[name] for errors in per_image])) for name in per_image[0]}


def _image_errors(prediction: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    ratio = np.maximum(prediction / reference, reference / prediction)
    return {
        "delta1": np.mean(ratio < _THRESHOLD),
        "delta2": np.mean(ratio < _THRESHOLD**2),
        "delta3": np.mean(ratio < _THRESHOLD**3),
        "abs_rel": np.mean(np.abs(prediction - reference) / reference),
        "rmse": np.sqrt(np.mean((prediction - reference) ** 2)),
        "log10": np.mean(np.abs(np.log10(prediction) - np.log10(reference))),
    }


def _crop_mask(crop, shape: tuple[int, ...], index: int) -> np.ndarray:
    if crop is None:
        return np.ones(shape, dtype=bool)
    if crop == "eigen":
        if shape != EIGEN_FRAME_SHAPE:
            raise ValueError(
                f"depth metric: image {index}: crop='eigen' needs {EIGEN_FRAME_SHAPE[0]} x {EIGEN_FRAME_SHAPE[1]} "
                f"NYUv2 frames, got {shape[0]} x {shape[1]}; pass crop=(top, bottom, left, right) instead"
            )
        crop = EIGEN_CROP
    if isinstance(crop, str) or len(crop) != 4:
        raise ValueError(f"depth metric: crop must be None, 'eigen' or (top, bottom, left, right), got {crop!r}")
    top, bottom, left, right = crop
    mask = np.zeros(shape, dtype=bool)
    mask[top:bottom, left:right] = True
    return mask


def _depth_map(values, index: int, name: str) -> np.ndarray:
    try:
        depth = np.asarray(values, dtype=np.float64)
    except ValueError as error:
        raise ValueError(f"depth metric: image {index}: {name} rows have different lengths") from error
    if depth.ndim != 2:
        raise ValueError(f"depth metric: image {index}: {name} must be an H x W depth map, got shape {depth.shape}")
    return depth
