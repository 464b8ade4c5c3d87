"""The dense fine-tuning's models: the checkpoint's type, the task model and its LoRA wiring, the layer-wise
parameter groups and the merged save."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import PretrainedConfig, PreTrainedModel, ViTConfig, ViTForImageClassification

from robust_pretrain.cli import UsageError, check_checkpoint
from robust_pretrain.options import LoraArguments
from robust_pretrain.vision.finetune.arguments import DenseModelArguments, DenseRunArguments
from robust_pretrain.vision.multimae.configuration_multimae import MultiMAEConfig
from robust_pretrain.vision.multimae.heads import (
    MultiMAEForDepthEstimation,
    MultiMAEForImageClassification,
    MultiMAEForSemanticSegmentation,
)
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor

# Model class per task; LoRA trains and saves its head_modules() fully.
MULTIMAE_HEADS = {
    "semseg": MultiMAEForSemanticSegmentation,
    "depth": MultiMAEForDepthEstimation,
    "classification": MultiMAEForImageClassification,
}
_NO_WEIGHT_DECAY = re.compile(r"global_tokens|cls_token|position_embeddings")
_ENCODER_LAYER = re.compile(r"(?:^|\.)(?:multimae\.layers|encoder\.layer)\.(\d+)\.")
_EMBEDDINGS = re.compile(r"(?:^|\.)(?:multimae|vit)\.embeddings\.")


def requested_image_size(image_size: list[int] | None, patch_size: int) -> tuple[int, int] | None:
    """``--image_size`` (one side or height width) as (height, width), each a multiple of the patch size."""
    if image_size is None:
        return None
    height, width = (image_size * 2)[:2]
    if height % patch_size or width % patch_size:
        raise UsageError(
            f"--image_size {' '.join(map(str, image_size))}: not a multiple of the checkpoint's patch size {patch_size}"
        )
    return height, width


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


def save_merged(model: PeftModel, processor: MultiMAEImageProcessor, directory: Path) -> Path:
    """Save ``model`` with its LoRA adapters merged in (the trained head replacing the original one) and the image
    processor into ``directory``: a plain checkpoint for ``AutoModelFor*.from_pretrained`` and the pipelines."""
    model.merge_and_unload().save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory
