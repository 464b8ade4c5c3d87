"""A causal LM's next-token losses without its full logits: the output embeddings applied slice by slice.

A decoder step's largest tensors are its ``[batch, seq, vocab]`` logits (in fp32 for the loss, and again for their
gradient). :class:`ChunkedNextTokenLoss` hooks the model's output-embeddings module (``lm_head``, found generically
with ``get_output_embeddings()``): during the model's own forward pass it takes the final hidden states at the target
positions and computes each target's cross-entropy one slice of the vocabulary at a time (:func:`chunked_head_losses`),
each slice's logits no larger than ``chunk_size`` targets' full logits (unset: :func:`default_chunk_size` of the
shapes); only one slice's logits exist at a time, in the forward pass and again in the backward pass, which recomputes
them and writes the head's gradient slice by slice in place. The head itself then runs on the first position
only, and those logits (what the model returns) check, in forward passes 1, 2, 4, 8, ..., that the head's output is
reproduced: ``nn.Linear`` followed by the logit scaling and soft-capping conventions of transformers' decoders
(:class:`LogitTransform`), read on the host in the first pass only (later checks are device assertions, no host
sync). A model whose head does something else is refused, naming it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from ..task_losses import check_class_ids, refuse_on_device

logger = logging.getLogger(__name__)

#: the option that switches the chunked loss off, named in every refusal
OPTION = "causal_lm_chunk_size"
#: config fields that soft-cap the final logits: Gemma 2/3's, RecurrentGemma's
SOFTCAP_NAMES = ("final_logit_softcapping", "logits_soft_cap")


@dataclass(frozen=True)
class LogitTransform:
    """What a decoder does to its head's output before the loss: ``softcap * tanh(scale * z / softcap)``.

    ``scale`` is Cohere's ``logit_scale`` (multiplied), Granite's ``1 / logits_scaling`` (divided) and a text
    config's ``output_multiplier``; ``softcap`` is Gemma's ``final_logit_softcapping`` or RecurrentGemma's
    ``logits_soft_cap`` (``None``: none).
    """

    scale: float = 1.0
    softcap: float | None = None

    @classmethod
    def of(cls, config: Any) -> LogitTransform:
        """The transform a transformers config declares (identity for Llama, GPT-2, Qwen2, ...)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        scale = 1.0
        for name in ("logit_scale", "output_multiplier"):
            if getattr(text, name, None) is not None:
                scale *= float(getattr(text, name))
        if getattr(text, "logits_scaling", None) is not None:
            scale /= float(text.logits_scaling)
        softcap = next((getattr(text, name) for name in SOFTCAP_NAMES if getattr(text, name, None) is not None), None)
        return cls(scale=scale, softcap=None if softcap is None else float(softcap))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """The transformed logits (in place on ``logits``, which must not need a gradient)."""
        if self.scale != 1.0:
            logits.mul_(self.scale)
        if self.softcap is not None:
            logits.div_(self.softcap).tanh_().mul_(self.softcap)
        return logits

    def backward(self, grad: torch.Tensor, transformed: torch.Tensor) -> torch.Tensor:
        """The gradient w.r.t. the head's output from that w.r.t. the ``transformed`` logits (in place on ``grad``)."""
        if self.softcap is not None:  # d/dz c * tanh(z / c) = 1 - tanh^2 = 1 - (out / c)^2
            grad.mul_(1 - (transformed / self.softcap).square_())
        if self.scale != 1.0:
            grad.mul_(self.scale)
        return grad


