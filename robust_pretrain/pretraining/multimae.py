"""Task-robust multi-modal masked-autoencoder pre-training (MM-MAE): one task per image modality.

    accelerate launch recipes/pretrain_multimae.py --config recipes/configs/vision_demo.yaml [--max_steps 100 ...]
    robust-pretrain-multimae --config recipes/configs/vision_demo.yaml      (the same, one process)

Data: generated indoor scenes by default (:mod:`robust_pretrain.vision.scenes`: RGB, metric depth, class maps), or a
folder layout ``<root>/<split>/{rgb,depth,semseg}/<id>.<ext>`` (``--image_folder``), or any ``datasets`` dataset
(``--dataset_name`` with ``--column_mapping rgb=image depth=depth_map ...``). A modality the data do not have is an
absent task (no loss, weight 0); a frame lacking one modality file is refused unless ``--unmatched drop`` (complete
frames only) or ``partial`` (kept: the collator fills that modality with an invalid value and hides it, so it gives
no input and no loss for that frame). Training examples get one random resized crop and flip shared by all their
modalities (the image processor) and a Dirichlet(``mask_alpha``) split of ``num_visible_tokens`` visible patches
across their modalities (the collator); both draw from ``(seed, epoch, image id)``, so a resumed run sees the same
crops and masks as an uninterrupted one. Held-out images are resized whole and masked by a fixed draw
(``eval_masking_seed``, image id): every evaluation, run and strategy scores the same patches.

Every option can come from the ``--config`` YAML/JSON file and be overridden on the command line. The run writes into
``output_dir``: ``model.safetensors``, ``config.json``, ``preprocessor_config.json`` (``AutoModelForPreTraining`` /
``AutoImageProcessor`` load them, no remote code), ``task_report.json`` (per-modality held-out loss, mean, worst),
``task_weights.png``, ``reconstructions.png`` (held-out images: input, masked input, prediction, target per modality),
a model card (README.md), ``*_results.json`` and the Trainer's checkpoints; it resumes from the last checkpoint in
``output_dir`` when there is one (with the same settings).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForPreTraining, set_seed

from robust_pretrain.cli import UsageError, check_checkpoint, run_console
from robust_pretrain.config import OptionParser, parse_with_config
from robust_pretrain.options import check_options, option
from robust_pretrain.output_dir import resume_or_refuse, write_run_config
from robust_pretrain.pretraining.common import (
    bind_tasks,
    create_trainer,
    push,
    refuse_given_options,
    setup_logging,
    train_and_evaluate,
    training_settings,
)
from robust_pretrain.reference import Provenance, check_override, check_reference_run, dataset_fingerprint
from robust_pretrain.reporting import card_renderer, task_report
from robust_pretrain.reporting.plots import plot_reconstructions
from robust_pretrain.reporting.recipe_cards import RECONSTRUCTIONS_NAME, multimae_card_content
from robust_pretrain.reporting.task_report import report_settings, write_report_and_card
from robust_pretrain.targets import refuse_tasks_without_targets
from robust_pretrain.training_args import MinimaxTrainingArguments
from robust_pretrain.vision.collator import ModalityMaskCollator
from robust_pretrain.vision.configuration_multimae import (
    DECODER_VARIANTS,
    DEPTH_NORMALIZATIONS,
    ModalitySpec,
    MultiMAEConfig,
)
from robust_pretrain.vision.image_processing_multimae import MODALITIES, MultiMAEImageProcessor, MultiMAETransform
from robust_pretrain.vision.loaders import (
    REDUCE_LABELS_HELP,
    UNMATCHED_HELP,
    UNMATCHED_MODES,
    UnmatchedStemsError,
    modalities_without_targets,
    unmatched_usage_error,
)

logger = logging.getLogger(__name__)

#: options of a model trained from scratch (a checkpoint keeps its own)
FROM_SCRATCH = ["model_size", "config_overrides", "depth_normalization", "max_depth", "image_size", "patch_size"]
# From-scratch presets: encoder layers, hidden, heads, intermediate; decoder hidden, layers, heads, intermediate.
MODEL_SIZES = {
    "tiny": (2, 64, 4, 256, 64, 1, 4, 256),
    "small": (6, 256, 4, 1024, 128, 2, 4, 512),
    "base": (12, 768, 12, 3072, 256, 2, 8, 1024),  # ViT-B encoder and MultiMAE's decoders
}
# Options that do not change what a run computes: they may differ when it resumes.
NOT_SETTINGS = {"overwrite_output_dir", "num_reconstructions"}
HELD_OUT = "held_out"  # marks held-out rows for the collate function: they get the fixed evaluation masks


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "MM-MAE checkpoint (local dir or Hub id) to continue pre-training; it must load with "
            "AutoModelForPreTraining. Leave unset to train from scratch (see model_size)."
        },
    )
    model_size: str = option("tiny", "From-scratch MM-MAE preset.", choices=list(MODEL_SIZES))
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "From scratch: override config values, e.g. 'hidden_size=128,num_hidden_layers=4'."},
    )
    modalities: list[str] | None = field(
        default=None,
        metadata={"help": "Modalities = tasks, among rgb, depth, semseg (default: a checkpoint's, else all three)."},
    )
    num_semseg_classes: int | None = option(
        None, "Classes of the semseg maps (default for generated scenes: their classes).", minimum=2
    )
    semseg_ignore_index: int = option(255, "Class id of unlabelled semseg pixels.", minimum=0)
    depth_normalization: str = option(
        "standardize_trimmed",
        "From scratch: depth input and loss on each image's depth standardised over its valid pixels as MultiMAE "
        "does, the top and bottom tenth of the values left out of the statistics ('standardize_trimmed', the "
        "default: robust to a sensor's far and stray pixels), with all of them ('standardize'), or on raw metres "
        "('none'). Standardised, the task weights do not depend on the depth unit.",
        choices=list(DEPTH_NORMALIZATIONS),
    )
    max_depth: float = option(
        10.0,
        "From scratch: depth pixels farther than this many metres are invalid (no input, no loss), the NYUv2 "
        "metric's cap; Kinect frames carry 65.535 m 'valid' pixels.",
        above=0,
    )
    decoder_variant: str = option(
        "multimae",
        "From scratch: the cross-attention decoders' variant, 'project' (mask-token queries, a residual around the "
        "cross-attention, a final norm, reading the encoder's final norm) or 'multimae' (MultiMAE's: a visible "
        "patch's query is its own encoded token, none of the three others); see MultiMAEConfig.",
        choices=list(DECODER_VARIANTS),
    )
    image_size: int = option(
        224, "From scratch: side of the square training images (a checkpoint keeps its own).", minimum=1
    )
    patch_size: int = option(
        16, "From scratch: side of a patch, divides image_size (a checkpoint keeps its own).", minimum=1
    )

    def __post_init__(self) -> None:
        check_options(self)
        if self.model_name_or_path is None and self.image_size % self.patch_size:
            raise UsageError(f"--patch_size {self.patch_size} does not divide --image_size {self.image_size}")


@dataclass
class DataArguments:
    image_folder: str | None = option(
        None, "Folder layout <root>/<split>/{rgb,depth,semseg}/<id>.<ext>, matched by file stem.", path="dir"
    )
    dataset_name: str | None = field(
        default=None, metadata={"help": "Dataset on the Hub or a local dataset folder (datasets.load_dataset)."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of dataset_name."})
    column_mapping: list[str] = field(
        default_factory=list,
        metadata={"help": "dataset_name columns as target=column, e.g. rgb=image depth=depth_map id=file_name."},
    )
    train_split: str = field(default="train", metadata={"help": "Training split of image_folder / dataset_name."})
    validation_split: str | None = field(
        default=None,
        metadata={
            "help": "Held-out split (default: 'validation', else 'test'; neither: validation_split_percentage "
            "of the training data)."
        },
    )
    validation_split_percentage: int = option(
        5, "Percent of the training data held out when there is no held-out split.", minimum=1, maximum=99
    )
    unmatched: str = option("error", UNMATCHED_HELP, choices=list(UNMATCHED_MODES))
    depth_scale: float = option(1000.0, "Integer depth units per metre (1000: millimetres).", above=0)
    do_reduce_labels: bool = option(False, REDUCE_LABELS_HELP)
    num_train_scenes: int = option(2000, "Generated scenes: training images.", minimum=1)
    num_eval_scenes: int = option(200, "Generated scenes: held-out images.", minimum=1)
    scene_size: int = option(256, "Generated scenes: rendered side in pixels.", minimum=8)
    scene_seed: int = option(0, "Generated scenes: seed (train and test scenes differ).", minimum=0)
    num_visible_tokens: int | None = option(
        None, "Visible patches per image over all its modalities (default: 1/6 of all, as MultiMAE).", minimum=1
    )
    mask_alpha: float = option(
        1.0, "Dirichlet concentration of the split of visible patches across modalities.", above=0
    )
    crop_scale: list[float] = option(
        default_factory=lambda: [0.2, 1.0], help="Random resized crop: area fraction range.", above=0, maximum=1
    )
    crop_ratio: list[float] = option(
        default_factory=lambda: [0.75, 4 / 3], help="Random resized crop: aspect ratio range.", above=0
    )
    flip_probability: float = option(0.5, "Horizontal flip probability.", minimum=0, maximum=1)
    max_train_samples: int | None = option(None, "Truncate the training set (debugging).", minimum=1)
    max_eval_samples: int | None = option(None, "Truncate the held-out set.", minimum=1)
    eval_masking_seed: int = option(
        1234, "Seed of the held-out masks: every evaluation and run scores the same ones.", minimum=0
    )
    num_reconstructions: int = option(4, "Held-out images shown in reconstructions.png.", minimum=0)
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Start afresh even if output_dir holds checkpoints (they are deleted)."}
    )

    def __post_init__(self) -> None:
        if self.image_folder is not None and self.dataset_name is not None:
            raise UsageError("give --image_folder or --dataset_name, not both")
        if self.column_mapping and self.dataset_name is None:
            raise UsageError("--column_mapping applies to --dataset_name only")
        if self.do_reduce_labels and self.image_folder is None and self.dataset_name is None:
            raise UsageError(
                "--do_reduce_labels: the generated scenes' class ids start at 0; it is for --image_folder / "
                "--dataset_name maps with 0 = unlabelled, 1..K = classes"
            )
        check_options(self)
        if len(self.crop_scale) != 2 or len(self.crop_ratio) != 2:
            raise UsageError("--crop_scale and --crop_ratio take two values each (min max)")
        if self.crop_scale[0] > self.crop_scale[1] or self.crop_ratio[0] > self.crop_ratio[1]:
            raise UsageError(f"--crop_scale {self.crop_scale} / --crop_ratio {self.crop_ratio}: give min then max")

    def mapping(self) -> dict[str, str]:
        """``--column_mapping`` as {target: column}."""
        pairs = [item.partition("=") for item in self.column_mapping]
        bad = [
            item
            for item, (target, sep, column) in zip(self.column_mapping, pairs, strict=True)
            if not (target and sep and column)
        ]
        if bad:
            raise UsageError(f"--column_mapping entries look like target=column, got {bad}")
        return {target: column for target, _, column in pairs}


def resolve_modalities(model_args: ModelArguments) -> list[str]:
    """The modalities (= task names), set in ``model_args``: --modalities, else a checkpoint's, else all three."""
    modalities, checkpoint = model_args.modalities, model_args.model_name_or_path
    if modalities is None and checkpoint is not None:
        check_checkpoint(checkpoint)
        try:
            model_args.modalities = list(AutoConfig.from_pretrained(checkpoint).task_names)
        except (OSError, ValueError, AttributeError) as err:
            raise UsageError(f"--model_name_or_path {checkpoint}: not an MM-MAE checkpoint ({err})") from err
        return model_args.modalities
    modalities = list(MODALITIES) if modalities is None else [str(m) for m in modalities]
    unknown = [m for m in modalities if m not in MODALITIES]
    if unknown or not modalities or len(set(modalities)) != len(modalities):
        raise UsageError(f"--modalities {modalities}: give distinct names among {list(MODALITIES)}")
    model_args.modalities = modalities
    return modalities


