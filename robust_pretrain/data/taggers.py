"""Part-of-speech tagger backends: each tags a batch of raw texts into ``(char_start, char_end, UPOS)`` words."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from robust_pretrain.data.perceptron import VectorizedPerceptron, load_model
from robust_pretrain.data.tasks import UPOS_TAGS
from robust_pretrain.data.word_tokenizer import script_upos, sentence_ranges, word_spans

SHIPPED_MODEL_PATH = Path(__file__).resolve().parent / "resources" / "upos_perceptron_ewt.json.gz"

TaggedWord = tuple[int, int, str]
"""A word as ``(char_start, char_end, upos)``: ``text[char_start:char_end]`` is the word."""

TagFunction = Callable[[list[str]], list[list[TaggedWord]]]
"""User backend signature: texts -> per text, its words in text order as ``(char_start, char_end, upos)``."""

# Refinements of the Penn -> universal map for distinctions UPOS makes and the 12-tag universal set merges.
_PENN_TO_UPOS_OVERRIDES = {"NNP": "PROPN", "NNPS": "PROPN", "MD": "AUX", "UH": "INTJ", "SYM": "SYM"}
_UNIVERSAL_TO_UPOS = {"CONJ": "CCONJ", "PRT": "PART", ".": "PUNCT"}
_NLTK_DOWNLOAD_HINT = (
    "the 'nltk' tagger backend needs NLTK's English perceptron tagger and the universal tagset map; install them "
    "with `python -c \"import nltk; nltk.download('averaged_perceptron_tagger_eng'); "
    "nltk.download('universal_tagset')\"` or point NLTK_DATA at a directory holding them"
)

_loaded_models: dict[Path, VectorizedPerceptron] = {}


@runtime_checkable
class Tagger(Protocol):
    """A picklable backend: ``tagger(texts)`` gives each text's words; ``fingerprint`` identifies its output."""

    fingerprint: str

    def __call__(self, texts: Sequence[str]) -> list[list[TaggedWord]]: ...


class ShippedTagger:
    """Averaged-perceptron UPOS tagger trained on UD English-EWT (the default backend).

    Words come from :func:`~robust_pretrain.data.word_tokenizer.word_spans`; each sentence (see
    :func:`~robust_pretrain.data.word_tokenizer.sentence_ranges`) is tagged on its own. The model loads lazily, once per
    process; pickling carries only the model path, so the tagger is cheap to send to ``datasets`` workers.
    """

    def __init__(self, model_path: str | Path = SHIPPED_MODEL_PATH) -> None:
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise FileNotFoundError(f"tagger model file not found: {self.model_path}")
        self.fingerprint = "shipped:" + hashlib.sha256(self.model_path.read_bytes()).hexdigest()[:16]

    @property
    def model(self) -> VectorizedPerceptron:
        model = _loaded_models.get(self.model_path)
        if model is None:
            model = _loaded_models[self.model_path] = VectorizedPerceptron(load_model(self.model_path))
        return model

    def tag_words(self, sentences: Sequence[Sequence[str]]) -> list[list[str]]:
        """UPOS tags of already tokenised sentences."""
        return self.model.tag(sentences)

    def __call__(self, texts: Sequence[str]) -> list[list[TaggedWord]]:
        spans = [word_spans(text) for text in texts]
        sentences: list[list[str]] = []
        for text, text_spans in zip(texts, spans, strict=True):
            words = [text[start:end] for start, end in text_spans]
            sentences.extend(words[start:end] for start, end in sentence_ranges(words))
        tags = self.model.tag_flat(sentences)
        tagged = []
        offset = 0
        for text_spans in spans:
            text_tags = tags[offset : offset + len(text_spans)]
            offset += len(text_spans)
            tagged.append([(start, end, tag) for (start, end), tag in zip(text_spans, text_tags, strict=True)])
        return tagged


def penn_to_upos(penn_tag: str) -> str:
    """Map a Penn Treebank tag to UPOS via NLTK's ``en-ptb`` universal map plus UPOS refinements."""
    from nltk.tag.mapping import map_tag

    if penn_tag in _PENN_TO_UPOS_OVERRIDES:
        return _PENN_TO_UPOS_OVERRIDES[penn_tag]
    universal = map_tag("en-ptb", "universal", penn_tag)
    return _UNIVERSAL_TO_UPOS.get(universal, universal)