class _ChunkedHeadCrossEntropy(torch.autograd.Function):
    """Per-target cross-entropy of ``transform(hidden @ weight.T + bias)``, one slice of the vocabulary at a time.

    Each slice's logits ``[targets, width]`` hold no more elements than ``chunk_size`` targets' full logits would
    (:func:`vocabulary_slice_width`). The forward pass accumulates each target's log-sum-exp over the slices; the
    backward pass recomputes each slice's logits, turns them into ``softmax - target distribution`` in place and
    multiplies by the incoming per-target gradients, so the gradients equal those of the unchunked loss whatever
    weight each target has in the objective. Slicing the vocabulary rather than the targets writes each row of the
    head's gradient once (no read-modify-write of a full ``[vocab, hidden]`` accumulator per chunk); what is
    accumulated across slices is the hidden states' gradient ``[targets, hidden]``, in fp32.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        chunk_size: int,
        transform: LogitTransform,
        smoothing: float,
        compute_dtype: torch.dtype,
    ) -> torch.Tensor:
        loss_dtype = softmax_dtype(compute_dtype)
        vocab = weight.shape[0]
        inputs = cast_to(hidden, compute_dtype)
        log_normalizers = hidden.new_full((hidden.shape[0],), -math.inf, dtype=loss_dtype)
        target_logits = torch.zeros_like(log_normalizers)
        logit_sums = torch.zeros_like(log_normalizers) if smoothing else None
        for columns, logits in _slice_logits(inputs, weight, bias, chunk_size, transform, compute_dtype):
            torch.logaddexp(log_normalizers, torch.logsumexp(logits, dim=-1), out=log_normalizers)
            inside, local = _targets_in(targets, columns)
            target_logits += logits.gather(1, local[:, None]).squeeze(1) * inside
            if logit_sums is not None:
                logit_sums += logits.sum(dim=-1)
        losses = log_normalizers - (1 - smoothing) * target_logits
        if logit_sums is not None:
            losses -= smoothing / vocab * logit_sums
        ctx.save_for_backward(hidden, weight, bias, targets, log_normalizers)
        ctx.options = chunk_size, transform, smoothing, compute_dtype
        return losses

    @staticmethod
    def backward(ctx: Any, grad_losses: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, log_normalizers = ctx.saved_tensors
        with torch.autocast(hidden.device.type, enabled=False):
            return _ChunkedHeadCrossEntropy._gradients(
                ctx.needs_input_grad[:3], grad_losses, hidden, weight, bias, targets, log_normalizers, *ctx.options
            )

    @staticmethod
    def _gradients(
        needs_grad: tuple[bool, bool, bool],
        grad_losses: torch.Tensor,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        log_normalizers: torch.Tensor,
        chunk_size: int,
        transform: LogitTransform,
        smoothing: float,
        compute_dtype: torch.dtype,
    ) -> tuple[torch.Tensor | None, ...]:
        need_hidden, need_weight, need_bias = needs_grad
        loss_dtype = softmax_dtype(compute_dtype)
        inputs = cast_to(hidden, compute_dtype)
        grad_hidden = torch.zeros(hidden.shape, dtype=loss_dtype, device=hidden.device) if need_hidden else None
        grad_weight = torch.empty_like(weight) if need_weight else None
        grad_bias = torch.empty_like(bias) if need_bias else None
        grad_losses = grad_losses.to(loss_dtype)[:, None]
        vocab = weight.shape[0]
        for columns, logits in _slice_logits(inputs, weight, bias, chunk_size, transform, compute_dtype):
            # softmax, in place unless the soft-cap's derivative needs the logits
            shifted = (
                logits.sub(log_normalizers[:, None]) if transform.softcap else logits.sub_(log_normalizers[:, None])
            )
            grad = shifted.exp_()
            inside, local = _targets_in(targets, columns)
            grad.scatter_add_(1, local[:, None], (inside * (smoothing - 1)).to(grad.dtype)[:, None])
            if smoothing:
                grad.sub_(smoothing / vocab)
            grad.mul_(grad_losses)
            grad = transform.backward(grad, logits).to(compute_dtype)
            del logits
            if need_hidden:
                accumulate_product(grad_hidden, grad, cast_to(weight[columns], compute_dtype))
            if need_weight:
                _write_product(grad_weight[columns], grad.T, inputs)
            if need_bias:
                grad_bias[columns] = grad.sum(dim=0)
        return (
            None if grad_hidden is None else grad_hidden.to(hidden.dtype),
            grad_weight,
            grad_bias,
            *(None,) * 5,
        )


def accumulate_product(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``out += a @ b``, in place where the dtypes agree (no ``out``-sized temporary)."""
    if out.dtype == a.dtype:
        out.addmm_(a, b)
    else:
        out.add_(a @ b)


