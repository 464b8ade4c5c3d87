"""Fine-tune an MM-MAE (or exported ViT) checkpoint on one downstream vision task and evaluate it.

    accelerate launch recipes/finetune_dense.py --task semseg --model_name_or_path <MM-MAE output dir> \
        --output_dir runs/semseg [--image_folder DIR | --dataset_name NAME --column_mapping rgb=image semseg=label]

Tasks: ``semseg`` (:class:`MultiMAEForSemanticSegmentation`, mIoU), ``depth`` (:class:`MultiMAEForDepthEstimation`,
δ1 and the NYUv2 errors), ``classification`` (:class:`MultiMAEForImageClassification` or, for a ViT checkpoint such
as one written by :mod:`robust_pretrain.vision.multimae.export`, ``ViTForImageClassification``; top-1/top-5). The
input is RGB (the paper); ``--input_modalities rgb depth`` feeds depth too (MM-MAE checkpoints, not the depth task).

Data: the generated scenes' downstream splits (``downstream_train`` / ``downstream_test``, never seen in
pre-training) by default; a folder layout ``<root>/<split>/{rgb,depth,semseg}/<id>.<ext>`` (classification: a
``<root>/<split>/labels.csv`` with columns ``id,label``); or a ``datasets`` dataset with ``--column_mapping``.
Every image is checked before training (unreadable files, label maps of another aspect ratio, class ids outside the
classes, depth maps without a valid pixel, an empty evaluation split), each error naming the file or option. A folder
whose frames lack a modality file is refused unless ``--unmatched drop`` (complete frames only) or ``partial`` (a
missing target gives no loss and the image is not scored; a missing input is refused).

Evaluation follows the NYUv2 convention: the model reads the image at ``--image_size`` (one side or height width),
its output is upsampled bilinearly to each label's stored size (segmentation: the logits, then argmax) and scored
against the label as stored, never resized; ``--eigen_crop`` and ``--max_depth`` set the depth protocol.

Protocol (MultiMAE's fine-tuning settings): AdamW, peak lr 1e-4, weight decay 0.05 (none on biases, norms and
tokens), layer-wise lr decay 0.75 (``--layer_decay 1`` turns it off), linear warm-up then cosine decay; training
crops are random resized crops and flips shared by image and target. ``--use_lora`` trains LoRA adapters on the
encoder's attention and the whole head (both saved).

Outputs in ``output_dir``: the model (or adapter + head, and in ``merged/`` the model with the adapters merged in,
which ``AutoModelFor*.from_pretrained`` and the pipelines load) and image processor, ``train_results.json`` /
``eval_results.json`` / ``all_results.json`` (``eval_mean_iou``, ``eval_iou_<class>``, ``eval_delta1``, ...,
``eval_top1_accuracy``), ``predictions_<task>.npz`` (per eval image: id, prediction, label; :func:`recompute_metrics`
recomputes the reported scores from it), for classification also ``predict_results_classification.txt``,
``predictions.png`` (input / prediction / target for a few eval images) and a model card ``README.md``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from peft import PeftModel
from transformers import PretrainedConfig, PreTrainedModel, ViTForImageClassification, set_seed
from transformers.trainer_utils import PredictionOutput

from robust_pretrain.cli import UsageError, run_console
from robust_pretrain.config import OptionParser, parse_with_config
from robust_pretrain.options import LoraArguments
from robust_pretrain.output_dir import claim_for_new_run, disk_full_is_one_line
from robust_pretrain.reporting.cards import render_finetuning_card
from robust_pretrain.reporting.plots import plot_predictions
from robust_pretrain.reporting.recipe_cards import dense_card_content
from robust_pretrain.reporting.train_results import log_train_results
from robust_pretrain.seeding import SetEpochCallback
from robust_pretrain.trainer import register_process_group_teardown
from robust_pretrain.vision.finetune.arguments import (
    DenseDataArguments,
    DenseLoraArguments,
    DenseModelArguments,
    DenseRunArguments,
    DenseTrainingArguments,
)
from robust_pretrain.vision.finetune.data import (
    TaskData,
    load_task_data,
    require_task_targets,
    target_sizes,
)
from robust_pretrain.vision.finetune.metrics import (
    build_compute_metrics,
    first_output,
    predictions_file_name,
    task_metric_kwargs,
    text_predictions_file_name,
    write_classification_results,
    write_predictions,
)
from robust_pretrain.vision.finetune.model import (
    checkpoint_model_type,
    checkpoint_normalisation,
    load_model,
    parameter_groups,
    requested_image_size,
    save_merged,
)
from robust_pretrain.vision.finetune.trainer import (
    DenseCollator,
    DenseTrainer,
    OriginalTargets,
)
from robust_pretrain.vision.multimae.configuration_multimae import MultiMAEConfig
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor, MultiMAETransform

__all__ = [
    "EIGEN_FRAME",
    "MERGED_DIR",
    "PREDICTIONS_PLOT",
    "CheckedInputs",
    "attach_transforms",
    "build_image_processor",
    "build_trainer",
    "check_inputs",
    "evaluate_and_report",
    "fine_tuning_image_size",
    "main",
    "run",
    "run_finetune",
    "train_and_save",
    "warn_reduced_labels",
    "write_prediction_files",
]

logger = logging.getLogger(__name__)

PREDICTIONS_PLOT = "predictions.png"
MERGED_DIR = "merged"
EIGEN_FRAME = (480, 640)  # NYUv2 frames, on which the Eigen crop is defined
_STALE_OUTPUTS = ("predictions_*.npz", "predict_results_*.txt", PREDICTIONS_PLOT, MERGED_DIR)


def warn_reduced_labels(checkpoint: str, task: str, do_reduce_labels: bool) -> None:
    """Warn when the checkpoint was pre-trained on semseg maps with label reduction (0 = unlabelled, its saved image
    processor says so) and a semseg fine-tuning omits ``--do_reduce_labels``: id 0 would be trained as a class."""
    saved = Path(checkpoint) / "preprocessor_config.json"
    if task != "semseg" or do_reduce_labels or not saved.is_file():
        return
    if json.loads(saved.read_text()).get("do_reduce_labels"):
        logger.warning(
            "%s was pre-trained with --do_reduce_labels (0 = unlabelled); this fine-tuning omits it, so id 0 is "
            "trained as a class: pass --do_reduce_labels true if 0 marks unlabelled pixels here too",
            checkpoint,
        )


@dataclass
class CheckedInputs:
    """What the checks before a run give: the checkpoint's config values, the task's data, the sizes of the
    evaluation labels (none for classification) and the ``--image_size`` asked for (height, width)."""

    config: dict[str, Any]
    data: TaskData
    eval_target_sizes: list[tuple[int, int]]
    requested_size: tuple[int, int] | None


def check_inputs(
    run_args: DenseRunArguments, model_args: DenseModelArguments, data_args: DenseDataArguments
) -> CheckedInputs:
    """Every check made before the output directory is claimed: the options against the task and the checkpoint,
    then the data (loaded here)."""
    task = run_args.task
    model_args.check_task(task)
    checkpoint_model_type(run_args.model_name_or_path, task)
    config, _ = PretrainedConfig.get_config_dict(run_args.model_name_or_path)
    requested_size = requested_image_size(data_args.image_size, int(config.get("patch_size", 16)))
    if data_args.eigen_crop and task != "depth":
        raise UsageError(f"--eigen_crop applies to --task depth, not {task}")
    data = load_task_data(task, data_args, model_args.input_modalities, int(config.get("patch_size", 16)))
    require_task_targets(task, data, data_args)
    warn_reduced_labels(run_args.model_name_or_path, task, data_args.do_reduce_labels)
    sizes = [] if task == "classification" else target_sizes(task, data.evaluation, data_args.depth_scale)
    other_frames = {size for size in sizes if size != EIGEN_FRAME}
    if data_args.eigen_crop and other_frames:
        raise UsageError(
            f"--eigen_crop: the Eigen crop is defined on {EIGEN_FRAME[0]}x{EIGEN_FRAME[1]} frames; the evaluation "
            f"depth maps include {'/'.join(f'{h}x{w}' for h, w in sorted(other_frames)[:3])}"
        )
    return CheckedInputs(config, data, sizes, requested_size)


def fine_tuning_image_size(
    model: PreTrainedModel | PeftModel, requested_size: tuple[int, int] | None, checkpoint_size: tuple[int, int]
) -> tuple[int, int]:
    """The model's input size: ``--image_size`` or the checkpoint's (a ViT only at its own); an MM-MAE model's config
    records it."""
    image_size = requested_size or checkpoint_size
    if image_size != checkpoint_size and isinstance(model, ViTForImageClassification):
        raise UsageError(f"--image_size {image_size}: the ViT checkpoint is trained at {checkpoint_size} pixels")
    if requested_size is not None and model.config.model_type == MultiMAEConfig.model_type:
        model.config.image_size = list(image_size)  # saved with the model: the size it is fine-tuned at
    return image_size


def build_image_processor(
    checkpoint: str, task: str, data_args: DenseDataArguments, image_size: tuple[int, int], num_labels: int | None
) -> MultiMAEImageProcessor:
    """The image processor of the run (saved with the model): the checkpoint's normalisation, the input size and the
    data options."""
    return MultiMAEImageProcessor(
        **checkpoint_normalisation(checkpoint),
        size={"height": image_size[0], "width": image_size[1]},
        crop_scale=data_args.crop_scale,
        flip_probability=data_args.flip_probability,
        depth_scale=data_args.depth_scale,
        ignore_index=data_args.ignore_index,
        num_classes=num_labels if task == "semseg" else None,
        do_reduce_labels=data_args.do_reduce_labels,
    )


def attach_transforms(
    task: str,
    data: TaskData,
    processor: MultiMAEImageProcessor,
    input_modalities: Sequence[str],
    seed: int,
    eval_target_sizes: list[tuple[int, int]],
) -> tuple[MultiMAETransform, list[str]]:
    """Set the training and evaluation transforms on the splits of ``data``; returns the training transform (its
    epoch is set each epoch) and the evaluation ids (read before the transform)."""
    modalities = list(dict.fromkeys([*input_modalities, *([task] if task != "classification" else [])]))
    columns = {name: name for name in modalities}
    train_transform = MultiMAETransform(processor, train=True, seed=seed, column_mapping=columns)
    eval_transform = MultiMAETransform(processor, train=False, column_mapping=columns)
    eval_ids = list(data.evaluation["id"])
    if task != "classification":
        eval_transform = OriginalTargets(eval_transform, task, tuple(np.max(eval_target_sizes, axis=0).tolist()))
    data.train.set_transform(train_transform)
    data.evaluation.set_transform(eval_transform)
    return train_transform, eval_ids


def build_trainer(
    task: str,
    model: PreTrainedModel | PeftModel,
    data: TaskData,
    input_modalities: Sequence[str],
    ignore_index: int,
    training_args: DenseTrainingArguments,
    num_layers: int,
    metric_kwargs: dict[str, Any],
    train_transform: MultiMAETransform,
) -> DenseTrainer:
    """The :class:`DenseTrainer` of the run: AdamW over the layer-wise decayed :func:`parameter_groups`."""
    return DenseTrainer(
        task=task,
        ignore_index=ignore_index,
        model=model,
        args=training_args,
        train_dataset=data.train if training_args.do_train else None,
        data_collator=DenseCollator(task, tuple(name for name in input_modalities if name != "rgb"), ignore_index),
        compute_metrics=build_compute_metrics(task, metric_kwargs, data.label_names),
        callbacks=[SetEpochCallback([train_transform])],
        optimizer_cls_and_kwargs=(
            torch.optim.AdamW,
            {
                "params": parameter_groups(
                    model,
                    num_layers,
                    training_args.learning_rate,
                    training_args.weight_decay,
                    training_args.layer_decay,
                ),
                "betas": (training_args.adam_beta1, training_args.adam_beta2),
                "eps": training_args.adam_epsilon,
            },
        ),
    )


def train_and_save(
    trainer: DenseTrainer,
    model: PreTrainedModel | PeftModel,
    processor: MultiMAEImageProcessor,
    num_train_examples: int,
    use_lora: bool,
    save_model: bool,
) -> None:
    """Fine-tune; save the model (and, on the main process, the image processor, and beside a LoRA adapter the
    MM-MAE config) if ``save_model``; log the training results."""
    output_dir = Path(trainer.args.output_dir)
    with disk_full_is_one_line(trainer.args.output_dir, resumes=False):
        train_result = trainer.train()
        if save_model:
            trainer.save_model()
            if trainer.is_world_process_zero():
                processor.save_pretrained(output_dir)
                if use_lora and model.config.model_type == MultiMAEConfig.model_type:
                    model.config.save_pretrained(output_dir)  # beside the adapter: the one-line load needs the head
    log_train_results(trainer, train_result, num_train_examples)


def write_prediction_files(
    task: str,
    output: PredictionOutput,
    eval_ids: list[str],
    data: TaskData,
    processor: MultiMAEImageProcessor,
    metric_kwargs: dict[str, Any],
    data_args: DenseDataArguments,
    output_dir: Path,
) -> None:
    """``predictions_<task>.npz``, for classification ``predict_results_classification.txt``, and
    ``predictions.png``."""
    predictions, ids = first_output(output.predictions), eval_ids
    write_predictions(
        output_dir / predictions_file_name(task),
        task,
        ids,
        predictions,
        output.label_ids,
        metric_kwargs,
        data.label_names,
    )
    if task == "classification":
        write_classification_results(
            output_dir / text_predictions_file_name(task), ids, predictions, output.label_ids, data.label_names
        )
    shown = min(data_args.num_prediction_images, len(data.evaluation))
    if shown:
        images = np.stack(data.evaluation[:shown]["rgb"])
        plot_predictions(
            task,
            images,
            predictions[:shown],
            output.label_ids[:shown],
            processor,
            data.label_names,
            data_args.ignore_index,
            output_dir / PREDICTIONS_PLOT,
        )


def evaluate_and_report(
    trainer: DenseTrainer,
    data: TaskData,
    eval_ids: list[str],
    processor: MultiMAEImageProcessor,
    metric_kwargs: dict[str, Any],
    run_args: DenseRunArguments,
    model_args: DenseModelArguments,
    data_args: DenseDataArguments,
    lora_args: LoraArguments,
    training_args: DenseTrainingArguments,
) -> dict[str, float]:
    """Evaluate, log and save the metrics; the main process writes the prediction files and the model card."""
    task, output_dir = run_args.task, Path(training_args.output_dir)
    output = trainer.predict(data.evaluation, metric_key_prefix="eval")
    eval_metrics = {**output.metrics, "eval_samples": len(data.evaluation)}
    trainer.log_metrics("eval", eval_metrics)
    trainer.save_metrics("eval", eval_metrics)
    if trainer.is_world_process_zero():
        write_prediction_files(task, output, eval_ids, data, processor, metric_kwargs, data_args, output_dir)
        content = dense_card_content(
            run_args,
            model_args,
            lora_args,
            training_args,
            data,
            eval_metrics,
            trainer.state.global_step,
            predictions_file_name(task),
        )
        render_finetuning_card(output_dir, content)
    return eval_metrics


def run_finetune(
    run_args: DenseRunArguments,
    model_args: DenseModelArguments,
    data_args: DenseDataArguments,
    lora_args: LoraArguments,
    training_args: DenseTrainingArguments,
    save_model: bool = True,
) -> dict[str, float]:
    """Check every input, fine-tune and/or evaluate; returns the eval metrics (``eval_`` keys, as logged).

    ``training_args.output_dir`` must be empty or new unless ``run_args.overwrite_output_dir``. Writes the files
    listed in the module docstring (the model only if ``save_model``)."""
    task = run_args.task
    checked = check_inputs(run_args, model_args, data_args)
    data = checked.data
    claim_for_new_run(
        training_args.output_dir, run_args.overwrite_output_dir, training_args.should_save, _STALE_OUTPUTS
    )
    set_seed(training_args.seed)
    model, checkpoint_size = load_model(run_args, model_args, lora_args, data.label_names, data_args.ignore_index)
    image_size = fine_tuning_image_size(model, checked.requested_size, checkpoint_size)
    num_labels = None if data.label_names is None else len(data.label_names)
    processor = build_image_processor(run_args.model_name_or_path, task, data_args, image_size, num_labels)
    train_transform, eval_ids = attach_transforms(
        task, data, processor, model_args.input_modalities, training_args.seed, checked.eval_target_sizes
    )
    metric_kwargs = task_metric_kwargs(task, num_labels, data_args)
    num_layers = int(checked.config.get("num_hidden_layers", 0))
    register_process_group_teardown()  # a finished torchrun process must not abort at exit
    trainer = build_trainer(
        task,
        model,
        data,
        model_args.input_modalities,
        data_args.ignore_index,
        training_args,
        num_layers,
        metric_kwargs,
        train_transform,
    )
    if training_args.do_train:
        train_and_save(trainer, model, processor, len(data.train), lora_args.use_lora, save_model)
    eval_metrics: dict[str, float] = {}
    if training_args.do_eval:
        eval_metrics = evaluate_and_report(
            trainer,
            data,
            eval_ids,
            processor,
            metric_kwargs,
            run_args,
            model_args,
            data_args,
            lora_args,
            training_args,
        )
    if save_model and training_args.do_train and lora_args.use_lora and trainer.is_world_process_zero():
        merged = Path(training_args.output_dir) / MERGED_DIR
        save_merged(trainer.model, processor, merged)  # last: merging changes the model in place
    return eval_metrics


def run(argv: list[str]) -> dict[str, float]:
    """Parse ``[--config FILE] [--option value ...]``, fine-tune and evaluate; returns the eval metrics."""
    parser = OptionParser(
        (DenseRunArguments, DenseModelArguments, DenseDataArguments, DenseLoraArguments, DenseTrainingArguments),
        description="Fine-tune an MM-MAE or ViT checkpoint on semantic segmentation, depth or classification. "
        "--config FILE (YAML/JSON) sets defaults for any option.",
    )
    run_args, model_args, data_args, lora_args, training_args = parse_with_config(parser, argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    datasets.utils.logging.set_verbosity_warning()
    return run_finetune(run_args, model_args, data_args, lora_args, training_args)


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``robust-pretrain-finetune-dense``): exit status 2 and one paragraph for a bad input."""
    return run_console(run, argv, prog="robust-pretrain-finetune-dense")