class NltkTagger:
    """NLTK's standard English perceptron (``nltk.pos_tag``), Penn tags mapped to UPOS by :func:`penn_to_upos`.

    NNP(S) -> PROPN, MD -> AUX, UH -> INTJ and SYM -> SYM refine the universal map; IN is always ADP (NLTK does
    not separate subordinating conjunctions). Words of other scripts, punctuation and symbols outside ASCII get
    X/PUNCT/SYM (as in the shipped tagger). Needs NLTK data (see the error message when it is missing).
    """

    fingerprint = "nltk:averaged_perceptron_tagger_eng+universal_tagset"

    def __init__(self) -> None:
        import nltk

        for resource in ("taggers/averaged_perceptron_tagger_eng/", "taggers/universal_tagset/en-ptb.map"):
            try:
                nltk.data.find(resource)
            except LookupError as error:
                raise LookupError(f"{_NLTK_DOWNLOAD_HINT} (missing: {resource})") from error
        self._tagger = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tagger": None}

    def __call__(self, texts: Sequence[str]) -> list[list[TaggedWord]]:
        if self._tagger is None:
            from nltk.tag.perceptron import PerceptronTagger

            self._tagger = PerceptronTagger(lang="eng")
        tagged = []
        for text in texts:
            spans = word_spans(text)
            words = [text[start:end] for start, end in spans]
            penn = [pair for start, end in sentence_ranges(words) for pair in self._tagger.tag(words[start:end])]
            tags = [self._upos(word, tag) for word, tag in penn]
            tagged.append([(start, end, tag) for (start, end), tag in zip(spans, tags, strict=True)])
        return tagged

    def _upos(self, word: str, penn_tag: str) -> str:
        """The UPOS of a tagged word; a word NLTK's model never saw with no Latin letter or digit gets the tag of its
        script (:func:`~robust_pretrain.data.word_tokenizer.script_upos`), not the noun the model guesses."""
        script_tag = None if word in self._tagger.tagdict else script_upos(word)
        return script_tag or penn_to_upos(penn_tag)


class CallableTagger:
    """Wraps a user function with the :data:`TagFunction` signature and checks what it returns."""

    def __init__(self, function: TagFunction) -> None:
        from datasets.fingerprint import Hasher

        self.function = function
        self.fingerprint = "callable:" + Hasher.hash(function)

    def __call__(self, texts: Sequence[str]) -> list[list[TaggedWord]]:
        texts = list(texts)
        tagged = self.function(texts)
        if not isinstance(tagged, Sequence) or len(tagged) != len(texts):
            raise ValueError(f"tagger function must return one list of words per text ({len(texts)} texts)")
        checked = []
        for text, words in zip(texts, tagged, strict=True):
            previous_end = 0
            for word in words:
                if len(word) != 3:
                    raise ValueError(f"tagger function returned {word!r}; expected (char_start, char_end, upos)")
                start, end, tag = word
                if not 0 <= start < end <= len(text) or start < previous_end:
                    raise ValueError(
                        f"tagger function returned span ({start}, {end}) for a text of length {len(text)}; spans "
                        "must be non-empty, inside the text, in order and non-overlapping"
                    )
                if tag not in UPOS_TAGS:
                    raise ValueError(f"tagger function returned unknown UPOS tag {tag!r}")
                previous_end = end
            checked.append([tuple(word) for word in words])
        return checked


def get_tagger(backend: str | Tagger | TagFunction = "shipped") -> Tagger:
    """Return a tagger: ``"shipped"`` (default), ``"nltk"``, a ``Tagger``, or a plain ``TagFunction``."""
    if isinstance(backend, str):
        if backend == "shipped":
            return ShippedTagger()
        if backend == "nltk":
            return NltkTagger()
        raise ValueError(f"unknown tagger backend {backend!r}; use 'shipped', 'nltk' or a callable")
    if isinstance(backend, Tagger):
        return backend
    if callable(backend):
        return CallableTagger(backend)
    raise TypeError(f"tagger backend must be 'shipped', 'nltk' or a callable, got {type(backend).__name__}")
