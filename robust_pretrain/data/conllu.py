"""Minimal CoNLL-U reader for the UD treebanks used to train the tagger and build the embedded corpus."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ConlluSentence:
    """One sentence: its raw ``# text``, document/paragraph ids and syntactic words with gold UPOS."""

    text: str
    doc_id: str | None
    paragraph_id: str | None
    words: list[str] = field(default_factory=list)
    upos: list[str] = field(default_factory=list)


def read_conllu(path: str | Path) -> Iterator[ConlluSentence]:
    """Yield the sentences of a CoNLL-U file.

    Multi-word token ranges (``1-2 don't``) and empty nodes (``8.1``) are skipped, so ``words`` are the syntactic
    words the UPOS tags belong to (``do``, ``n't``). Paragraph/document ids carry over to following sentences.
    """
    doc_id: str | None = None
    paragraph_id: str | None = None
    text: str | None = None
    words: list[str] = []
    upos: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            line = line.rstrip("\n")
            if line.startswith("# newdoc id ="):
                doc_id = line.split("=", 1)[1].strip()
                paragraph_id = None
            elif line.startswith("# newpar id ="):
                paragraph_id = line.split("=", 1)[1].strip()
            elif line.startswith("# text ="):
                text = line.split("=", 1)[1].strip()
            elif line.startswith("#"):
                continue
            elif not line:
                if words:
                    if text is None:
                        raise ValueError(f"{path}:{line_number}: sentence without a '# text =' comment")
                    yield ConlluSentence(text, doc_id, paragraph_id, words, upos)
                text, words, upos = None, [], []
            else:
                columns = line.split("\t")
                if len(columns) != 10:
                    raise ValueError(f"{path}:{line_number}: expected 10 tab-separated columns, got {len(columns)}")
                if "-" in columns[0] or "." in columns[0]:
                    continue
                words.append(columns[1])
                upos.append(columns[3])
    if words:
        if text is None:
            raise ValueError(f"{path}: last sentence has no '# text =' comment")
        yield ConlluSentence(text, doc_id, paragraph_id, words, upos)


def upos_accuracy(predicted: list[list[str]], sentences: list[ConlluSentence]) -> float:
    """Fraction of words whose predicted tag equals the gold UPOS (one tag list per sentence, same order)."""
    pairs = [(p, g) for tags, s in zip(predicted, sentences, strict=True) for p, g in zip(tags, s.upos, strict=True)]
    if not pairs:
        raise ValueError("no words to score")
    return sum(p == g for p, g in pairs) / len(pairs)
