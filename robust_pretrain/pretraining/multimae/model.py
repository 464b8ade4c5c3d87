"""The model of the MM-MAE pre-training recipe: a checkpoint to continue, or a from-scratch MM-MAE of a preset size."""

from __future__ import annotations

from transformers import AutoModelForPreTraining

from robust_pretrain.cli import UsageError
from robust_pretrain.pretraining.multimae.arguments import MODEL_SIZES, DataArguments, ModelArguments
from robust_pretrain.vision.multimae.configuration_multimae import DECODER_VARIANTS, ModalitySpec, MultiMAEConfig


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


def semseg_classes(model_args: ModelArguments, data_args: DataArguments) -> int | None:
    """The classes of the semseg maps: ``--num_semseg_classes``, else the generated scenes' (unknown for other data)."""
    num_classes = model_args.num_semseg_classes
    if num_classes is None and data_args.image_folder is None and data_args.dataset_name is None:
        from robust_pretrain.vision import scenes

        num_classes = scenes.NUM_CLASSES
    return num_classes
