"""MM-MAE fine-tuning models: every patch of ``config.finetune_modalities`` (RGB by default) is encoded; a linear
classifier reads the global token (:class:`MultiMAEForImageClassification`), the dense heads are transformers' DPT
neck and heads (:class:`MultiMAEForSemanticSegmentation`, optionally MultiMAE's ConvNeXt head;
:class:`MultiMAEForDepthEstimation`, optionally MultiMAE's berHu loss)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers import DPTConfig
from transformers import initialization as init
from transformers.modeling_outputs import DepthEstimatorOutput, ImageClassifierOutput, SemanticSegmenterOutput
from transformers.models.dpt.modeling_dpt import DPTDepthEstimationHead, DPTNeck, DPTSemanticSegmentationHead

from .configuration_multimae import MultiMAEConfig
from .convnext_head import ConvNeXtSegmentationHead
from .encoder import MultiMAEModel, MultiMAEModelOutput, MultiMAEPreTrainedModel
from .lora import is_lora_output, load_lora_output
from .losses import depth_loss
from .modality_values import check_class_ids


class MultiMAEFineTuningModel(MultiMAEPreTrainedModel):
    """Shared input handling of the fine-tuning heads: every patch of the ``finetune_modalities`` is encoded.

    The RGB input comes as ``pixel_values`` (the transformers convention) or under its modality name; other inputs
    (``depth`` when ``finetune_modalities`` lists it) under their modality names. Loading a pre-training checkpoint
    keeps the encoder and initialises the head (the usual missing-weights report).
    """

    main_input_name = "pixel_values"

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, *model_args: Any, **kwargs: Any
    ) -> MultiMAEFineTuningModel:
        """``PreTrainedModel.from_pretrained``; a LoRA output folder of ``robust-pretrain-finetune-dense`` (adapters,
        head and ``config.json``, no model weights) loads as the base checkpoint its ``adapter_config.json`` names
        with the adapters and the head merged in (:mod:`robust_pretrain.vision.multimae.lora`)."""
        if is_lora_output(pretrained_model_name_or_path):
            return load_lora_output(super().from_pretrained, pretrained_model_name_or_path, *model_args, **kwargs)
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)

    def _encode_finetune_inputs(
        self, pixel_values: torch.Tensor | None, modality_inputs: dict[str, torch.Tensor | None], hidden_states: bool
    ) -> tuple[MultiMAEModelOutput, tuple[int, int], tuple[int, int]]:
        """Encode; returns the encoder output, the patch grid and the image size."""
        allowed = list(self.config.finetune_modalities)
        inputs, masks = self._collect_modalities(modality_inputs, allowed)
        if pixel_values is not None:
            rgb_name = next((n for n in allowed if self.config.modality(n).kind == "rgb"), None)
            if rgb_name is None:
                raise ValueError(f"pixel_values is an RGB image but finetune_modalities {allowed} has no rgb modality")
            if rgb_name in inputs:
                raise ValueError(f"give the RGB input once, as pixel_values or as {rgb_name!r}")
            inputs[rgb_name] = pixel_values
        if masks:
            raise ValueError(f"{type(self).__name__} encodes every patch: no masks (got mask_ for {sorted(masks)})")
        missing = [name for name in allowed if name not in inputs]
        if missing:
            raise ValueError(f"{type(self).__name__} needs the finetune_modalities {allowed}: missing {missing}")
        _, grid_h, grid_w = self.multimae.grid_size(inputs)
        patch = self.config.patch_size
        output = self.multimae.encode(inputs, {}, output_hidden_states=hidden_states)
        return output, (grid_h, grid_w), (grid_h * patch, grid_w * patch)


class MultiMAEForImageClassification(MultiMAEFineTuningModel):
    """Image classification: a linear classifier on the final global token (as ``ViTForImageClassification`` reads
    its [CLS] token, so an exported encoder fine-tunes the same way). Loss: transformers' classification loss
    (``config.problem_type``)."""

    def __init__(self, config: MultiMAEConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.multimae = MultiMAEModel(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def head_modules(self) -> list[str]:
        """The modules of the head (LoRA's ``modules_to_save``)."""
        return ["classifier"]

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        rgb: torch.Tensor | None = None,
        depth: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **other_modalities: torch.Tensor,
    ) -> ImageClassifierOutput | tuple:
        encoded, _, _ = self._encode_finetune_inputs(
            pixel_values, {"rgb": rgb, "depth": depth, **other_modalities}, bool(output_hidden_states)
        )
        logits = self.classifier(encoded.last_hidden_state[:, 0])
        loss = None
        if labels is not None:
            if self.num_labels > 1 and not labels.is_floating_point():
                check_class_ids(labels, self.num_labels, -100, "labels")
            loss = self.loss_function(labels, logits, self.config)
        output = ImageClassifierOutput(loss=loss, logits=logits, hidden_states=encoded.hidden_states)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        return output if return_dict else output.to_tuple()


