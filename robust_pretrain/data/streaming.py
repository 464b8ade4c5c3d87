"""Online domain sampling on streams: one stream per domain, each row's domain drawn with the step's weights.

Map-style domain sampling (:class:`~robust_pretrain.data.domains.DomainCollator`) draws a sequence uniformly among a
domain's packed sequences. On streams the drawn domain's **next** packed sequence is read instead:

- :class:`DomainStreams` holds each domain's training stream of texts, packed on the fly
  (:func:`~robust_pretrain.data.domains.pack_text_stream`), and where each stands: its pass over the stream
  (``wraps``: a stream read to its end starts over) and the rows read in that pass (``rows``). With
  ``shuffle_buffer`` each pass reads the texts through a ``datasets`` shuffle buffer seeded by
  :func:`pass_seed` ``(seed, domain, wrap)``: a new order every pass, the same order in every run.
- :class:`StreamDomainCollator` draws the rows of optimizer step ``s``, micro-batch ``m`` as the map-style collator
  draws them (one generator seeded with ``(seed, s, m)``, ``world_size * per_device_train_batch_size`` domains with
  the probabilities the schedule gives the step), then reads the next sequence of each drawn domain, row by row in
  the global batch's order; process ``r`` keeps rows ``r * B .. (r + 1) * B - 1``. Every process reads every row of
  the global batch, so all of them hold the same positions, and 2 processes train on exactly the rows 1 process with
  their global batch does.
- :class:`StreamPositionsCallback` writes the positions after each checkpoint's step into the checkpoint's
  ``trainer_state.json`` (so they are saved with it, never apart) and :meth:`StreamPositionsCallback.load` restores
  them. The draws' generator needs no state of its own: it is seeded by the step, which the checkpoint holds.

Resuming is therefore exact: a run killed after a checkpoint and resumed from it reads, draws and trains what the
uninterrupted run does. The Trainer skips the checkpoint's steps without collating them (the training data are
:class:`~robust_pretrain.data.domains.DrawSlots`), and each domain's reader starts its pass over again and skips the
rows read in it (re-reading and re-packing them: up to one pass per domain). The collator reads the streams in the
process that trains (``dataloader_num_workers`` 0): each read advances the positions every process shares.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datasets import IterableDataset
from transformers import TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState

from robust_pretrain.data.domains import DomainCollator, DrawSlots, pack_text_stream
from robust_pretrain.trainer.task_sampling import SAMPLING_LAG

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from robust_pretrain.trainer.task_sampling import TaskSamplingSchedule


def pass_seed(seed: int, domain: int, wrap: int) -> int:
    """The shuffle seed of pass ``wrap`` over domain ``domain``'s stream: a function of the three only."""
    digest = hashlib.sha256(f"stream/{seed}/{domain}/{wrap}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class DomainStreams:
    """Each domain's packed training stream, read one sequence at a time, and its position (``wraps``, ``rows``).

    ``streams`` are the domains' training texts (a ``text`` column), in domain order; sequences are packed from them
    as :func:`~robust_pretrain.data.domains.pack_text_stream` packs (``max_seq_length`` tokens, map batches of
    ``batch_size`` texts). A pass that ends starts the next (``wraps + 1``); ``shuffle_buffer`` > 0 shuffles each
    pass's texts (module docstring). :meth:`start_batch` marks the position before each step's first micro-batch,
    so :meth:`state_at` gives the position after any recent step even when a later batch was already read.
    """

    def __init__(
        self,
        streams: Sequence[IterableDataset],
        tokenizer: Any,
        max_seq_length: int,
        seed: int,
        shuffle_buffer: int = 0,
        batch_size: int = 1000,
    ) -> None:
        if not streams:
            raise ValueError("DomainStreams needs at least one domain stream")
        if shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be >= 0, got {shuffle_buffer}")
        self.texts = list(streams)
        self.tokenizer, self.max_seq_length, self.seed = tokenizer, max_seq_length, seed
        self.shuffle_buffer, self.batch_size = shuffle_buffer, batch_size
        self.wraps = [0] * len(self.texts)
        self.rows = [0] * len(self.texts)
        self._readers: list[Iterator[dict[str, Any]] | None] = [None] * len(self.texts)
        self._marks: dict[int, dict[str, list[int]]] = {}

    @property
    def num_domains(self) -> int:
        return len(self.texts)

    def pass_stream(self, domain: int, wrap: int) -> IterableDataset:
        """The packed sequences of pass ``wrap`` over ``domain``'s stream, from its start."""
        texts = self.texts[domain]
        if self.shuffle_buffer:
            texts = texts.shuffle(seed=pass_seed(self.seed, domain, wrap), buffer_size=self.shuffle_buffer)
        return pack_text_stream(texts, self.tokenizer, self.max_seq_length, domain, self.batch_size)

    def next_row(self, domain: int) -> dict[str, Any]:
        """``domain``'s next packed sequence (``input_ids``, ``task_ids``), starting a new pass after the last."""
        while True:
            reader = self._readers[domain]
            if reader is None:
                reader = self._readers[domain] = self._open(domain)
            row = next(reader, None)
            if row is not None:
                self.rows[domain] += 1
                return row
            if self.rows[domain] == 0:
                raise ValueError(f"domain {domain}'s training stream holds no sequence")
            self.wraps[domain], self.rows[domain], self._readers[domain] = self.wraps[domain] + 1, 0, None

    def _open(self, domain: int) -> Iterator[dict[str, Any]]:
        """A reader of the domain's current pass past its ``rows`` first sequences (read again and skipped)."""
        reader = iter(self.pass_stream(domain, self.wraps[domain]))
        skipped = sum(1 for _ in itertools.islice(reader, self.rows[domain]))
        if skipped < self.rows[domain]:
            raise ValueError(
                f"domain {domain}'s stream holds {skipped} sequences in pass {self.wraps[domain]}, but "
                f"{self.rows[domain]} were read from it: the data changed since the checkpoint"
            )
        return reader

    def position(self) -> dict[str, list[int]]:
        """Where every domain stands: its pass (``wraps``) and the rows read in it (``rows``)."""
        return {"wraps": list(self.wraps), "rows": list(self.rows)}

    def start_batch(self, step: int, micro_batch: int) -> None:
        """Before the rows of optimizer step ``step``'s micro-batch ``micro_batch`` are read: mark the step's start."""
        if micro_batch == 0:
            self._marks[step] = self.position()
            for old in [s for s in self._marks if s < step - SAMPLING_LAG - 1]:
                del self._marks[old]

    def state_at(self, step: int) -> dict[str, list[int]]:
        """The position after optimizer step ``step``: before step ``step + 1``'s first row (the current position if
        that batch was not read yet)."""
        return self._marks.get(step + 1, self.position())

    def load_state_dict(self, state: dict[str, list[int]]) -> None:
        """Continue from a position of :meth:`state_at` (the readers reopen at it)."""
        wraps, rows = [int(w) for w in state["wraps"]], [int(r) for r in state["rows"]]
        if len(wraps) != self.num_domains or len(rows) != self.num_domains:
            raise ValueError(f"stream positions of {len(wraps)} domains, this run has {self.num_domains}")
        if min(wraps + rows) < 0:
            raise ValueError(f"stream positions must be >= 0, got {state}")
        self.wraps, self.rows = wraps, rows
        self._readers = [None] * self.num_domains
        self._marks = {}


@dataclass
class StreamDomainCollator(DomainCollator):
    """:class:`~robust_pretrain.data.domains.DomainCollator` drawing each training row's domain by the schedule and
    reading that domain's next sequence from :class:`DomainStreams` (module docstring); held-out batches (rows with
    ``input_ids``) are only padded."""

    streams: DomainStreams | None = field(default=None, init=False, repr=False)

    def sample_tasks(self, schedule: TaskSamplingSchedule, sequences: Any, args: TrainingArguments) -> DrawSlots:
        """Draw from ``sequences`` (the :class:`DomainStreams`) by ``schedule``; the training data become the
        :class:`~robust_pretrain.data.domains.DrawSlots` of ``max_steps`` optimizer steps (one epoch)."""
        if not isinstance(sequences, DomainStreams):
            raise ValueError(f"StreamDomainCollator draws from DomainStreams, got {type(sequences).__name__}")
        if sequences.num_domains != schedule.num_tasks:
            raise ValueError(f"{sequences.num_domains} domain streams for {schedule.num_tasks} tasks")
        if args.max_steps <= 0:
            raise ValueError("drawing from streams needs max_steps: a stream has no length")
        if args.dataloader_num_workers:
            raise ValueError(
                "drawing from streams reads them in the training process: dataloader_num_workers must be 0, got "
                f"{args.dataloader_num_workers}"
            )
        self.streams = sequences
        self.bind_draws(schedule, args)
        global_batch = args.per_device_train_batch_size * args.world_size
        return DrawSlots(args.max_steps * args.gradient_accumulation_steps * global_batch)

    def drawn_rows(self, rows: int) -> list[dict[str, Any]]:
        """This process's ``rows`` sequences of the next training batch; every row of the global batch is read."""
        step, micro, domains, _ = self.global_draw()
        self.streams.start_batch(step, micro)
        batch = [self.streams.next_row(domain) for domain in domains.tolist()]
        start = self.process_index * self.rows_per_process
        return batch[start : start + rows]


class StreamPositionsCallback(TrainerCallback, ExportableState):
    """Writes the streams' position after each checkpoint's step into its ``trainer_state.json``; :meth:`load`
    restores a checkpoint's (before training)."""

    def __init__(self, streams: DomainStreams) -> None:
        self.streams, self.step = streams, 0

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step = state.global_step

    def state(self) -> dict[str, Any]:
        return {"args": {}, "attributes": {"positions": self.streams.state_at(self.step)}}

    def load(self, checkpoint: str) -> None:
        """Continue the streams where ``checkpoint`` left them; refuse a checkpoint without stream positions."""
        saved = json.loads((Path(checkpoint) / TRAINER_STATE_NAME).read_text()).get("stateful_callbacks", {})
        if type(self).__name__ not in saved:
            raise ValueError(
                f"{checkpoint} holds no stream positions: it was not written by a run drawing from streams online"
            )
        self.streams.load_state_dict(saved[type(self).__name__]["attributes"]["positions"])


__all__ = ["DomainStreams", "StreamDomainCollator", "StreamPositionsCallback", "pass_seed"]
