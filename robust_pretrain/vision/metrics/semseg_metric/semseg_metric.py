"""Semantic-segmentation metrics as an ``evaluate`` module, shipped with robust-pretrain so it loads offline by path.

Usage: ``evaluate.load("<path to this folder>").compute(predictions=..., references=..., num_labels=K)`` with one
integer label map (H x W, any size, equal for a prediction and its reference) per image.

Returns ``mean_iou``, ``pixel_accuracy`` (floats in [0, 1]) and ``per_class_iou`` (a list of ``num_labels`` floats).

Conventions (those of mmsegmentation and of the Hub's ``mean_iou``):

- pixels whose reference equals ``ignore_index`` are left out, whatever was predicted there;
- one confusion matrix is accumulated over all pixels of all images: IoU_c = TP_c / (TP_c + FP_c + FN_c), not a mean
  of per-image IoUs;
- a class absent from both the predictions and the references (on the pixels kept) has IoU 0/0 = NaN in
  ``per_class_iou`` and is left out of ``mean_iou``; a class predicted but never present in the references has IoU 0;
- ``pixel_accuracy`` = correctly labelled pixels / pixels kept.

Label ids other than ``ignore_index`` must lie in [0, num_labels); anything else is a ``ValueError``.
"""

import datasets
import evaluate
import numpy as np

_INPUTS = """
Args:
    predictions: predicted label maps, one H x W integer array (or nested list) per image.
    references: reference label maps, same shapes as the predictions.
    num_labels: number of classes K; valid ids are 0..K-1.
    ignore_index: reference id of pixels to leave out (default 255).
Returns:
    mean_iou: mean of the per-class IoUs over the classes present in the predictions or references.
    pixel_accuracy: share of the kept pixels whose prediction equals the reference.
    per_class_iou: list of K IoUs, NaN for a class absent from both predictions and references.
"""

_LABEL_MAP = datasets.Sequence(datasets.Sequence(datasets.Value("int64")))


class SemsegMetric(evaluate.Metric):
    """Mean IoU, per-class IoU and pixel accuracy from one confusion matrix over the evaluation set."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="Semantic segmentation metrics (robust-pretrain, offline).",
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": _LABEL_MAP, "references": _LABEL_MAP}),
        )

    def _compute(self, predictions, references, num_labels: int | None = None, ignore_index: int = 255) -> dict:
        if num_labels is None or num_labels < 1:
            raise ValueError(f"semseg metric: pass num_labels=<number of classes, at least 1>, got {num_labels}")
        confusion = np.zeros((num_labels, num_labels), dtype=np.int64)  # rows: reference, columns: prediction
        for index, (prediction, reference) in enumerate(zip(predictions, references, strict=True)):
            prediction = _label_map(prediction, index, "prediction")
            reference = _label_map(reference, index, "reference")
            if prediction.shape != reference.shape:
                raise ValueError(
                    f"semseg metric: image {index}: prediction shape {prediction.shape} differs from reference shape "
                    f"{reference.shape}"
                )
            kept = reference != ignore_index
            prediction, reference = prediction[kept], reference[kept]
            for name, labels in (("reference", reference), ("prediction", prediction)):
                outside = (labels < 0) | (labels >= num_labels)
                if outside.any():
                    raise ValueError(
                        f"semseg metric: image {index}: {name} label {int(labels[outside][0])} is outside "
                        f"[0, num_labels={num_labels}) and is not ignore_index={ignore_index}"
                    )
            confusion += np.bincount(reference * num_labels + prediction, minlength=num_labels * num_labels).reshape(
                num_labels, num_labels
            )
        total = confusion.sum()
        if total == 0:
            raise ValueError(f"semseg metric: no pixel to evaluate (no image, or every reference is {ignore_index})")
        true_positives = np.diag(confusion)
        union = confusion.sum(axis=0) + confusion.sum(axis=1) - true_positives
        with np.errstate(invalid="ignore", divide="ignore"):
            per_class_iou = true_positives / union
        return {
            "mean_iou": float(np.nanmean(per_class_iou)),
            "pixel_accuracy": float(true_positives.sum() / total),
            "per_class_iou": [float(iou) for iou in per_class_iou],
        }


def _label_map(values, index: int, name: str) -> np.ndarray:
    try:
        label_map = np.asarray(values, dtype=np.int64)
    except ValueError as error:
        raise ValueError(f"semseg metric: image {index}: {name} rows have different lengths") from error
    if label_map.ndim != 2:
        raise ValueError(
            f"semseg metric: image {index}: {name} must be an H x W label map, not shape {label_map.shape}"
        )
    return label_map
