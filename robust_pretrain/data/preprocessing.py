"""Turn raw text into token features aligned with part-of-speech tasks, for ``datasets`` (eager or streaming)."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from typing import Any

from datasets import Dataset, Features, IterableDataset, List, Value
from datasets.fingerprint import Hasher

from robust_pretrain.data.taggers import TagFunction, TaggedWord, Tagger, get_tagger
from robust_pretrain.data.tasks import TaskSpec, TaskSpecLike
from robust_pretrain.data.word_tokenizer import text_pieces

FEATURES = Features(
    {
        "input_ids": List(Value("int32")),
        "attention_mask": List(Value("int8")),
        "special_tokens_mask": List(Value("int8")),
        "word_ids": List(Value("int32")),
        "token_task_ids": List(Value("int8")),
    }
)
"""Output columns. ``word_ids``: word index within the sequence (0, 1, ...), -1 for special tokens and tokens
outside any word. ``token_task_ids``: task id of the token's word, -1 for special tokens and non-task words."""

_TRANSFORM_VERSION = "tokenize_and_tag/3"  # 3: script tags for non-Latin words, long texts cut into pieces
MAX_TEXT_CHARS = 2_000
"""With packing, longer texts are cut into pieces of at most this many characters at sentence ends (see
:func:`~robust_pretrain.data.word_tokenizer.text_pieces`) before tokenizing and tagging: the memory a map batch
needs stays bounded (a 20 MB line is no longer one example), and the pieces tag and pack like the whole text."""
TRUNCATION_CHARS_PER_TOKEN = 64
"""Without packing, a text is tokenized only up to ``64 * max_seq_length`` characters (at least
:data:`MAX_TEXT_CHARS`, ending at a word or sentence end): truncation keeps fewer tokens than those in any text but
one averaging over 64 characters per token."""
_WHITESPACE = re.compile(r"\s")


def align_tokens_to_words(
    offsets: Sequence[tuple[int, int]], special_tokens_mask: Sequence[int], words: Sequence[TaggedWord]
) -> list[int]:
    """Index into ``words`` of the word each token belongs to, or -1.

    A token belongs to the first word its character span ``[start, end)`` overlaps, so tokens whose offsets include
    a leading space (byte-level BPE, SentencePiece) and tokens that run across a word boundary are handled alike.
    """
    word_ends = [end for _, end, _ in words]
    token_words = []
    for (start, end), special in zip(offsets, special_tokens_mask, strict=True):
        index = bisect_right(word_ends, start) if not special and end > start else len(words)
        token_words.append(index if index < len(words) and words[index][0] < end else -1)
    return token_words


Row = tuple[list[int], list[int], list[int], list[int]]
"""A sequence as (input_ids, special_tokens_mask, word_ids, token_task_ids)."""


class _TokenizeAndTag:
    """Batched ``datasets.map`` function, one row per text (picklable: tokenizer, tagger and spec go to workers).

    ``max_length=None`` gives the texts' tokens without special tokens and without truncation, for
    :class:`_PackBlocks`.
    """

    def __init__(
        self, tokenizer: Any, spec: TaskSpec, tagger: Tagger, text_column: str, max_length: int | None
    ) -> None:
        self.tokenizer = tokenizer
        self.tag_to_task = spec.tag_to_task
        self.tagger = tagger
        self.text_column = text_column
        self.max_length = max_length

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        texts = batch[self.text_column]
        for row, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"column {self.text_column!r} must hold strings; row {row} is {type(text).__name__}")
        whole = self.max_length is None
        if not whole:  # the tokenizer would encode a whole huge text before truncating it
            limit = max(MAX_TEXT_CHARS, TRUNCATION_CHARS_PER_TOKEN * self.max_length)
            texts = [text_pieces(text, limit)[0] for text in texts]
        encoded = self.tokenizer(
            texts,
            add_special_tokens=not whole,
            truncation=not whole,
            max_length=self.max_length,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            return_attention_mask=False,
            verbose=False,
        )
        if whole:
            tagged = self.tagger(texts)
        else:  # tag only what survives truncation
            tagged = self.tagger([_covered_prefix(t, o) for t, o in zip(texts, encoded["offset_mapping"], strict=True)])
        rows: list[Row] = []
        for ids, offsets, special, words in zip(
            encoded["input_ids"], encoded["offset_mapping"], encoded["special_tokens_mask"], tagged, strict=True
        ):
            token_words = align_tokens_to_words(offsets, special, words)
            tasks = [self.tag_to_task.get(words[w][2], -1) if w >= 0 else -1 for w in token_words]
            rows.append((ids, list(special), token_words, tasks))
        return _columns(rows)


