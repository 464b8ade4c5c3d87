"""Fine-tune an MM-MAE (or exported ViT) checkpoint on one downstream vision task and evaluate it.

    accelerate launch recipes/finetune_dense.py --task semseg --model_name_or_path <MM-MAE output dir> \
        --output_dir runs/semseg [--image_folder DIR | --dataset_name NAME --column_mapping rgb=image semseg=label]

Tasks: ``semseg`` (:class:`MultiMAEForSemanticSegmentation`, mIoU), ``depth`` (:class:`MultiMAEForDepthEstimation`,
δ1 and the NYUv2 errors), ``classification`` (:class:`MultiMAEForImageClassification` or, for a ViT checkpoint such
as one written by :mod:`robust_pretrain.vision.export`, ``ViTForImageClassification``; top-1/top-5). The input is
RGB (the paper); ``--input_modalities rgb depth`` feeds depth too (MM-MAE checkpoints, not the depth task).

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

import csv
import json
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import (
    EvalPrediction,
    PretrainedConfig,
    PreTrainedModel,
    Trainer,
    TrainingArguments,
    ViTConfig,
    ViTForImageClassification,
    set_seed,
)
from transformers.trainer_utils import EvalLoopOutput, SaveStrategy

from robust_pretrain.cli import UsageError, check_checkpoint, run_console
from robust_pretrain.config import OptionParser, parse_with_config
from robust_pretrain.finetuning import log_train_results
from robust_pretrain.options import LoraArguments, check_options, option
from robust_pretrain.output_dir import claim_for_new_run, disk_full_is_one_line
from robust_pretrain.reporting.cards import render_finetuning_card
from robust_pretrain.reporting.plots import plot_predictions
from robust_pretrain.reporting.recipe_cards import dense_card_content
from robust_pretrain.seeding import SetEpochCallback
from robust_pretrain.targets import refuse_tasks_without_targets
from robust_pretrain.trainer import register_process_group_teardown
from robust_pretrain.training_args import use_cpu_when_launched_without_accelerator
from robust_pretrain.vision.configuration_multimae import DEPTH_LOSSES, SEMSEG_HEADS, MultiMAEConfig
from robust_pretrain.vision.image_processing_multimae import MultiMAEImageProcessor, MultiMAETransform
from robust_pretrain.vision.loaders import (
    REDUCE_LABELS_HELP,
    UNMATCHED_HELP,
    UNMATCHED_MODES,
    modalities_without_targets,
)
from robust_pretrain.vision.metrics import load_vision_metric
from robust_pretrain.vision.modeling_multimae import (
    MultiMAEForDepthEstimation,
    MultiMAEForImageClassification,
    MultiMAEForSemanticSegmentation,
)

logger = logging.getLogger(__name__)

TASKS = ("semseg", "depth", "classification")
PRIMARY_METRICS = {"semseg": "mean_iou", "depth": "delta1", "classification": "top1_accuracy"}
# Model class per task; LoRA trains and saves its head_modules() fully.
MULTIMAE_HEADS = {
    "semseg": MultiMAEForSemanticSegmentation,
    "depth": MultiMAEForDepthEstimation,
    "classification": MultiMAEForImageClassification,
}
PREDICTIONS_PLOT = "predictions.png"
MERGED_DIR = "merged"
LABELS_FILE = "labels.csv"
SCENE_SPLITS = ("downstream_train", "downstream_test")
EIGEN_FRAME = (480, 640)  # NYUv2 frames, on which the Eigen crop is defined
ORIGINAL_TARGET, TARGET_SIZE = "original_target", "target_size"  # evaluation batches: labels at their own size
_STALE_OUTPUTS = ("predictions_*.npz", "predict_results_*.txt", PREDICTIONS_PLOT, MERGED_DIR)
_NO_WEIGHT_DECAY = re.compile(r"global_tokens|cls_token|position_embeddings")
_ENCODER_LAYER = re.compile(r"(?:^|\.)(?:multimae\.layers|encoder\.layer)\.(\d+)\.")
_EMBEDDINGS = re.compile(r"(?:^|\.)(?:multimae|vit)\.embeddings\.")


@dataclass
class DenseRunArguments:
    """What to fine-tune on which task."""

    model_name_or_path: str = field(
        metadata={"help": "MM-MAE checkpoint (a pre-training output) or ViT checkpoint: local directory or Hub id."}
    )
    task: str = field(metadata={"help": f"Downstream task: {', '.join(TASKS)}.", "choices": list(TASKS)})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Write into an output_dir holding an earlier run (its weights and predictions go first)."},
    )
    random_init: bool = field(
        default=False,
        metadata={
            "help": "Build the model from the checkpoint's config.json only, with randomly initialised weights (seeded "
            "by --seed): the no-pre-training baseline. The checkpoint's weights are not read."
        },
    )

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise UsageError(f"--task {self.task!r} is not a known task; expected one of: {', '.join(TASKS)}")


@dataclass
class DenseModelArguments:
    """What the fine-tuned model reads and the size of its new dense head (MM-MAE checkpoints)."""

    input_modalities: list[str] = field(
        default_factory=lambda: ["rgb"],
        metadata={"help": "Inputs (MM-MAE): rgb (the paper), optionally depth (not for --task depth)."},
    )
    neck_hidden_sizes: list[int] | None = field(
        default=None,
        metadata={"help": "Dense heads (MM-MAE): DPT neck widths, four (default: the checkpoint config's)."},
    )
    fusion_hidden_size: int | None = field(
        default=None, metadata={"help": "Dense heads (MM-MAE): DPT fusion width (default: the checkpoint config's)."}
    )
    semseg_head: str | None = field(
        default=None,
        metadata={
            "help": "Segmentation head (MM-MAE): 'dpt' or MultiMAE's 'convnext' (default: the checkpoint config's, "
            "dpt unless set).",
            "choices": list(SEMSEG_HEADS),
        },
    )
    convnext_head_dim: int | None = field(
        default=None,
        metadata={"help": "ConvNeXt head: width of a patch's projection (default: the checkpoint config's, 6144)."},
    )
    depth_loss: str | None = field(
        default=None,
        metadata={
            "help": "Depth loss (MM-MAE): 'l1' or MultiMAE's 'berhu' (default: the checkpoint config's, l1 if unset).",
            "choices": list(DEPTH_LOSSES),
        },
    )

    def __post_init__(self) -> None:
        if "rgb" not in self.input_modalities or not set(self.input_modalities) <= {"rgb", "depth"}:
            raise UsageError(f"--input_modalities {self.input_modalities}: rgb, optionally with depth")
        if self.neck_hidden_sizes is not None and (len(self.neck_hidden_sizes) != 4 or min(self.neck_hidden_sizes) < 1):
            raise UsageError(f"--neck_hidden_sizes {self.neck_hidden_sizes}: four positive widths")
        if self.fusion_hidden_size is not None and self.fusion_hidden_size < 1:
            raise UsageError(f"--fusion_hidden_size must be a positive integer, got {self.fusion_hidden_size}")
        if self.convnext_head_dim is not None and self.convnext_head_dim < 1:
            raise UsageError(f"--convnext_head_dim must be a positive integer, got {self.convnext_head_dim}")

    def check_task(self, task: str) -> None:
        if task == "depth" and "depth" in self.input_modalities:
            raise UsageError("--input_modalities: the depth task cannot read its own target (depth) as input")
        if task != "semseg" and (self.semseg_head is not None or self.convnext_head_dim is not None):
            raise UsageError(f"--semseg_head and --convnext_head_dim apply to --task semseg, not {task}")
        if task != "depth" and self.depth_loss is not None:
            raise UsageError(f"--depth_loss applies to --task depth, not {task}")

    def config_overrides(self) -> dict[str, Any]:
        """The head settings given, as MM-MAE config values."""
        names = ("neck_hidden_sizes", "fusion_hidden_size", "semseg_head", "convnext_head_dim", "depth_loss")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


@dataclass
class DenseDataArguments:
    """Where the images come from, how they are prepared and how much of them is used."""

    image_folder: str | None = option(
        None, "Folder layout <root>/<split>/{rgb,depth,semseg}/<id>.<ext> (+ labels.csv).", path="dir"
    )
    unmatched: str = option("error", UNMATCHED_HELP, choices=list(UNMATCHED_MODES))
    dataset_name: str | None = field(
        default=None, metadata={"help": "Dataset on the Hub or a local dataset folder (datasets.load_dataset)."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of dataset_name."})
    column_mapping: list[str] = field(
        default_factory=list,
        metadata={"help": "dataset_name columns as target=column, e.g. rgb=image semseg=annotation label=label."},
    )
    train_split: str | None = field(
        default=None, metadata={"help": "Training split (default: train; generated scenes: downstream_train)."}
    )
    eval_split: str | None = field(
        default=None,
        metadata={"help": "Evaluation split (default: validation, else test; generated scenes: downstream_test)."},
    )
    num_train_scenes: int = option(512, "Generated scenes: training images.", minimum=1)
    num_eval_scenes: int = option(64, "Generated scenes: evaluation images.", minimum=1)
    scene_size: int = option(64, "Generated scenes: rendered side in pixels.", minimum=8)
    scene_seed: int = option(0, "Generated scenes: seed of the downstream scenes.", minimum=0)
    image_size: list[int] | None = option(
        None,
        "Model input size: one side (square) or height width, multiples of the patch size (default: the "
        "checkpoint's image_size). Scores are computed at each label's own size.",
        minimum=1,
    )
    num_labels: int | None = option(
        None, "Classes (semseg: class ids 0..N-1; default from the scenes / dataset / class_names).", minimum=1
    )
    class_names: list[str] | None = field(default=None, metadata={"help": "Class names, in class-id order."})
    ignore_index: int = option(255, "Class id of unlabelled semseg pixels.", minimum=0)
    do_reduce_labels: bool = option(False, REDUCE_LABELS_HELP)
    depth_scale: float = option(1000.0, "Integer depth units per metre (1000: millimetres).", above=0)
    min_depth: float = option(1e-3, "Depth metrics: smallest valid depth (metres).", above=0)
    max_depth: float | None = option(10.0, "Depth metrics: depth cap (metres; NYUv2: 10).", above=0)
    eigen_crop: bool = option(
        False, "Depth metrics: score the Eigen crop of 480x640 frames only (rows 45:471, columns 41:601; NYUv2)."
    )
    crop_scale: list[float] = option(
        default_factory=lambda: [0.5, 1.0],
        help="Training random resized crop: area fraction range.",
        above=0,
        maximum=1,
    )
    flip_probability: float = option(0.5, "Training horizontal flip probability.", minimum=0, maximum=1)
    max_train_samples: int | None = option(None, "Use only the first N training images.", minimum=1)
    max_eval_samples: int | None = option(None, "Use only the first N evaluation images.", minimum=1)
    num_prediction_images: int = option(4, "Evaluation images shown in predictions.png.", minimum=0)

    def __post_init__(self) -> None:
        if self.image_folder is not None and self.dataset_name is not None:
            raise UsageError("give --image_folder or --dataset_name, not both")
        if self.column_mapping and self.dataset_name is None:
            raise UsageError("--column_mapping applies to --dataset_name only")
        check_options(self)
        if self.image_size is not None and len(self.image_size) not in (1, 2):
            raise UsageError(f"--image_size {self.image_size}: one side or height width")
        if self.class_names is not None and self.num_labels not in (None, len(self.class_names)):
            raise UsageError(f"--num_labels {self.num_labels} differs from the {len(self.class_names)} --class_names")
        if self.max_depth is not None and self.max_depth <= self.min_depth:
            raise UsageError(
                f"--max_depth {self.max_depth:g} must exceed --min_depth {self.min_depth:g}: no depth would be valid"
            )

    def mapping(self) -> dict[str, str]:
        """``--column_mapping`` as {target: column}."""
        pairs = [item.partition("=") for item in self.column_mapping]
        if not all(target and sep and column for target, sep, column in pairs):
            raise UsageError(f"--column_mapping entries look like target=column, got {self.column_mapping}")
        return {target: column for target, _, column in pairs}


@dataclass
class DenseTrainingArguments(TrainingArguments):
    """``TrainingArguments`` with MultiMAE's fine-tuning defaults; trains, evaluates, saves the final model."""

    learning_rate: float = field(default=1e-4, metadata={"help": "Peak learning rate (MultiMAE: 1e-4)."})
    weight_decay: float = field(default=0.05, metadata={"help": "AdamW weight decay (MultiMAE: 0.05)."})
    layer_decay: float = option(
        0.75,
        "Layer-wise lr decay: encoder layer l of L gets lr * layer_decay**(L + 1 - l); 1 = off.",
        above=0,
        maximum=1,
    )
    warmup_steps: float = field(
        default=0.1, metadata={"help": "Warm-up: ratio of total steps if < 1, else a step count."}
    )
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Schedule after warm-up (cosine)."})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "Training batch size per device."})
    num_train_epochs: float = field(default=20.0, metadata={"help": "Training epochs (unless max_steps > 0)."})
    save_strategy: SaveStrategy | str = field(
        default="no", metadata={"help": "Intermediate checkpoints ('no', 'epoch', 'steps'); the final model is saved."}
    )
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Kept False: the image columns are turned into model inputs by the collator."}
    )
    label_names: list[str] | None = field(
        default_factory=lambda: ["labels"], metadata={"help": "Batch keys holding the targets."}
    )
    do_train: bool = field(default=True, metadata={"help": "Fine-tune (disable to only evaluate the checkpoint)."})
    do_eval: bool = field(default=True, metadata={"help": "Evaluate on the evaluation split after training."})

    def __post_init__(self) -> None:
        check_options(self)
        use_cpu_when_launched_without_accelerator(self)
        super().__post_init__()
        if self.remove_unused_columns:
            raise UsageError("--remove_unused_columns must stay false: the collator reads the image columns")


