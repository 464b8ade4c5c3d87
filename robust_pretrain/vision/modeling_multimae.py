"""MM-MAE: a MultiMAE-style multi-modal masked autoencoder, its pre-training model and its fine-tuning heads.

Encoder (:class:`MultiMAEModel`): each modality is cut into ``patch_size`` patches and projected by its own linear
patch projection (a class embedding first for semantic maps); the visible patches of all modalities, each plus its
fixed 2D sine-cosine position embedding, follow ``num_global_tokens`` learned global tokens into one shared ViT
encoder (transformers' ``ViTLayer``). With one global token and RGB input it computes exactly what a ``ViTModel``
computes, which is what :mod:`robust_pretrain.vision.export` relies on.

Pre-training (:class:`MultiMAEForPreTraining`): one decoder per modality (= task). A decoder reads the encoded tokens
of all modalities (projected to its width, with position and source-modality embeddings) with one query token per
patch of its modality (cross-attention, or ViT layers over both for the ``"joint"`` decoder; ``DECODER_VARIANTS``
switches between this project's cross-attention decoder and MultiMAE's) and predicts every patch of its modality;
only the hidden patches are scored.

Fine-tuning (:class:`MultiMAEForImageClassification`, :class:`MultiMAEForSemanticSegmentation`,
:class:`MultiMAEForDepthEstimation`): every patch of ``config.finetune_modalities`` (RGB by default) is encoded; a
linear classifier reads the global token, the dense heads are transformers' DPT neck and heads (segmentation
optionally MultiMAE's ConvNeXt head, depth optionally MultiMAE's berHu loss).
"""

from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers import (
    AutoModel,
    AutoModelForDepthEstimation,
    AutoModelForImageClassification,
    AutoModelForPreTraining,
    AutoModelForSemanticSegmentation,
    DPTConfig,
    PreTrainedModel,
)
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import (
    BaseModelOutput,
    DepthEstimatorOutput,
    ImageClassifierOutput,
    SemanticSegmenterOutput,
)
from transformers.models.dpt.modeling_dpt import DPTDepthEstimationHead, DPTNeck, DPTSemanticSegmentationHead
from transformers.models.vit.modeling_vit import ViTLayer
from transformers.models.vit_mae.modeling_vit_mae import build_2d_sinusoidal_position_embedding
from transformers.utils import ModelOutput

from .configuration_multimae import DEPTH_TRIM, DEPTH_VARIANCE_EPS, ModalitySpec, MultiMAEConfig
from .heads import ConvNeXtSegmentationHead
from .lora import is_lora_output, load_lora_output
from .losses import depth_loss

# ------------------------------------------------------------------------------------------------------ helpers


@functools.lru_cache(maxsize=32)
def _sincos_table(grid_height: int, grid_width: int, dim: int) -> torch.Tensor:
    return build_2d_sinusoidal_position_embedding(grid_height, grid_width, embed_dim=dim)


def sincos_position_embedding(
    grid_height: int, grid_width: int, dim: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """Fixed 2D sine-cosine embeddings ``(grid_height * grid_width, dim)`` of a row-major patch grid."""
    return _sincos_table(grid_height, grid_width, dim).to(device=device, dtype=dtype)


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B, N, patch_size**2 * C)``, patches row-major, values ordered (row, column, channel)."""
    batch, channels, height, width = images.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    patches = images.reshape(batch, channels, grid_h, patch_size, grid_w, patch_size)
    return patches.permute(0, 2, 4, 3, 5, 1).reshape(batch, grid_h * grid_w, patch_size * patch_size * channels)


def unpatchify(patches: torch.Tensor, patch_size: int, grid_height: int, grid_width: int) -> torch.Tensor:
    """Inverse of :func:`patchify`: ``(B, N, patch_size**2 * C)`` -> ``(B, C, H, W)``."""
    batch = patches.shape[0]
    channels = patches.shape[-1] // (patch_size * patch_size)
    images = patches.reshape(batch, grid_height, grid_width, patch_size, patch_size, channels)
    return images.permute(0, 5, 1, 3, 2, 4).reshape(batch, channels, grid_height * patch_size, grid_width * patch_size)


def prepare_depth(spec: ModalitySpec, depth: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A depth modality's values as the model sees and reconstructs them, for ``depth`` (B, C, H, W): the values
    (invalid pixels 0), the valid-pixel mask (positive, finite, at most ``spec.max_depth``) and each image's mean and
    standard deviation (B, 1, 1, 1) that map the values back to depth units, ``values * std + mean``: 0 and 1 for
    ``spec.depth_normalization`` ``"none"``; for ``"standardize"`` those of the valid pixels (a constant image keeps
    1); for ``"standardize_trimmed"`` :func:`trimmed_depth_statistics`."""
    valid = (depth > 0) & torch.isfinite(depth)
    if spec.max_depth is not None:
        valid = valid & (depth <= spec.max_depth)
    zero = torch.zeros((), dtype=depth.dtype, device=depth.device)
    values = torch.where(valid, depth, zero)
    mean, std = torch.zeros_like(depth[:, :1, :1, :1]), torch.ones_like(depth[:, :1, :1, :1])
    if spec.depth_normalization == "standardize":
        count = valid.sum(dim=(1, 2, 3), keepdim=True).clamp_min(1)
        mean = values.sum(dim=(1, 2, 3), keepdim=True) / count
        variance = torch.where(valid, (values - mean) ** 2, zero).sum(dim=(1, 2, 3), keepdim=True) / count
        std = torch.where(variance > 0, variance.sqrt(), torch.ones_like(variance))
    elif spec.depth_normalization == "standardize_trimmed":
        mean, std = trimmed_depth_statistics(values, valid)
    if spec.depth_normalization != "none":
        values = torch.where(valid, (values - mean) / std, zero)
    return values, valid, mean, std