def _write_product(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``out[...] = a @ b`` (``out``: a contiguous slice of the gradient), written in place where the dtypes agree."""
    if out.dtype == a.dtype:
        torch.mm(a, b, out=out)
    else:
        out.copy_(a @ b)


#: the range of the chunk size derived from the shapes (:func:`default_chunk_size`)
CHUNK_RANGE = (128, 8192)


def default_chunk_size(targets: int, vocab: int, hidden: int) -> int:
    """The chunk size when ``causal_lm_chunk_size`` is unset, from the shapes (Liger kernel's rule for its fused
    linear cross-entropy): ``next_pow2(ceil(targets / ceil(vocab / hidden)))``, so that a chunk's logits hold about as
    many elements as the hidden states of all targets, clamped to :data:`CHUNK_RANGE`."""
    ratio = -(-vocab // max(hidden, 1))
    chunk = 1 << (max(-(-targets // ratio), 1) - 1).bit_length()
    return min(max(chunk, CHUNK_RANGE[0]), CHUNK_RANGE[1])


#: slices wider than this are a multiple of it: aligned matrix shapes (an odd width takes slow GPU kernels)
SLICE_ALIGNMENT = 128


def vocabulary_slice_width(chunk_size: int, targets: int, vocab: int) -> int:
    """Columns per vocabulary slice: ``targets x width`` logits are at most ``chunk_size x vocab``; widths above
    :data:`SLICE_ALIGNMENT` are rounded down to a multiple of it."""
    width = chunk_size * vocab // max(targets, 1)
    if width > SLICE_ALIGNMENT:
        width -= width % SLICE_ALIGNMENT
    return min(vocab, max(1, width))


def _slice_logits(
    inputs: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    chunk_size: int,
    transform: LogitTransform,
    compute_dtype: torch.dtype,
) -> Iterator[tuple[slice, torch.Tensor]]:
    """The transformed logits of every target over one slice of the vocabulary at a time (in the softmax dtype)."""
    vocab = weight.shape[0]
    width = vocabulary_slice_width(chunk_size, inputs.shape[0], vocab)
    for start in range(0, vocab, width):
        columns = slice(start, start + width)
        sliced_bias = None if bias is None else cast_to(bias[columns], compute_dtype)
        logits = F.linear(inputs, cast_to(weight[columns], compute_dtype), sliced_bias)
        yield columns, transform(logits.to(softmax_dtype(compute_dtype)))


def _targets_in(targets: torch.Tensor, columns: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether each target lies in the slice ``columns``, and its column there (0 where it does not)."""
    local = targets - columns.start
    inside = (local >= 0) & (targets < columns.stop)
    return inside, local.where(inside, 0)


def softmax_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """fp32 for the softmax and losses, or the head's own dtype where it is wider (fp64)."""
    return torch.promote_types(compute_dtype, torch.float32)


def cast_to(tensor: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``tensor`` in ``dtype`` (``None`` stays ``None``)."""
    return None if tensor is None else tensor.to(dtype)


def chunked_head_losses(
    hidden: torch.Tensor,
    head: torch.nn.Linear,
    targets: torch.Tensor,
    chunk_size: int,
    transform: LogitTransform = LogitTransform(),
    smoothing: float = 0.0,
) -> torch.Tensor:
    """Cross-entropy (fp32, unreduced) of each row of ``hidden`` ``[N, hidden]`` under ``transform(head(hidden))``
    against ``targets`` ``[N]``, ``chunk_size`` rows at a time; at most one chunk's logits exist at once, in the forward
    and in the backward pass. ``smoothing`` is the Trainer's label smoothing. Under autocast the head's matmul runs in
    the autocast dtype (as ``head(hidden)`` would), the softmax in fp32 (:func:`softmax_dtype`).
    """
    device = hidden.device.type
    autocast = torch.is_autocast_enabled(device)
    compute_dtype = (
        torch.get_autocast_dtype(device) if autocast else torch.promote_types(hidden.dtype, head.weight.dtype)
    )
    with torch.autocast(device, enabled=False):
        return _ChunkedHeadCrossEntropy.apply(
            hidden, head.weight, head.bias, targets, chunk_size, transform, smoothing, compute_dtype
        )


def check_sharding(distributed_type: str, fsdp_version: int | None) -> None:
    """Refuse the engines that shard the output embeddings outside the model's forward pass (Accelerate's
    ``DistributedType`` value and FSDP version): DeepSpeed and FSDP1; FSDP2 gathers the root's weights for the whole
    forward pass, where the chunked loss runs."""
    if distributed_type == "DEEPSPEED" or (distributed_type == "FSDP" and fsdp_version != 2):
        engine = "DeepSpeed" if distributed_type == "DEEPSPEED" else "FSDP1"
        raise ValueError(
            f"{OPTION} is not supported with {engine}, which flattens or partitions the output embeddings' weight "
            "outside the model's forward pass: use FSDP2 (fsdp_version: 2, where the chunked loss runs inside the "
            f"forward on the gathered weight) or set {OPTION}=0"
        )


class ChunkedNextTokenLoss:
    """Computes a causal LM's per-target next-token losses inside its forward pass, in chunks of positions.

    A forward pre-hook on the output-embeddings module (a plain ``nn.Linear``) takes the hidden states
    ``[batch, seq, hidden]``, computes the losses of the targets selected by :meth:`targets` with
    :func:`chunked_head_losses`, and passes the head only the first position, so the model returns logits of shape
    ``[batch, 1, vocab]``. In forward passes 1, 2, 4, 8, ... (a logit transform the code does not know can hide
    while the logits are small), those logits are compared with the head's output as reproduced here
    (:class:`LogitTransform`); a mismatch raises ``ValueError`` (from pass 2 on, checked without a host sync: on a
    GPU an asynchronous device-side assertion, surfacing at the next sync). The hook changes nothing in the model's
    state dict and does nothing outside :meth:`targets`.
    """

    def __init__(self, model: torch.nn.Module, head: torch.nn.Module, chunk_size: int | None = None) -> None:
        if type(head) is not torch.nn.Linear:
            raise ValueError(
                f"{OPTION}: the output embeddings of {type(model).__name__} are a {type(head).__name__}, not a plain "
                f"nn.Linear whose output the chunked loss can reproduce; set {OPTION}=0"
            )
        self.model_name = type(model).__name__
        self.head = head
        #: the option's chunk size; ``None``: :func:`default_chunk_size` of each forward pass's shapes
        self.chunk_size = chunk_size
        #: the chunk size of the last forward pass (``None`` before the first)
        self.last_chunk_size: int | None = None
        self.transform = LogitTransform.of(model.config) if hasattr(model, "config") else LogitTransform()
        self.forward_passes = 0
        #: forward passes that computed the head's gradients too (targets' ``scales`` given)
        self.single_passes = 0
        self._request: tuple | None = None
        self._losses: torch.Tensor | None = None
        self._first_position: torch.Tensor | None = None
        self._handle = head.register_forward_pre_hook(self._compute_losses)

    @classmethod
    def attach(cls, model: torch.nn.Module, chunk_size: int | None = None) -> ChunkedNextTokenLoss | None:
        """Hook the output embeddings of ``model`` (also inside a peft wrapper); ``None`` for a model without any
        (``get_output_embeddings``), whose own logits are then used."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        get_output = getattr(base, "get_output_embeddings", None)
        head = get_output() if callable(get_output) else None
        return None if head is None else cls(base, head, chunk_size)

    @contextmanager
    def targets(
        self,
        mask: torch.Tensor,
        targets: torch.Tensor,
        smoothing: float = 0.0,
        positions: torch.Tensor | None = None,
        scales: torch.Tensor | None = None,
    ) -> Iterator[None]:
        """Within the block, the model's forward pass computes the losses of ``targets`` (the labels at the positions
        where ``mask`` ``[batch, seq]`` is true, in that order; ``positions``: their flat indices, which spare the
        boolean-mask selection its host sync); read them with :meth:`losses`. ``scales``: each target's weight in the
        objective, known before the forward pass: the gradients are then computed in it
        (:func:`~robust_pretrain.trainer.single_pass_loss.single_pass_head_losses`)."""
        self._request, self._losses = (mask, targets, smoothing, positions, scales), None
        try:
            yield
        finally:
            self._request = None

    def losses(self, outputs: Any) -> torch.Tensor:
        """The per-target losses of the last forward pass; ``outputs`` (the model's) check the head when due."""
        if self._losses is None:
            raise ValueError(
                f"{OPTION}: the output embeddings of {self.model_name} never received hidden states of the labels' "
                f"shape [batch, seq, hidden]; set {OPTION}=0"
            )
        if self._first_position is not None:
            logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
            self._verify(logits)
        losses, self._losses = self._losses, None
        return losses

    def _compute_losses(self, module: torch.nn.Module, args: tuple) -> tuple | None:
        if self._request is None or not args or not torch.is_tensor(args[0]):
            return None
        mask, targets, smoothing, positions, scales = self._request
        hidden = args[0]
        if hidden.dim() != 3 or hidden.shape[:2] != mask.shape:
            return None
        if self._losses is not None:
            raise ValueError(
                f"{OPTION}: the output embeddings of {self.model_name} ran twice in one forward pass (more than one "
                f"next-token head); set {OPTION}=0"
            )
        if isinstance(module.weight, DTensor):  # FSDP2 would gather it in a hook that runs after this one
            raise ValueError(
                f"{OPTION}: the output embeddings of {self.model_name} are sharded in an FSDP unit of their own; "
                f"shard them with the root module (leave lm_head out of the wrap policy) or set {OPTION}=0"
            )
        check_class_ids(targets, module.weight.shape[0])
        selected = hidden[mask] if positions is None else hidden.flatten(0, 1).index_select(0, positions)
        chunk_size = self.chunk_size or default_chunk_size(selected.shape[0], *module.weight.shape)
        if self.chunk_size is None and chunk_size != self.last_chunk_size:
            logger.info(
                f"{OPTION} from the shapes: {chunk_size} ({selected.shape[0]} targets, vocabulary "
                f"{module.weight.shape[0]}, hidden {module.weight.shape[1]})"
            )
        self.last_chunk_size = chunk_size
        if scales is not None and torch.is_grad_enabled():
            from .single_pass_loss import single_pass_head_losses  # it builds on this module

            self._losses = single_pass_head_losses(
                selected, module, targets, scales, chunk_size, self.transform, smoothing
            )
            self.single_passes += 1
        else:
            self._losses = chunked_head_losses(selected, module, targets, chunk_size, self.transform, smoothing)
        first_position = hidden[:, :1]
        self.forward_passes += 1
        if self.forward_passes & (self.forward_passes - 1) == 0:  # a power of two
            with torch.no_grad():
                self._first_position = F.linear(first_position, module.weight, module.bias)
        return (first_position, *args[1:])

    def _verify(self, logits: torch.Tensor) -> None:
        """Compare the model's logits with the head's output transformed; the first pass reads the difference on the
        host (one sync, named in the error), later ones check it on the device (:func:`refuse_on_device`, no sync)."""
        expected, self._first_position = self._first_position, None
        if logits.shape != expected.shape:
            raise ValueError(
                f"{OPTION}: {self.model_name} returned logits of shape {tuple(logits.shape)} from its head's output "
                f"of shape {tuple(expected.shape)}; set {OPTION}=0"
            )
        expected = self.transform(expected.float())
        tolerance = 1e-4 if logits.dtype == torch.float32 else 2e-2
        error = (logits.detach().float() - expected).abs().max() / expected.abs().max().clamp_min(1e-6)
        message = (
            f"{OPTION}: the logits of {self.model_name} are not its output embeddings' output transformed as its "
            f"config declares ({self.transform})"
        )
        if self.forward_passes > 1:
            refuse_on_device(~(error <= tolerance), f"{message}; set {OPTION}=0")
            return
        difference = float(error)
        if not math.isfinite(difference) or difference > tolerance:
            raise ValueError(f"{message}; relative difference {difference:.2g}; set {OPTION}=0")

    def remove(self) -> None:
        self._handle.remove()