@dataclass
class DenseLoraArguments(LoraArguments):
    """LoRA on the attention projections of the ViT layers (the head is trained fully and saved with the adapter)."""

    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "v_proj"], metadata={"help": "Module names that get LoRA adapters."}
    )


# --------------------------------------------------------------------------------------------------------- data


@dataclass
class TaskData:
    """The checked training and evaluation images of one task, its classes (None for depth) and the name of the
    evaluation split (``split[:N]`` when limited to its first N images)."""

    train: datasets.Dataset
    evaluation: datasets.Dataset
    label_names: list[str] | None
    description: str
    eval_split: str


def _limit(dataset: datasets.Dataset, count: int | None) -> datasets.Dataset:
    return dataset if count is None else dataset.select(range(min(count, len(dataset))))


def _default_split(
    available: Sequence[str], chosen: str | None, default: Sequence[str], option: str, where: str
) -> str:
    if chosen is not None:
        if chosen not in available:
            raise UsageError(f"{option} {chosen!r}: {where} has no such split (splits: {sorted(available)})")
        return chosen
    found = next((name for name in default if name in available), None)
    if found is None:
        raise UsageError(f"{where} has none of the splits {list(default)} (splits: {sorted(available)}); set {option}")
    return found


def _folder_labels(split_dir: Path, dataset: datasets.Dataset) -> list[str]:
    """The class name of each image of a folder split, from ``<split>/labels.csv`` (columns ``id,label``)."""
    path = split_dir / LABELS_FILE
    if not path.is_file():
        raise UsageError(f"--image_folder: classification needs {path} with columns id,label (one row per image)")
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or not {"id", "label"} <= set(reader.fieldnames):
            raise UsageError(f"{path}: expected the columns id,label, got {reader.fieldnames}")
        labels = {row["id"]: row["label"] for row in reader}
    missing = [image_id for image_id in dataset["id"] if image_id not in labels]
    if missing:
        raise UsageError(f"{path}: no label for the images {missing[:10]}")
    return [labels[image_id] for image_id in dataset["id"]]


