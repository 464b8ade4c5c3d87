"""Data domains as tasks for causal-LM pre-training: texts grouped by domain, packed per domain, drawn per domain.

A *domain* is a source of text (a genre, a web crawl, code, ...); each is one task of the robust objective. The
pipeline:

- texts with a domain id (:func:`ewt_genre_texts` for UD English-EWT's five genres; the recipe also reads a
  ``datasets`` column or one file per domain) ->
- :func:`pack_domains`: tokenised, each text followed by the end-of-text token, concatenated **within one domain**
  and cut into sequences of ``max_seq_length`` tokens, so a sequence never crosses a domain boundary and its domain
  is its example-level ``task_ids`` ->
- :class:`DomainCollator`: pads the sequences (labels ``-100`` at padding; the trainer shifts them for next-token
  prediction), or, with a :class:`~robust_pretrain.trainer.task_sampling.TaskSamplingSchedule` (``MinimaxTrainer``
  hands it over with ``task_sampling``), first **chooses which domain each sequence of a training batch comes from**
  (DoReMi's way of applying domain weights) and then a sequence of it.

Domain-weighted draws: the rows of optimizer step ``s``, micro-batch ``m`` are drawn by one generator seeded with
``(seed, s, m)``: ``world_size * per_device_train_batch_size`` domains with probabilities ``w / sum(w)`` and, for each,
one of its sequences uniformly (with replacement); process ``r`` keeps rows ``r * B .. (r + 1) * B - 1``. So every
process computes the same global draw, the draw depends on the step (not on time or on which process or worker
collates), and a resumed run draws exactly what an uninterrupted one does. ``w`` are the weights the schedule gives
the step (online: a strategy's weights by the lag rule of :mod:`robust_pretrain.trainer.task_sampling`; fixed: a
file's).
From streams (a stream per domain) the same draws read each drawn domain's next sequence instead:
:mod:`robust_pretrain.data.streaming`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from datasets import Dataset, IterableDataset, concatenate_datasets, interleave_datasets

from robust_pretrain.data.conllu import read_conllu
from robust_pretrain.data.corpus import SPLIT_SOURCES, paragraphs, resolve_ud_dir
from robust_pretrain.data.preprocessing import repeat_stream

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from robust_pretrain.trainer.task_sampling import TaskSamplingSchedule

EWT_GENRES = ("answers", "email", "newsgroup", "reviews", "weblog")
"""UD English-EWT's genres: the prefix of every ``newdoc id`` / ``sent_id`` (``weblog-juancole.com_...``)."""
DOMAIN_COLUMN = "domain"
"""Column of :func:`ewt_genre_texts` and of the recipe's raw data holding each text's domain id."""


def ewt_genre_texts(split: str = "train", ud_dir: str | Path | None = None) -> Dataset:
    """UD English-EWT paragraphs with their genre: columns ``text`` and :data:`DOMAIN_COLUMN` (index into
    :data:`EWT_GENRES`). ``"train"`` is EWT train + dev, ``"test"`` EWT test (:mod:`robust_pretrain.data.corpus`)."""
    if split not in SPLIT_SOURCES:
        raise ValueError(f"unknown split {split!r}; choose one of {sorted(SPLIT_SOURCES)}")
    folder = resolve_ud_dir(ud_dir)
    texts: list[str] = []
    domains: list[int] = []
    for source in SPLIT_SOURCES[split]:
        path = folder / f"en_ewt-ud-{source}.conllu"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: the UD English-EWT folder must hold en_ewt-ud-{source}.conllu")
        by_genre: dict[str, list] = {genre: [] for genre in EWT_GENRES}
        for sentence in read_conllu(path):
            genre = (sentence.doc_id or "").split("-", 1)[0]
            if genre not in by_genre:
                raise ValueError(f"{path}: document {sentence.doc_id!r} has no genre prefix among {EWT_GENRES}")
            by_genre[genre].append(sentence)
        for index, genre in enumerate(EWT_GENRES):
            genre_texts = paragraphs(by_genre[genre])
            texts.extend(genre_texts)
            domains.extend([index] * len(genre_texts))
    return Dataset.from_dict({"text": texts, DOMAIN_COLUMN: domains}, split=split)


