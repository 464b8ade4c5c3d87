"""Export the MM-MAE encoder as a standard transformers ViT checkpoint (RGB input).

The encoder with one global token computes exactly what ``ViTModel`` computes on the RGB patches: the global token
becomes the [CLS] token (position embedding 0), the fixed sine-cosine table at ``config.image_size`` becomes ViT's
``position_embeddings``, the RGB patch projection becomes ViT's patch projection, and the ViT layers and final
layer norm carry over unchanged. ``ViTModel`` / ``ViTForImageClassification.from_pretrained`` then load the output
without custom code (the pooler, which MM-MAE lacks, and any classifier are initialised as usual). Only the RGB
(or the named pixel) modality's projection is exported; the other modalities and the decoders are not.

Command line: ``python -m robust_pretrain.vision.multimae.export <MM-MAE checkpoint> <output dir> [--modality rgb]``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoImageProcessor, BaseImageProcessor, ViTConfig, ViTModel
from transformers.image_utils import PILImageResampling
from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil

from robust_pretrain.cli import ConsoleArgumentParser, UsageError, check_checkpoint, refuse, run_console
from robust_pretrain.options import path_problem

from .configuration_multimae import MultiMAEConfig
from .encoder import MultiMAEModel, MultiMAEPreTrainedModel
from .patch_grid import sincos_position_embedding


def encoder_to_vit(model: MultiMAEPreTrainedModel, modality: str | None = None) -> ViTModel:
    """A ``ViTModel`` (no pooler) with the encoder's weights, reading ``modality`` (default: the rgb modality)."""
    config: MultiMAEConfig = model.config
    encoder: MultiMAEModel = model if isinstance(model, MultiMAEModel) else model.multimae
    name = modality or next((s.name for s in config.modalities if s.kind == "rgb"), None)
    if name is None:
        raise ValueError(f"the model has no rgb modality (modalities {config.task_names}); name one with modality=")
    spec = config.modality(name)
    if spec.kind == "semseg":
        raise ValueError(f"modality {name!r} is a class-id map; a ViT reads pixel images (rgb or depth)")
    if config.num_global_tokens != 1:
        raise ValueError(f"a ViT has one [CLS] token; this encoder has num_global_tokens={config.num_global_tokens}")
    vit_config = ViTConfig(
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act,
        hidden_dropout_prob=config.hidden_dropout_prob,
        attention_probs_dropout_prob=config.attention_probs_dropout_prob,
        initializer_range=config.initializer_range,
        layer_norm_eps=config.layer_norm_eps,
        image_size=[config.image_height, config.image_width],
        patch_size=config.patch_size,
        num_channels=spec.channels,
        qkv_bias=config.qkv_bias,
        encoder_stride=config.patch_size,
    )
    vit = ViTModel(vit_config, add_pooling_layer=False)
    grid_h, grid_w = config.image_grid_size()
    source = encoder.state_dict()
    position = sincos_position_embedding(grid_h, grid_w, config.hidden_size, torch.device("cpu"), torch.float32)
    state = {
        "embeddings.cls_token": source["embeddings.global_tokens"],
        "embeddings.position_embeddings": torch.cat([position.new_zeros(1, config.hidden_size), position])[None],
        "embeddings.patch_embeddings.projection.weight": source[
            f"embeddings.patch_embeddings.{name}.projection.weight"
        ],
        "embeddings.patch_embeddings.projection.bias": source[f"embeddings.patch_embeddings.{name}.projection.bias"],
    }
    state.update({key: value for key, value in source.items() if key.startswith(("layers.", "layernorm."))})
    vit.load_state_dict(state, strict=True)
    return vit


def vit_image_processor(processor: BaseImageProcessor) -> ViTImageProcessorPil:
    """ViT's image processor doing what ``processor`` (an MM-MAE image processor) does to RGB at evaluation: resize
    (bilinear) to its ``size``, scale to [0, 1], normalise with its ``image_mean`` / ``image_std``."""
    return ViTImageProcessorPil(
        size=dict(processor.size),
        image_mean=list(processor.image_mean),
        image_std=list(processor.image_std),
        resample=PILImageResampling.BILINEAR,
    )


def export_vit(
    model_or_path: MultiMAEPreTrainedModel | str | os.PathLike,
    output_dir: str | os.PathLike,
    modality: str | None = None,
) -> Path:
    """Write the encoder of an MM-MAE model (or checkpoint) as a ViT checkpoint; returns ``output_dir``.

    Given a checkpoint with a ``preprocessor_config.json``, the output also gets the matching ViT image processor,
    so ``pipeline(..., model=output_dir)`` prepares images as the MM-MAE processor does at evaluation.
    """
    output = Path(output_dir)
    existing = output / "config.json"
    if existing.is_file() and json.loads(existing.read_text()).get("model_type") != "vit":
        raise FileExistsError(f"{output} holds another (non-ViT) checkpoint; export to a new directory")
    model, processor = model_or_path, None
    if not isinstance(model, MultiMAEPreTrainedModel):
        model = MultiMAEModel.from_pretrained(model_or_path)
        try:
            processor = AutoImageProcessor.from_pretrained(model_or_path)
        except OSError:  # a checkpoint without preprocessor_config.json
            processor = None
    encoder_to_vit(model, modality).save_pretrained(output)
    if processor is not None:
        vit_image_processor(processor).save_pretrained(output)
    return output


def run(argv: Sequence[str] | None = None) -> Path:
    parser = ConsoleArgumentParser(prog="robust-pretrain-export-vit", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="MM-MAE checkpoint directory (or Hub id)")
    parser.add_argument("output_dir", help="where to write the ViT checkpoint")
    parser.add_argument("--modality", default=None, help="modality the ViT reads (default: the rgb modality)")
    args = parser.parse_args(argv)
    check_checkpoint(args.checkpoint, "checkpoint")
    refuse([f"output_dir {args.output_dir}: {why}" for why in [path_problem(args.output_dir, "output_dir")] if why])
    try:
        config = MultiMAEConfig.from_pretrained(args.checkpoint)
    except (OSError, ValueError) as err:
        raise UsageError(f"checkpoint {args.checkpoint} is not an MM-MAE checkpoint ({err})") from err
    pixel_modalities = [spec.name for spec in config.modalities if spec.kind != "semseg"]
    if args.modality is not None and args.modality not in pixel_modalities:
        raise UsageError(
            f"--modality {args.modality}: the checkpoint's pixel modalities are {', '.join(pixel_modalities)}"
        )
    try:
        output = export_vit(args.checkpoint, args.output_dir, args.modality)
    except (FileExistsError, ValueError) as err:
        raise UsageError(str(err)) from err
    print(f"ViT checkpoint written to {output}")
    return output


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``robust-pretrain-export-vit``): exit status 2 and one paragraph for a bad input."""
    return run_console(run, argv, prog="robust-pretrain-export-vit")


if __name__ == "__main__":
    raise SystemExit(main())
