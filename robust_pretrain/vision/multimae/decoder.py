"""MM-MAE's decoders, one per modality (= task).

A decoder reads the encoded tokens of all modalities (projected to its width, with position and source-modality
embeddings) with one query token per patch of its modality (cross-attention, or ViT layers over both for the
``"joint"`` decoder; ``DECODER_VARIANTS`` switches between this project's cross-attention decoder and MultiMAE's) and
predicts every patch of its modality.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F
from transformers.activations import ACT2FN
from transformers.masking_utils import create_bidirectional_mask
from transformers.models.vit.modeling_vit import ViTLayer

from .configuration_multimae import ModalitySpec, MultiMAEConfig


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
