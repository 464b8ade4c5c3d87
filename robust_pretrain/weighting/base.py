"""Common base of the task-weighting strategies.

A strategy turns per-task loss estimates into one weight per task, once per optimizer step. The trainer then
minimises ``sum_t w_t * L_t``. Absent tasks get weight 0, except with ``weigh_absent_tasks`` (always on for
``doremi``), where every task is weighed at every step from its last estimate (an absent task contributes no loss, but
its weight counts in the time average and in online sampling; the weights then sum to 1 over all tasks). Over the
present tasks P the weights of ``proportional``, ``average``, ``minimax``, ``hardmax``, ``group_dro``, ``morbit`` and
``dwa`` sum to 1; those of ``uncertainty`` (``0.5 * exp(-s_t)``) and ``gradnorm`` (``w_t / T``, 1 only with every task
present) do not.

Weights of loss-driven strategies are constants (no gradient flows through them); strategies with learnable
parameters (uncertainty, GradNorm) expose them through :meth:`Weighting.parameters` so the trainer's optimizer trains
them and checkpoints their optimizer state. A strategy that needs more than the losses says so with a class flag:
``needs_grad_norms`` (per-task gradient norms on a shared module) or ``needs_task_counts`` (the step's per-task target
counts); :meth:`Weighting.weights` then requires that argument.
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from typing import Any

import torch

from .arguments import DEFAULTS, check_weighting_options


class Weighting(ABC):
    """Base class: keeps the per-task loss estimates and applies the task-loss normalisation.

    Args:
        num_tasks: number of tasks T.
        loss_normalization: how loss-driven strategies see the task losses: ``raw`` (the paper), ``relative``
            (``L_t / L_t^0``, the first estimate of task t) or ``excess`` (``max(L_t - ref_t, 0)``, DoReMi's excess
            loss against a reference model).
        reference_losses: one reference loss per task, for ``excess`` (static reference).
        loss_ema: exponential moving average factor ``beta`` of the estimates:
            ``est_t <- beta * est_t + (1 - beta) * L_t`` (0 uses the current step's loss, the paper's rule).
        reference_model: ``excess`` against a frozen reference model (its path; the trainer runs it): per-task
            values on the same targets, passed to :meth:`weights` at every step as ``reference_losses``, replace
            static ``reference_losses``; their estimates follow the same EMA, so ``excess_t = max(est_t - ref_t, 0)``.
        weigh_absent_tasks: weigh every task at every step, a task absent from the step from its last estimate (one
            never estimated: the largest current estimate; with ``excess``, the largest known excess), instead of
            giving it weight 0.
        excess_clipping: with ``reference_model``, where the excess is clipped at 0: ``token`` (DoReMi's
            ``mean over t's targets of max(l - l_ref, 0)``; the trainer passes as ``reference_losses`` the means of
            ``min(l, l_ref)`` per target, so ``est_t - ref_t`` is that mean, exactly, and EMAs of both are its EMA) or
            ``domain`` (``max(mean l - mean l_ref, 0)``: the excess of the task's mean loss; the trainer passes the
            reference's means).
    """

    #: whether the weights follow the task losses (only those accept a loss normalisation and an EMA)
    loss_driven: bool = True
    #: whether :meth:`~robust_pretrain.Weighting.weights` needs per-task gradient norms of a shared module (GradNorm)
    needs_grad_norms: bool = False
    #: whether :meth:`~robust_pretrain.Weighting.weights` needs the step's per-task target counts (proportional)
    needs_task_counts: bool = False

    def __init__(
        self,
        num_tasks: int,
        loss_normalization: str = DEFAULTS.loss_normalization,
        reference_losses: list[float] | None = DEFAULTS.reference_losses,
        loss_ema: float = DEFAULTS.loss_ema,
        reference_model: str | None = DEFAULTS.reference_model,
        excess_clipping: str = DEFAULTS.excess_clipping,
        weigh_absent_tasks: bool = DEFAULTS.weigh_absent_tasks,
    ) -> None:
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
        check_weighting_options(
            loss_normalization=loss_normalization,
            reference_losses=reference_losses,
            loss_ema=loss_ema,
            excess_clipping=excess_clipping,
        )
        if not self.loss_driven and (loss_normalization != "raw" or loss_ema or weigh_absent_tasks):
            raise ValueError(
                f"{type(self).__name__} is not loss-driven: loss_normalization, loss_ema and weigh_absent_tasks do not "
                "apply"
            )
        if reference_model is not None and (loss_normalization != "excess" or reference_losses is not None):
            raise ValueError("reference_model needs loss_normalization='excess' and no static reference_losses")
        if reference_model is None and excess_clipping != DEFAULTS.excess_clipping:
            raise ValueError(f"excess_clipping={excess_clipping!r} applies to a reference_model only")
        if loss_normalization == "excess" and reference_model is None:
            if reference_losses is None or len(reference_losses) != num_tasks:
                raise ValueError(
                    f"loss_normalization='excess' needs reference_losses with one value per task ({num_tasks}), "
                    f"got {reference_losses!r}"
                )
        self.num_tasks = num_tasks
        self.loss_normalization = loss_normalization
        self.reference_losses = None if reference_losses is None else torch.tensor(reference_losses).float()
        self.loss_ema = loss_ema
        self.reference_model = reference_model
        self.excess_clipping = excess_clipping
        self.weigh_absent_tasks = bool(weigh_absent_tasks)
        self.reference_estimates = None if reference_model is None else torch.full((num_tasks,), math.nan)
        self.step = 0
        self.estimates = torch.full((num_tasks,), math.nan)
        self.initial_losses = torch.full((num_tasks,), math.nan)

    # ----------------------------------------------------------------------------------------------------------------
    def weights(
        self,
        task_losses: torch.Tensor,
        present: torch.Tensor,
        observed: torch.Tensor | None = None,
        grad_norms: torch.Tensor | None = None,
        task_counts: torch.Tensor | None = None,
        reference_losses: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return the weights (shape ``[T]``) for this optimizer step and advance the strategy by one step.

        Args:
            task_losses: the step's per-task mean losses, ``[T]``; entries outside ``observed`` are ignored.
            present: tasks with at least one target in this step. Only they get weight (every task with
                ``weigh_absent_tasks``); the others keep their estimate.
            observed: tasks whose entry of ``task_losses`` is a fresh measurement (default: ``present``). A task present
                but not yet observed uses its last estimate (or, never seen, the largest current estimate; with
                ``excess``, the largest known excess, whichever the reference).
            grad_norms: per-task gradient norms on the shared module, for strategies with ``needs_grad_norms``;
                NaN for a task whose norm was not measured at this step.
            task_counts: the step's number of targets of each task (all micro-batches and processes), for
                strategies with ``needs_task_counts``.
            reference_losses: with ``reference_model`` (and only then), per-task means on the same targets as
                ``task_losses`` (see ``excess_clipping``: of ``min(l, l_ref)``, or of the reference's losses), ``[T]``;
                entries outside ``observed`` are ignored.
        """
        if task_losses.shape != (self.num_tasks,) or present.shape != (self.num_tasks,):
            raise ValueError(
                f"expected task_losses and present of shape ({self.num_tasks},), "
                f"got {tuple(task_losses.shape)} and {tuple(present.shape)}"
            )
        if (self.reference_model is None) != (reference_losses is None):
            raise ValueError(
                "reference_losses are given at each step with a reference_model, and only then "
                f"(reference_model={self.reference_model!r})"
            )
        if self.needs_task_counts and (task_counts is None or task_counts.shape != (self.num_tasks,)):
            raise ValueError(
                f"{type(self).__name__} needs task_counts of shape ({self.num_tasks},), got {task_counts!r}"
            )
        counts = task_counts if self.needs_task_counts else None
        task_losses, present, observed, counts, reference_losses = _to_host(
            task_losses, present, observed, counts, reference_losses
        )
        present = present.bool()
        observed = present if observed is None else observed.bool() & present
        self._observe(task_losses, observed)
        if reference_losses is not None:
            bad = observed & ~torch.isfinite(reference_losses)
            if bad.any():
                raise FloatingPointError(
                    f"non-finite reference loss for task(s) {torch.nonzero(bad).flatten().tolist()} at step {self.step}"
                )
            _ema_update(self.reference_estimates, reference_losses, observed, self.loss_ema)
        weighed = torch.ones_like(present) if self.weigh_absent_tasks else present
        estimates = self.estimates.clone()
        unseen = weighed & estimates.isnan()
        if unseen.any() and self.loss_normalization != "excess":  # excess: the unseen one's excess (_normalize)
            known = estimates[~estimates.isnan()]
            estimates[unseen] = known.max() if known.numel() else 0.0
        if not present.any():
            w = torch.zeros(self.num_tasks)
        else:
            kwargs: dict[str, torch.Tensor | None] = {}
            if self.needs_grad_norms:
                kwargs["grad_norms"] = grad_norms
            if self.needs_task_counts:
                kwargs["task_counts"] = counts
            w = self._weights(self._normalize(estimates), weighed, **kwargs)
        self.step += 1
        return w

    def _observe(self, task_losses: torch.Tensor, observed: torch.Tensor) -> None:
        _ema_update(self.estimates, task_losses, observed, self.loss_ema)
        first = observed & self.initial_losses.isnan()
        self.initial_losses[first] = task_losses[first]

    def _normalize(self, estimates: torch.Tensor) -> torch.Tensor:
        if self.loss_normalization == "relative":
            initial = torch.where(self.initial_losses.isnan(), estimates, self.initial_losses)
            return estimates / initial.clamp_min(1e-12)
        if self.loss_normalization == "excess":
            # one rule for both references: a task not measured yet takes the largest known excess (0 if none)
            reference = self.reference_losses if self.reference_estimates is None else self.reference_estimates
            excess = (estimates - reference).clamp_min(0.0)
            unseen = excess.isnan()
            known = excess[~unseen]
            return excess.masked_fill(unseen, float(known.max()) if known.numel() else 0.0)
        return estimates

    @abstractmethod
    def _weights(self, losses: torch.Tensor, present: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """The strategy's rule on normalised estimates; tasks outside ``present`` (the tasks to weigh: every task
        with ``weigh_absent_tasks``) must get weight 0."""

    # ----------------------------------------------------------------------------------------------------------------
    def parameters(self) -> list[torch.nn.Parameter]:
        """Learnable parameters the trainer's optimizer updates (none for loss-driven strategies)."""
        return []

    def differentiable_weights(self, weights: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """The step's weights as used in the loss; learnable strategies rebuild them so gradient reaches them."""
        return weights

    def regularizer(self, present: torch.Tensor) -> torch.Tensor | None:
        """A term added once per optimizer step to the objective (uncertainty weighting's log-variances)."""
        return None

    def log_values(self) -> dict[str, float]:
        """Scalars the trainer logs with the task weights (e.g. minimax's automatic alpha); none by default."""
        return {}

    def to(self, device: torch.device | str) -> Weighting:
        """Move learnable parameters to ``device`` (estimates stay on the CPU)."""
        for param in self.parameters():
            param.data = param.data.to(device)
        return self

    def options(self) -> dict[str, Any]:
        """The constructor options of this strategy (every ``__init__`` parameter but ``num_tasks``), JSON values."""
        names = [
            name
            for cls in type(self).__mro__
            if issubclass(cls, Weighting) and "__init__" in vars(cls)
            for name in inspect.signature(cls.__init__).parameters
            if name not in ("self", "num_tasks", "args", "kwargs") and hasattr(self, name)
        ]
        values = {name: getattr(self, name) for name in dict.fromkeys(names)}
        for name in ("excess_clipping", "weigh_absent_tasks"):  # at their defaults: as in checkpoints written before
            if name in values and values[name] == getattr(DEFAULTS, name):
                del values[name]
        return {name: value.tolist() if torch.is_tensor(value) else value for name, value in values.items()}

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (NaN stored as ``null``); float32 values round-trip exactly through JSON."""
        state: dict[str, Any] = {"name": type(self).__name__, "step": self.step}
        for key, value in self._tensor_state().items():
            state[key] = _nan_to_none(value.detach().float().cpu().tolist())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != type(self).__name__:
            raise ValueError(f"weighting state is for {state.get('name')!r}, not {type(self).__name__!r}")
        self.step = int(state["step"])
        for key, tensor in self._tensor_state().items():
            if key not in state:
                raise ValueError(f"weighting state of {type(self).__name__} lacks {key!r}")
            value = torch.tensor(_none_to_nan(state[key]), dtype=torch.float32)
            if value.shape != tensor.shape:
                raise ValueError(
                    f"weighting state {key!r} has shape {tuple(value.shape)}, expected {tuple(tensor.shape)}"
                )
            tensor.data.copy_(value.to(tensor.device))

    def _tensor_state(self) -> dict[str, torch.Tensor]:
        """Tensors that make up the state; subclasses extend it."""
        state = {"estimates": self.estimates, "initial_losses": self.initial_losses}
        if self.reference_estimates is not None:
            state["reference_estimates"] = self.reference_estimates
        return state


def _ema_update(estimates: torch.Tensor, values: torch.Tensor, observed: torch.Tensor, beta: float) -> None:
    """In place: a first observation sets the estimate, later ones move it by ``est <- beta * est + (1 - beta) * x``."""
    fresh = observed & estimates.isnan()
    estimates[fresh] = values[fresh]
    seen = observed & ~fresh
    estimates[seen] = beta * estimates[seen] + (1 - beta) * values[seen]


def _to_host(*vectors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """The ``[T]`` vectors (``None`` stays ``None``) as float32 host tensors, in one device->host transfer."""
    given = [vector for vector in vectors if vector is not None]
    device = given[0].device
    host = iter(torch.stack([vector.detach().to(device, torch.float32) for vector in given]).cpu().unbind())
    return [None if vector is None else next(host) for vector in vectors]


def _nan_to_none(values: Any) -> Any:
    """Strict JSON has no NaN: unknown estimates are stored as ``null``."""
    if isinstance(values, list):
        return [_nan_to_none(v) for v in values]
    return None if math.isnan(values) else values


def _none_to_nan(values: Any) -> Any:
    if isinstance(values, list):
        return [_none_to_nan(v) for v in values]
    return math.nan if values is None else values


def masked_uniform(present: torch.Tensor) -> torch.Tensor:
    """Uniform weights over the present tasks, zero elsewhere."""
    return present.float() / present.sum().clamp_min(1)