def _class_ids(names: list[str], label_names: list[str], where: str) -> list[int]:
    unknown = sorted(set(names) - set(label_names))
    if unknown:
        raise UsageError(f"{where}: labels {unknown[:5]} are not among --class_names {label_names}")
    return [label_names.index(name) for name in names]


def _check_class_labels(dataset: datasets.Dataset, num_labels: int, where: str) -> None:
    labels = np.asarray(dataset["label"])
    bad = (labels < 0) | (labels >= num_labels)
    if bad.any():
        rows = np.flatnonzero(bad)[:5].tolist()
        raise UsageError(
            f"{where}: class ids {sorted(set(labels[bad].tolist()))[:5]} (rows {rows}) are outside the {num_labels} "
            "classes; set --num_labels or --class_names"
        )


def _image_folder_data(
    task: str, data_args: DenseDataArguments, needed: list[str], num_labels: int | None, checks: dict[str, Any]
) -> TaskData:
    """The train and eval splits of ``--image_folder`` (classification: class names from each split's labels.csv)."""
    from robust_pretrain.vision import loaders

    root = Path(data_args.image_folder)
    if not root.is_dir():
        raise UsageError(f"--image_folder {root}: no such directory")
    available = [p.name for p in root.iterdir() if p.is_dir()]
    where = f"--image_folder {root}"
    train_split = _default_split(available, data_args.train_split, ["train"], "--train_split", where)
    eval_split = _default_split(available, data_args.eval_split, ["validation", "test"], "--eval_split", where)
    if task == "semseg" and num_labels is None:
        raise UsageError("--image_folder with --task semseg needs --num_labels (or --class_names)")
    splits = {}
    for split in (train_split, eval_split):
        try:
            splits[split] = loaders.load_image_folder(
                root, split, modalities=needed, unmatched=data_args.unmatched, **checks
            )
        except loaders.UnmatchedStemsError as err:
            raise loaders.unmatched_usage_error(err) from err
        except (ValueError, FileNotFoundError) as err:
            raise UsageError(f"{where}: {err}") from err
    label_names = data_args.class_names
    if task == "classification":
        names = {split: _folder_labels(root / split, dataset) for split, dataset in splits.items()}
        label_names = label_names or sorted(set(names[train_split]) | set(names[eval_split]))
        splits = {
            split: dataset.add_column("label", _class_ids(names[split], label_names, str(root / split)))
            for split, dataset in splits.items()
        }
    description = f"the image folder `{root.resolve().name}` (splits {train_split} / {eval_split})"
    return TaskData(splits[train_split], splits[eval_split], label_names, description, eval_split)


