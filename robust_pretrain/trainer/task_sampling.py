"""Task-weighted sampling (DoReMi-style): draw each sequence's task in proportion to the task weights, train on the
plain mean over the drawn targets.

Instead of reweighting the loss (``sum_t w_t L_t``), ``per_example`` masking draws the task of every training
sequence with probability proportional to ``w_t`` (among the tasks the sequence contains), so the targets themselves
follow the weights and the objective is the plain per-target mean. Three pieces, one :class:`TaskSamplingSchedule`:

- :class:`TaskSamplingWeighting` wraps a strategy (e.g. ``minimax``) for the trainer. Each optimizer step it feeds the
  strategy the step's per-task training losses (pooled over all processes, so every rank computes the same weights)
  and records the strategy's weights as the step's *sampling* weights; the objective's weights are ``proportional``
  (``N_t / N``), i.e. the trainer minimises the plain mean over the step's targets. Its checkpoint state
  (``weighting_state.json``) holds the strategy's state and the recent sampling weights, so a resumed run draws as an
  uninterrupted one.
- ``TaskGroupedMLMCollator(..., mode="per_example", task_schedule=schedule)`` draws with the weights the schedule
  assigns to each batch.
- :class:`TaskSamplingCallback` tells the schedule where each epoch starts.

``MinimaxTrainer`` builds and wires them itself from ``MinimaxTrainingArguments.task_sampling`` (``online``: the
strategy's weights; ``fixed``: ``task_sampling_weights``, the objective the strategy's, or with
``importance_weighting`` the :class:`ImportanceWeighting` of it) and logs each step's sampling weights as
``task_sampling_weight/<task>`` (``task_weight/<task>`` are the objective's).

Sampling weights exactly: at optimizer step ``s`` the trainer pools each task's mean training loss ``L_t`` over the
step's first micro-batch and all processes (the whole step without gradient accumulation), for the tasks that batch
drew; the strategy updates its estimates with them (the others keep their last estimate, a task never seen yet gets
the largest) and its weights over all tasks are step ``s``'s sampling weights, e.g. for ``minimax``
``w = (1 - eps) * softmax(alpha * L) + eps / T``. The objective is ``sum_t (N_t / N) L_t``, the plain mean over the
step's ``N`` targets (``proportional`` weights, ``N_t`` targets of task t over all micro-batches and processes). A
sequence can only get a task it contains, so a task's share of the draws is at most the share of sequences holding
it (rare tasks such as interjections get less than their weight); among the tasks of a sequence the draw follows the
weights exactly.

Lag rule: the batches of optimizer step ``s`` (1-based) are drawn with the sampling weights recorded at step ``s - 2``
(the initial weights, uniform unless published otherwise, for ``s <= 2``). The Trainer fetches the first micro-batch
of step ``s`` while step ``s - 1`` is still running (Accelerate's data loader reads one batch ahead), so ``s - 2`` is
the newest step whose weights exist whenever that batch is collated. The rule keys the weights by step, not by time,
so the draws are the same with any number of processes, on resume, and with any ``gradient_accumulation_steps``, and
the same in ``DataLoader`` workers as in the main process. It needs to know which step a batch belongs to: the
collator counts the training batches it collates (a worker: its share of them, in turn with the others), so it must
collate only training batches (held-out data masked in advance, as the recipe does). Map-style datasets only (with an
iterable dataset Accelerate may let one process collate for all).

Usage (the PoS recipe: ``--masking per_example --task_sampling online --weighting minimax``)::

    args = MinimaxTrainingArguments(output_dir, weighting="minimax", task_sampling="online")
    collator = TaskGroupedMLMCollator(tokenizer, mode="per_example", seed=args.seed)  # its spec's tasks
    trainer = MinimaxTrainer(model=model, args=args, train_dataset=train, data_collator=collator)

Sampling with fixed weights ``q`` toward an objective ``w`` (:class:`ImportanceWeighting`): with every sequence of
one task (data domains, :class:`~robust_pretrain.data.domains.DomainCollator`) and of the same number of targets,
``sum_t (w_t / q_t) S_t / N`` over a step of ``N`` targets (``S_t``: task t's loss sum) has the expected gradient of
``sum_t w_t L_t``, ``L_t`` the mean loss of task t's sequences; ``w = q`` is the plain mean. This holds exactly
when ``w`` does not depend on which tasks the step drew: the objective weighs every task at every step (a task the
step did not draw keeps its weight, from its last loss estimate, as with ``weigh_absent_tasks``; a loss-driven ``w``
renormalised over the drawn tasks is biased, 0.43 in total for 3 domains at batch 6 in
``tests/test_importance_weighting.py``), and every ``q_t`` is at least ``MIN_IMPORTANCE_SHARE / T`` (a task drawn
less often is refused: in practice it would never be drawn and would leave the objective). A loss-driven ``w`` is
computed from the step's own losses: the expectation is over the draws for the weights the step computes (constants
of the step, as for every objective here), not over the losses' noise. Proportional weights (the batch's own shares)
are refused as the objective or the sampler.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from robust_pretrain.weighting import ProportionalWeighting, Weighting

logger = logging.getLogger(__name__)

#: optimizer steps between the step whose weights a batch uses and the step the batch trains
SAMPLING_LAG = 2
#: importance weighting refuses a task whose sampling weight is below this share of the uniform one (``q_t * T``)
MIN_IMPORTANCE_SHARE = 1e-3


class TaskSamplingSchedule:
    """Sampling weights by optimizer step and the step of each training batch the collator draws.

    ``publish(step, weights)`` records the weights of a step (step 0: before training; uniform by default, else
    ``fixed_weights``: then every batch is drawn with them, whatever its step, and no other step is published);
    :meth:`start_epoch` says which step the next batch belongs to; :meth:`next_batch_weights` returns the weights of
    the next batch by the lag rule (module docstring) and counts the batch.

    The recent steps' weights and the epoch's start live in shared memory, so ``DataLoader`` worker processes (forked
    or spawned, persistent or not) read what the main process publishes: worker ``i`` of ``W`` collates the epoch's
    batches ``i, i + W, i + 2W, ...`` (map-style datasets hand batches to workers in turn) and waits, if it runs ahead,
    until the weights its batch needs are published.
    """

    #: seconds a DataLoader worker waits for the weights of a step before it gives up
    worker_timeout: float = 600.0

    def __init__(
        self, num_tasks: int, accumulation_steps: int = 1, fixed_weights: torch.Tensor | list[float] | None = None
    ) -> None:
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
        self.num_tasks = num_tasks
        self.fixed = fixed_weights is not None
        slots = SAMPLING_LAG + 2  # a batch needs step s - LAG while steps up to s - 1 can be published
        self._steps = torch.full((slots,), -1, dtype=torch.int64).share_memory_()
        self._weights = torch.zeros(slots, num_tasks, dtype=torch.float64).share_memory_()
        self._epoch = torch.zeros(3, dtype=torch.int64).share_memory_()  # epoch counter, first step, accumulation
        self._local_epoch, self._local_batches = -1, 0  # per process: batches collated by it in this epoch
        uniform = torch.full((num_tasks,), 1.0 / num_tasks, dtype=torch.float64)
        self.publish(0, uniform if fixed_weights is None else fixed_weights)
        self.start_epoch(1, accumulation_steps)

    @property
    def history(self) -> dict[int, torch.Tensor]:
        """The weights of the recent published steps, by step."""
        return {int(step): self._weights[slot].clone() for slot, step in enumerate(self._steps.tolist()) if step >= 0}

    def publish(self, step: int, weights: torch.Tensor | list[float]) -> None:
        if self.fixed and step != 0:
            raise ValueError(f"the sampling weights are fixed: step {step}'s cannot be published")
        weights = torch.as_tensor(weights, dtype=torch.float64).cpu()
        if weights.shape != (self.num_tasks,) or not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
            raise ValueError(f"sampling weights must be {self.num_tasks} finite values >= 0, got {weights.tolist()}")
        slot = step % len(self._steps)
        self._steps[slot] = -1  # readers never see a half-written row
        self._weights[slot] = weights
        self._steps[slot] = step

    def start_epoch(self, next_step: int, accumulation_steps: int) -> None:
        """The next batch collated is the first micro-batch of optimizer step ``next_step``."""
        if next_step < 1 or accumulation_steps < 1:
            raise ValueError(f"next_step and accumulation_steps must be >= 1, got {next_step}, {accumulation_steps}")
        self._epoch[1], self._epoch[2] = next_step, accumulation_steps
        self._epoch[0] += 1

    def next_batch_weights(self) -> tuple[int, torch.Tensor]:
        """``(step, weights)`` for the next training batch: the weights recorded at ``step - SAMPLING_LAG``."""
        step, _, weights = self.next_batch()
        return step, weights

    def next_batch(self) -> tuple[int, int, torch.Tensor]:
        """``(step, micro_batch, weights)`` for the next training batch: its optimizer step, its index among the
        step's ``accumulation_steps`` micro-batches, and the weights recorded at ``step - SAMPLING_LAG`` (with
        ``fixed`` weights: those of step 0, whatever the step)."""
        epoch, next_step, accumulation_steps = self._epoch.tolist()
        if epoch != self._local_epoch:
            self._local_epoch, self._local_batches = epoch, 0
        worker = torch.utils.data.get_worker_info()
        worker_id, num_workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        batch_index = self._local_batches * num_workers + worker_id
        step = next_step + batch_index // accumulation_steps
        source = 0 if self.fixed else max(0, step - SAMPLING_LAG)
        slot = source % len(self._steps)
        deadline = time.monotonic() + (self.worker_timeout if worker is not None else 0.0)
        while (published := int(self._steps[slot])) != source:
            if published > source or time.monotonic() >= deadline:
                raise RuntimeError(
                    f"the sampling weights of optimizer step {source} (needed by step {step}) were not published; "
                    f"known steps: {sorted(self.history)}. Is the collator used for other batches than training "
                    "ones, or did the run skip TaskSamplingCallback?"
                )
            time.sleep(0.001)  # a worker ahead of training: the main process publishes the step soon
        weights = self._weights[slot].clone()
        if int(self._steps[slot]) != source:  # overwritten while read (cannot happen by the lag rule): refuse
            raise RuntimeError(f"the sampling weights of optimizer step {source} changed while they were read")
        self._local_batches += 1
        return step, batch_index % accumulation_steps, weights

    def weights_at(self, step: int) -> torch.Tensor | None:
        """The sampling weights recorded at optimizer ``step`` (fixed ones: whatever the step), None if unknown."""
        return self.history.get(0 if self.fixed else step)

    def state_dict(self) -> dict[str, Any]:
        return {"history": {str(step): weights.tolist() for step, weights in self.history.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._steps.fill_(-1)
        for step, weights in sorted((int(s), w) for s, w in state["history"].items()):
            self.publish(step, weights)


def refuse_learned_sampler(strategy: Weighting, name: str | None = None) -> None:
    """Refuse a strategy whose weights are learned through the weighted objective, which sampling replaces, or are
    the batch's own task shares (``proportional``: drawing by them feeds the draws back into the weights)."""
    if strategy.parameters() or strategy.needs_grad_norms or strategy.needs_task_counts:
        reason = (
            "its weights are the batch's own task shares, so drawing by them (or correcting draws toward them) feeds "
            "the draws back into the weights"
            if strategy.needs_task_counts
            else "its weights are learned through the weighted objective, which task sampling replaces"
        )
        raise ValueError(
            f"{name or type(strategy).__name__} cannot drive task sampling: {reason}; use a loss-driven strategy "
            "(minimax, hardmax, group_dro, dwa, morbit, average)"
        )


