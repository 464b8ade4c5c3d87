"""The options of ``robust-pretrain-finetune-dense``: its argument dataclasses and their checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments
from transformers.trainer_utils import SaveStrategy

from robust_pretrain.cli import UsageError
from robust_pretrain.options import LoraArguments, check_options, option
from robust_pretrain.trainer.training_args import use_cpu_when_launched_without_accelerator
from robust_pretrain.vision.loaders import REDUCE_LABELS_HELP, UNMATCHED_HELP, UNMATCHED_MODES
from robust_pretrain.vision.multimae.configuration_multimae import DEPTH_LOSSES, SEMSEG_HEADS

TASKS = ("semseg", "depth", "classification")


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
