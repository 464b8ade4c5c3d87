"""The dense fine-tuning's scores and prediction files: the metrics per task and the files they are recomputed
from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers import EvalPrediction

from robust_pretrain.vision.finetune.arguments import DenseDataArguments
from robust_pretrain.vision.metrics import load_vision_metric

PRIMARY_METRICS = {"semseg": "mean_iou", "depth": "delta1", "classification": "top1_accuracy"}


def predictions_file_name(task: str) -> str:
    return f"predictions_{task}.npz"


def text_predictions_file_name(task: str) -> str:
    return f"predict_results_{task}.txt"


def task_metric_kwargs(task: str, num_labels: int | None, data_args: DenseDataArguments) -> dict[str, Any]:
    if task == "semseg":
        return {"num_labels": num_labels, "ignore_index": data_args.ignore_index}
    if task == "depth":
        crop = "eigen" if data_args.eigen_crop else None
        return {"min_depth": data_args.min_depth, "max_depth": data_args.max_depth, "crop": crop}
    return {"top_k": (1, 5) if num_labels >= 5 else (1,)}


def flatten_metrics(task: str, result: dict[str, Any], label_names: list[str] | None) -> dict[str, float]:
    """The metric module's result as flat floats: per-class IoU as ``iou_<class>`` (classes absent from both the
    predictions and the references, NaN in the module's list, are left out)."""
    flat = {key: float(value) for key, value in result.items() if key != "per_class_iou"}
    if task == "semseg":
        names = label_names or [str(i) for i in range(len(result["per_class_iou"]))]
        flat.update(
            {
                f"iou_{name}": float(iou)
                for name, iou in zip(names, result["per_class_iou"], strict=True)
                if not np.isnan(iou)
            }
        )
    return flat


def compute_task_metrics(
    task: str, predictions: np.ndarray, labels: np.ndarray, metric_kwargs: dict[str, Any], label_names: list[str] | None
) -> dict[str, float]:
    """Score predictions (semseg class maps, depth maps in metres, classification scores) with the shipped
    ``evaluate`` module of ``task``."""
    result = load_vision_metric(task).compute(predictions=predictions, references=labels, **metric_kwargs)
    return flatten_metrics(task, result, label_names)


def build_compute_metrics(
    task: str, metric_kwargs: dict[str, Any], label_names: list[str] | None
) -> Callable[[EvalPrediction], dict[str, float]]:
    """``compute_metrics`` for the Trainer (dense predictions arrive at the labels' own size as class maps or depth
    maps, see :class:`DenseTrainer`)."""

    def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
        return compute_task_metrics(
            task, first_output(prediction.predictions), prediction.label_ids, metric_kwargs, label_names
        )

    return compute_metrics


def first_output(predictions: np.ndarray | tuple) -> np.ndarray:
    return predictions[0] if isinstance(predictions, tuple) else predictions


def write_predictions(
    path: Path,
    task: str,
    ids: Sequence[str],
    predictions: np.ndarray,
    labels: np.ndarray,
    metric_kwargs: dict[str, Any],
    label_names: list[str] | None,
) -> Path:
    """Per eval image: ``ids``, ``predictions`` (semseg class maps, depth maps in metres, classification scores),
    ``labels`` and the metric settings, so :func:`recompute_metrics` gives the reported scores."""
    dtype = {"semseg": np.int16, "depth": np.float32, "classification": np.float32}[task]
    np.savez_compressed(
        path,
        task=np.asarray(task),
        ids=np.asarray(list(ids)),
        predictions=np.asarray(predictions, dtype=dtype),
        labels=np.asarray(labels, dtype=np.int16 if task == "semseg" else labels.dtype),
        label_names=np.asarray(label_names or []),
        **{f"metric_{k}": np.asarray(v) for k, v in metric_kwargs.items() if v is not None},
    )
    return path


def recompute_metrics(path: str | Path) -> dict[str, float]:
    """The eval metrics (without the ``eval_`` prefix) recomputed from a :func:`write_predictions` file."""
    with np.load(path, allow_pickle=False) as saved:
        task = str(saved["task"])
        kwargs = {key[len("metric_") :]: saved[key] for key in saved.files if key.startswith("metric_")}
        kwargs = {key: tuple(value.tolist()) if key == "top_k" else value.item() for key, value in kwargs.items()}
        if task == "depth":
            kwargs.setdefault("max_depth", None)
        label_names = [str(name) for name in saved["label_names"]] or None
        return compute_task_metrics(task, saved["predictions"], saved["labels"], kwargs, label_names)


def write_classification_results(
    path: Path, ids: Sequence[str], scores: np.ndarray, labels: np.ndarray, label_names: list[str]
) -> Path:
    """Tab-separated ``index  id  prediction  label`` (class names), as HF's ``run_glue.py`` writes."""
    rows = ["index\tid\tprediction\tlabel"]
    rows += [
        f"{i}\t{image_id}\t{label_names[int(p)]}\t{label_names[int(y)]}"
        for i, (image_id, p, y) in enumerate(zip(ids, scores.argmax(axis=1), labels, strict=True))
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path