TaskWeights = dict[str, float] | list[float]


def task_weights(value: Any) -> TaskWeights | None:
    """``task_sampling_weights`` as given, read: ``{task: weight}`` from a mapping, ``name=weight`` tokens, a JSON
    object (a string) or a JSON file (its object, or the ``weights`` of one written by ``robust-pretrain-mixture`` /
    ``robust-pretrain-decide``); a list of weights in task order from numbers (or number tokens). Values are
    checked by the option's declaration (finite, >= 0) and against the tasks by ``bind_tasks``."""
    if value is None or isinstance(value, Mapping):
        return None if value is None else _named(value)
    tokens = [value] if isinstance(value, str | Path) else list(value)
    if len(tokens) == 1 and isinstance(tokens[0], str | Path) and _is_json(str(tokens[0])):
        return _named(_read_json(str(tokens[0])))
    if all(isinstance(token, str) and "=" in token for token in tokens):
        pairs = [token.split("=", 1) for token in tokens]
        if len({name for name, _ in pairs}) != len(pairs):
            raise ValueError(f"task_sampling_weights: a task named twice in {tokens}")
        return _named({name: _number(weight, name, spelt=True) for name, weight in pairs})
    if any(isinstance(token, str) and "=" in token for token in tokens):
        raise ValueError(f"task_sampling_weights: every task as name=weight, or weights in task order, got {tokens}")
    return [_number(token, f"#{position}", spelt=True) for position, token in enumerate(tokens)]