def _dpt_config(config: MultiMAEConfig) -> DPTConfig:
    """The settings transformers' DPT neck and heads read, from an MM-MAE config."""
    return DPTConfig(
        hidden_size=config.hidden_size,
        hidden_act=config.hidden_act,
        neck_hidden_sizes=list(config.neck_hidden_sizes),
        reassemble_factors=[4, 2, 1, 0.5],
        fusion_hidden_size=config.fusion_hidden_size,
        readout_type="project",
        is_hybrid=False,
        num_labels=config.num_labels,
        semantic_classifier_dropout=config.semantic_classifier_dropout,
        head_in_index=-1,
        add_projection=False,
        use_batch_norm_in_fusion_residual=False,
        neck_ignore_stages=[],
    )


class MultiMAEDenseModel(MultiMAEFineTuningModel):
    """A DPT reassemble-and-fuse neck (transformers' ``DPTNeck``) over four encoder layers (``head_layer_indices``);
    ``neck=False`` leaves it out for a head that reads the encoder itself (the ConvNeXt segmentation head).

    DPT rather than a progressive-upsampling head: MultiMAE fine-tunes its dense tasks with DPT, the neck combines
    shallow (fine) and deep (semantic) layers, and transformers already ships it, so nothing is re-implemented. At
    each layer the patch tokens of the input modalities are averaged per position and the global token is the DPT
    readout token.
    """

    def __init__(self, config: MultiMAEConfig, neck: bool = True) -> None:
        super().__init__(config)
        self.multimae = MultiMAEModel(config)
        if neck:
            self.neck = DPTNeck(_dpt_config(config))

    def head_modules(self) -> list[str]:
        """The modules of the head (LoRA's ``modules_to_save``): the DPT head is named by its only child, so that
        a suffix match cannot catch that child as a second module."""
        return ["neck", "head.head"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """As the encoder, except He (fan-in, ReLU) initialisation for the convolutions of the neck and head: with
        ``normal(0.02)`` their output vanishes through the fusion stack unless the channels are wide."""
        super()._init_weights(module)
        if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)) and not any(
            module is encoder_module for encoder_module in self.multimae.modules()
        ):
            init.kaiming_normal_(module.weight, nonlinearity="relu")

    def _fused_features(
        self, pixel_values: torch.Tensor | None, modality_inputs: dict[str, torch.Tensor | None]
    ) -> tuple[list[torch.Tensor], tuple[int, int], tuple[tuple[torch.Tensor, ...], ...]]:
        encoded, (grid_h, grid_w), image_size = self._encode_finetune_inputs(pixel_values, modality_inputs, True)
        num_global, num_inputs = self.config.num_global_tokens, len(self.config.finetune_modalities)
        layers = []
        for index in self.config.head_layer_indices:
            hidden = encoded.hidden_states[index + 1]
            patches = hidden[:, num_global:].reshape(hidden.shape[0], num_inputs, grid_h * grid_w, -1).mean(1)
            layers.append(torch.cat([hidden[:, :1], patches], dim=1))
        return self.neck(layers, grid_h, grid_w), image_size, encoded.hidden_states


