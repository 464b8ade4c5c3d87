"""The options of the MM-MAE pre-training recipe (:mod:`robust_pretrain.pretraining.multimae.recipe`): model and data
arguments, the modalities (= tasks) they name, and the settings a resumed run must share."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from transformers import AutoConfig

from robust_pretrain.cli import UsageError, check_checkpoint
from robust_pretrain.options import check_options, option
from robust_pretrain.pretraining.common import training_settings
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments
from robust_pretrain.vision.loaders import REDUCE_LABELS_HELP, UNMATCHED_HELP, UNMATCHED_MODES
from robust_pretrain.vision.multimae.configuration_multimae import DECODER_VARIANTS, DEPTH_NORMALIZATIONS
from robust_pretrain.vision.multimae.image_processing_multimae import MODALITIES

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