class _SplitLongTexts:
    """Batched ``datasets.map`` function: each text of ``text_column`` as its pieces of at most ``max_chars``
    characters (one row each; values that are not strings pass through, for :class:`_TokenizeAndTag` to refuse)."""

    def __init__(self, text_column: str, max_chars: int) -> None:
        self.text_column = text_column
        self.max_chars = max_chars

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        pieces = []
        for text in batch[self.text_column]:
            pieces.extend(text_pieces(text, self.max_chars) if isinstance(text, str) else [text])
        return {self.text_column: pieces}


def _longest_text(dataset: Dataset, text_column: str) -> int:
    """Characters in the longest string of an eager dataset's text column (0 when it holds no string)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = dataset.data.column(text_column)
    if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
        return 0
    longest = pc.max(pc.utf8_length(column)).as_py()
    return longest or 0


class _PackBlocks:
    """Batched ``datasets.map`` function: concatenate the rows of a batch (texts without special tokens) and cut
    blocks of ``max_length`` tokens, special tokens included; the last, shorter block is kept.

    Word indices are made unique across texts before cutting. Blocks depend only on which texts form a batch, so
    this step runs in one process over the whole dataset (``datasets`` splits the rows among processes at places
    that depend on ``num_proc``).
    """

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        probe = tokenizer("a", return_special_tokens_mask=True)
        mask = probe["special_tokens_mask"]
        if 0 not in mask:
            raise ValueError("the tokenizer produced only special tokens for the text 'a'; cannot locate its template")
        first = mask.index(0)
        last = len(mask) - 1 - mask[::-1].index(0)
        self.prefix_ids = probe["input_ids"][:first]
        self.suffix_ids = probe["input_ids"][last + 1 :]
        self.block_size = max_length - len(self.prefix_ids) - len(self.suffix_ids)
        if self.block_size < 1:
            raise ValueError(f"max_seq_length={max_length} leaves no room next to the tokenizer's special tokens")

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        ids, words, tasks = [], [], []
        word_offset = 0
        for text_ids, text_words, text_tasks in zip(
            batch["input_ids"], batch["word_ids"], batch["token_task_ids"], strict=True
        ):
            ids.extend(text_ids)
            words.extend(w + word_offset if w >= 0 else -1 for w in text_words)
            tasks.extend(text_tasks)
            word_offset += max(text_words, default=-1) + 1
        n_prefix, n_suffix = len(self.prefix_ids), len(self.suffix_ids)
        blocks: list[Row] = []
        for start in range(0, len(ids), self.block_size):
            stop = start + self.block_size
            blocks.append(
                (
                    self.prefix_ids + ids[start:stop] + self.suffix_ids,
                    [1] * n_prefix + [0] * len(ids[start:stop]) + [1] * n_suffix,
                    [-1] * n_prefix + words[start:stop] + [-1] * n_suffix,
                    [-1] * n_prefix + tasks[start:stop] + [-1] * n_suffix,
                )
            )
        return _columns(blocks)


def _columns(rows: list[Row]) -> dict[str, list]:
    """The :data:`FEATURES` columns of ``rows``, word indices renumbered 0, 1, ... per row."""
    columns: dict[str, list] = {name: [] for name in FEATURES}
    for ids, special, token_words, tasks in rows:
        columns["input_ids"].append(ids)
        columns["attention_mask"].append([1] * len(ids))
        columns["special_tokens_mask"].append(special)
        columns["word_ids"].append(_renumber(token_words))
        columns["token_task_ids"].append(tasks)
    return columns


def _covered_prefix(text: str, offsets: Sequence[tuple[int, int]]) -> str:
    """The start of ``text`` that its (possibly truncated) tokens cover, extended to the end of the last word."""
    end = max((token_end for _, token_end in offsets), default=0)
    if end >= len(text):
        return text
    whitespace = _WHITESPACE.search(text, end)
    return text[: whitespace.start()] if whitespace else text


def _renumber(token_words: list[int]) -> list[int]:
    """Map word indices to 0, 1, ... in order of first appearance (-1 stays -1)."""
    new_ids: dict[int, int] = {}
    return [new_ids.setdefault(w, len(new_ids)) if w >= 0 else -1 for w in token_words]


def _require_column(batch: dict[str, list], column: str) -> dict[str, list]:
    if column not in batch:
        raise ValueError(f"text column {column!r} not in the stream's columns {list(batch)}")
    return {}


def _tokenizer_fingerprint(tokenizer: Any) -> str:
    return Hasher.hash([type(tokenizer).__name__, tokenizer.backend_tokenizer.to_str()])


def tokenize_and_tag(
    dataset: Dataset | IterableDataset,
    tokenizer: Any,
    spec: TaskSpecLike = None,
    tagger: str | Tagger | TagFunction = "shipped",
    *,
    text_column: str = "text",
    max_seq_length: int | None = None,
    pack: bool = False,
    num_proc: int | None = None,
    batch_size: int = 1000,
    load_from_cache_file: bool | None = None,
) -> Dataset | IterableDataset:
    """Tokenize and PoS-tag ``dataset[text_column]`` into the columns of ``FEATURES`` (others are dropped).

    Args:
        dataset: a ``Dataset`` (mapped eagerly, cached under a deterministic fingerprint, so a repeated call is a
            cache hit) or an ``IterableDataset`` (mapped lazily: tagging runs where it is iterated, e.g. in
            ``DataLoader`` workers).
        tokenizer: a fast (Rust-backed) tokenizer; its character offsets align tokens with tagged words.
        spec: task specification (``TaskSpec``, mapping, YAML path, or ``None`` for the nine default PoS tasks).
        tagger: ``"shipped"`` (default), ``"nltk"``, or a callable backend (see :func:`get_tagger`).
        max_seq_length: tokens per sequence, special tokens included; default ``min(model_max_length, 512)``.
            Without packing longer texts are truncated, and only the part of a text that survives truncation is
            tagged (up to the end of the word the last token falls in).
        pack: concatenate the texts of each map batch and cut them into ``max_seq_length`` blocks. The blocks are
            the same for any ``num_proc`` and for streaming (tagging runs in ``num_proc`` processes, packing in one).
            Texts longer than ``MAX_TEXT_CHARS`` characters are first cut into pieces at sentence ends.
        num_proc: worker processes for an eager ``Dataset`` (ignored for streaming).
        batch_size: texts per map batch (packing happens within a batch).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"tokenize_and_tag needs a fast tokenizer (PreTrainedTokenizerFast) for character offsets; got "
            f"{type(tokenizer).__name__}. Load it with AutoTokenizer.from_pretrained(..., use_fast=True)."
        )
    spec = TaskSpec.resolve(spec)
    tagger = get_tagger(tagger)
    if max_seq_length is None:
        max_seq_length = min(tokenizer.model_max_length, 512)
    column_names = dataset.column_names
    if column_names is not None and text_column not in column_names:
        raise ValueError(f"text column {text_column!r} not in dataset columns {column_names}")
    tokenize = _TokenizeAndTag(tokenizer, spec, tagger, text_column, None if pack else max_seq_length)
    pack_blocks = _PackBlocks(tokenizer, max_seq_length) if pack else None
    if isinstance(dataset, IterableDataset):
        return _tag_stream(dataset, tokenize, pack_blocks, text_column, batch_size)
    settings = [
        _TRANSFORM_VERSION,
        _tokenizer_fingerprint(tokenizer),
        spec.to_dict(),
        tagger.fingerprint,
        text_column,
        max_seq_length,
        pack,
        batch_size,
    ]
    return _tag_dataset(
        dataset, tokenize, pack_blocks, settings, text_column, batch_size, num_proc, load_from_cache_file
    )


