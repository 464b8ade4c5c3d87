"""Top-k image-classification accuracy as an ``evaluate`` module, shipped with robust-pretrain for offline use.

Usage: ``evaluate.load("<path to this folder>").compute(predictions=scores, references=labels)`` with one vector of
class scores (logits or probabilities, C >= max(top_k) classes) per image and one integer label per image.

Returns ``top1_accuracy`` and ``top5_accuracy`` (or ``top{k}_accuracy`` for each k of ``top_k``), in [0, 1]: the
share of images whose label is among the k highest-scoring classes. Classes are ranked by score, ties broken by the
lower class id, so ``top1_accuracy`` equals the accuracy of ``argmax(scores)``.
"""

import datasets
import evaluate
import numpy as np

_INPUTS = """
Args:
    predictions: class scores, one vector of C floats per image.
    references: label ids in 0..C-1, one per image.
    top_k: the k values to report (default (1, 5)); each must be between 1 and C.
Returns:
    top{k}_accuracy for each k: floats in [0, 1].
"""


class ClassificationMetric(evaluate.Metric):
    """Top-k accuracy from class scores."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="Top-k image classification accuracy (robust-pretrain, offline).",
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Value("float32")), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references, top_k: tuple[int, ...] = (1, 5)) -> dict[str, float]:
        try:
            scores = np.asarray(predictions, dtype=np.float64)
        except ValueError as error:
            raise ValueError("classification metric: predictions hold different numbers of class scores") from error
        labels = np.asarray(references, dtype=np.int64)
        if scores.ndim != 2 or scores.shape[0] == 0:
            raise ValueError(f"classification metric: expected N x C class scores, N >= 1, got shape {scores.shape}")
        num_classes = scores.shape[1]
        if np.isnan(scores).any():
            raise ValueError("classification metric: the class scores contain NaN")
        outside = (labels < 0) | (labels >= num_classes)
        if outside.any():
            raise ValueError(
                f"classification metric: label {int(labels[outside][0])} is outside the {num_classes} scored classes"
            )
        for k in top_k:
            if not 1 <= k <= num_classes:
                raise ValueError(f"classification metric: top_k={k} needs 1 <= k <= {num_classes} (number of classes)")
        label_scores = scores[np.arange(len(labels)), labels][:, None]
        lower_ids = np.arange(num_classes)[None, :] < labels[:, None]
        rank = (scores > label_scores).sum(axis=1) + ((scores == label_scores) & lower_ids).sum(axis=1)
        return {f"top{k}_accuracy": float(np.mean(rank < k)) for k in top_k}
