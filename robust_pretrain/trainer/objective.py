"""The per-task loss computation of :class:`~robust_pretrain.trainer.MinimaxTrainer`: one forward pass, its per-target
losses reduced by task (targets with ``task_ids``, or a model's ``task_losses``), the reference model's sums on the
same targets, and the micro-batch's share of the step's weighted objective with its finiteness checks (see the
package docstring for the rule over micro-batches and processes)."""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any

import torch

from ..task_losses import HOST_TARGET_COLUMNS, next_token_targets, per_target_losses, reduce_by_task
from .models import last_encoder_layer
from .weight_update import loss_free_weights


class TaskObjective:
    """``MinimaxTrainer``'s loss side, mixed into it: the per-task sums of a forward pass and the step's objective.

    Reads the trainer's ``task_names``, ``weighting``, ``causal_lm``, heads (``mlm_head``, ``lm_loss``,
    ``reference``, ``reference_lm_loss``) and step state (``_step_counts``, ``_micro_index``, ``_rule_weights``,
    ...), set by ``MinimaxTrainer.__init__`` and ``get_batch_samples``, and sums over processes with its
    ``_all_reduce``.
    """

    def _unique_rows(self, inputs: dict[str, Any]) -> int | None:
        """How many leading rows of this eval batch are not repeats added by the distributed sampler (None: no
        process's batch has any, so none runs its forward pass again).

        Uses ``gather_for_metrics``, which drops exactly those repeats from the gathered rows of the last batch.
        """
        if self.accelerator.num_processes == 1:
            return None
        size = batch_size(inputs)
        rank = self.accelerator.process_index
        owners = self.accelerator.gather_for_metrics(torch.full((size,), rank, device=self.args.device))
        return None if owners.numel() == size * self.accelerator.num_processes else int((owners == rank).sum())

    def _reference_sums(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The reference model's per-task loss sums on this micro-batch's targets (no gradient); with
        ``excess_clipping='token'`` the sums of ``min(l, l_ref)`` per target (``l``: the trained model's loss on this
        micro-batch), whose mean subtracted from the mean of ``l`` is DoReMi's ``mean of max(l - l_ref, 0)``."""
        with torch.no_grad():
            return self._task_sums(self.reference.model, inputs, reference=True)[0]

    def _task_sums(
        self, model: torch.nn.Module, inputs: dict[str, Any], reference: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """One forward pass; returns per-task loss sums (with gradient), target counts and the model outputs.
        ``reference``: ``model`` is the reference model (its own target-only head)."""
        inputs = dict(inputs)  # the caller's batch stays intact (prediction_step reads its labels)
        task_ids = inputs.pop("task_ids", None)
        if task_ids is None:
            outputs = model(**inputs)
            task_losses = outputs.get("task_losses") if isinstance(outputs, dict) else None
            if task_losses is None:
                raise ValueError(
                    "MinimaxTrainer needs `task_ids` in every batch (with `labels`) or a model that returns "
                    "`task_losses` (a dict task name -> loss)"
                )
            if self.label_smoother is not None:
                raise ValueError(
                    "label_smoothing_factor: the model computes its own `task_losses`; smooth its targets in the model"
                )
            if reference and self.weighting.excess_clipping == "token":
                raise ValueError(
                    "excess_clipping='token' clips per target, and this model returns per-task `task_losses` only: "
                    "use excess_clipping='domain'"
                )
            return (*self._sums_from_dict(task_losses, outputs.get("task_counts")), outputs)
        if "labels" not in inputs:
            raise ValueError("batch has `task_ids` but no `labels`")
        targets = self._task_targets({**inputs, "task_ids": task_ids})
        labels = targets.labels
        for column in ("labels", "shift_labels", *HOST_TARGET_COLUMNS):  # targets never go to the model
            inputs.pop(column, None)
        head = self.reference.head if reference else self.mlm_head
        sparse = (
            head is not None
            and not self._collecting_predictions  # user code gets logits in the layout of the labels
            and labels.shape == inputs.get("input_ids", labels).shape
        )
        smoothing = self.label_smoother.epsilon if self.label_smoother is not None else 0.0
        lm_loss = self.reference_lm_loss if reference else self.lm_loss
        chunked = lm_loss is not None and not self._collecting_predictions
        if chunked:  # the model returns the logits of its first position only
            scales = self._target_scales(targets) if model.training and not reference else None
            context = lm_loss.targets(targets.mask, targets.gather(labels), smoothing, targets.positions, scales)
        else:
            context = head.select(targets.mask, targets.positions) if sparse else nullcontext()
        with context:
            outputs = model(**inputs)
        if chunked:
            losses = lm_loss.losses(outputs)
        else:
            if isinstance(outputs, dict) and "logits" not in outputs:
                raise ValueError(
                    f"{type(model).__name__} returned no `logits` (its outputs: {sorted(outputs)}): MinimaxTrainer "
                    "needs them for batches with `labels` and `task_ids`, or per-task losses as `task_losses`"
                )
            logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
            if logits.shape[:-1] == labels.shape:
                logits = targets.gather(logits)
            elif logits.shape[0] != targets.positions.numel():
                raise ValueError(f"logits of shape {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
            losses = per_target_losses(logits, targets.gather(labels), smoothing)
        if not reference:
            self._target_losses = losses.detach()  # the per-token side of excess_clipping='token'
        elif self.weighting.excess_clipping == "token":
            losses = torch.minimum(losses, self._target_losses.to(losses.dtype))
        sums, counts = reduce_by_task(losses, targets.ids, self.num_tasks, self.args.full_determinism)
        return sums, counts, outputs

    def _targets(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's targets in the layout of the logits, and their task ids (next-token targets for a causal LM)."""
        if not self.causal_lm:
            if "shift_labels" in batch:
                raise ValueError("batch has `shift_labels`, which only a causal LM's next-token loss uses")
            return batch["labels"], batch["task_ids"]
        return next_token_targets(batch["labels"], batch["task_ids"], batch.get("shift_labels"))

    def _sums_from_dict(
        self, task_losses: dict[str, torch.Tensor], task_counts: dict[str, Any] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        unknown = set(task_losses) - set(self.task_names)
        if unknown:
            raise ValueError(f"model returned losses for unknown tasks {sorted(unknown)}; task_names={self.task_names}")
        device = next(iter(task_losses.values())).device if task_losses else self.args.device
        counts = [float((task_counts or {}).get(name, 1.0)) if name in task_losses else 0.0 for name in self.task_names]
        for name, count in zip(self.task_names, counts, strict=True):
            if not (math.isfinite(count) and count >= 0):
                raise ValueError(f"task_counts[{name!r}] must be a finite number >= 0, got {count}")
        # a task with count 0 is absent: its loss (the mean of an empty selection: NaN) must not enter as NaN * 0
        sums = torch.stack(
            [
                task_losses[name].float().reshape(()) * count if count > 0 else torch.zeros((), device=device)
                for name, count in zip(self.task_names, counts, strict=True)
            ]
        )
        return sums, torch.tensor(counts, device=device)

    def _weighted_objective(
        self, sums: torch.Tensor, counts: torch.Tensor, reference_sums: torch.Tensor | None = None
    ) -> torch.Tensor:
        """This micro-batch's share of the step's objective; ``reference_sums``: the reference model's per-task loss
        sums on the same targets (first micro-batch only). Host synchronisation: one device->host transfer at the
        step's first micro-batch (the weighting's inputs), one at its last (the later micro-batches' finiteness and,
        for a ``task_losses`` model, task presence), none in between; under ``weight_update='simultaneous'`` the first
        one comes before the forward pass (:meth:`_prepare_weights`) and the first micro-batch's finiteness is read
        with the later ones'."""
        step_counts = self._step_counts
        per_micro_batch = step_counts is None  # dict-returning model: counts are only known after the forward pass
        if per_micro_batch:
            step_counts = self._all_reduce(counts.detach().float()) * self.current_gradient_accumulation_steps
        step_counts = step_counts.to(sums.device)
        present = step_counts > 0
        regularizer = None
        if self._micro_index == 0:
            parts = [sums.detach().float(), counts.float()]
            pooled = self._all_reduce(torch.cat(parts if reference_sums is None else [*parts, reference_sums.float()]))
            if self.args.weight_update == "simultaneous":
                host_present = self._simultaneous_step(pooled, sums, counts, step_counts)
            else:
                host_present = self._alternating_weights(pooled, step_counts, sums, counts)
            self._device_rule_weights = self._rule_weights.to(sums.device, non_blocking=True)
            if per_micro_batch:  # effective weight: w_t / GA for each micro-batch where task t is present
                self.step_weights = self._rule_weights * host_present / self.current_gradient_accumulation_steps
            else:
                self.step_weights = self._rule_weights
            regularizer = self.weighting.regularizer(host_present)
            if self.args.weight_update == "simultaneous" and self.current_gradient_accumulation_steps == 1:
                self._check_later_micro_batches(per_micro_batch, first=True)
        else:
            self._later_nonfinite |= (counts > 0) & ~torch.isfinite(sums.detach() / counts.clamp_min(1))
            self._later_presence += present
            if self._micro_index == self.current_gradient_accumulation_steps - 1:
                self._check_later_micro_batches(per_micro_batch)
        self._micro_index += 1
        weights = self.weighting.differentiable_weights(self._device_rule_weights, present)
        loss = (weights * sums / step_counts.clamp_min(1)).sum() * self.accelerator.num_processes
        return loss if regularizer is None else loss + regularizer

    def _alternating_weights(
        self, pooled: torch.Tensor, step_counts: torch.Tensor, sums: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor:
        """The step's weights from its first micro-batch's pooled per-task sums, counts (and reference sums):
        one host transfer, with the weights predicted before the forward pass where they were (checked equal).
        Returns the step's present tasks (host)."""
        n = self.num_tasks
        ahead = [] if self._weights_ahead is None else [self._weights_ahead.float()]
        host = torch.cat([pooled, step_counts.float(), *ahead]).cpu()  # the step's one transfer of the inputs
        pooled_sums, pooled_counts = host[:n], host[n : 2 * n]
        host_step_counts = host[len(pooled) : len(pooled) + n]
        observed = pooled_counts > 0
        means = torch.where(observed, pooled_sums / pooled_counts.clamp_min(1), math.nan)
        self._check_finite(means, observed)
        extra: dict[str, torch.Tensor] = {}
        if len(pooled) > 2 * n:  # the reference model's means on the same targets (checked on the host)
            reference_means = host[2 * n : 3 * n] / pooled_counts.clamp_min(1)
            extra["reference_losses"] = torch.where(observed, reference_means, math.nan)
        grad_norms = self._task_grad_norms(sums, counts) if self.weighting.needs_grad_norms else None
        host_present = host_step_counts > 0
        self._rule_weights = (
            self.weighting.weights(
                means, host_present, observed, grad_norms=grad_norms, task_counts=host_step_counts, **extra
            )
            .detach()
            .cpu()
        )
        if ahead and not torch.allclose(host[-n:], self._rule_weights, rtol=1e-6, atol=0):
            raise RuntimeError(
                f"the weights used before the forward pass {host[-n:].tolist()} differ from the strategy's "
                f"{self._rule_weights.tolist()}"
            )
        self._later_nonfinite = torch.zeros(n, dtype=torch.bool, device=sums.device)
        self._later_presence = torch.zeros(n, device=sums.device)
        return host_present

    def _prepare_weights(self) -> None:
        """Before the step's first forward pass: its weights where they are known already (``_weights_ahead``): under
        ``weight_update='simultaneous'`` from the previous step's losses (one host transfer, the step's only one at
        its first micro-batch), else those of a strategy that does not weigh by the losses (on the device)."""
        self._weights_ahead = None
        if self._step_counts is None:
            return
        if self.args.weight_update == "simultaneous":
            self._weights_ahead, self._host_step_counts = self._simultaneous_weights(self._step_counts)
            self._device_rule_weights = self._weights_ahead.to(self.args.device, non_blocking=True)
        else:
            self._weights_ahead = loss_free_weights(self.weighting, self._step_counts > 0, self._step_counts)
            if self._weights_ahead is not None:
                self._device_rule_weights = self._weights_ahead

    def _simultaneous_weights(self, step_counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's weights from the previous step's first micro-batch (its pooled per-task sums, counts and
        reference sums; none before the first step: every task unobserved), and the step's target counts (host)."""
        n = self.num_tasks
        previous = [] if self._previous_observation is None else [self._previous_observation.to(step_counts.device)]
        host = torch.cat([step_counts.float(), *previous]).cpu()
        host_step_counts = host[:n]
        observation = host[n:] if previous else torch.zeros((3 if self.reference is not None else 2) * n)
        sums, counts = observation[:n], observation[n : 2 * n]
        observed = counts > 0
        means = torch.where(observed, sums / counts.clamp_min(1), math.nan)
        extra: dict[str, torch.Tensor] = {}
        if self.reference is not None:
            extra["reference_losses"] = torch.where(observed, observation[2 * n :] / counts.clamp_min(1), math.nan)
        weights = self.weighting.weights(means, host_step_counts > 0, observed, task_counts=host_step_counts, **extra)
        return weights.detach().cpu(), host_step_counts

    def _simultaneous_step(
        self, pooled: torch.Tensor, sums: torch.Tensor, counts: torch.Tensor, step_counts: torch.Tensor
    ) -> torch.Tensor:
        """Under the simultaneous order, at the first micro-batch: its pooled sums are kept on the device for the next
        step's weights, its finiteness is read with the later micro-batches'; the weights are those computed before
        the forward pass (or now, for a ``task_losses`` model). Returns the step's present tasks (host)."""
        if self._weights_ahead is None:
            self._weights_ahead, self._host_step_counts = self._simultaneous_weights(step_counts)
        self._rule_weights = self._weights_ahead
        self._previous_observation = pooled.detach()
        self._later_nonfinite = (counts > 0) & ~torch.isfinite(sums.detach() / counts.clamp_min(1))
        self._later_presence = torch.zeros(self.num_tasks, device=sums.device)
        return self._host_step_counts > 0

    def _target_scales(self, targets: Any) -> torch.Tensor | None:
        """Each target's weight in this micro-batch's objective, ``w_t * processes / N_t`` (``N_t``: the step's targets
        of its task), where the weights are known before the forward pass (later micro-batches: fixed at the first;
        the first: :meth:`_prepare_weights`), so that the chunked loss computes the head's gradients in it; ``None``
        otherwise, and for GradNorm (its per-task gradients are not the objective's)."""
        if self._step_counts is None or self.weighting.needs_grad_norms:
            return None
        if self._micro_index == 0 and self._weights_ahead is None:
            return None
        step_counts = self._step_counts.to(self._device_rule_weights.device)
        weights = self.weighting.differentiable_weights(self._device_rule_weights, step_counts > 0).detach()
        scales = weights.to(step_counts.device) * self.accelerator.num_processes / step_counts.clamp_min(1)
        return scales.to(targets.ids.device)[targets.ids]

    def _check_later_micro_batches(self, per_micro_batch: bool, first: bool = False) -> None:
        """At the step's last micro-batch (before its backward pass): one transfer of the later micro-batches'
        non-finite task flags and, for a ``task_losses`` model, of the number of them each task was present in
        (effective weight ``w_t * k_t / GA``, see the module docstring); ``first``: the last is the first."""
        host = torch.cat([self._later_nonfinite.float(), self._later_presence]).cpu()
        nonfinite, presence = host.split(self.num_tasks)
        self._check_finite(torch.where(nonfinite > 0, math.nan, 0.0), nonfinite > 0)
        if per_micro_batch and not first:
            self.step_weights = self.step_weights + self._rule_weights * presence / (
                self.current_gradient_accumulation_steps
            )

    def _check_finite(self, task_means: torch.Tensor, observed: torch.Tensor) -> None:
        """Raise ``FloatingPointError`` naming the observed tasks whose mean loss is not finite (host tensors)."""
        bad = observed & ~torch.isfinite(task_means)
        if bad.any():
            names = [self.task_names[i] for i in torch.nonzero(bad).flatten().tolist()]
            raise FloatingPointError(
                f"non-finite loss for task(s) {names} at optimizer step {self.state.global_step + 1}"
            )

    def _task_grad_norms(self, sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Norm of each task's mean-loss gradient w.r.t. the shared module, averaged over the processes that measured
        it (GradNorm); NaN for a task no process saw in this micro-batch."""
        params = self._shared_parameters()
        norms = torch.zeros(self.num_tasks, device=sums.device)
        for t in torch.nonzero(counts > 0).flatten().tolist():
            grads = torch.autograd.grad(sums[t] / counts[t], params, retain_graph=True, allow_unused=True)
            norms[t] = torch.sqrt(sum((g.float() ** 2).sum() for g in grads if g is not None))
        pooled = self._all_reduce(torch.cat([norms, (counts > 0).float()]))
        measured = pooled[self.num_tasks :]
        return torch.where(measured > 0, pooled[: self.num_tasks] / measured.clamp_min(1), math.nan)

    def _shared_parameters(self) -> list[torch.nn.Parameter]:
        if self._shared_params is None:
            model = self.accelerator.unwrap_model(self.model)
            name = self.args.gradnorm_shared_module or last_encoder_layer(model)
            modules = dict(model.named_modules())
            if name not in modules:
                raise ValueError(f"gradnorm_shared_module: the model has no module named {name!r}")
            self._shared_params = [p for p in modules[name].parameters() if p.requires_grad]
            if not self._shared_params:
                raise ValueError(f"gradnorm_shared_module: module {name!r} has no trainable parameters")
        return self._shared_params

    def _all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.accelerator.num_processes == 1:
            return tensor
        return self.accelerator.reduce(tensor.to(self.args.device), reduction="sum")


def batch_size(inputs: dict[str, Any]) -> int:
    """Leading dimension of the batch's first tensor."""
    return next(v.shape[0] for v in inputs.values() if torch.is_tensor(v) and v.dim())


def first_rows(inputs: dict[str, Any], rows: int) -> dict[str, Any]:
    """The batch restricted to its first ``rows`` examples (tensors sharing the batch dimension are sliced)."""
    size = batch_size(inputs)
    return {k: v[:rows] if torch.is_tensor(v) and v.dim() and v.shape[0] == size else v for k, v in inputs.items()}
