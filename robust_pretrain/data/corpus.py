"""UD English-EWT raw text as a pre-training corpus, read from the treebank's CoNLL-U files (CC BY-SA 4.0).

The text is not shipped with the package: point ``ud_dir`` at a folder holding ``en_ewt-ud-{train,dev,test}.conllu``
(a clone of https://github.com/UniversalDependencies/UD_English-EWT) or at a Hub dataset repository holding them, or
set ``$ROBUST_PRETRAIN_UD_DIR``; by default it is ``../shared/data/ud_ewt`` from the current directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from datasets import Dataset

from robust_pretrain.data.conllu import ConlluSentence, read_conllu

UD_DIR_ENV = "ROBUST_PRETRAIN_UD_DIR"
"""Environment variable naming the UD-EWT folder (or Hub reference) used when no ``ud_dir`` is given."""
DEFAULT_UD_DIR = Path("..", "shared", "data", "ud_ewt")
"""Where the UD-EWT folder is when neither ``ud_dir`` nor :data:`UD_DIR_ENV` is given: relative to the current
directory, the layout of the project checkout (the shared data beside it)."""
UD_EWT_URL = "https://github.com/UniversalDependencies/UD_English-EWT"
HUB_PREFIX = "hf://datasets/"
SPLIT_SOURCES = {"train": ("train", "dev"), "test": ("test",)}
"""Corpus split -> treebank files: ``train`` holds EWT train and dev, ``test`` EWT test (unseen by the tagger)."""


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


def resolve_ud_dir(ud_dir: str | Path | None = None) -> Path:
    """The local folder of the UD English-EWT CoNLL-U files.

    ``ud_dir``: a local folder; ``hf://datasets/<owner>/<name>[@<revision>][/<folder>]`` for a Hub dataset
    repository holding the files (downloaded once into the Hugging Face cache); ``None`` for the environment variable
    :data:`UD_DIR_ENV` if set, else :data:`DEFAULT_UD_DIR` (relative paths: from the current directory).
    """
    origin = ""
    if ud_dir is None:
        ud_dir = os.environ.get(UD_DIR_ENV) or None
        origin = f" (from ${UD_DIR_ENV})" if ud_dir else f" (the default, {DEFAULT_UD_DIR} from the current directory)"
        ud_dir = ud_dir or DEFAULT_UD_DIR
    if str(ud_dir).startswith(HUB_PREFIX):
        return _download_from_hub(str(ud_dir))
    path = Path(ud_dir)
    if not path.is_dir():
        raise FileNotFoundError(
            f"UD English-EWT folder not found: {os.path.abspath(path)}{origin}. Clone {UD_EWT_URL} (CC BY-SA 4.0) "
            f"and pass its folder as ud_dir (--ud_dir) or in ${UD_DIR_ENV}, or pass {HUB_PREFIX}<owner>/<name>"
            "[/<folder>] for a Hub dataset repository holding en_ewt-ud-{train,dev,test}.conllu."
        )
    return path


def _download_from_hub(reference: str) -> Path:
    from huggingface_hub import snapshot_download

    parts = reference[len(HUB_PREFIX) :].strip("/").split("/")
    if len(parts) < 2 or not all(parts[:2]):
        raise ValueError(f"expected {HUB_PREFIX}<owner>/<name>[@<revision>][/<folder>], got {reference!r}")
    name, _, revision = parts[1].partition("@")
    folder = "/".join(parts[2:])
    pattern = f"{folder}/en_ewt-ud-*.conllu" if folder else "en_ewt-ud-*.conllu"
    snapshot = snapshot_download(
        f"{parts[0]}/{name}", repo_type="dataset", revision=revision or None, allow_patterns=[pattern]
    )
    return Path(snapshot, folder)


def load_ewt_corpus(split: str = "train", ud_dir: str | Path | None = None) -> Dataset:
    """UD English-EWT raw text as a ``Dataset`` with one ``text`` column, one paragraph per row.

    ``"train"`` holds the EWT train and dev paragraphs, ``"test"`` the EWT test paragraphs (the shipped tagger never
    saw them). Paragraphs rather than sentences give masked-LM examples some context (about five sentences on
    average). ``ud_dir`` is resolved by ``resolve_ud_dir``.
    """
    if split not in SPLIT_SOURCES:
        raise ValueError(f"unknown split {split!r}; choose one of {sorted(SPLIT_SOURCES)}")
    folder = resolve_ud_dir(ud_dir)
    texts = []
    for source in SPLIT_SOURCES[split]:
        path = folder / f"en_ewt-ud-{source}.conllu"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: the UD English-EWT folder must hold en_ewt-ud-{source}.conllu")
        texts.extend(paragraphs(read_conllu(path)))
    return Dataset.from_dict({"text": texts}, split=split)
