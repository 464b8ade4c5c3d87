"""Frozen-encoder linear probes as a suite family (``--family probe``): one row per GLUE task, each cell a probe
(:mod:`robust_pretrain.glue.probe`) on the checkpoint's frozen, mean-pooled features.

A probe involves no random choice, so the suite's ``--seeds`` only repeat a cell: run it with one seed. Each cell
writes ``probe_predictions_<task>.txt`` (dev predictions, as the fine-tuning suite's files) and ``probe.json`` (the
chosen lambda and every lambda's cross-validated loss); its metrics add ``majority_<metric>``, the score of always
predicting the training set's majority label (0 for STS-B).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoTokenizer, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

from robust_pretrain.cli import UsageError, check_checkpoint
from robust_pretrain.evaluation.tasks import ModelIndexTarget, RunSettings, SuiteTask, TaskFamily, TaskRunResult
from robust_pretrain.glue.data import HUB_DATASET, check_glue_files, load_glue
from robust_pretrain.glue.finetune import write_predictions
from robust_pretrain.glue.probe import (
    SELECTION,
    ProbeArguments,
    fit_probe,
    load_encoder,
    majority_score,
    score_predictions,
    task_features,
)
from robust_pretrain.glue.tasks import GLUE_TASKS, GlueTask

PROBE_TASKS = ("cola", "sst2", "mrpc", "stsb", "rte")
# Options that cut the protocol short (recorded with every result).
_LIMITS = ("max_train_samples", "max_eval_samples")
# Options that cannot change a score.
_BOOKKEEPING = ("output_dir", "glue_dir", "cache_dir", "encode_batch_size")


def probe_predictions_file(task: str) -> str:
    return f"probe_predictions_{task}.txt"


def probe_run_settings(options: Sequence[Any]) -> RunSettings:
    """Every probe option that can change a score is a setting; the sample limits are also limits."""
    (probe_args,) = options
    values = dataclasses.asdict(probe_args)
    return RunSettings(
        settings={
            **{name: value for name, value in values.items() if name not in _BOOKKEEPING},
            "lambda_selection": SELECTION,
        },
        limits={name: values[name] for name in _LIMITS if values[name] is not None},
        fine_tuning="frozen encoder, linear probe",
    )


def check_probe_inputs(checkpoints: Sequence[str], tasks: Sequence[SuiteTask], options: Sequence[Any]) -> None:
    """Missing checkpoints or data files, or a checkpoint that is not a text encoder, fail before any cell runs."""
    (probe_args,) = options
    for checkpoint in checkpoints:
        check_checkpoint(checkpoint, "--checkpoints")
        try:
            config, _ = PretrainedConfig.get_config_dict(checkpoint, cache_dir=probe_args.cache_dir)
        except OSError:
            continue  # a Hub id resolved when its cell runs
        model_type = config.get("model_type")
        if model_type is not None and model_type not in MODEL_MAPPING_NAMES:
            raise UsageError(f"--checkpoints {checkpoint} ({model_type}) is not a model AutoModel can load")
    if probe_args.glue_dir is not None:
        for task in tasks:
            check_glue_files(task.name, probe_args.glue_dir)


def _first(values: list, count: int | None) -> list:
    return values if count is None else values[:count]


def run_probe_task(
    task: str, checkpoint: str, seed: int, output_dir: Path, options: Sequence[Any], save_model: bool
) -> TaskRunResult:
    """Probe ``checkpoint``'s frozen features on ``task``; scores x100 (``seed`` and ``save_model`` are unused: the
    probe is deterministic and its weights are not kept)."""
    (probe_args,) = options
    spec = GLUE_TASKS[task]
    splits = load_glue(task, probe_args.glue_dir, probe_args.cache_dir)
    train, dev = splits["train"], splits[spec.eval_splits[0]]
    train_rows = _first(list(range(len(train))), probe_args.max_train_samples)
    dev_rows = _first(list(range(len(dev))), probe_args.max_eval_samples)
    train, dev = train.select(train_rows), dev.select(dev_rows)
    model = load_encoder(checkpoint, probe_args.cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, cache_dir=probe_args.cache_dir)
    max_length = min(probe_args.max_seq_length, tokenizer.model_max_length)

    def features(split: Any) -> np.ndarray:
        columns = {name: split[name] for name in spec.text_columns}
        return task_features(model, tokenizer, spec, columns, max_length, probe_args.encode_batch_size)

    train_labels, dev_labels = np.asarray(train["label"]), np.asarray(dev["label"])
    result = fit_probe(
        spec, features(train), train_labels, features(dev), probe_args.probe_lambdas, probe_args.probe_folds
    )
    write_predictions(output_dir / probe_predictions_file(task), spec, list(dev["idx"]), result.predictions, dev_labels)
    raw = score_predictions(spec, result.predictions, dev_labels)
    majority = majority_score(spec, train_labels, dev_labels)
    details = {
        "lambda": result.lambda_,
        "cv_losses": {str(key): value for key, value in result.cv_losses.items()},
        "dev_metrics": raw,
        f"majority_{spec.primary_metric}": majority,
        "train_examples": len(train),
        "dev_examples": len(dev),
    }
    (output_dir / "probe.json").write_text(json.dumps(details, indent=2) + "\n", encoding="utf-8")
    metrics = {metric: 100.0 * float(raw[metric]) for metric in spec.metrics}
    metrics[f"majority_{spec.primary_metric}"] = 100.0 * majority
    return TaskRunResult(metrics=metrics, prediction_files=(probe_predictions_file(task),), raw_metrics=details)


def _card_metrics(spec: GlueTask) -> dict[str, tuple[str, ModelIndexTarget]]:
    target = ModelIndexTarget(
        task_type="text-classification",
        dataset_type=HUB_DATASET,
        dataset_name=f"GLUE {spec.glue_dir_name} (linear probe)",
        dataset_config=spec.name,
        dataset_split=spec.eval_splits[0],
    )
    return {metric: (metric, target) for metric in spec.metrics}


def _row(spec: GlueTask) -> SuiteTask:
    return SuiteTask(
        name=spec.name,
        family="probe",
        display_name=spec.glue_dir_name,
        primary_metric=spec.primary_metric,
        metric_label="mcc" if spec.primary_metric == "matthews_correlation" else None,
        run=lambda *args, **kwargs: run_probe_task(spec.name, *args, **kwargs),
        card_metrics=_card_metrics(spec),
    )


FAMILY = TaskFamily(
    name="probe",
    description="GLUE dev scores x100 of linear probes on frozen mean-pooled features",
    tasks=tuple(_row(GLUE_TASKS[name]) for name in PROBE_TASKS),
    default_tasks=PROBE_TASKS,
    option_types=(ProbeArguments,),
    run_settings=probe_run_settings,
    check_inputs=check_probe_inputs,
)