def _mapped_dataset_data(
    task: str, data_args: DenseDataArguments, needed: list[str], num_labels: int | None, checks: dict[str, Any]
) -> TaskData:
    """The train and eval splits of ``--dataset_name``, columns mapped by ``--column_mapping``."""
    from robust_pretrain.vision import loaders

    mapping = data_args.mapping() or {name: name for name in [*needed, "label"]}
    where = f"--dataset_name {data_args.dataset_name}"
    try:
        raw = datasets.load_dataset(data_args.dataset_name, data_args.dataset_config_name)
    except (FileNotFoundError, ValueError, datasets.exceptions.DatasetNotFoundError) as err:
        raise UsageError(f"{where}: {err}") from err
    train_split = _default_split(list(raw), data_args.train_split, ["train"], "--train_split", where)
    eval_split = _default_split(list(raw), data_args.eval_split, ["validation", "test"], "--eval_split", where)
    required = [*needed, "label"] if task == "classification" else needed
    missing = [target for target in required if target not in mapping]
    if missing:
        raise UsageError(f"--column_mapping maps no column to {missing}, which --task {task} needs")
    mapping = {target: column for target, column in mapping.items() if target in [*required, "id"]}
    if task == "semseg" and num_labels is None:
        raise UsageError(f"{where} with --task semseg needs --num_labels (or --class_names)")
    splits = {}
    for split in (train_split, eval_split):
        try:
            splits[split] = loaders.load_mapped_dataset(raw[split], mapping, **checks)
        except ValueError as err:
            raise UsageError(f"{where} [{split}]: {err}") from err
    label_names = data_args.class_names
    feature = splits[train_split].features.get("label")
    if task == "classification" and label_names is None and isinstance(feature, datasets.ClassLabel):
        label_names = list(feature.names)
    description = f"the dataset `{data_args.dataset_name}` (splits {train_split} / {eval_split})"
    return TaskData(splits[train_split], splits[eval_split], label_names, description, eval_split)


def _scene_data(task: str, data_args: DenseDataArguments) -> TaskData:
    """The generated scenes' downstream splits (never seen in pre-training)."""
    from robust_pretrain.vision import scenes

    config = scenes.SceneConfig(image_size=data_args.scene_size)
    train = scenes.generate_scenes(data_args.num_train_scenes, SCENE_SPLITS[0], data_args.scene_seed, config)
    evaluation = scenes.generate_scenes(data_args.num_eval_scenes, SCENE_SPLITS[1], data_args.scene_seed, config)
    label_names = data_args.class_names
    if label_names is None:
        label_names = list(scenes.CLASS_NAMES if task == "semseg" else scenes.LABEL_NAMES)
    description = (
        f"procedural indoor scenes (`robust_pretrain.vision.scenes` v{scenes.GENERATOR_VERSION}, seed "
        f"{data_args.scene_seed}, {data_args.scene_size}x{data_args.scene_size} pixels): "
        f"{data_args.num_train_scenes} `{SCENE_SPLITS[0]}` / {data_args.num_eval_scenes} `{SCENE_SPLITS[1]}` "
        "scenes, disjoint from the pre-training splits"
    )
    return TaskData(train, evaluation, label_names, description, SCENE_SPLITS[1])


def _checked_label_names(task: str, data: TaskData, num_labels: int | None) -> list[str] | None:
    """The task's class names (None for depth), every class id checked against them."""
    label_names = data.label_names
    if task == "depth":
        return None
    if task == "classification":
        if label_names is None:
            observed = int(max(data.train["label"] + data.evaluation["label"]))
            label_names = [str(i) for i in range(num_labels or observed + 1)]
        for split_name, dataset in (("training", data.train), ("evaluation", data.evaluation)):
            _check_class_labels(dataset, len(label_names), f"the {split_name} split of {data.description}")
    elif label_names is None:
        label_names = [str(i) for i in range(num_labels)]
    if task == "semseg" and num_labels is not None and len(label_names) != num_labels:
        raise UsageError(f"--num_labels {num_labels} differs from the {len(label_names)} classes of {data.description}")
    return label_names