def run_config(model_args: ModelArguments, data_args: DataArguments, training_args: MinimaxTrainingArguments) -> dict:
    """Every setting that changes the result (model, data, augmentation, masking, strategy, optimiser, schedule,
    seeds): a run resumes only with the same ones (``max_steps`` may grow)."""
    config = {k: v for k, v in {**asdict(model_args), **asdict(data_args)}.items() if k not in NOT_SETTINGS}
    config.update(training_settings(training_args))
    return config


# ---------------------------------------------------------------------------------------------------------- data


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


# --------------------------------------------------------------------------------------------------------- model


def modality_specs(model_args: ModelArguments, num_classes: int | None) -> list[ModalitySpec]:
    specs = []
    for name in model_args.modalities:
        if name == "semseg":
            if num_classes is None:
                raise UsageError("--num_semseg_classes: the semseg modality needs the number of classes of the data")
            specs.append(
                ModalitySpec(name, "semseg", num_classes=num_classes, ignore_index=model_args.semseg_ignore_index)
            )
        elif name == "depth":
            specs.append(
                ModalitySpec(
                    name,
                    "depth",
                    depth_normalization=model_args.depth_normalization,
                    max_depth=model_args.max_depth,
                )
            )
        else:
            specs.append(ModalitySpec(name, name))
    return specs