def _is_json(text: str) -> bool:
    """Whether one token names a JSON object or file rather than one weight or one ``name=weight``."""
    if text.lstrip().startswith("{"):
        return True
    if "=" in text and not Path(text).is_file():
        return False
    try:
        float(text)
    except ValueError:
        return True
    return False


def _read_json(text: str) -> Any:
    try:
        content = json.loads(text) if text.lstrip().startswith("{") else json.loads(Path(text).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"task_sampling_weights {text}: expected a JSON object of task -> weight ({err})") from None
    is_weights_file = isinstance(content, dict) and isinstance(content.get("weights"), dict)
    return content["weights"] if is_weights_file else content


def _named(mapping: Any) -> dict[str, float]:
    if not isinstance(mapping, Mapping) or not mapping:
        raise ValueError(f"task_sampling_weights: expected {{task: weight}} with one or more tasks, got {mapping!r}")
    return {str(name): _number(weight, name) for name, weight in mapping.items()}


def _number(value: Any, name: Any, spelt: bool = False) -> float:
    """A weight as a float: a number (not a bool, nor NaN / infinity), or with ``spelt`` a token that spells one."""
    accepted = (int, float, str) if spelt else (int, float)
    try:
        if isinstance(value, bool) or not isinstance(value, accepted):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"task_sampling_weights: the weight of {name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"task_sampling_weights: the weight of {name} must be finite, got {value!r}")
    return number


