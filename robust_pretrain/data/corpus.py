"""UD English-EWT raw text as a pre-training corpus, read from the treebank's CoNLL-U files (CC BY-SA 4.0).

The text is not shipped with the package: point ``ud_dir`` at a folder holding ``en_ewt-ud-{train,dev,test}.conllu``
(a clone of https://github.com/UniversalDependencies/UD_English-EWT) or at a Hub dataset repository holding them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from datasets import Dataset

from robust_pretrain.data.conllu import ConlluSentence, read_conllu

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_UD_DIR = PROJECT_ROOT.parent / "shared" / "data" / "ud_ewt"
"""``../shared/data/ud_ewt`` beside the project checkout, used when no ``ud_dir`` is given."""
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
    repository holding the files (downloaded once into the Hugging Face cache); ``None`` for
    :data:`DEFAULT_UD_DIR`.
    """
    if ud_dir is not None and str(ud_dir).startswith(HUB_PREFIX):
        return _download_from_hub(str(ud_dir))
    path = Path(ud_dir) if ud_dir is not None else DEFAULT_UD_DIR
    if not path.is_dir():
        raise FileNotFoundError(
            f"UD English-EWT folder not found: {path}. Clone {UD_EWT_URL} (CC BY-SA 4.0) and pass its folder as "
            f"ud_dir (--ud_dir), or pass {HUB_PREFIX}<owner>/<name>[/<folder>] for a Hub dataset repository holding "
            "en_ewt-ud-{train,dev,test}.conllu."
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
    average). ``ud_dir`` is resolved by :func:`resolve_ud_dir`.
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