def load_model(model_args: ModelArguments, num_classes: int | None):
    if model_args.model_name_or_path is not None:
        try:
            model = AutoModelForPreTraining.from_pretrained(model_args.model_name_or_path)
        except (OSError, ValueError) as err:
            raise UsageError(f"--model_name_or_path {model_args.model_name_or_path}: {err}") from err
        if getattr(model.config, "model_type", None) != MultiMAEConfig.model_type:
            raise UsageError(
                f"--model_name_or_path {model_args.model_name_or_path} is a {model.config.model_type} "
                "checkpoint, not MM-MAE (model_type multimae)"
            )
        return model
    layers, hidden, heads, intermediate, dec_hidden, dec_layers, dec_heads, dec_intermediate = MODEL_SIZES[
        model_args.model_size
    ]
    specs = modality_specs(model_args, num_classes)
    try:
        config = MultiMAEConfig(
            modalities=specs,
            image_size=model_args.image_size,
            patch_size=model_args.patch_size,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            decoder_hidden_size=dec_hidden,
            decoder_num_hidden_layers=dec_layers,
            decoder_num_attention_heads=dec_heads,
            decoder_intermediate_size=dec_intermediate,
            **DECODER_VARIANTS[model_args.decoder_variant],
        )
        if model_args.config_overrides:
            config.update_from_string(model_args.config_overrides)
            config = MultiMAEConfig(**config.to_dict())  # re-validated
    except ValueError as err:
        raise UsageError(f"model settings (--image_size, --patch_size, --config_overrides): {err}") from err
    return AutoModelForPreTraining.from_config(config)


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