def ordered_weights(weights: TaskWeights, names: list[str]) -> list[float]:
    """The weights in the order of the tasks ``names``: a list as it is (one per task), a mapping by name (every task
    named, no other)."""
    if not isinstance(weights, Mapping):
        if len(weights) != len(names):
            raise ValueError(f"task_sampling_weights: one weight per task ({len(names)}: {names}), got {weights}")
        return list(weights)
    missing, unknown = [n for n in names if n not in weights], [n for n in weights if n not in names]
    if missing or unknown:
        raise ValueError(
            f"task_sampling_weights: the tasks are {names}"
            + (f"; no weight for {missing}" if missing else "")
            + (f"; no task named {unknown}" if unknown else "")
        )
    return [weights[name] for name in names]


def check_importance_sampling(
    sampling_weights: torch.Tensor | list[float], names: list[str] | None = None, option: str = "task_sampling_weights"
) -> torch.Tensor:
    """The normalised sampling weights ``q`` of importance weighting; refuse a task drawn with ``q_t * T`` below
    :data:`MIN_IMPORTANCE_SHARE` (0 or tiny: the task is, in practice, never drawn and leaves the objective)."""
    q = torch.as_tensor(sampling_weights, dtype=torch.float64)
    if q.ndim != 1 or not bool(torch.isfinite(q).all()) or bool((q < 0).any()) or not q.sum() > 0:
        raise ValueError(f"{option}: finite values >= 0, not all 0, got {q.tolist()}")
    q = q / q.sum()
    floor = MIN_IMPORTANCE_SHARE / len(q)
    rare = [(names[t] if names else f"task {t}", float(q[t])) for t in range(len(q)) if q[t] < floor]
    if rare:
        listed = ", ".join(f"{name}: {share:.3g}" for name, share in rare)
        raise ValueError(
            f"{option}: importance weighting draws every task, but {listed} (normalised) is below "
            f"{floor:.3g} = {MIN_IMPORTANCE_SHARE:g} / {len(q)} tasks: it is (almost) never drawn and leaves the "
            "objective; raise its sampling weight or drop the task"
        )
    return q