class _PackCausal:
    """Batched ``datasets.map`` function over the texts of **one** domain: tokenise, end each text with ``eos``,
    concatenate and cut into ``max_length`` tokens (the last, shorter sequence is kept; the collator pads it)."""

    def __init__(self, tokenizer: Any, max_length: int, domain: int) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no end-of-text (eos) token to separate the packed texts")
        self.tokenizer, self.max_length, self.domain = tokenizer, max_length, domain

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        encoded = self.tokenizer(batch["text"], add_special_tokens=False, return_attention_mask=False, verbose=False)
        ids = [token for text_ids in encoded["input_ids"] for token in (*text_ids, self.tokenizer.eos_token_id)]
        blocks = [ids[start : start + self.max_length] for start in range(0, len(ids), self.max_length)]
        return {"input_ids": blocks, "task_ids": [self.domain] * len(blocks)}


def pack_domain_texts(
    texts: Mapping[str, Sequence[str]], tokenizer: Any, max_seq_length: int, *, num_proc: int | None = None
) -> Dataset:
    """``pack_domains`` of ``{domain: texts}``: the domains' ids follow the mapping's order (give
    ``list(texts)`` as the collator's ``task_names``)."""
    names = list(texts)
    raw = Dataset.from_dict(
        {
            "text": [t for name in names for t in texts[name]],
            DOMAIN_COLUMN: [i for i, n in enumerate(names) for _ in texts[n]],
        }
    )
    return pack_domains(raw, tokenizer, len(names), max_seq_length, num_proc=num_proc)


def pack_domains(
    dataset: Dataset,
    tokenizer: Any,
    num_domains: int,
    max_seq_length: int,
    *,
    batch_size: int = 1000,
    num_proc: int | None = None,
) -> Dataset:
    """Sequences of ``max_seq_length`` tokens (columns ``input_ids``, ``task_ids``) packed from ``dataset``'s
    ``text`` within each domain (:data:`DOMAIN_COLUMN`): a sequence holds text of one domain only, texts separated by
    the eos token. Packing happens within map batches of ``batch_size`` texts of a domain. Domains in id order."""
    packed = []
    for domain in range(num_domains):
        texts = domain_texts(dataset, domain)
        packed.append(
            texts.map(
                _PackCausal(tokenizer, max_seq_length, domain),
                batched=True,
                batch_size=batch_size,
                remove_columns=texts.column_names,
                num_proc=num_proc,
                desc=f"Packing domain {domain}",
            )
        )
    return concatenate_datasets(packed)


def stream_domains(
    streams: Sequence[IterableDataset],
    tokenizer: Any,
    max_seq_length: int,
    probabilities: Sequence[float],
    seed: int,
    batch_size: int = 1000,
) -> IterableDataset:
    """One endless stream of packed sequences from several domain streams (each with a ``text`` column): each is
    packed within itself as :func:`pack_domains` packs (map batches of ``batch_size`` texts), read over and over
    (:func:`~robust_pretrain.data.preprocessing.repeat_stream`), and the next sequence's domain is drawn with
    ``probabilities`` by a generator seeded with ``seed``. The stream is a function of its position only, so a resumed
    run that replays the batches drawn so far (the Trainer's resume) continues exactly where it was."""
    packed = [
        repeat_stream(pack_text_stream(stream, tokenizer, max_seq_length, domain, batch_size))
        for domain, stream in enumerate(streams)
    ]
    total = sum(probabilities)
    return interleave_datasets(
        packed, probabilities=[p / total for p in probabilities], seed=seed, stopping_strategy="all_exhausted"
    )


def pack_text_stream(
    stream: IterableDataset, tokenizer: Any, max_seq_length: int, domain: int, batch_size: int = 1000
) -> IterableDataset:
    """One domain's stream of texts (a ``text`` column) packed on the fly as :func:`pack_domains` packs: sequences of
    ``max_seq_length`` tokens (``input_ids``, ``task_ids`` = ``domain``) within map batches of ``batch_size`` texts."""
    return stream.select_columns(["text"]).map(
        _PackCausal(tokenizer, max_seq_length, domain), batched=True, batch_size=batch_size, remove_columns=["text"]
    )