# ---------------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``robust-pretrain-multimae``, ``recipes/pretrain_multimae.py``): exit status 2 and one
    paragraph for a bad option, file or checkpoint."""
    return run_console(run, argv, prog="robust-pretrain-multimae")


def run(argv: list[str]) -> dict:
    """Pre-train as ``argv`` says; the held-out metrics and the task report."""
    parser = OptionParser((ModelArguments, DataArguments, MinimaxTrainingArguments), description=__doc__)
    parser.set_defaults(
        report_to=[],
        save_total_limit=3,
        remove_unused_columns=False,  # the image transform needs the raw columns and the ids
        learning_rate=1e-4,  # the paper's (MultiMAE's) optimiser: AdamW, lr 1e-4, wd 0.05, warm-up then cosine
        weight_decay=0.05,
        adam_beta2=0.95,
        lr_scheduler_type="cosine",
        warmup_steps=0.05,
    )
    model_args, data_args, training_args = parse_with_config(parser, argv)
    check_override(training_args.reference_mismatch_ok, {"reference_run": training_args.reference_run})
    check_checkpoint(model_args.model_name_or_path)
    if model_args.model_name_or_path is not None:
        refuse_given_options(
            argv, FROM_SCRATCH, "from-scratch options, unused with --model_name_or_path (the checkpoint keeps its own)"
        )
    task_names = resolve_modalities(model_args)
    bind_tasks(training_args, task_names, "the modalities")

    setup_logging(training_args, logger)
    logger.info(
        "weighting=%s modalities=%s output_dir=%s", training_args.weighting, task_names, training_args.output_dir
    )
    settings = run_config(model_args, data_args, training_args)
    resume_checkpoint = resume_or_refuse(training_args, settings, overwrite=data_args.overwrite_output_dir)
    set_seed(training_args.seed)

    scene_data = data_args.image_folder is None and data_args.dataset_name is None
    num_classes = model_args.num_semseg_classes
    if num_classes is None and scene_data:
        from robust_pretrain.vision import scenes

        num_classes = scenes.NUM_CLASSES
    model = load_model(model_args, num_classes if "semseg" in task_names else None)
    config: MultiMAEConfig = model.config
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
    processor = build_processor(model_args, data_args, config)
    budget = data_args.num_visible_tokens or max(1, len(task_names) * config.num_patches // 6)
    present = [name for name in task_names if name in train_raw.column_names]
    if budget > config.num_patches * len(present):
        raise UsageError(
            f"--num_visible_tokens {budget} exceeds the {config.num_patches * len(present)} patches of "
            f"the {len(present)} modalities of the data at image size {config.image_size}"
        )
    fill = {s.name: (s.ignore_index if s.kind == "semseg" else 0.0) for s in config.modalities if s.kind != "rgb"}
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

    train_collator = mask_collator(training_args.seed)
    collator = HeldOutOrTrainingCollator(train_collator, mask_collator(data_args.eval_masking_seed))

    held_out = dataset_fingerprint(
        eval_raw, data_args.eval_masking_seed, budget, data_args.mask_alpha, config.image_size, config.patch_size
    )
    provenance = Provenance.of_run(task_names, None, dataset_fingerprint(train_raw), held_out, model)
    check_reference_run(training_args.reference_run, training_args.reference_mismatch_ok, provenance)
    write_run_config(training_args, settings)
    trainer = create_trainer(
        training_args,
        model=model,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processor,
        data_collator=collator,
    )
    eval_metrics = train_and_evaluate(trainer, resume_checkpoint)

    recipe_settings = {
        "image_size": config.image_size,
        "patch_size": config.patch_size,
        "num_visible_tokens": budget,
        "mask_alpha": data_args.mask_alpha,
    }
    stated = report_settings(training_args, trainer.state.max_steps, recipe_settings)
    final_weights = trainer.step_weights.tolist()
    report = task_report(task_names, trainer.state.log_history, eval_metrics, stated, final_weights, provenance)
    output_dir = Path(training_args.output_dir)
    base = trainer.accelerator.unwrap_model(trainer.model)
    reconstructions = training_args.should_save and data_args.num_reconstructions > 0
    if reconstructions:
        shown = eval_dataset.select(range(min(data_args.num_reconstructions, len(eval_dataset))))
        examples = [shown[i] for i in range(len(shown))]
        plot_reconstructions(
            base, collator(examples), [e["id"] for e in examples], processor, output_dir / RECONSTRUCTIONS_NAME
        )
    content = multimae_card_content(
        base, report, model_args, data_args, len(train_raw), len(eval_raw), reconstructions=reconstructions
    )
    write_report_and_card(trainer, report, card_renderer(trainer, content))
    push(trainer)
    return {**eval_metrics, "report": report}


if __name__ == "__main__":
    raise SystemExit(main())