class EpochCap:
    """UniMax's epoch cap for online sampling: once the sequences drawn of a task reach ``max_epochs`` times its
    training sequences, its sampling weight is 0 and the others are renormalised.

    The draws are counted exactly: ``count_draws(step, weights)`` recomputes the sequences of each task that optimizer
    ``step`` draws with the sampling weights its batches use (those of ``step - SAMPLING_LAG``). After step ``s`` the
    draws of steps ``<= s + 1`` are known (step ``s + 1`` uses the weights of ``s - 1``), so the weights of step ``s``
    (drawing step ``s + 2``) close every task whose count through ``s + 1`` reached its cap; the step that crosses a
    cap may overshoot it by part of one global batch. Once every task reached its cap the weights are left uncapped
    (warned once). The counts are part of the checkpoint state: a resumed run caps as an uninterrupted one.
    """

    def __init__(
        self, max_epochs: float, sequences: list[int], count_draws: Callable[[int, torch.Tensor], torch.Tensor]
    ) -> None:
        if not max_epochs > 0 or not sequences or min(sequences) < 1:
            raise ValueError(f"max_epochs > 0 and >= 1 sequence per task, got {max_epochs}, {sequences}")
        self.max_epochs, self.count_draws = max_epochs, count_draws
        self.limit = max_epochs * torch.tensor(sequences, dtype=torch.float64)
        self.drawn = torch.zeros(len(sequences), dtype=torch.float64)
        self.ahead = torch.zeros_like(self.drawn)  # the draws of the step after the last one trained
        self.counted_step, self.warned = 0, False

    def apply(self, step: int, weights: torch.Tensor, schedule: TaskSamplingSchedule) -> torch.Tensor:
        """Step ``step``'s sampling ``weights``, the tasks that reached their cap (through step ``step + 1``) at 0."""
        for later in range(self.counted_step + 1, step + 2):
            used = schedule.weights_at(max(0, later - SAMPLING_LAG))
            if used is None:
                raise RuntimeError(f"the sampling weights that step {later} draws with are unknown")
            self.ahead = self.count_draws(later, used)
            self.drawn += self.ahead
        self.counted_step = max(self.counted_step, step + 1)
        open_tasks = self.drawn < self.limit
        if not bool(open_tasks.any()):
            if not self.warned:
                logger.warning(
                    "every task was drawn %g epochs (max_epochs_per_task): the cap no longer holds", self.max_epochs
                )
                self.warned = True
            return weights
        capped = torch.where(open_tasks, weights.to(torch.float64), 0.0)
        capped = capped if float(capped.sum()) > 0 else open_tasks.to(torch.float64)
        return capped / capped.sum()

    def epochs(self) -> list[float]:
        """Epochs drawn of each task by the steps trained so far: its draws over its training sequences."""
        return ((self.drawn - self.ahead) * self.max_epochs / self.limit).tolist()

    def state_dict(self) -> dict[str, Any]:
        drawn, ahead = self.drawn.tolist(), self.ahead.tolist()
        return {"drawn": drawn, "ahead": ahead, "counted_step": self.counted_step, "warned": self.warned}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drawn = torch.tensor(state["drawn"], dtype=torch.float64)
        self.ahead = torch.tensor(state["ahead"], dtype=torch.float64)
        self.counted_step, self.warned = int(state["counted_step"]), bool(state["warned"])