def trimmed_depth_statistics(values: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MultiMAE's robust depth statistics per image of ``values`` (B, C, H, W) over its ``valid`` pixels: the mean
    and ``sqrt(variance + DEPTH_VARIANCE_EPS)`` (unbiased variance) of the sorted valid values of ranks
    ``floor(DEPTH_TRIM * n)`` to ``floor((1 - DEPTH_TRIM) * n) - 1``, each (B, 1, 1, 1). Where that leaves no value
    (n < 2) every valid value counts (mean 0 without any); a single value has variance 0."""
    flat_valid = valid.flatten(1)
    count = flat_valid.sum(dim=1, keepdim=True)
    infinity = torch.tensor(float("inf"), dtype=values.dtype, device=values.device)
    ordered = torch.sort(torch.where(flat_valid, values.flatten(1), infinity), dim=1).values
    ordered = torch.where(torch.isfinite(ordered), ordered, torch.zeros_like(ordered))
    rank = torch.arange(ordered.shape[1], device=values.device)[None]
    low, high = (count * DEPTH_TRIM).long(), (count * (1 - DEPTH_TRIM)).long()
    kept = (rank >= low) & (rank < high)
    kept = torch.where(high > low, kept, rank < count)
    kept_count = kept.sum(dim=1, keepdim=True)
    mean = (ordered * kept).sum(dim=1, keepdim=True) / kept_count.clamp_min(1)
    variance = (((ordered - mean) * kept) ** 2).sum(dim=1, keepdim=True) / (kept_count - 1).clamp_min(1)
    shape = (-1, 1, 1, 1)
    return mean.view(shape), (variance + DEPTH_VARIANCE_EPS).sqrt().view(shape)


def _place_own_tokens(
    queries: torch.Tensor, context: torch.Tensor, context_patches: torch.Tensor, own: torch.Tensor
) -> torch.Tensor:
    """``queries`` (B, N, D) with the query of every patch that has an ``own`` context token (``context`` (B, S, D)
    at patch ``context_patches`` (B, S)) replaced by that token."""
    patches = torch.arange(queries.shape[1], device=queries.device)
    match = own[:, None, :] & (context_patches[:, None, :] == patches[None, :, None])  # (B, N, S)
    source = match.to(torch.uint8).argmax(dim=-1)  # (B, N) the matching context token, if any
    tokens = torch.gather(context, 1, source[..., None].expand(-1, -1, context.shape[-1]))
    return torch.where(match.any(dim=-1)[..., None], tokens, queries)


def _check_class_ids(ids: torch.Tensor, num_classes: int, ignore_index: int, what: str) -> None:
    bad = (ids != ignore_index) & ((ids < 0) | (ids >= num_classes))
    if bad.any():
        values = sorted(set(ids[bad].unique().tolist()))[:5]
        raise ValueError(
            f"{what}: class ids {values} are outside 0..{num_classes - 1} (and not the ignore index {ignore_index})"
        )


# ------------------------------------------------------------------------------------------------------ outputs


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


# ------------------------------------------------------------------------------------------------------ modules


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
            _check_class_ids(ids, self.spec.num_classes, self.spec.ignore_index, f"input {self.spec.name!r}")
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


class MultiMAECrossAttention(nn.Module):
    """The decoder's cross-attention block: the queries attend to the context (pre-norm on both, multi-head; plus the
    queries when ``decoder_cross_attention_residual``, which MultiMAE's block does not add), then a pre-norm MLP
    (residual). Sizes, activation and dropouts from the decoder's config."""

    def __init__(self, config: MultiMAEConfig) -> None:
        super().__init__()
        width, eps = config.hidden_size, config.layer_norm_eps
        self.num_heads = config.num_attention_heads
        self.attention_dropout = config.attention_probs_dropout_prob
        self.query_norm = nn.LayerNorm(width, eps=eps)
        self.context_norm = nn.LayerNorm(width, eps=eps)
        self.query = nn.Linear(width, width, bias=config.qkv_bias)
        self.key = nn.Linear(width, width, bias=config.qkv_bias)
        self.value = nn.Linear(width, width, bias=config.qkv_bias)
        self.output = nn.Linear(width, width)
        self.mlp_norm = nn.LayerNorm(width, eps=eps)
        self.mlp = nn.Sequential(
            nn.Linear(width, config.intermediate_size),
            ACT2FN[config.hidden_act],
            nn.Linear(config.intermediate_size, width),
        )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.residual = config.decoder_cross_attention_residual

    def _heads(self, values: torch.Tensor) -> torch.Tensor:
        batch, length, width = values.shape
        return values.view(batch, length, self.num_heads, width // self.num_heads).transpose(1, 2)

    def forward(self, queries: torch.Tensor, context: torch.Tensor, context_mask: torch.Tensor | None) -> torch.Tensor:
        """``queries`` (B, N, D), ``context`` (B, S, D), ``context_mask`` (B, S) 1 for real tokens, or None."""
        normed = self.context_norm(context)
        attended = F.scaled_dot_product_attention(
            self._heads(self.query(self.query_norm(queries))),
            self._heads(self.key(normed)),
            self._heads(self.value(normed)),
            attn_mask=None if context_mask is None else context_mask.bool()[:, None, None, :],
            dropout_p=self.attention_dropout if self.training else 0.0,
        )
        hidden = self.dropout(self.output(attended.transpose(1, 2).flatten(2)))
        if self.residual:
            hidden = queries + hidden
        return hidden + self.dropout(self.mlp(self.mlp_norm(hidden)))


class MultiMAEDecoder(nn.Module):
    """The decoder of one modality: one query per patch, predicting every patch's values from the encoded context
    tokens. ``decoder_type="cross_attention"`` (MultiMAE): a cross-attention block from the queries to the context,
    then ViT layers over the queries; ``"joint"``: ViT layers over the context and the queries together. A query is
    the mask token plus position and modality embeddings, or with ``decoder_use_task_queries`` for a visible patch of
    the decoder's own modality that patch's context token; a LayerNorm precedes the prediction if
    ``decoder_final_norm``."""

    def __init__(self, config: MultiMAEConfig, spec: ModalitySpec) -> None:
        super().__init__()
        decoder_config = copy.deepcopy(config)
        decoder_config.hidden_size = config.decoder_hidden_size
        decoder_config.num_attention_heads = config.decoder_num_attention_heads
        decoder_config.intermediate_size = config.decoder_intermediate_size
        self.config = decoder_config
        self.decoder_embed = nn.Linear(config.hidden_size, config.decoder_hidden_size)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, config.decoder_hidden_size))
        self.modality_embeddings = nn.Parameter(torch.zeros(len(config.modalities), config.decoder_hidden_size))
        if config.decoder_type == "cross_attention":
            self.cross_attention = MultiMAECrossAttention(decoder_config)
        self.layers = nn.ModuleList([ViTLayer(decoder_config) for _ in range(config.decoder_num_hidden_layers)])
        if config.decoder_final_norm:
            self.norm = nn.LayerNorm(config.decoder_hidden_size, eps=config.layer_norm_eps)
        self.prediction = nn.Linear(config.decoder_hidden_size, config.patch_size**2 * spec.output_channels)

    def forward(
        self,
        encoded: torch.Tensor,
        context_positions: torch.Tensor,
        context_modalities: torch.Tensor,
        context_patches: torch.Tensor,
        query_positions: torch.Tensor,
        query_modality: int,
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """``encoded`` (B, G+V, D); ``context_positions`` (B, G+V, Dd) position embeddings (0 for global tokens);
        ``context_modalities`` (B, G+V) source-modality ids (-1 for global tokens); ``context_patches`` (B, G+V)
        patch indices (-1 for global tokens); ``query_positions`` (N, Dd); ``attention_mask`` (B, G+V) 1 for real
        tokens, or None. Returns (B, N, patch_size**2 * output_channels)."""
        batch = encoded.shape[0]
        modality_embedding = torch.where(
            (context_modalities >= 0)[..., None],
            self.modality_embeddings[context_modalities.clamp_min(0)],
            torch.zeros((), dtype=encoded.dtype, device=encoded.device),
        )
        context = self.decoder_embed(encoded) + context_positions + modality_embedding
        queries = (self.mask_token + query_positions + self.modality_embeddings[query_modality]).expand(batch, -1, -1)
        if self.config.decoder_use_task_queries:
            own = context_modalities == query_modality
            if attention_mask is not None:
                own = own & attention_mask.bool()
            queries = _place_own_tokens(queries, context, context_patches, own)
        if self.config.decoder_type == "cross_attention":
            hidden = self.cross_attention(queries, context, attention_mask)
            for layer in self.layers:
                hidden = layer(hidden)
            return self.prediction(self.norm(hidden) if self.config.decoder_final_norm else hidden)
        hidden = torch.cat([context, queries], dim=1)
        if attention_mask is not None:
            padding = torch.ones(batch, queries.shape[1], dtype=attention_mask.dtype, device=attention_mask.device)
            attention_mask = create_bidirectional_mask(
                config=self.config, inputs_embeds=hidden, attention_mask=torch.cat([attention_mask, padding], dim=1)
            )
        for layer in self.layers:
            hidden = layer(hidden, attention_mask)
        return self.prediction(self.norm(hidden[:, -queries.shape[1] :]))


# ------------------------------------------------------------------------------------------------------ models


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
    without a mask is fully visible. Returns :class:`MultiMAEModelOutput` (global tokens first, then the visible
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
            _check_class_ids(ids, spec.num_classes, spec.ignore_index, f"target {spec.name!r}")
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


# ------------------------------------------------------------------------------------------------------ heads


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
        with the adapters and the head merged in (:mod:`robust_pretrain.vision.lora`)."""
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
                _check_class_ids(labels, self.num_labels, -100, "labels")
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
            _check_class_ids(labels, self.config.num_labels, ignore, "labels")
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
    batch has none, or MultiMAE's berHu over them (:func:`~robust_pretrain.vision.losses.depth_loss`). L1 by
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


def register_auto_classes() -> None:
    """Register the models with transformers' Auto classes (no ``trust_remote_code`` needed)."""
    for auto_class, model_class in (
        (AutoModel, MultiMAEModel),
        (AutoModelForPreTraining, MultiMAEForPreTraining),
        (AutoModelForImageClassification, MultiMAEForImageClassification),
        (AutoModelForSemanticSegmentation, MultiMAEForSemanticSegmentation),
        (AutoModelForDepthEstimation, MultiMAEForDepthEstimation),
    ):
        auto_class.register(MultiMAEConfig, model_class, exist_ok=True)


register_auto_classes()
