"""MM-MAE pre-training (:class:`MultiMAEForPreTraining`): the encoder plus one decoder per modality; each
modality's reconstruction is a task, scored on its hidden patches only (and there on its valid targets)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers.utils import ModelOutput

from .configuration_multimae import ModalitySpec, MultiMAEConfig
from .decoder import MultiMAEDecoder
from .encoder import MultiMAEModel, MultiMAEPreTrainedModel
from .modality_values import check_class_ids, prepare_depth
from .patch_grid import patchify, sincos_position_embedding, unpatchify


@dataclass
class MultiMAEForPreTrainingOutput(ModelOutput):
    """Pre-training output.

    Args:
        loss: mean of the task losses of the tasks with at least one target (for the plain ``Trainer``).
        task_losses: modality name -> mean loss over its valid targets in masked patches (per-patch normalised
            pixel values for rgb with ``norm_pix_loss``, valid depth pixels, non-ignored class pixels); only for the
            modalities present in the batch (0 with 0 targets, never NaN).
        task_counts: modality name -> number of target values that mean is over.
        predictions: modality name -> full-image reconstruction in input layout (rgb ``(B,3,H,W)`` un-normalised
            per patch, depth ``(B,1,H,W)`` metres, semseg logits ``(B,C,H,W)``).
        hidden_states: the encoder's hidden states when requested.
    """

    loss: torch.FloatTensor | None = None
    task_losses: dict[str, torch.Tensor] | None = None
    task_counts: dict[str, float] | None = None
    predictions: dict[str, torch.Tensor] | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None


class MultiMAEForPreTraining(MultiMAEPreTrainedModel):
    """MM-MAE pre-training: the encoder plus one decoder per modality; each modality's reconstruction is a task.

    ``forward(**batch)`` takes the collator's batch (modality tensors and ``mask_<name>``) and returns
    :class:`MultiMAEForPreTrainingOutput` with ``task_losses`` / ``task_counts`` for ``MinimaxTrainer``
    (``task_names = config.task_names``). A modality missing from the batch is an absent task (no entry).
    """

    def __init__(self, config: MultiMAEConfig) -> None:
        super().__init__(config)
        self.multimae = MultiMAEModel(config)
        self.decoders = nn.ModuleDict({spec.name: MultiMAEDecoder(config, spec) for spec in config.modalities})
        self.post_init()

    def forward(
        self,
        rgb: torch.Tensor | None = None,
        depth: torch.Tensor | None = None,
        semseg: torch.Tensor | None = None,
        mask_rgb: torch.Tensor | None = None,
        mask_depth: torch.Tensor | None = None,
        mask_semseg: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        return_loss: bool = True,
        **other_modalities: torch.Tensor,
    ) -> MultiMAEForPreTrainingOutput | tuple:
        """``return_loss=False`` leaves ``loss`` unset (``task_losses`` are always computed); its default tells the
        ``Trainer`` that this label-free model returns an evaluation loss."""
        inputs, masks = self._collect_modalities(
            dict(rgb=rgb, depth=depth, semseg=semseg, mask_rgb=mask_rgb, mask_depth=mask_depth, mask_semseg=mask_semseg)
            | other_modalities,
            self.config.task_names,
        )
        encoder = self.multimae
        batch, grid_h, grid_w = encoder.grid_size(inputs)
        num_patches = grid_h * grid_w
        reads_norm = self.config.decoder_reads_encoder_norm
        encoded = encoder.encode(inputs, masks, output_hidden_states=output_hidden_states or not reads_norm)
        present = [spec.name for spec in self.config.modalities if spec.name in inputs]
        config_index = {spec.name: i for i, spec in enumerate(self.config.modalities)}
        hidden_states = encoded.last_hidden_state if reads_norm else encoded.hidden_states[-1]
        decoder_dim = self.config.decoder_hidden_size
        position = sincos_position_embedding(grid_h, grid_w, decoder_dim, hidden_states.device, hidden_states.dtype)
        # Position and source modality of every context token (global tokens: no position, modality -1).
        patch_index = encoded.visible_token_indices % num_patches
        source = torch.tensor([config_index[name] for name in present], device=hidden_states.device)
        source = source[encoded.visible_token_indices // num_patches]
        num_global = self.config.num_global_tokens
        context_positions = torch.cat(
            [hidden_states.new_zeros(batch, num_global, decoder_dim), position[patch_index]], dim=1
        )
        context_modalities = torch.cat([source.new_full((batch, num_global), -1), source], dim=1)
        context_patches = torch.cat([patch_index.new_full((batch, num_global), -1), patch_index], dim=1)

        task_losses, task_counts, predictions = {}, {}, {}
        for name in present:
            spec = self.config.modality(name)
            patch_predictions = self.decoders[name](
                hidden_states,
                context_positions,
                context_modalities,
                context_patches,
                position,
                config_index[name],
                encoded.attention_mask,
            )
            mask = masks.get(name)
            hidden_patches = (
                torch.zeros(batch, num_patches, dtype=torch.bool, device=hidden_states.device)
                if mask is None
                else mask.to(device=hidden_states.device, dtype=torch.bool)
            )
            loss_sum, count, prediction = self._reconstruction_loss(
                spec, patch_predictions, inputs[name], hidden_patches
            )
            task_losses[name] = loss_sum / count.clamp_min(1)
            task_counts[name] = float(count)
            predictions[name] = unpatchify(prediction, self.config.patch_size, grid_h, grid_w)
        with_targets = [task_losses[name] for name in present if task_counts[name] > 0]
        loss = torch.stack(with_targets).mean() if with_targets else sum(task_losses.values())
        output = MultiMAEForPreTrainingOutput(
            loss=loss if return_loss else None,
            task_losses=task_losses,
            task_counts=task_counts,
            predictions=predictions,
            hidden_states=encoded.hidden_states if output_hidden_states else None,
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        return output if return_dict else output.to_tuple()

    def _reconstruction_loss(
        self, spec: ModalitySpec, predicted: torch.Tensor, target: torch.Tensor, hidden_patches: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Loss sum and count over the valid target values of the hidden patches, and the patch predictions in
        input units. ``predicted`` (B, N, p*p*C_out)."""
        patch = self.config.patch_size
        if spec.kind == "semseg":
            ids = patchify(target.long()[:, None], patch)  # (B, N, p*p)
            check_class_ids(ids, spec.num_classes, spec.ignore_index, f"target {spec.name!r}")
            logits = predicted.reshape(*ids.shape, spec.num_classes)
            valid = (ids != spec.ignore_index) & hidden_patches[..., None]
            losses = F.cross_entropy(
                logits.flatten(0, 2).float(), ids.clamp(0, spec.num_classes - 1).flatten(), reduction="none"
            )
            return (losses * valid.flatten()).sum(), valid.sum(), predicted
        target = target.to(predicted.dtype)
        if spec.kind == "depth":  # invalid pixels (0, non-finite, beyond max_depth) are not targets
            target, measured, depth_mean, depth_std = prepare_depth(spec, target)
        values = patchify(target, patch)  # (B, N, p*p*C)
        valid = hidden_patches[..., None].expand_as(values)
        prediction = predicted
        if spec.kind == "depth":
            valid = valid & patchify(measured, patch)
            prediction = predicted * depth_std.flatten(1)[..., None] + depth_mean.flatten(1)[..., None]
        if spec.kind == "rgb" and spec.loss == "mse" and spec.norm_pix_loss:
            mean = values.mean(dim=-1, keepdim=True)
            std = (values.var(dim=-1, keepdim=True) + 1e-6).sqrt()
            values = (values - mean) / std
            prediction = predicted * std + mean
        error = (predicted - values) ** 2 if spec.loss == "mse" else (predicted - values).abs()
        return (error * valid).sum(), valid.sum(), prediction