def _tag_stream(
    dataset: IterableDataset,
    tokenize: _TokenizeAndTag,
    pack_blocks: _PackBlocks | None,
    text_column: str,
    batch_size: int,
) -> IterableDataset:
    """:func:`tokenize_and_tag` of a stream: mapped lazily, packed when ``pack_blocks`` is given."""
    map_options = {"batched": True, "batch_size": batch_size, "features": FEATURES}
    if dataset.column_names is None:  # undeclared columns (from_generator): check the text column as rows arrive
        dataset = dataset.map(_require_column, batched=True, batch_size=batch_size, fn_kwargs={"column": text_column})
    # keep only the text, so that no other column leaks into the rows or breaks packing
    texts = dataset.select_columns([text_column])
    if pack_blocks is not None:
        texts = texts.map(_SplitLongTexts(text_column, MAX_TEXT_CHARS), batched=True, batch_size=batch_size)
    tokenized = texts.map(tokenize, remove_columns=[text_column], **map_options)
    return tokenized.map(pack_blocks, **map_options) if pack_blocks is not None else tokenized


def _tag_dataset(
    dataset: Dataset,
    tokenize: _TokenizeAndTag,
    pack_blocks: _PackBlocks | None,
    settings: list,
    text_column: str,
    batch_size: int,
    num_proc: int | None,
    load_from_cache_file: bool | None,
) -> Dataset:
    """:func:`tokenize_and_tag` of a ``Dataset``: mapped eagerly, each step cached under a fingerprint of the input
    and the ``settings``; packed when ``pack_blocks`` is given."""
    map_options = {"batched": True, "batch_size": batch_size, "features": FEATURES}
    if pack_blocks is not None and _longest_text(dataset, text_column) > MAX_TEXT_CHARS:
        dataset = dataset.map(
            _SplitLongTexts(text_column, MAX_TEXT_CHARS),
            batched=True,
            batch_size=batch_size,
            remove_columns=dataset.column_names,
            num_proc=num_proc,
            new_fingerprint=Hasher.hash([dataset._fingerprint, *settings, MAX_TEXT_CHARS]),
            load_from_cache_file=load_from_cache_file,
            desc="Cutting long texts into pieces",
        )
    tokenized = dataset.map(
        tokenize,
        remove_columns=dataset.column_names,
        num_proc=num_proc,
        new_fingerprint=Hasher.hash([dataset._fingerprint, *settings]),
        load_from_cache_file=load_from_cache_file,
        desc="Tokenizing and PoS-tagging",
        **map_options,
    )
    if pack_blocks is None:
        return tokenized
    return tokenized.map(
        pack_blocks,
        new_fingerprint=Hasher.hash([tokenized._fingerprint, *settings]),
        load_from_cache_file=load_from_cache_file,
        desc="Packing",
        **map_options,
    )


