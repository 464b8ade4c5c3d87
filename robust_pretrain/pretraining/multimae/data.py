"""The images of the MM-MAE pre-training recipe: loading and checking them (generated scenes, an image folder or a
``datasets`` dataset), their transforms and the collator that masks them."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robust_pretrain.cli import UsageError
from robust_pretrain.pretraining.multimae.arguments import DataArguments, ModelArguments
from robust_pretrain.trainer.targets import refuse_tasks_without_targets
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments
from robust_pretrain.vision.collator import ModalityMaskCollator
from robust_pretrain.vision.loaders import UnmatchedStemsError, modalities_without_targets, unmatched_usage_error
from robust_pretrain.vision.multimae.configuration_multimae import MultiMAEConfig
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor, MultiMAETransform

logger = logging.getLogger(__name__)

HELD_OUT = "held_out"  # marks held-out rows for the collate function: they get the fixed evaluation masks


def _held_out_split(available: list[str], data_args: DataArguments) -> str | None:
    if data_args.validation_split is not None:
        if data_args.validation_split not in available:
            raise UsageError(f"--validation_split {data_args.validation_split!r} not found (splits: {available})")
        return data_args.validation_split
    return next((name for name in ("validation", "test") if name in available), None)


def load_images(data_args: DataArguments, model_args: ModelArguments, num_classes: int | None) -> tuple[Any, Any]:
    """The training and held-out ``datasets.Dataset`` (``id`` + modality columns), checked image by image (folder
    and datasets loaders): a corrupt file, a depth map without valid pixel, a class id >= ``num_classes`` or an image
    smaller than one patch is refused, naming the file or row."""
    from robust_pretrain.vision import loaders, scenes

    checks = dict(
        ignore_index=model_args.semseg_ignore_index,
        num_classes=num_classes,
        do_reduce_labels=data_args.do_reduce_labels,
        depth_scale=data_args.depth_scale,
        patch_size=model_args.patch_size,
    )
    if data_args.image_folder is not None:
        root = Path(data_args.image_folder)
        if not (root / data_args.train_split).is_dir():
            raise UsageError(
                f"--image_folder {root}: no {data_args.train_split}/ folder (expected "
                f"{root}/{data_args.train_split}/{{rgb,depth,semseg}}/<id>.<ext>)"
            )
        splits = sorted(p.name for p in root.iterdir() if p.is_dir())
        held_out = _held_out_split(splits, data_args)
        checks.update(modalities=model_args.modalities, unmatched=data_args.unmatched)
        try:
            train = loaders.load_image_folder(root, data_args.train_split, **checks)
            evaluation = None if held_out is None else loaders.load_image_folder(root, held_out, **checks)
        except UnmatchedStemsError as err:
            raise unmatched_usage_error(err) from err
        except (ValueError, FileNotFoundError) as err:
            raise UsageError(f"--image_folder {root}: {err}") from err
    elif data_args.dataset_name is not None:
        import datasets

        try:
            raw = datasets.load_dataset(data_args.dataset_name, data_args.dataset_config_name)
        except (FileNotFoundError, ValueError, datasets.exceptions.DatasetNotFoundError) as err:
            raise UsageError(f"--dataset_name {data_args.dataset_name}: {err}") from err
        held_out = _held_out_split(list(raw), data_args)
        if data_args.train_split not in raw:
            raise UsageError(
                f"--dataset_name {data_args.dataset_name} has no split {data_args.train_split!r} "
                f"(splits: {list(raw)}); set --train_split"
            )
        # without --column_mapping: the columns named after the modalities (a missing one is an absent task) and id
        columns = raw[data_args.train_split].column_names
        mapping = data_args.mapping() or {t: t for t in (*model_args.modalities, "id") if t in columns}
        try:
            train = loaders.load_mapped_dataset(raw[data_args.train_split], mapping, **checks)
            evaluation = None if held_out is None else loaders.load_mapped_dataset(raw[held_out], mapping, **checks)
        except ValueError as err:
            raise UsageError(f"--dataset_name {data_args.dataset_name}: {err}") from err
    else:
        config = scenes.SceneConfig(image_size=data_args.scene_size)
        train = scenes.generate_scenes(data_args.num_train_scenes, "train", data_args.scene_seed, config)
        evaluation = scenes.generate_scenes(data_args.num_eval_scenes, "test", data_args.scene_seed, config)
    if evaluation is None:
        split = train.train_test_split(test_size=data_args.validation_split_percentage / 100, seed=0)
        train, evaluation = split["train"], split["test"]
    if data_args.max_train_samples is not None:
        train = train.select(range(min(data_args.max_train_samples, len(train))))
    if data_args.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(data_args.max_eval_samples, len(evaluation))))
    return train, evaluation


def check_partial_examples(
    data: Any, split: str, task_names: list[str], fill_values: dict[str, float], budget: int, num_patches: int
) -> None:
    """Examples missing a modality (``--unmatched partial``) are refused when that modality has no fill value (rgb:
    its loss has no invalid value, so it would learn the filler) or when they have too few patches for the budget of
    visible tokens."""
    table = data.with_format("arrow")[:]  # the rows after select(), images not decoded
    missing = {
        name: table.column(name).is_null().to_numpy(zero_copy_only=False)
        for name in task_names
        if name in table.column_names
    }
    ids = table.column("id").to_pylist()
    for name, rows in missing.items():
        if name not in fill_values and rows.any():
            lacking = [ids[row] for row in np.flatnonzero(rows)[:10]]
            raise UsageError(
                f"the {split} examples {lacking} have no {name}, which cannot be left out (its loss has no invalid "
                "value to fill in); add the files or pass --unmatched drop"
            )
    fewest = len(missing) - int(np.sum(list(missing.values()), axis=0).max()) if missing else 0
    if missing and budget > fewest * num_patches:
        raise UsageError(
            f"--num_visible_tokens {budget} exceeds the {fewest * num_patches} patches of a {split} example with only "
            f"{fewest} of the modalities; lower it or pass --unmatched drop"
        )


def require_modality_targets(
    data: Any, split: str, processor: MultiMAEImageProcessor, config: MultiMAEConfig, reduced: bool
) -> None:
    """Refuse a modality of which no ``split`` example has a target: no image with it, no valid depth pixel (within
    the model's ``max_depth``), no labelled semseg pixel. A modality that is no column of the data (an absent task)
    is left to the warning above."""
    tests: dict[str, Callable[[np.ndarray], bool]] = {}
    reasons: dict[str, str] = {}
    for spec in config.modalities:
        if spec.kind == "depth":
            cap = math.inf if spec.max_depth is None else spec.max_depth
            tests[spec.name] = lambda depth, cap=cap: bool(((depth > 0) & (depth <= cap)).any())
            reasons[spec.name] = f"no valid depth pixel: none is within (0, {cap:g}] metres (--max_depth)"
        elif spec.kind == "semseg":
            tests[spec.name] = lambda classes, ignore=spec.ignore_index: bool((classes != ignore).any())
            after = " after --do_reduce_labels (0 = unlabelled)" if reduced else ""
            reasons[spec.name] = f"no labelled pixel: every pixel is the ignore index {spec.ignore_index}{after}"
        else:
            tests[spec.name] = lambda image: True
    for name, present in modalities_without_targets(data, processor, tests).items():
        reason = reasons[name] if present else "no example has the modality (--unmatched partial)"
        refuse_tasks_without_targets("modality", [name], [0], split, reason)


@dataclass
class HeldOutOrTrainingCollator:
    """Training rows get the epoch's random masks; held-out rows (a ``held_out`` column) the fixed evaluation masks
    (collator with the evaluation seed, whose epoch never changes: masks are a function of the image id only)."""

    training: ModalityMaskCollator
    held_out: ModalityMaskCollator

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        return (self.held_out if HELD_OUT in features[0] else self.training)(features)

    @property
    def task_names(self) -> list[str]:
        """The modalities, in task-id order (``MinimaxTrainer`` takes its tasks from them)."""
        return list(self.training.modalities)

    def set_epoch(self, epoch: int) -> None:
        """New training masks each epoch (``MinimaxTrainer`` calls this, as it does the transform's)."""
        self.training.set_epoch(epoch)


def build_processor(model_args: ModelArguments, data_args: DataArguments, config: MultiMAEConfig):
    semseg = next((spec for spec in config.modalities if spec.kind == "semseg"), None)
    try:
        return MultiMAEImageProcessor(
            size={"height": config.image_height, "width": config.image_width},
            crop_scale=data_args.crop_scale,
            crop_ratio=data_args.crop_ratio,
            flip_probability=data_args.flip_probability,
            depth_scale=data_args.depth_scale,
            ignore_index=semseg.ignore_index if semseg else model_args.semseg_ignore_index,
            num_classes=semseg.num_classes if semseg else None,
            do_reduce_labels=data_args.do_reduce_labels,
        )
    except ValueError as err:
        raise UsageError(
            f"augmentation and label settings (--crop_scale, --crop_ratio, --flip_probability, --do_reduce_labels): "
            f"{err}"
        ) from err


def load_checked_images(
    data_args: DataArguments, model_args: ModelArguments, config: MultiMAEConfig, num_classes: int | None
) -> tuple[Any, Any]:
    """The training and held-out images (:func:`load_images`, checked against the model's semseg classes, else
    ``num_classes``); a modality that is no column of a split is an absent task (a warning), none at all an error."""
    task_names = model_args.modalities
    semseg = next((spec for spec in config.modalities if spec.kind == "semseg"), None)
    train_raw, eval_raw = load_images(data_args, model_args, semseg.num_classes if semseg else num_classes)
    for split, data in (("training", train_raw), ("held-out", eval_raw)):
        absent = [name for name in task_names if name not in data.column_names]
        if absent:
            logger.warning("The %s data have no %s column: absent task(s), no loss and weight 0", split, absent)
        if len(absent) == len(task_names):
            raise UsageError(
                f"the {split} data have none of the modalities {task_names} (columns: "
                f"{data.column_names}); map them with --column_mapping or set --modalities"
            )
    return train_raw, eval_raw


def visible_token_budget(
    data_args: DataArguments, config: MultiMAEConfig, task_names: list[str], train_raw: Any
) -> int:
    """Visible patches per image: ``--num_visible_tokens``, else 1/6 of all (MultiMAE), at most the data's patches."""
    budget = data_args.num_visible_tokens or max(1, len(task_names) * config.num_patches // 6)
    present = [name for name in task_names if name in train_raw.column_names]
    if budget > config.num_patches * len(present):
        raise UsageError(
            f"--num_visible_tokens {budget} exceeds the {config.num_patches * len(present)} patches of "
            f"the {len(present)} modalities of the data at image size {config.image_size}"
        )
    return budget


def fill_values(config: MultiMAEConfig) -> dict[str, float]:
    """The value a missing non-RGB modality is filled with (an invalid one: no input, no loss)."""
    return {s.name: (s.ignore_index if s.kind == "semseg" else 0.0) for s in config.modalities if s.kind != "rgb"}


@dataclass
class MaskedImages:
    """The checked images of a run and how they reach the model: transformed datasets and the masking collator."""

    train_raw: Any
    eval_raw: Any
    processor: MultiMAEImageProcessor
    budget: int
    train_dataset: Any
    eval_dataset: Any
    collator: HeldOutOrTrainingCollator


def prepare_images(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: MinimaxTrainingArguments,
    config: MultiMAEConfig,
    num_classes: int | None,
) -> MaskedImages:
    """Load and check the images (:func:`load_checked_images`, the budget of visible patches, the examples missing a
    modality, a target for every modality), then attach the crops (training) or resizing (held out) and the masks."""
    task_names = model_args.modalities
    train_raw, eval_raw = load_checked_images(data_args, model_args, config, num_classes)
    processor = build_processor(model_args, data_args, config)
    budget = visible_token_budget(data_args, config, task_names, train_raw)
    fill = fill_values(config)
    for split, data in (("training", train_raw), ("held-out", eval_raw)):
        check_partial_examples(data, split, task_names, fill, budget, config.num_patches)
        require_modality_targets(data, split, processor, config, data_args.do_reduce_labels)

    columns = {name: name for name in task_names}
    train_transform = MultiMAETransform(processor, train=True, seed=training_args.seed, column_mapping=columns)
    train_dataset = train_raw.with_transform(train_transform)
    eval_dataset = eval_raw.add_column(HELD_OUT, [True] * len(eval_raw)).with_transform(
        MultiMAETransform(processor, train=False, column_mapping=columns, keep_columns=("id", HELD_OUT))
    )

    def mask_collator(seed: int) -> ModalityMaskCollator:
        return ModalityMaskCollator(
            budget, config.patch_size, alpha=data_args.mask_alpha, modalities=task_names, fill_values=fill, seed=seed
        )

    collator = HeldOutOrTrainingCollator(mask_collator(training_args.seed), mask_collator(data_args.eval_masking_seed))
    return MaskedImages(train_raw, eval_raw, processor, budget, train_dataset, eval_dataset, collator)
