"""The MM-MAE encoder (:class:`MultiMAEModel`) and the base class of every MM-MAE model.

Each modality is cut into ``patch_size`` patches and projected by its own linear patch projection (a class embedding
first for semantic maps); the visible patches of all modalities, each plus its fixed 2D sine-cosine position
embedding, follow ``num_global_tokens`` learned global tokens into one shared ViT encoder (transformers'
``ViTLayer``). With one global token and RGB input it computes exactly what a ``ViTModel`` computes, which is what
:mod:`robust_pretrain.vision.multimae.export` relies on."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import BaseModelOutput
from transformers.models.vit.modeling_vit import ViTLayer

from .configuration_multimae import ModalitySpec, MultiMAEConfig
from .decoder import MultiMAEDecoder
from .modality_values import check_class_ids, prepare_depth
from .patch_grid import sincos_position_embedding


@dataclass
class MultiMAEModelOutput(BaseModelOutput):
    """``BaseModelOutput`` plus where the encoded patch tokens come from.

    Args:
        visible_token_indices: ``(B, V)`` index of each encoded patch token (after the global tokens) in the
            concatenation of the present modalities' patch grids, in config order (``m * N + patch``).
        attention_mask: ``(B, G + V)``, 1 = real token, 0 = padding; ``None`` when every sample has ``V`` visible
            patches (the collator's fixed budget).
    """

    visible_token_indices: torch.LongTensor | None = None
    attention_mask: torch.Tensor | None = None


class MultiMAEPatchEmbedding(nn.Module):
    """One modality's linear patch projection (a ``patch_size`` strided convolution); semantic class ids go through
    a class embedding first (ignored pixels get an extra "unknown" class)."""

    def __init__(self, config: MultiMAEConfig, spec: ModalitySpec) -> None:
        super().__init__()
        self.spec = spec
        in_channels = spec.channels
        if spec.kind == "semseg":
            self.class_embedding = nn.Embedding(spec.num_classes + 1, config.class_embed_dim)
            in_channels = config.class_embed_dim
        self.projection = nn.Conv2d(
            in_channels, config.hidden_size, kernel_size=config.patch_size, stride=config.patch_size
        )

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        if self.spec.kind == "semseg":
            ids = values.long()
            check_class_ids(ids, self.spec.num_classes, self.spec.ignore_index, f"input {self.spec.name!r}")
            ids = torch.where(ids == self.spec.ignore_index, self.spec.num_classes, ids)
            values = self.class_embedding(ids).permute(0, 3, 1, 2)
        else:
            values = values.to(self.projection.weight.dtype)
            if self.spec.kind == "depth":  # invalid pixels (0, non-finite, beyond max_depth) enter as 0
                values = prepare_depth(self.spec, values)[0]
        return self.projection(values).flatten(2).transpose(1, 2)


class MultiMAEEmbeddings(nn.Module):
    """Global tokens and the per-modality patch projections."""

    def __init__(self, config: MultiMAEConfig) -> None:
        super().__init__()
        self.global_tokens = nn.Parameter(torch.zeros(1, config.num_global_tokens, config.hidden_size))
        self.patch_embeddings = nn.ModuleDict(
            {spec.name: MultiMAEPatchEmbedding(config, spec) for spec in config.modalities}
        )


class MultiMAEPreTrainedModel(PreTrainedModel):
    config_class = MultiMAEConfig
    config: MultiMAEConfig
    base_model_prefix = "multimae"
    main_input_name = "rgb"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["ViTLayer", "MultiMAEEmbeddings"]
    _supports_sdpa = True
    # The encoder and the heads load from pre-training checkpoints: their decoders are dropped silently.
    _keys_to_ignore_on_load_unexpected = [r"^decoders\."]
    # Modality tensors arrive as keyword arguments: the Trainer must not add `num_items_in_batch` to them.
    accepts_loss_kwargs = False

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, MultiMAEEmbeddings):
            init.normal_(module.global_tokens, std=std)
        elif isinstance(module, MultiMAEDecoder):
            init.normal_(module.mask_token, std=std)
            init.normal_(module.modality_embeddings, std=std)

    def _collect_modalities(
        self, values: dict[str, torch.Tensor | None], allowed: list[str]
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Split keyword inputs into ``{modality: tensor}`` and ``{modality: mask}``; ``None`` values are absent,
        other keys than the ``allowed`` modalities (and their ``mask_<name>``) are an error."""
        inputs, masks = {}, {}
        for key, value in values.items():
            if value is None:
                continue
            name = key[len("mask_") :] if key.startswith("mask_") else key
            if name not in allowed:
                raise TypeError(
                    f"{type(self).__name__}.forward got an unexpected input {key!r}; its modalities are {allowed} "
                    "(each optionally with mask_<name>)"
                )
            (masks if key.startswith("mask_") else inputs)[name] = value
        orphan = sorted(set(masks) - set(inputs))
        if orphan:
            raise ValueError(f"masks given for modalities {orphan} that are not in the batch")
        return inputs, masks


class MultiMAEModel(MultiMAEPreTrainedModel):
    """The MM-MAE encoder. ``forward`` takes each present modality by name (``rgb`` (B,3,H,W), ``depth`` (B,1,H,W),
    ``semseg`` (B,H,W), or the config's names) and optionally ``mask_<name>`` (B, N) bool, True = hidden; a modality
    without a mask is fully visible. Returns ``MultiMAEModelOutput`` (global tokens first, then the visible
    patches in modality-then-patch order)."""

    def __init__(self, config: MultiMAEConfig) -> None:
        super().__init__(config)
        self.embeddings = MultiMAEEmbeddings(config)
        self.layers = nn.ModuleList([ViTLayer(config) for _ in range(config.num_hidden_layers)])
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.patch_embeddings

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
        **other_modalities: torch.Tensor,
    ) -> MultiMAEModelOutput | tuple:
        inputs, masks = self._collect_modalities(
            dict(rgb=rgb, depth=depth, semseg=semseg, mask_rgb=mask_rgb, mask_depth=mask_depth, mask_semseg=mask_semseg)
            | other_modalities,
            self.config.task_names,
        )
        output = self.encode(inputs, masks, output_hidden_states=output_hidden_states)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        return output if return_dict else output.to_tuple()

    def grid_size(self, inputs: dict[str, torch.Tensor]) -> tuple[int, int, int]:
        """Validate the modality tensors; return (batch, grid height, grid width)."""
        if not inputs:
            raise ValueError(f"no modality given; expected any of {self.config.task_names}")
        sizes = {}
        for name, value in inputs.items():
            spec = self.config.modality(name)
            expected_dims = 3 if spec.kind == "semseg" else 4
            if value.dim() != expected_dims or (spec.kind != "semseg" and value.shape[1] != spec.channels):
                layout = "(B, H, W) class ids" if spec.kind == "semseg" else f"(B, {spec.channels}, H, W)"
                raise ValueError(f"input {name!r} has shape {tuple(value.shape)}; expected {layout}")
            sizes[name] = (value.shape[0], *value.shape[-2:])
        if len(set(sizes.values())) > 1:
            raise ValueError(f"modalities differ in batch size or image size (B, H, W): {sizes}")
        batch, height, width = next(iter(sizes.values()))
        patch = self.config.patch_size
        if height < patch or width < patch or height % patch or width % patch:
            raise ValueError(f"images of {height}x{width} pixels do not tile into {patch}x{patch} patches")
        return batch, height // patch, width // patch

    def encode(
        self,
        inputs: dict[str, torch.Tensor],
        masks: dict[str, torch.Tensor],
        output_hidden_states: bool | None = None,
    ) -> MultiMAEModelOutput:
        """Encode the visible patches of the modalities in ``inputs`` (see :meth:`forward`)."""
        batch, grid_h, grid_w = self.grid_size(inputs)
        num_patches = grid_h * grid_w
        present = [spec.name for spec in self.config.modalities if spec.name in inputs]
        dtype = self.embeddings.global_tokens.dtype
        device = self.embeddings.global_tokens.device
        position = sincos_position_embedding(grid_h, grid_w, self.config.hidden_size, device, dtype)
        tokens = torch.cat([self.embeddings.patch_embeddings[name](inputs[name]) + position for name in present], 1)
        hidden_flags = []
        for name in present:
            mask = masks.get(name)
            if mask is None:
                mask = torch.zeros(batch, num_patches, dtype=torch.bool, device=tokens.device)
            elif mask.shape != (batch, num_patches):
                raise ValueError(f"mask_{name} has shape {tuple(mask.shape)}; expected ({batch}, {num_patches})")
            hidden_flags.append(mask.to(device=tokens.device, dtype=torch.bool))
        hidden = torch.cat(hidden_flags, dim=1)
        visible_counts = (~hidden).sum(dim=1)
        num_visible = int(visible_counts.max())
        if num_visible == 0:
            raise ValueError("every patch of a sample is masked: the encoder needs at least one visible patch")
        # Stable sort puts the visible patches first, in their original order.
        order = torch.sort(hidden.to(torch.uint8), dim=1, stable=True).indices[:, :num_visible]
        visible = torch.gather(tokens, 1, order[..., None].expand(-1, -1, tokens.shape[-1]))
        sequence = torch.cat([self.embeddings.global_tokens.expand(batch, -1, -1), visible], dim=1)
        attention_mask = None
        if bool((visible_counts != num_visible).any()):
            real = torch.arange(num_visible, device=tokens.device)[None] < visible_counts[:, None]
            globals_ = torch.ones(batch, self.config.num_global_tokens, dtype=torch.bool, device=tokens.device)
            attention_mask = torch.cat([globals_, real], dim=1).long()
        layer_mask = (
            None
            if attention_mask is None
            else create_bidirectional_mask(config=self.config, inputs_embeds=sequence, attention_mask=attention_mask)
        )
        all_hidden = [sequence] if output_hidden_states else None
        for layer in self.layers:
            sequence = layer(sequence, layer_mask)
            if all_hidden is not None:
                all_hidden.append(sequence)
        return MultiMAEModelOutput(
            last_hidden_state=self.layernorm(sequence),
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
            visible_token_indices=order,
            attention_mask=attention_mask,
        )