STREAM_POSITION_COLUMN = "stream_position"
"""Column :func:`repeat_stream` adds: a row's position (0, 1, ...) in what its reader has read, over all passes."""


def repeat_stream(dataset: IterableDataset) -> IterableDataset:
    """The stream read over and over without end, each row with its position in :data:`STREAM_POSITION_COLUMN`.

    It keeps the shards (files) of ``dataset``, and a reader of some of them (a process after Accelerate's
    ``shard``, a ``DataLoader`` worker) reads its shards pass after pass: its ``n``-th row is a function of ``n``
    alone, also when its shards are shorter than those of the other processes and wrap sooner. A run resumed by
    skipping the batches it had drawn (the Trainer's replay) therefore continues exactly where each process was,
    in whichever pass; with the Trainer's own epochs each process's pass would end separately and the replay would
    restart from a pass's start. The position keys per-batch randomness (new masks in every pass).
    """
    features = dataset.features
    if features is not None:
        features = Features({**features, STREAM_POSITION_COLUMN: Value("int64")})
    return dataset.repeat(None).map(_add_position, with_indices=True, batched=True, features=features)


def _add_position(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
    return {**batch, STREAM_POSITION_COLUMN: indices}


def task_word_counts(dataset: Dataset | IterableDataset, max_rows: int | None = None) -> tuple[int, int]:
    """``(words of a task, words)`` in features made by :func:`tokenize_and_tag` (in its first ``max_rows`` rows).

    A word counts once per sequence it has tokens in, with the task of its first token; words of no task
    (punctuation, numbers, symbols, foreign words tagged ``X``) count among the words only.
    """
    task_words = words = 0
    for word_tasks in _word_task_ids(dataset, max_rows):
        words += len(word_tasks)
        task_words += int((word_tasks >= 0).sum())
    return task_words, words


def words_per_task(dataset: Dataset | IterableDataset, num_tasks: int, max_rows: int | None = None) -> list[int]:
    """The words of each task (counted as :func:`task_word_counts` counts them) in the first ``max_rows`` rows."""
    import numpy as np

    counts = np.zeros(num_tasks, dtype=np.int64)
    for word_tasks in _word_task_ids(dataset, max_rows):
        counts += np.bincount(word_tasks[word_tasks >= 0], minlength=num_tasks)[:num_tasks]
    return counts.tolist()


def _word_task_ids(dataset: Dataset | IterableDataset, max_rows: int | None) -> Iterator[Any]:
    """Per batch of rows, the task id of every word (of its first token; negative: no task)."""
    import numpy as np
    import pyarrow.compute as pc

    if max_rows is not None and isinstance(dataset, IterableDataset):
        dataset = dataset.take(max_rows)
    elif max_rows is not None:
        dataset = dataset.select(range(min(max_rows, len(dataset))))
    for table in dataset.select_columns(["word_ids", "token_task_ids"]).with_format("arrow").iter(batch_size=4096):
        word_lists = table.column("word_ids").combine_chunks()
        word_ids = np.asarray(pc.list_flatten(word_lists))
        task_ids = np.asarray(pc.list_flatten(table.column("token_task_ids").combine_chunks()))
        offsets = np.asarray(word_lists.offsets)
        row_starts = offsets[:-1][offsets[1:] > offsets[:-1]] - offsets[0]
        first_tokens = word_ids >= 0  # a word's tokens are consecutive: its first one follows another word's
        first_tokens[1:] &= word_ids[1:] != word_ids[:-1]
        first_tokens[row_starts] = word_ids[row_starts] >= 0
        yield task_ids[first_tokens]