def _missing(dataset: datasets.Dataset, column: str) -> np.ndarray:
    """Which rows have no value in ``column`` (``--unmatched partial``: a file missing from its folder)."""
    if column not in dataset.column_names:
        return np.zeros(len(dataset), dtype=bool)
    table = dataset.with_format("arrow")[:]  # the rows after select(), images not decoded
    return table.column(column).is_null().to_numpy(zero_copy_only=False)


def _without_missing_inputs(task: str, data: TaskData, input_modalities: Sequence[str]) -> TaskData:
    """Examples lacking a modality (``--unmatched partial``): lacking an input, refused (the fine-tuning model
    encodes every patch of its inputs); lacking the target, kept for training (filled with the no-label value: no
    loss) and left out of the evaluation (nothing to score)."""
    for split_name, dataset in (("training", data.train), ("evaluation", data.evaluation)):
        for modality in input_modalities:
            rows = np.flatnonzero(_missing(dataset, modality))
            if rows.size:
                ids = [dataset.with_format("arrow")[int(row)]["id"][0].as_py() for row in rows[:10]]
                raise UsageError(
                    f"the {split_name} examples {ids} of {data.description} have no {modality}, an input of the "
                    "model; add the files or pass --unmatched drop"
                )
    unscored = _missing(data.evaluation, task) if task != "classification" else np.zeros(0, dtype=bool)
    if unscored.any():
        logger.warning("%d evaluation images without %s are not scored", int(unscored.sum()), task)
        data = replace(data, evaluation=data.evaluation.select(np.flatnonzero(~unscored)))
    return data


def load_task_data(
    task: str, data_args: DenseDataArguments, input_modalities: Sequence[str], patch_size: int | None
) -> TaskData:
    """Load and check the training and evaluation images of ``task`` (``--image_folder``, ``--dataset_name`` or the
    generated scenes); every problem is a :class:`UsageError` naming the file, split, row or option."""
    needed = list(dict.fromkeys([*input_modalities, *([task] if task != "classification" else [])]))
    num_labels = data_args.num_labels if data_args.class_names is None else len(data_args.class_names)
    if data_args.do_reduce_labels and task != "semseg":
        raise UsageError(f"--do_reduce_labels applies to --task semseg, not {task}")
    if data_args.do_reduce_labels and data_args.image_folder is None and data_args.dataset_name is None:
        raise UsageError(
            "--do_reduce_labels: the generated scenes' class ids start at 0; it is for --image_folder / "
            "--dataset_name maps with 0 = unlabelled, 1..K = classes"
        )
    checks = dict(
        ignore_index=data_args.ignore_index,
        depth_scale=data_args.depth_scale,
        patch_size=patch_size,
        num_classes=num_labels if task == "semseg" else None,
        do_reduce_labels=data_args.do_reduce_labels,
    )
    if data_args.image_folder is not None:
        data = _image_folder_data(task, data_args, needed, num_labels, checks)
    elif data_args.dataset_name is not None:
        data = _mapped_dataset_data(task, data_args, needed, num_labels, checks)
    else:
        data = _scene_data(task, data_args)
    limit = data_args.max_eval_samples
    limited = limit is not None and limit < len(data.evaluation)
    data = replace(
        data,
        train=_limit(data.train, data_args.max_train_samples),
        evaluation=_limit(data.evaluation, limit),
        eval_split=f"{data.eval_split}[:{limit}]" if limited else data.eval_split,
    )
    data = _without_missing_inputs(task, data, input_modalities)
    for name, dataset in (("training", data.train), ("evaluation", data.evaluation)):
        if len(dataset) == 0:
            option = "--train_split" if name == "training" else "--eval_split"
            raise UsageError(f"the {name} split of {data.description} is empty ({option})")
    return replace(data, label_names=_checked_label_names(task, data, num_labels))


@dataclass
class DenseCollator:
    """Processed rows -> model batch: ``pixel_values`` (RGB), extra input modalities by name, ``labels``
    (semseg (B,H,W) int64, depth (B,H,W) metres with 0 = invalid, classification (B,) int64). A missing dense target
    (``--unmatched partial``) is filled with the no-label value (``ignore_index`` / 0 m): no loss. Evaluation rows
    also carry the target at its own resolution (:class:`OriginalTargets`), passed on for :class:`DenseTrainer`."""

    task: str
    extra_inputs: tuple[str, ...] = ()
    ignore_index: int = 255

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        def stack(name: str, fill: float | None = None) -> torch.Tensor:
            values = [feature[name] for feature in features]
            if any(value is None for value in values):  # a missing target: depth (1,H,W) metres, semseg (H,W) ids
                height, width = np.shape(features[0]["rgb"])[-2:]
                shape, dtype = ((1, height, width), np.float32) if name == "depth" else ((height, width), np.int64)
                values = [np.full(shape, fill, dtype) if value is None else value for value in values]
            return torch.from_numpy(np.stack([np.asarray(value) for value in values]))

        batch = {"pixel_values": stack("rgb")}
        batch.update({name: stack(name) for name in self.extra_inputs})
        if self.task == "classification":
            batch["labels"] = torch.tensor([int(feature["label"]) for feature in features], dtype=torch.long)
        elif self.task == "depth":
            batch["labels"] = stack("depth", fill=0.0)[:, 0]
        else:
            batch["labels"] = stack("semseg", fill=self.ignore_index).long()
        if ORIGINAL_TARGET in features[0]:
            batch[ORIGINAL_TARGET] = stack(ORIGINAL_TARGET)
            batch[TARGET_SIZE] = stack(TARGET_SIZE)
        return batch


