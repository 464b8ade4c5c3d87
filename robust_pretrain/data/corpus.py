"""Embedded raw-text corpus: UD English-EWT paragraphs (CC BY-SA 4.0), one paragraph per row."""

from __future__ import annotations

import gzip
from collections.abc import Iterable
from pathlib import Path

from datasets import Dataset

from robust_pretrain.data.conllu import ConlluSentence

RESOURCES = Path(__file__).resolve().parent / "resources"
CORPUS_FILES = {"train": RESOURCES / "ewt_paragraphs_train.txt.gz", "test": RESOURCES / "ewt_paragraphs_test.txt.gz"}


def paragraphs(sentences: Iterable[ConlluSentence]) -> list[str]:
    """Join consecutive sentences of the same document paragraph (``# newpar``) with single spaces.

    Sentences outside any marked paragraph form one paragraph per document. Whitespace inside a sentence is
    collapsed to single spaces so that each paragraph fits on one line.
    """
    texts: list[str] = []
    current_key: tuple[str | None, str | None] | None = None
    for sentence in sentences:
        key = (sentence.doc_id, sentence.paragraph_id)
        text = " ".join(sentence.text.split())
        if key == current_key and texts:
            texts[-1] = f"{texts[-1]} {text}"
        else:
            texts.append(text)
            current_key = key
    return texts


def write_corpus(texts: Iterable[str], path: str | Path) -> None:
    """Write one text per line, gzipped without a timestamp (byte-reproducible)."""
    payload = "".join(f"{text}\n" for text in texts).encode("utf-8")
    Path(path).write_bytes(gzip.compress(payload, mtime=0))


def load_embedded_corpus(split: str = "train") -> Dataset:
    """UD English-EWT raw text as a ``Dataset`` with one ``text`` column, one paragraph per row.

    ``"train"`` holds the EWT train and dev paragraphs, ``"test"`` the EWT test paragraphs (the tagger never saw
    them). Paragraphs rather than sentences give masked-LM examples some context (about five sentences on average).
    """
    if split not in CORPUS_FILES:
        raise ValueError(f"unknown split {split!r}; choose one of {sorted(CORPUS_FILES)}")
    with gzip.open(CORPUS_FILES[split], "rt", encoding="utf-8") as handle:
        texts = handle.read().splitlines()
    return Dataset.from_dict({"text": texts}, split=split)