def domain_texts(dataset: Dataset, domain: int) -> Dataset:
    """The rows of ``dataset`` whose :data:`DOMAIN_COLUMN` is ``domain``, in order."""
    return dataset.filter(lambda ids: [x == domain for x in ids], input_columns=DOMAIN_COLUMN, batched=True)


def domain_counts(packed: Dataset, num_domains: int) -> list[int]:
    """Sequences of each domain in a :func:`pack_domains` dataset."""
    counts = torch.bincount(torch.as_tensor(packed["task_ids"], dtype=torch.long), minlength=num_domains)
    return counts.tolist()


class DrawSlots(torch.utils.data.Dataset):
    """``length`` empty rows: the training dataset of domain-weighted sampling, where :class:`DomainCollator` chooses
    each row's sequence (an epoch is ``length`` draws)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {}


@dataclass
class DomainCollator:
    """Pads packed sequences into a batch: ``input_ids``, ``attention_mask``, ``labels`` (the ids, ``-100`` at
    padding) and per-sequence ``task_ids``; ``task_names`` are the domains' names in id order (``MinimaxTrainer``
    takes its tasks from them).

    With a schedule (``MinimaxTrainer`` hands it over with ``task_sampling``, :meth:`sample_tasks`), a batch of
    ``DrawSlots`` rows (no ``input_ids``) is a training batch whose sequences are drawn by domain (module
    docstring); batches of sequences (held-out data) are only padded.
    """

    pad_token_id: int
    task_names: Sequence[str] | None = None
    schedule: TaskSamplingSchedule | None = field(default=None, init=False)
    sequences: Dataset | None = field(default=None, init=False, repr=False)
    seed: int = field(default=0, init=False)
    rows_per_process: int = field(default=1, init=False)
    process_index: int = field(default=0, init=False)
    num_processes: int = field(default=1, init=False)
    _rows_by_domain: list[torch.Tensor] = field(default_factory=list, init=False, repr=False)

    def sample_tasks(self, schedule: TaskSamplingSchedule, sequences: Dataset, args: TrainingArguments) -> DrawSlots:
        """Draw the training batches' domains by ``schedule`` from ``sequences`` (the packed training set), seeded by
        ``args.seed``, each process keeping its ``per_device_train_batch_size`` rows of the global draw; the training
        data becomes the ``DrawSlots`` of an epoch (``draws_per_epoch``)."""
        if isinstance(sequences, (torch.utils.data.IterableDataset, IterableDataset)):
            raise ValueError("domain-weighted sampling draws from map-style sequences, not a stream")
        task_ids = torch.as_tensor(sequences["task_ids"], dtype=torch.long)
        rows_by_domain = [torch.nonzero(task_ids == d).flatten() for d in range(schedule.num_tasks)]
        empty = [d for d, rows in enumerate(rows_by_domain) if len(rows) == 0]
        if empty:
            raise ValueError(f"domains {empty} have no training sequence to draw")
        self.sequences, self._rows_by_domain = sequences, rows_by_domain
        self.bind_draws(schedule, args)
        return DrawSlots(draws_per_epoch(len(sequences), args))

    def bind_draws(self, schedule: TaskSamplingSchedule, args: TrainingArguments) -> None:
        """Draw by ``schedule``, seeded by ``args.seed``, this process keeping its rows of each global draw."""
        self.schedule, self.seed, self.rows_per_process = schedule, args.seed, args.per_device_train_batch_size
        self.process_index, self.num_processes = args.process_index, args.world_size

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if features and "input_ids" not in features[0]:
            if self.schedule is None:
                raise ValueError("rows without input_ids need a sampling schedule to draw their sequences")
            features = self.drawn_rows(len(features))
        return self.pad(features)

    def drawn_rows(self, rows: int) -> list[dict[str, Any]]:
        """This process's ``rows`` sequences of the next training batch."""
        return [self.sequences[int(row)] for row in self.draw(rows)]

    def global_draw(self) -> tuple[int, int, torch.Tensor, torch.Tensor]:
        """``(step, micro_batch, domains, positions)`` of the next training batch's global draw: the domain of each of
        its ``rows_per_process * num_processes`` rows and a uniform number in [0, 1) per row (which of the domain's
        sequences it gets), the same on every process."""
        step, micro, weights = self.schedule.next_batch()
        generator = torch.Generator().manual_seed(batch_seed(self.seed, step, micro))
        domains = draw_domains(weights, self.rows_per_process * self.num_processes, generator)
        return step, micro, domains, torch.rand(len(domains), generator=generator, dtype=torch.float64)

    def step_draw_counts(self, step: int, weights: torch.Tensor, accumulation_steps: int) -> torch.Tensor:
        """Sequences of each domain that optimizer ``step`` draws (all its micro-batches and processes) with the
        sampling ``weights`` its batches use: the draws of :meth:`global_draw`, recomputed."""
        total = self.rows_per_process * self.num_processes
        counts = torch.zeros(len(weights), dtype=torch.float64)
        for micro in range(accumulation_steps):
            generator = torch.Generator().manual_seed(batch_seed(self.seed, step, micro))
            counts += torch.bincount(draw_domains(weights, total, generator), minlength=len(weights))
        return counts

    def domain_sequences(self) -> list[int]:
        """Training sequences of each domain that draws choose from."""
        return [len(rows) for rows in self._rows_by_domain]

    def draw(self, rows: int) -> torch.Tensor:
        """Indices into ``sequences`` of this process's ``rows`` rows of the next training batch."""
        _, _, domains, positions = self.global_draw()
        start = self.process_index * self.rows_per_process
        chosen = []
        mine = zip(domains[start : start + rows].tolist(), positions[start : start + rows].tolist(), strict=True)
        for domain, position in mine:
            candidates = self._rows_by_domain[domain]
            chosen.append(candidates[min(int(position * len(candidates)), len(candidates) - 1)])
        return torch.stack(chosen)

    def pad(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(row["input_ids"]) for row in features)
        input_ids = torch.full((len(features), longest), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(len(features), longest, dtype=torch.long)
        for i, row in enumerate(features):
            ids = torch.as_tensor(row["input_ids"], dtype=torch.long)
            input_ids[i, : len(ids)] = ids
            attention_mask[i, : len(ids)] = 1
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        task_ids = torch.tensor([int(row["task_ids"]) for row in features], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels, "task_ids": task_ids}


def draws_per_epoch(sequences: int, args: TrainingArguments) -> int:
    """An epoch of domain-weighted draws: about as many draws as there are sequences, in whole global batches (so the
    draws are the same with any number of processes for the same global batch)."""
    global_batch = args.per_device_train_batch_size * args.world_size
    return math.ceil(sequences / global_batch) * global_batch


def draw_domains(weights: torch.Tensor, rows: int, generator: torch.Generator) -> torch.Tensor:
    """The domain of each of ``rows`` rows, drawn with replacement in proportion to ``weights`` (uniformly if they are
    all 0)."""
    probabilities = weights / weights.sum() if float(weights.sum()) > 0 else torch.ones_like(weights)
    return torch.multinomial(probabilities, rows, replacement=True, generator=generator)


def batch_seed(seed: int, step: int, micro_batch: int) -> int:
    """The seed of the draws of optimizer step ``step``'s micro-batch ``micro_batch``: a function of the three only."""
    digest = hashlib.sha256(f"{seed}/{step}/{micro_batch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


__all__ = [
    "DOMAIN_COLUMN",
    "EWT_GENRES",
    "DomainCollator",
    "DrawSlots",
    "batch_seed",
    "domain_counts",
    "domain_texts",
    "draw_domains",
    "draws_per_epoch",
    "ewt_genre_texts",
    "pack_domain_texts",
    "pack_domains",
    "pack_text_stream",
    "stream_domains",
]