class MultiMAEForSemanticSegmentation(MultiMAEDenseModel):
    """Semantic segmentation (``config.num_labels`` classes) with a DPT neck and transformers' DPT segmentation head,
    or with ``config.semseg_head="convnext"`` MultiMAE's ConvNeXt head on the encoder's last layer (before its final
    norm: MultiMAE's encoder has none), the input modalities' tokens of a patch concatenated as MultiMAE does.

    ``logits`` are upsampled (bilinear) to the label map's size when ``labels`` are given, else to the input size;
    so a label map of another size than the image is scored at its own resolution (never resized). Loss: pixel
    cross-entropy ignoring ``config.semantic_loss_ignore_index``; other ids outside ``0..num_labels-1`` are an error.
    """

    def __init__(self, config: MultiMAEConfig) -> None:
        convnext = config.semseg_head == "convnext"
        super().__init__(config, neck=not convnext)
        if convnext:
            self.head = ConvNeXtSegmentationHead(
                config.hidden_size * len(config.finetune_modalities),
                config.convnext_head_dim,
                config.convnext_preds_per_patch,
                config.convnext_num_blocks,
                config.num_labels,
            )
        else:
            self.head = DPTSemanticSegmentationHead(_dpt_config(config))
        self.post_init()

    def head_modules(self) -> list[str]:
        return ["head"] if self.config.semseg_head == "convnext" else super().head_modules()

    def _convnext_logits(
        self, pixel_values: torch.Tensor | None, modality_inputs: dict[str, torch.Tensor | None]
    ) -> tuple[torch.Tensor, tuple[int, int], tuple[torch.Tensor, ...]]:
        encoded, (grid_h, grid_w), image_size = self._encode_finetune_inputs(pixel_values, modality_inputs, True)
        last = encoded.hidden_states[-1][:, self.config.num_global_tokens :]
        batch, num_inputs = last.shape[0], len(self.config.finetune_modalities)
        tokens = last.reshape(batch, num_inputs, grid_h * grid_w, -1).permute(0, 2, 1, 3).flatten(2)
        return self.head(tokens, grid_h, grid_w), image_size, encoded.hidden_states

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        rgb: torch.Tensor | None = None,
        depth: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **other_modalities: torch.Tensor,
    ) -> SemanticSegmenterOutput | tuple:
        modality_inputs = {"rgb": rgb, "depth": depth, **other_modalities}
        if self.config.semseg_head == "convnext":
            logits, image_size, hidden_states = self._convnext_logits(pixel_values, modality_inputs)
        else:
            features, image_size, hidden_states = self._fused_features(pixel_values, modality_inputs)
            logits = self.head(features)
        size = tuple(labels.shape[-2:]) if labels is not None else image_size
        logits = F.interpolate(logits, size=size, mode="bilinear", align_corners=False)
        loss = None
        if labels is not None:
            if labels.dim() != 3:
                raise ValueError(f"labels has shape {tuple(labels.shape)}; expected (B, H, W) class ids")
            ignore = self.config.semantic_loss_ignore_index
            labels = labels.long()
            check_class_ids(labels, self.config.num_labels, ignore, "labels")
            valid = labels != ignore
            losses = F.cross_entropy(logits.float(), labels.masked_fill(~valid, 0), reduction="none")
            loss = (losses * valid).sum() / valid.sum().clamp_min(1)
        output = SemanticSegmenterOutput(
            loss=loss, logits=logits, hidden_states=hidden_states if output_hidden_states else None
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        return output if return_dict else output.to_tuple()


class MultiMAEForDepthEstimation(MultiMAEDenseModel):
    """Monocular depth with a DPT neck and transformers' DPT depth head (non-negative output, metres).

    ``predicted_depth`` (B, H, W) is upsampled (bilinear) to the label size when ``labels`` are given, else to the
    input size. Loss (``config.depth_loss``): L1 in metres over the valid pixels (label > 0 and finite), 0 when a
    batch has none, or MultiMAE's berHu over them (``robust_pretrain.vision.multimae.losses.depth_loss``). L1 by
    default rather than the scale-invariant log loss: it scores the metric depth the metrics (δ1, AbsRel, RMSE)
    evaluate, is the pre-training depth loss, and needs no log of a zero prediction from the ReLU output.
    """

    def __init__(self, config: MultiMAEConfig) -> None:
        super().__init__(config)
        self.head = DPTDepthEstimationHead(_dpt_config(config))
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        rgb: torch.Tensor | None = None,
        depth: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **other_modalities: torch.Tensor,
    ) -> DepthEstimatorOutput | tuple:
        features, image_size, hidden_states = self._fused_features(
            pixel_values, {"rgb": rgb, "depth": depth, **other_modalities}
        )
        if labels is not None and labels.dim() == 4 and labels.shape[1] == 1:
            labels = labels[:, 0]
        if labels is not None and labels.dim() != 3:
            raise ValueError(f"labels has shape {tuple(labels.shape)}; expected (B, H, W) depth in metres")
        size = tuple(labels.shape[-2:]) if labels is not None else image_size
        predicted = self.head(features)[:, None]
        predicted_depth = F.interpolate(predicted, size=size, mode="bilinear", align_corners=False)[:, 0]
        loss = None
        if labels is not None:
            labels = labels.to(predicted_depth.dtype)
            loss = depth_loss(self.config.depth_loss, predicted_depth, labels, (labels > 0) & torch.isfinite(labels))
        output = DepthEstimatorOutput(
            loss=loss, predicted_depth=predicted_depth, hidden_states=hidden_states if output_hidden_states else None
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        return output if return_dict else output.to_tuple()