class TaskSamplingWeighting(ProportionalWeighting):
    """Objective: the plain mean over the step's targets (``proportional`` weights). Sampling: ``sampler``'s weights.

    Each step the sampler sees every task as present (the step's losses where measured, its last estimate for tasks
    the step did not draw), so a task absent from one step keeps a sampling weight and can be drawn again; its
    weights of step ``s`` are published to ``schedule`` as step ``s``'s sampling weights. Learnable strategies
    (``uncertainty``, ``gradnorm``) are refused: their weights learn through the weighted objective, which sampling
    replaces by the plain mean. With ``cap`` (:class:`EpochCap`) the published weights are the capped ones.
    """

    def __init__(self, sampler: Weighting, schedule: TaskSamplingSchedule, cap: EpochCap | None = None) -> None:
        refuse_learned_sampler(sampler)
        if sampler.num_tasks != schedule.num_tasks:
            raise ValueError(f"sampler has {sampler.num_tasks} tasks, the schedule {schedule.num_tasks}")
        super().__init__(sampler.num_tasks)
        self.sampler, self.schedule, self.cap = sampler, schedule, cap

    def weights(
        self,
        task_losses: torch.Tensor,
        present: torch.Tensor,
        observed: torch.Tensor | None = None,
        grad_norms: torch.Tensor | None = None,
        task_counts: torch.Tensor | None = None,
    ) -> torch.Tensor:
        measured = present if observed is None else observed & present
        every_task = torch.ones(self.num_tasks, dtype=torch.bool)
        sampling = self.sampler.weights(task_losses, every_task, measured.cpu(), task_counts=task_counts)
        objective = super().weights(task_losses, present, observed, task_counts=task_counts)
        if self.cap is not None:
            sampling = self.cap.apply(self.step, sampling, self.schedule)
        self.schedule.publish(self.step, sampling)  # self.step: the optimizer step just computed (1-based)
        return objective

    def log_values(self) -> dict[str, float]:
        """The sampling strategy's own log values (e.g. ``minimax_alpha``)."""
        return self.sampler.log_values()

    def options(self) -> dict[str, Any]:
        """The sampling strategy's name and options (the objective, ``proportional``, has none)."""
        return {"sampler": type(self.sampler).__name__, "sampler_options": self.sampler.options()}

    def state_dict(self) -> dict[str, Any]:
        cap = {} if self.cap is None else {"epoch_cap": self.cap.state_dict()}
        return {
            **super().state_dict(),
            "sampler": self.sampler.state_dict(),
            "schedule": self.schedule.state_dict(),
        } | cap

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.sampler.load_state_dict(state["sampler"])
        self.schedule.load_state_dict(state["schedule"])
        if self.cap is not None:
            if "epoch_cap" not in state:
                raise ValueError("the checkpoint was written without max_epochs_per_task: its draws were not counted")
            self.cap.load_state_dict(state["epoch_cap"])