@dataclass
class OriginalTargets:
    """Evaluation transform: the processed rows plus each target at its own resolution (``original_target``, padded
    to ``canvas`` with the no-label value) and its ``target_size`` (height, width), which :class:`DenseTrainer`
    scores against (the NYUv2 convention: the labels are never resized)."""

    transform: MultiMAETransform
    task: str
    canvas: tuple[int, int]

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        out = self.transform(batch)
        processor = self.transform.processor
        fill, dtype = (processor.ignore_index, np.int32) if self.task == "semseg" else (0.0, np.float32)
        out[ORIGINAL_TARGET], out[TARGET_SIZE] = [], []
        for image_id, value in zip(batch["id"], batch[self.task], strict=True):
            target = processor.decode_example({self.task: value}, f"row {image_id}")[self.task]
            padded = np.full(self.canvas, fill, dtype=dtype)
            padded[: target.shape[0], : target.shape[1]] = target
            out[ORIGINAL_TARGET].append(padded)
            out[TARGET_SIZE].append(np.asarray(target.shape, dtype=np.int64))
        return out


def _requested_image_size(image_size: list[int] | None, patch_size: int) -> tuple[int, int] | None:
    """``--image_size`` (one side or height width) as (height, width), each a multiple of the patch size."""
    if image_size is None:
        return None
    height, width = (image_size * 2)[:2]
    if height % patch_size or width % patch_size:
        raise UsageError(
            f"--image_size {' '.join(map(str, image_size))}: not a multiple of the checkpoint's patch size {patch_size}"
        )
    return height, width


def target_sizes(task: str, dataset: datasets.Dataset, depth_scale: float) -> list[tuple[int, int]]:
    """(height, width) of every target of ``dataset`` (raw rows) at its own resolution."""
    processor = MultiMAEImageProcessor(depth_scale=depth_scale)
    return [
        processor.decode_example({task: row[task]}, f"row {row['id']}")[task].shape
        for row in dataset.select_columns(["id", task])
    ]


