"""The dense fine-tuning's images: loading the training and evaluation splits (image folder, mapped dataset or
generated scenes) and checking their labels, targets and sizes."""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from robust_pretrain.cli import UsageError
from robust_pretrain.trainer.targets import refuse_tasks_without_targets
from robust_pretrain.vision.finetune.arguments import DenseDataArguments
from robust_pretrain.vision.loaders import modalities_without_targets
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor

# The recipe's logger: its console lines keep naming robust_pretrain.vision.finetune.recipe
logger = logging.getLogger("robust_pretrain.vision.finetune.recipe")

LABELS_FILE = "labels.csv"
SCENE_SPLITS = ("downstream_train", "downstream_test")


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


def target_sizes(task: str, dataset: datasets.Dataset, depth_scale: float) -> list[tuple[int, int]]:
    """(height, width) of every target of ``dataset`` (raw rows) at its own resolution."""
    processor = MultiMAEImageProcessor(depth_scale=depth_scale)
    return [
        processor.decode_example({task: row[task]}, f"row {row['id']}")[task].shape
        for row in dataset.select_columns(["id", task])
    ]


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
