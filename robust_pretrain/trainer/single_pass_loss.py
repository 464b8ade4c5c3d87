"""The head's cross-entropy with its gradients computed in the forward pass, when each target's weight is known.

The chunked loss of :mod:`~robust_pretrain.trainer.next_token_loss` computes the logits twice (``8VH`` FLOPs per target:
``2VH`` in the forward, ``2VH`` again in the backward, ``4VH`` for the two gradient products), since the gradient of
each target's loss is only known once the objective's weights are. When the trainer knows every target's scale
``s_i = dObjective/dl_i`` before the forward pass (``w_t / N_t`` of the target's task; fixed weightings, later
micro-batches, ``weight_update='simultaneous'``), :func:`single_pass_head_losses` computes, one chunk of targets at a
time over the whole vocabulary, the losses ``l_i = lse(z_i) - z_{i,y_i}`` and at once the gradient
``G_i = (softmax(z_i) - onehot(y_i)) W`` of each target's hidden state and ``sum_i s_i (softmax(z_i) - onehot(y_i))^T
h_i`` of the head's weight (``6VH``). The backward pass only scales them: the hidden states' gradient by the
incoming per-target gradient ``g_i`` (exact whatever ``g``), the weight's by ``c = (g . s) / (s . s)``, the factor
by which the trainer scaled the objective (``1 / accumulation``, a loss scale), checked on the device to be uniform
(``g = c s``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..task_losses import refuse_on_device
from .next_token_loss import OPTION, LogitTransform, accumulate_product, cast_to, softmax_dtype

#: no logit scaling or soft-cap (Llama, GPT-2, Qwen2, ...)
IDENTITY = LogitTransform()
#: the largest relative deviation of the incoming gradients from ``c * scales`` (rounding of the objective's sum)
PROPORTIONALITY_TOLERANCE = 1e-3


class _SinglePassHeadCrossEntropy(torch.autograd.Function):
    """Per-target cross-entropy of ``transform(hidden @ weight.T + bias)`` whose gradients, for the objective
    ``sum_i scales_i * loss_i``, are accumulated in the forward pass, ``chunk_size`` targets at a time."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        scales: torch.Tensor,
        chunk_size: int,
        transform: LogitTransform,
        smoothing: float,
        compute_dtype: torch.dtype,
    ) -> torch.Tensor:
        loss_dtype = softmax_dtype(compute_dtype)
        accumulate_dtype = torch.promote_types(weight.dtype, torch.float32)
        inputs, head = cast_to(hidden, compute_dtype), cast_to(weight, compute_dtype)
        shift = cast_to(bias, compute_dtype)
        vocab = weight.shape[0]
        losses = torch.empty(hidden.shape[0], dtype=loss_dtype, device=hidden.device)
        grad_hidden = torch.empty(hidden.shape, dtype=loss_dtype, device=hidden.device)  # G_i, not yet scaled
        grad_weight = torch.zeros(weight.shape, dtype=accumulate_dtype, device=weight.device)
        grad_bias = None if bias is None else torch.zeros(bias.shape, dtype=accumulate_dtype, device=bias.device)
        scales = scales.to(loss_dtype)
        for start in range(0, hidden.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            logits = transform(F.linear(inputs[rows], head, shift).to(loss_dtype))
            log_normalizers = torch.logsumexp(logits, dim=-1, keepdim=True)
            chosen = targets[rows, None]
            losses[rows] = (log_normalizers - (1 - smoothing) * logits.gather(1, chosen)).squeeze(1)
            if smoothing:
                losses[rows] -= smoothing / vocab * logits.sum(dim=-1)
            grad = logits.sub(log_normalizers) if transform.softcap else logits.sub_(log_normalizers)
            grad = grad.exp_().scatter_add_(1, chosen, grad.new_full(chosen.shape, smoothing - 1))
            if smoothing:
                grad.sub_(smoothing / vocab)
            grad = transform.backward(grad, logits).to(compute_dtype)
            del logits
            grad_hidden[rows] = grad @ head
            grad.mul_(scales[rows, None].to(compute_dtype))
            accumulate_product(grad_weight, grad.T, inputs[rows])
            if grad_bias is not None:
                grad_bias += grad.sum(dim=0)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias, scales)
        ctx.dtypes = hidden.dtype, weight.dtype
        return losses

    @staticmethod
    def backward(ctx: Any, grad_losses: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_weight, grad_bias, scales = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        grad_losses = grad_losses.to(scales.dtype)
        factor = (grad_losses * scales).sum() / (scales * scales).sum().clamp_min(torch.finfo(scales.dtype).tiny)
        deviation = (grad_losses - factor * scales).abs().max()
        refuse_on_device(
            ~(deviation <= PROPORTIONALITY_TOLERANCE * grad_losses.abs().max()),
            f"{OPTION}: the single-pass loss got gradients that are not its targets' scales times one factor (the "
            "objective is not the weighted sum the trainer declared before the forward pass)",
        )
        return (
            (grad_hidden * grad_losses[:, None]).to(hidden_dtype),
            (grad_weight * factor).to(weight_dtype),
            None if grad_bias is None else (grad_bias * factor).to(weight_dtype),
            *(None,) * 6,
        )


def single_pass_head_losses(
    hidden: torch.Tensor,
    head: torch.nn.Linear,
    targets: torch.Tensor,
    scales: torch.Tensor,
    chunk_size: int,
    transform: LogitTransform = IDENTITY,
    smoothing: float = 0.0,
) -> torch.Tensor:
    """Cross-entropy (fp32, unreduced) of each row of ``hidden`` ``[N, hidden]`` under ``transform(head(hidden))``
    against ``targets`` ``[N]``, for an objective whose gradient w.r.t. the losses is proportional to ``scales``
    ``[N]`` (the objective ``c * sum_i scales_i * loss_i`` for any ``c``): the gradients are computed in the forward
    pass, ``chunk_size`` targets at a time (logits ``[chunk_size, vocab]``). Same dtypes as
    :func:`~robust_pretrain.trainer.next_token_loss.chunked_head_losses`."""
    device = hidden.device.type
    autocast = torch.is_autocast_enabled(device)
    compute_dtype = (
        torch.get_autocast_dtype(device) if autocast else torch.promote_types(hidden.dtype, head.weight.dtype)
    )
    with torch.autocast(device, enabled=False):
        return _SinglePassHeadCrossEntropy.apply(
            hidden, head.weight, head.bias, targets, scales.detach(), chunk_size, transform, smoothing, compute_dtype
        )