class DenseTrainer(Trainer):
    """``Trainer`` scoring dense predictions at each label's own resolution (the NYUv2 convention): the model's output
    at its input size is upsampled bilinearly to the label's size (segmentation: the logits, then argmax) and
    compared with the label as stored. The evaluation loss stays the model's, at the input size."""

    def __init__(self, *args: Any, task: str, ignore_index: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.task, self.ignore_index = task, ignore_index

    def prediction_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        targets, sizes = inputs.pop(ORIGINAL_TARGET, None), inputs.pop(TARGET_SIZE, None)
        loss, outputs, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        if targets is None or outputs is None:
            return loss, outputs, labels
        predictions = upsample_predictions(self.task, _first(outputs), sizes, targets.shape[-2:], self.ignore_index)
        return loss, predictions, targets.to(predictions.device)

    def evaluation_loop(self, *args: Any, **kwargs: Any) -> EvalLoopOutput:
        """Evaluate with the main process's buffers on every process: under DDP each process updates its own batch
        norm statistics (the segmentation head's) in training, and evaluation does not wrap the model, so the other
        processes would score a model other than the one saved."""
        if torch.distributed.is_available() and torch.distributed.is_initialized() and self.args.world_size > 1:
            for buffer in self.model.buffers():
                torch.distributed.broadcast(buffer, src=0)
        return super().evaluation_loop(*args, **kwargs)


def upsample_predictions(
    task: str, outputs: torch.Tensor, sizes: torch.Tensor, canvas: Sequence[int], ignore_index: int
) -> torch.Tensor:
    """Per example, ``outputs`` (semseg logits (B,C,h,w), depth (B,h,w) metres) upsampled bilinearly to its label
    size ``sizes[i]`` (segmentation: then argmax), on a ``canvas`` filled with the no-label value elsewhere."""
    semseg = task == "semseg"
    predictions = torch.full(
        (len(outputs), *canvas),
        ignore_index if semseg else 0.0,
        dtype=torch.int32 if semseg else torch.float32,
        device=outputs.device,
    )
    for index, (height, width) in enumerate(sizes.tolist()):
        values = outputs[index : index + 1].float()
        values = values if semseg else values[:, None]
        upsampled = torch.nn.functional.interpolate(values, size=(height, width), mode="bilinear", align_corners=False)
        predictions[index, :height, :width] = upsampled[0].argmax(0) if semseg else upsampled[0, 0]
    return predictions


# -------------------------------------------------------------------------------------------------------- model


def checkpoint_model_type(checkpoint: str, task: str) -> str:
    """``"multimae"`` or ``"vit"`` (classification only); anything else is a :class:`UsageError`."""
    check_checkpoint(checkpoint)
    try:
        config, _ = PretrainedConfig.get_config_dict(checkpoint)
    except (OSError, ValueError) as err:
        raise UsageError(f"--model_name_or_path {checkpoint}: cannot read its config.json ({err})") from err
    model_type = config.get("model_type")
    if model_type == "vit" and task != "classification":
        raise UsageError(
            f"--model_name_or_path {checkpoint} is a ViT checkpoint; --task {task} needs the dense (DPT) heads of an "
            "MM-MAE checkpoint (a pre-training output). A ViT fine-tunes with --task classification."
        )
    if model_type not in ("multimae", "vit"):
        raise UsageError(
            f"--model_name_or_path {checkpoint}: config.json has model_type {model_type!r}; expected an MM-MAE "
            "checkpoint ('multimae', e.g. a pre-training output) or a ViT ('vit', e.g. an exported encoder)"
        )
    return model_type


def checkpoint_normalisation(checkpoint: str) -> dict[str, list[float]]:
    """``image_mean`` / ``image_std`` of a local checkpoint's ``preprocessor_config.json`` (e.g. 0.5 for Google's
    ViTs), else nothing (the processor's ImageNet defaults, which MM-MAE pre-training uses)."""
    path = Path(checkpoint) / "preprocessor_config.json"
    if not path.is_file():
        return {}
    saved = json.loads(path.read_text(encoding="utf-8"))
    return {key: saved[key] for key in ("image_mean", "image_std") if key in saved}


def load_model(
    run_args: DenseRunArguments,
    model_args: DenseModelArguments,
    lora_args: LoraArguments,
    label_names: list[str] | None,
    ignore_index: int,
) -> tuple[PreTrainedModel | PeftModel, tuple[int, int]]:
    """The task model (head initialised, encoder from the checkpoint, or everything initialised with
    ``run_args.random_init``), LoRA-wrapped if asked; and the image size (height, width) the checkpoint was trained
    at."""
    path, task = run_args.model_name_or_path, run_args.task
    model_type = checkpoint_model_type(path, task)
    # A local checkpoint loads by its absolute path, which a LoRA adapter records as its base (resolves from anywhere)
    source = str(Path(path).resolve()) if Path(path).is_dir() else path
    labels = (
        {}
        if label_names is None
        else {
            "num_labels": len(label_names),
            "id2label": dict(enumerate(label_names)),
            "label2id": {name: i for i, name in enumerate(label_names)},
        }
    )
    if model_type == "vit":
        if model_args.input_modalities != ["rgb"]:
            raise UsageError(f"--input_modalities {model_args.input_modalities}: a ViT checkpoint reads rgb only")
        if run_args.random_init:
            model = ViTForImageClassification(ViTConfig.from_pretrained(source, **labels))
        else:
            model = ViTForImageClassification.from_pretrained(source, ignore_mismatched_sizes=True, **labels)
        size = model.config.image_size
        height, width = (size, size) if isinstance(size, int) else size
        if height != width:
            raise UsageError(f"{path}: image_size {size} is not square")
        image_size, head_modules = (height, width), ["classifier"]
    else:
        model_class = MULTIMAE_HEADS[task]
        config = MultiMAEConfig.from_pretrained(
            source, semantic_loss_ignore_index=ignore_index, **model_args.config_overrides(), **labels
        )
        known = config.task_names
        unknown = [name for name in model_args.input_modalities if name not in known]
        if unknown:
            raise UsageError(f"--input_modalities {unknown}: {path} has the modalities {known}")
        config.finetune_modalities = list(model_args.input_modalities)
        if run_args.random_init:
            model = model_class(config)
        else:
            model = model_class.from_pretrained(source, config=config, ignore_mismatched_sizes=True)
        image_size, head_modules = (config.image_height, config.image_width), model.head_modules()
    if lora_args.use_lora:
        model = get_peft_model(
            model,
            LoraConfig(
                r=lora_args.lora_r,
                lora_alpha=lora_args.lora_alpha,
                lora_dropout=lora_args.lora_dropout,
                target_modules=list(lora_args.lora_target_modules),
                modules_to_save=head_modules,
            ),
        )
        model.print_trainable_parameters()
    return model, image_size


def parameter_groups(
    model: torch.nn.Module, num_layers: int, learning_rate: float, weight_decay: float, layer_decay: float
) -> list[dict[str, Any]]:
    """AdamW parameter groups with layer-wise lr decay (BEiT / MultiMAE): the embeddings are layer 0, encoder layer
    ``i`` is layer ``i + 1``, everything after the encoder (final norm, head) layer ``L + 1``; layer ``l`` gets
    ``learning_rate * layer_decay ** (L + 1 - l)``. No weight decay on biases, norms and learned tokens. The head's
    group comes first (the lr the Trainer logs)."""
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        layer_match = _ENCODER_LAYER.search(name)
        layer = int(layer_match.group(1)) + 1 if layer_match else 0 if _EMBEDDINGS.search(name) else num_layers + 1
        decay = parameter.ndim >= 2 and not _NO_WEIGHT_DECAY.search(name)
        group = groups.setdefault(
            (layer, decay),
            {
                "params": [],
                "weight_decay": weight_decay if decay else 0.0,
                "lr": learning_rate * layer_decay ** (num_layers + 1 - layer),
            },
        )
        group["params"].append(parameter)
    return [groups[key] for key in sorted(groups, key=lambda key: (-key[0], not key[1]))]


# ------------------------------------------------------------------------------------------------------ metrics


def predictions_file_name(task: str) -> str:
    return f"predictions_{task}.npz"


def text_predictions_file_name(task: str) -> str:
    return f"predict_results_{task}.txt"


def _metric_kwargs(task: str, num_labels: int | None, data_args: DenseDataArguments) -> dict[str, Any]:
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
            task, _first(prediction.predictions), prediction.label_ids, metric_kwargs, label_names
        )

    return compute_metrics


def _first(predictions: np.ndarray | tuple) -> np.ndarray:
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


# ---------------------------------------------------------------------------------------------------------- run