class ImportanceWeighting(ProportionalWeighting):
    """Objective of drawing tasks with fixed weights ``q`` toward the weights ``w`` of ``objective``: task t's mean
    gets the weight ``(w_t / q_t) * N_t / N``, so the step minimises ``sum_t (w_t / q_t) S_t / N`` (each target's
    loss times ``w_t / q_t``, the sum divided by the step's ``N`` targets; module docstring). ``w`` weighs every task
    at every step (a task the step did not draw from its last estimate), so its expected weights are ``w``."""

    def __init__(self, objective: Weighting, sampling_weights: torch.Tensor | list[float]) -> None:
        refuse_learned_sampler(objective)
        if len(sampling_weights) != objective.num_tasks:
            raise ValueError(f"sampling weights: one per task ({objective.num_tasks}), got {list(sampling_weights)}")
        q = check_importance_sampling(sampling_weights, option="sampling weights")
        super().__init__(objective.num_tasks)
        self.objective, self.sampling_weights = objective, q.float()

    def weights(
        self,
        task_losses: torch.Tensor,
        present: torch.Tensor,
        observed: torch.Tensor | None = None,
        grad_norms: torch.Tensor | None = None,
        task_counts: torch.Tensor | None = None,
        reference_losses: torch.Tensor | None = None,
    ) -> torch.Tensor:
        extra = {} if reference_losses is None else {"reference_losses": reference_losses}
        measured = present if observed is None else observed & present
        every_task = torch.ones(self.num_tasks, dtype=torch.bool)  # w must not depend on the draw (module docstring)
        target = self.objective.weights(task_losses, every_task, measured, task_counts=task_counts, **extra)
        shares = super().weights(task_losses, present, observed, task_counts=task_counts)
        return target / self.sampling_weights * shares

    def log_values(self) -> dict[str, float]:
        return self.objective.log_values()

    def options(self) -> dict[str, Any]:
        """The objective's name and options, and the sampling weights."""
        return {
            "objective": type(self.objective).__name__,
            "objective_options": self.objective.options(),
            "sampling_weights": self.sampling_weights.tolist(),
        }

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "objective": self.objective.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.objective.load_state_dict(state["objective"])


class FixedWeighting(Weighting):
    """Static task weights ``w`` (normalised over all tasks; an absent task gets 0, the others keep theirs): e.g. a
    file's mixture as the objective of :class:`ImportanceWeighting`."""

    loss_driven = False

    def __init__(self, num_tasks: int, task_weights: list[float]) -> None:
        w = torch.as_tensor(task_weights, dtype=torch.float32)
        if w.shape != (num_tasks,) or not bool(torch.isfinite(w).all()) or (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"task_weights: {num_tasks} finite values >= 0, not all 0, got {w.tolist()}")
        super().__init__(num_tasks)
        self.task_weights = w / w.sum()

    def _weights(self, losses: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        return torch.where(present, self.task_weights, 0.0)


class TaskSamplingCallback(TrainerCallback):
    """Before each epoch's batches: the next batch is the first micro-batch of step ``global_step + 1``."""

    def __init__(self, schedule: TaskSamplingSchedule) -> None:
        self.schedule = schedule

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = kwargs.get("train_dataloader")
        if isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset):
            raise ValueError("task-weighted sampling needs a map-style training dataset, not an iterable one")

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.schedule.start_epoch(state.global_step + 1, args.gradient_accumulation_steps)


def draw_tasks(present: torch.Tensor, weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One task per row of ``present`` (bool ``(batch, tasks)``), drawn with probability ``weights[t]`` normalised over
    the row's present tasks (uniformly among them if they all weigh 0); -1 for a row without tasks."""
    row_weights = torch.where(present, weights.to(torch.float64)[None, :], 0.0)
    total = row_weights.sum(dim=1, keepdim=True)
    row_weights = torch.where(total > 0, row_weights, present.to(torch.float64))
    cumulative = row_weights.cumsum(dim=1)
    total = cumulative[:, -1]
    draw = torch.rand(present.shape[0], generator=generator, dtype=torch.float64) * total
    draw = torch.minimum(draw, torch.nextafter(total, torch.zeros_like(total)))  # below the total despite rounding
    tasks = (cumulative <= draw[:, None]).sum(dim=1)  # the first task whose cumulative weight exceeds the draw
    return torch.where(present.any(dim=1), tasks, -1)


__all__ = [
    "MIN_IMPORTANCE_SHARE",
    "SAMPLING_LAG",
    "EpochCap",
    "FixedWeighting",
    "ImportanceWeighting",
    "TaskSamplingCallback",
    "TaskSamplingSchedule",
    "TaskSamplingWeighting",
    "check_importance_sampling",
    "draw_tasks",
    "refuse_learned_sampler",
]
