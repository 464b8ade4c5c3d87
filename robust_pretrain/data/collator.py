"""Masked-language-model collator that masks whole words of part-of-speech tasks and labels targets by task."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Literal

import numpy as np
import torch

from robust_pretrain.data.tasks import TaskSpec, TaskSpecLike
from robust_pretrain.seeding import SharedEpoch, keyed_torch_generator
from robust_pretrain.trainer.task_sampling import TaskSamplingSchedule, draw_tasks

IGNORE_INDEX = -100
_INPUT_COLUMNS = ("input_ids", "word_ids", "token_task_ids")


@dataclass
class TaskGroupedMLMCollator:
    """Pad features from :func:`~robust_pretrain.data.tokenize_and_tag` and mask whole task words.

    Modes:
        ``per_token``: every task word is a target with probability ``mlm_probability`` (whole words, Bernoulli per
        word), so about that fraction of task words is masked; each target carries its own word's task id.
        ``per_example``: each sequence gets one task, present in it, and only that task's words are masked, in random
        order, skipping words that would exceed ``round(mlm_probability * non-special tokens)`` target tokens (the
        first word is always taken; fewer targets if the task has fewer tokens). Tasks are balanced within the
        batch: a maximum matching between tasks and the sequences containing them first gives as many distinct
        tasks as possible their own sequence, then each remaining sequence takes its least-covered task (rarer
        tasks first on ties). Guaranteed: no one-task-per-sequence choice covers more distinct tasks; every task
        present in the batch appears if and only if every k of them occur together in at least k sequences (Hall's
        condition, e.g. when each present task occurs in at least as many sequences as there are present tasks).
        A batch size >= number of tasks is not enough: of 9 sequences where 8 hold only nouns, at most 2 tasks
        can be covered. With a ``task_schedule`` (task-weighted sampling, ``robust_pretrain.trainer.task_sampling``)
        each sequence's task is instead drawn independently, with probability proportional to the schedule's
        weights for the batch's optimizer step, among the tasks the sequence contains.

    Targets are replaced by the mask token with ``mask_replace_prob``, by a random token with
    ``random_replace_prob`` and kept otherwise (80/10/10). Words of no task (punctuation, numbers, ...), special
    tokens and padding are never targets; a sequence without any task word simply has no targets.

    Output: ``input_ids``, ``attention_mask``, ``labels`` (original id at targets, -100 elsewhere) and ``task_ids``
    (task id at targets, -100 elsewhere), all ``LongTensor`` of shape ``(batch, length)``.

    Randomness: each batch draws from ``robust_pretrain.seeding.keyed_torch_generator`` with ``(seed, epoch,
    the batch's padded tensors)``, so a batch's masks do not depend on how many batches were collated before, in
    which process or ``DataLoader`` worker, or with how many workers: a run resumed mid-epoch (whose skipped batches
    are never collated) draws the masks of an uninterrupted run. :meth:`set_epoch` gives every epoch new masks, also
    in persistent workers (the epoch is a ``robust_pretrain.seeding.SharedEpoch``); ``MinimaxTrainer`` calls
    it at each epoch (``robust_pretrain.seeding.SetEpochCallback``). Two batches with identical tokens in the
    same epoch get the same masks. ``seed=None`` takes a seed from the OS.
    """

    tokenizer: Any
    spec: TaskSpecLike = None
    num_tasks: int | None = None
    mode: Literal["per_token", "per_example"] = "per_token"
    mlm_probability: float = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1
    pad_to_multiple_of: int | None = None
    seed: int | None = None
    task_schedule: TaskSamplingSchedule | None = None
    #: the spec's task names (None when only ``num_tasks`` is given); ``MinimaxTrainer`` takes its tasks from them
    task_names: list[str] | None = field(default=None, init=False)
    _base_seed: int = field(init=False, repr=False)
    _epoch: SharedEpoch = field(default_factory=SharedEpoch, init=False, repr=False)

    def __post_init__(self) -> None:
        spec = TaskSpec.resolve(self.spec)
        spec_tasks = spec.num_tasks
        if self.spec is not None or self.num_tasks is None:
            self.task_names = list(spec.task_names)
        if self.num_tasks is None:
            self.num_tasks = spec_tasks
        elif self.spec is not None and self.num_tasks != spec_tasks:
            raise ValueError(f"num_tasks={self.num_tasks} disagrees with the spec's {spec_tasks} tasks")
        if self.num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {self.num_tasks}")
        if self.mode not in ("per_token", "per_example"):
            raise ValueError(f"mode must be 'per_token' or 'per_example', got {self.mode!r}")
        if not 0.0 <= self.mlm_probability <= 1.0:
            raise ValueError(f"mlm_probability must be in [0, 1], got {self.mlm_probability}")
        if not (
            0.0 <= self.mask_replace_prob
            and 0.0 <= self.random_replace_prob
            and self.mask_replace_prob + self.random_replace_prob <= 1.0
        ):
            raise ValueError("mask_replace_prob and random_replace_prob must be >= 0 and sum to at most 1")
        if self.task_schedule is not None:
            self._check_schedule(self.task_schedule)
        if self.tokenizer.mask_token_id is None:
            raise ValueError("the tokenizer has no mask token, which masked language modelling needs")
        if self.tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token before collating")
        self._base_seed = np.random.SeedSequence(self.seed).entropy

    def _check_schedule(self, schedule: TaskSamplingSchedule) -> None:
        if self.mode != "per_example" or schedule.num_tasks != self.num_tasks:
            raise ValueError(
                f"a task_schedule (task-weighted sampling) needs mode='per_example' and {self.num_tasks} tasks, got "
                f"mode={self.mode!r} and {schedule.num_tasks} tasks"
            )

    def sample_tasks(self, schedule: TaskSamplingSchedule, train_dataset: Any, args: Any) -> Any:
        """Draw each training sequence's task by ``schedule`` from now on (``MinimaxTrainer`` calls this with
        ``task_sampling``); the training data stay as they are."""
        self._check_schedule(schedule)
        self.task_schedule = schedule
        return train_dataset

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Draw the masks of ``epoch`` from now on (also in existing ``DataLoader`` workers)."""
        self._epoch.set(epoch)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not features:
            raise ValueError("cannot collate an empty batch")
        missing = [c for c in _INPUT_COLUMNS if c not in features[0]]
        if missing:
            raise ValueError(f"features lack {missing}; produce them with robust_pretrain.data.tokenize_and_tag")
        input_ids, attention_mask, special, word_ids, token_tasks = self._pad(features)
        self._check_task_ids(token_tasks)
        generator = keyed_torch_generator(
            self._base_seed, self.epoch, (input_ids, attention_mask, word_ids, token_tasks)
        )
        if self.mode == "per_token":
            targets = self._per_token_targets(word_ids, token_tasks, generator)
        else:
            targets = self._per_example_targets(word_ids, token_tasks, attention_mask.bool() & ~special, generator)
        labels = torch.where(targets, input_ids, IGNORE_INDEX)
        task_ids = torch.where(targets, token_tasks, IGNORE_INDEX)
        draw = torch.rand(input_ids.shape, generator=generator)
        to_mask = targets & (draw < self.mask_replace_prob)
        to_random = targets & ~to_mask & (draw < self.mask_replace_prob + self.random_replace_prob)
        random_ids = torch.randint(len(self.tokenizer), input_ids.shape, generator=generator)
        input_ids = torch.where(to_mask, self.tokenizer.mask_token_id, input_ids)
        input_ids = torch.where(to_random, random_ids, input_ids)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels, "task_ids": task_ids}

    def _check_task_ids(self, token_tasks: torch.Tensor) -> None:
        """Reject task ids outside ``-1 .. num_tasks - 1`` (features built with another task spec)."""
        out_of_range = token_tasks[(token_tasks < -1) | (token_tasks >= self.num_tasks)]
        if out_of_range.numel():
            raise ValueError(
                f"features hold token_task_ids {sorted(set(out_of_range.tolist()))}, but the collator has "
                f"{self.num_tasks} tasks (valid ids 0..{self.num_tasks - 1}, -1 for no task); build the features "
                "(tokenize_and_tag) and the collator with the same task spec"
            )

    def _pad(self, features: list[dict[str, Any]]) -> tuple[torch.Tensor, ...]:
        """Right- or left-pad (``tokenizer.padding_side``) every column to the batch length."""
        lengths = torch.tensor([len(f["input_ids"]) for f in features])
        for name in ("attention_mask", "word_ids", "token_task_ids", "special_tokens_mask"):
            if name in features[0] and any(len(f[name]) != len(f["input_ids"]) for f in features):
                raise ValueError(f"column {name!r} and input_ids differ in length in this batch")
        length = int(lengths.max())
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        positions = torch.arange(length)
        if self.tokenizer.padding_side == "left":
            filled = positions[None, :] >= (length - lengths)[:, None]
        else:
            filled = positions[None, :] < lengths[:, None]

        def column(name: str, pad_value: int) -> torch.Tensor:
            values = [f[name] for f in features]
            flat = (
                torch.cat([torch.as_tensor(v) for v in values])
                if isinstance(values[0], torch.Tensor)
                else torch.tensor(list(chain.from_iterable(values)), dtype=torch.long)
            )
            out = torch.full((len(features), length), pad_value, dtype=torch.long)
            out[filled] = flat.long()
            return out

        special = column("special_tokens_mask", 1).bool() if "special_tokens_mask" in features[0] else None
        word_ids = column("word_ids", -1)
        if special is None:
            special = word_ids < 0
        attention_mask = column("attention_mask", 0) if "attention_mask" in features[0] else filled.long()
        return (
            column("input_ids", self.tokenizer.pad_token_id),
            attention_mask,
            special,
            word_ids,
            column("token_task_ids", -1),
        )

    def _word_table(self, word_ids: torch.Tensor, values: torch.Tensor, fill: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-word values ``(batch, n_words)`` from per-token ``values``, and token -> word-column indices.

        Tokens outside words point at an extra last column, which callers drop or keep as a neutral slot.
        """
        n_words = int(word_ids.max()) + 1 if word_ids.numel() else 0
        columns = torch.where(word_ids >= 0, word_ids, n_words)
        table = torch.full((word_ids.shape[0], n_words + 1), fill, dtype=values.dtype)
        table.scatter_(1, columns, values)
        return table, columns

    def _per_token_targets(
        self, word_ids: torch.Tensor, token_tasks: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        word_tasks, columns = self._word_table(word_ids, token_tasks, -1)
        chosen = (torch.rand(word_tasks.shape, generator=generator) < self.mlm_probability) & (word_tasks >= 0)
        chosen[:, -1] = False
        return chosen.gather(1, columns)

    def _per_example_targets(
        self, word_ids: torch.Tensor, token_tasks: torch.Tensor, maskable: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        word_tasks, columns = self._word_table(word_ids, token_tasks, -1)
        word_tasks[:, -1] = -1
        if self.task_schedule is None:
            assigned = self.assign_tasks(word_tasks, generator)
        else:
            assigned = draw_tasks(
                self._present_tasks(word_tasks), self.task_schedule.next_batch_weights()[1], generator
            )
        eligible = (word_tasks == assigned[:, None]) & (assigned[:, None] >= 0)
        word_lengths = torch.zeros(word_tasks.shape, dtype=torch.long)
        word_lengths.scatter_add_(1, columns, torch.ones_like(columns))
        priority = torch.where(eligible, torch.rand(word_tasks.shape, generator=generator), 2.0)
        order = priority.argsort(dim=1)  # eligible words first, in random order
        sorted_eligible = eligible.gather(1, order)
        sorted_lengths = word_lengths.gather(1, order)
        remaining = (self.mlm_probability * maskable.sum(dim=1)).round().long().clamp(min=1)
        chosen_sorted = torch.zeros_like(sorted_eligible)
        # Take words while they fit in the remaining token budget, skipping those that do not (the first is always
        # taken, so a sequence with its task's words always gets a target).
        for rank in range(int(eligible.sum(dim=1).max())):
            take = sorted_eligible[:, rank] & ((sorted_lengths[:, rank] <= remaining) | (rank == 0))
            chosen_sorted[:, rank] = take
            remaining -= torch.where(take, sorted_lengths[:, rank], 0)
        chosen = torch.zeros_like(chosen_sorted).scatter_(1, order, chosen_sorted)
        return chosen.gather(1, columns)

    def _present_tasks(self, word_tasks: torch.Tensor) -> torch.Tensor:
        """Bool ``(batch, num_tasks)``: whether each sequence has a word of each task."""
        present = torch.zeros(word_tasks.shape[0], self.num_tasks + 1, dtype=torch.bool)
        present.scatter_(1, torch.where(word_tasks >= 0, word_tasks, self.num_tasks), True)
        return present[:, : self.num_tasks]

    def assign_tasks(self, word_tasks: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """One task per sequence (-1 if it has no task word), balanced over the batch as described above."""
        batch_size = word_tasks.shape[0]
        present = self._present_tasks(word_tasks)
        sequence_order = torch.randperm(batch_size, generator=generator)
        tie_break = torch.randperm(self.num_tasks, generator=generator)
        frequency_t = present.sum(dim=0)
        # Python lists only for the tasks present in the batch (at most the number of task words, whatever T is):
        # the tasks of each sequence, and the sequences of each present task in ``sequence_order``.
        rows, cols = present.nonzero(as_tuple=True)  # row-major: each sequence's tasks in increasing order
        tasks_of: list[list[int]] = [[] for _ in range(batch_size)]
        for row, task in zip(rows.tolist(), cols.tolist(), strict=True):
            tasks_of[row].append(task)
        by_task = present[sequence_order].T.nonzero(as_tuple=True)  # task-major, sequences in sequence_order
        sequences_of: dict[int, list[int]] = {}
        for task, sequence in zip(by_task[0].tolist(), sequence_order[by_task[1]].tolist(), strict=True):
            sequences_of.setdefault(task, []).append(sequence)
        present_tasks = frequency_t.nonzero().flatten()
        # Ascending (frequency, tie_break) over present tasks; tie_break is a permutation, so keys are unique.
        matching_order = present_tasks[
            torch.from_numpy(np.lexsort((tie_break[present_tasks].numpy(), frequency_t[present_tasks].numpy())))
        ].tolist()
        frequency = frequency_t.tolist()
        tie_break = tie_break.tolist()
        sequence_order = sequence_order.tolist()

        owner: dict[int, int] = {}  # sequence -> task, built by augmenting paths (Kuhn's algorithm)

        def augment(task: int, visited: set[int]) -> bool:
            for sequence in sequences_of[task]:
                if sequence in visited:
                    continue
                visited.add(sequence)
                if sequence not in owner or augment(owner[sequence], visited):
                    owner[sequence] = task
                    return True
            return False

        for task in matching_order:
            augment(task, set())
        coverage = [0] * self.num_tasks
        for task in owner.values():
            coverage[task] += 1
        assigned = [-1] * batch_size
        for sequence in sequence_order:
            if sequence in owner:
                assigned[sequence] = owner[sequence]
            elif tasks_of[sequence]:
                task = min(tasks_of[sequence], key=lambda t: (coverage[t], frequency[t], tie_break[t]))
                coverage[task] += 1
                assigned[sequence] = task
        return torch.tensor(assigned, dtype=torch.long)