def require_task_targets(task: str, data: TaskData, data_args: DenseDataArguments) -> None:
    """Refuse semseg data without a labelled pixel in the training or the evaluation split, and depth data without a
    valid pixel in training or one the metrics score (within ``[--min_depth, --max_depth]``) in evaluation: nothing
    would be learned or scored."""
    if task == "classification":
        return
    decoder = MultiMAEImageProcessor(
        depth_scale=data_args.depth_scale,
        ignore_index=data_args.ignore_index,
        do_reduce_labels=data_args.do_reduce_labels,
    )
    if task == "semseg":
        after = " after --do_reduce_labels (0 = unlabelled)" if data_args.do_reduce_labels else ""
        reason = f"no labelled pixel: every pixel is the ignore index {data_args.ignore_index}{after}"
        labelled = {task: lambda classes: bool((classes != data_args.ignore_index).any())}
        checks = {"training": (labelled, reason), "held-out": (labelled, reason)}
    else:
        cap = math.inf if data_args.max_depth is None else data_args.max_depth
        scored = {task: lambda depth: bool(((depth >= data_args.min_depth) & (depth <= cap)).any())}
        within = f"none within [{data_args.min_depth:g}, {cap:g}] metres (--min_depth, --max_depth)"
        positive = {task: lambda depth: bool((depth > 0).any())}
        checks = {
            "training": (positive, "no valid depth pixel"),
            "held-out": (scored, f"no valid depth pixel: {within}"),
        }
    for split, dataset in (("training", data.train), ("held-out", data.evaluation)):
        test, why = checks[split]
        missing = modalities_without_targets(dataset, decoder, test)
        if missing:
            refuse_tasks_without_targets("task", [task], [0], split, why if missing[task] else f"no {task} map")


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
    model_args.check_task(task)
    checkpoint_model_type(run_args.model_name_or_path, task)
    config, _ = PretrainedConfig.get_config_dict(run_args.model_name_or_path)
    requested_size = _requested_image_size(data_args.image_size, int(config.get("patch_size", 16)))
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
    claim_for_new_run(
        training_args.output_dir, run_args.overwrite_output_dir, training_args.should_save, _STALE_OUTPUTS
    )
    set_seed(training_args.seed)
    model, checkpoint_size = load_model(run_args, model_args, lora_args, data.label_names, data_args.ignore_index)
    image_size = requested_size or checkpoint_size
    if image_size != checkpoint_size and isinstance(model, ViTForImageClassification):
        raise UsageError(f"--image_size {image_size}: the ViT checkpoint is trained at {checkpoint_size} pixels")
    if requested_size is not None and model.config.model_type == MultiMAEConfig.model_type:
        model.config.image_size = list(image_size)  # saved with the model: the size it is fine-tuned at
    num_labels = None if data.label_names is None else len(data.label_names)
    processor = MultiMAEImageProcessor(
        **checkpoint_normalisation(run_args.model_name_or_path),
        size={"height": image_size[0], "width": image_size[1]},
        crop_scale=data_args.crop_scale,
        flip_probability=data_args.flip_probability,
        depth_scale=data_args.depth_scale,
        ignore_index=data_args.ignore_index,
        num_classes=num_labels if task == "semseg" else None,
        do_reduce_labels=data_args.do_reduce_labels,
    )
    modalities = list(dict.fromkeys([*model_args.input_modalities, *([task] if task != "classification" else [])]))
    columns = {name: name for name in modalities}
    train_transform = MultiMAETransform(processor, train=True, seed=training_args.seed, column_mapping=columns)
    eval_transform = MultiMAETransform(processor, train=False, column_mapping=columns)
    eval_ids = list(data.evaluation["id"])
    if task != "classification":
        eval_transform = OriginalTargets(eval_transform, task, tuple(np.max(sizes, axis=0).tolist()))
    data.train.set_transform(train_transform)
    data.evaluation.set_transform(eval_transform)

    metric_kwargs = _metric_kwargs(task, num_labels, data_args)
    num_layers = int(config.get("num_hidden_layers", 0))
    register_process_group_teardown()  # a finished torchrun process must not abort at exit
    trainer = DenseTrainer(
        task=task,
        ignore_index=data_args.ignore_index,
        model=model,
        args=training_args,
        train_dataset=data.train if training_args.do_train else None,
        data_collator=DenseCollator(
            task, tuple(name for name in model_args.input_modalities if name != "rgb"), data_args.ignore_index
        ),
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
    output_dir = Path(training_args.output_dir)
    if training_args.do_train:
        with disk_full_is_one_line(training_args.output_dir, resumes=False):
            train_result = trainer.train()
            if save_model:
                trainer.save_model()
                if trainer.is_world_process_zero():
                    processor.save_pretrained(output_dir)
                    if lora_args.use_lora and model.config.model_type == MultiMAEConfig.model_type:
                        model.config.save_pretrained(output_dir)  # beside the adapter: the one-line load needs the head
        log_train_results(trainer, train_result, len(data.train))

    eval_metrics: dict[str, float] = {}
    if training_args.do_eval:
        output = trainer.predict(data.evaluation, metric_key_prefix="eval")
        eval_metrics = {**output.metrics, "eval_samples": len(data.evaluation)}
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
        if trainer.is_world_process_zero():
            predictions, ids = _first(output.predictions), eval_ids
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
    if save_model and training_args.do_train and lora_args.use_lora and trainer.is_world_process_zero():
        save_merged(trainer.model, processor, output_dir / MERGED_DIR)  # last: merging changes the model in place
    return eval_metrics


def save_merged(model: PeftModel, processor: MultiMAEImageProcessor, directory: Path) -> Path:
    """Save ``model`` with its LoRA adapters merged in (the trained head replacing the original one) and the image
    processor into ``directory``: a plain checkpoint for ``AutoModelFor*.from_pretrained`` and the pipelines."""
    model.merge_and_unload().save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


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
