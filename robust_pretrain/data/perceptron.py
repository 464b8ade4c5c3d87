"""Averaged-perceptron UPOS tagger: training with NLTK's ``AveragedPerceptron``, JSON storage, vectorised decoding.

The feature set extends the one of NLTK's ``PerceptronTagger`` with word-shape features (capitalisation matters for
PROPN). Every feature is either a function of a single word at a fixed offset (-2..+2) or of the previous tags, so
the tagger scores a token as ``bias + sum_offsets contribution[word at offset] + tag-dependent terms``: word
contributions are cached per word type, and greedy left-to-right decoding runs position by position over a whole
batch of sentences with numpy, giving the same tags as the pure-Python perceptron (up to float summation order).
"""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

START = ("-START-", "-START2-")
END = ("-END-", "-END2-")
OFFSETS = (-2, -1, 0, 1, 2)
FORMAT_NAME = "robust-pretrain/averaged-perceptron-tagger"
FORMAT_VERSION = 1
# A word goes to the tag dictionary (tagged without scoring) when frequent and unambiguous, as in NLTK.
TAGDICT_MIN_COUNT = 20
TAGDICT_MIN_PURITY = 0.97


def normalize_word(word: str) -> str:
    """Lower-case a word and collapse hyphenated words, four-digit years and other numbers into classes."""
    if "-" in word and not word.startswith("-"):
        return "!HYPHEN"
    if len(word) == 4 and word.isdigit():
        return "!YEAR"
    if word[:1].isdigit():
        return "!DIGITS"
    return word.lower()


def word_shape(word: str) -> str:
    """Coarse shape: runs of upper (X), lower (x), digit (d) and other characters collapsed, at most 4 symbols."""
    symbols: list[str] = []
    for char in word:
        symbol = "X" if char.isupper() else "x" if char.islower() else "d" if char.isdigit() else char
        if not symbols or symbols[-1] != symbol:
            symbols.append(symbol)
    return "".join(symbols[:4])


def offset_features(word: str, offset: int) -> list[str]:
    """Features the word contributes when it sits ``offset`` positions from the word being tagged.

    ``word`` is a raw token or one of the START/END padding symbols (used verbatim).
    """
    padding = word in START or word in END
    norm = word if padding else normalize_word(word)
    shape = word if padding else word_shape(word)
    if offset == 0:
        return [
            f"i suffix {word[-3:]}",
            f"i pref1 {word[:1]}",
            f"i word {norm}",
            f"i shape {shape}",
            f"i suffix2 {word[-2:].lower()}",
        ]
    if offset in (-1, 1):
        name = f"i{offset:+d}"
        return [f"{name} word {norm}", f"{name} suffix {norm[-3:]}", f"{name} shape {shape}"]
    if offset in (-2, 2):
        return [f"i{offset:+d} word {norm}"]
    raise ValueError(f"offset must be one of {OFFSETS}, got {offset}")


def tag_features(prev: str, prev2: str, norm: str) -> list[str]:
    """Features that depend on the two previously predicted tags (``norm`` = normalised current word)."""
    return [f"i-1 tag {prev}", f"i-2 tag {prev2}", f"i tag+i-2 tag {prev} {prev2}", f"i-1 tag+i word {prev} {norm}"]


def sentence_features(words: Sequence[str], i: int, prev: str, prev2: str) -> list[str]:
    """All features of word ``i`` of ``words`` (reference implementation used for training)."""
    context = [*START, *words, *END]
    features = ["bias"]
    for offset in OFFSETS:
        features.extend(offset_features(context[i + len(START) + offset], offset))
    features.extend(tag_features(prev, prev2, normalize_word(words[i])))
    return features


def train_perceptron(sentences: Sequence[tuple[Sequence[str], Sequence[str]]], n_iter: int = 5, seed: int = 0) -> dict:
    """Train NLTK's ``AveragedPerceptron`` on ``(words, tags)`` sentences; return the JSON-ready model dict.

    Training order is shuffled with ``random.Random(seed)`` after each pass, so a seed fixes the result.
    """
    from nltk.tag.perceptron import AveragedPerceptron

    counts: dict[str, Counter] = defaultdict(Counter)
    for words, tags in sentences:
        if len(words) != len(tags):
            raise ValueError(f"sentence has {len(words)} words but {len(tags)} tags")
        for word, tag in zip(words, tags, strict=True):
            counts[word][tag] += 1
    classes = sorted({tag for tag_counts in counts.values() for tag in tag_counts})
    tagdict = {}
    for word, tag_counts in counts.items():
        tag, mode = tag_counts.most_common(1)[0]
        total = sum(tag_counts.values())
        if total >= TAGDICT_MIN_COUNT and mode / total >= TAGDICT_MIN_PURITY:
            tagdict[word] = tag

    model = AveragedPerceptron()
    model.classes = set(classes)
    order = list(sentences)
    rng = random.Random(seed)
    for _ in range(n_iter):
        for words, tags in order:
            prev, prev2 = START
            for i, word in enumerate(words):
                guess = tagdict.get(word)
                if guess is None:
                    features = dict.fromkeys(sentence_features(words, i, prev, prev2), 1)
                    guess, _ = model.predict(features)
                    model.update(tags[i], guess, features)
                prev2, prev = prev, guess
        rng.shuffle(order)
    model.average_weights()
    return encode_model(model.weights, tagdict, classes)


def encode_model(weights: dict[str, dict[str, float]], tagdict: dict[str, str], classes: Sequence[str]) -> dict:
    """Columnar JSON layout: feature names plus (feature index, class index, weight) triplets."""
    class_index = {name: k for k, name in enumerate(classes)}
    features, rows, cols, values = [], [], [], []
    for feature, class_weights in weights.items():
        nonzero = [(class_index[c], w) for c, w in class_weights.items() if w]
        if not nonzero:
            continue
        row = len(features)
        features.append(feature)
        for col, weight in nonzero:
            rows.append(row)
            cols.append(col)
            values.append(weight)
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "classes": list(classes),
        "tagdict": tagdict,
        "features": features,
        "rows": rows,
        "cols": cols,
        "values": values,
    }


def save_model(model: dict, path: str | Path) -> None:
    """Write a model dict as (gzipped if the name ends in ``.gz``) JSON, byte-reproducibly."""
    payload = json.dumps(model, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if str(path).endswith(".gz"):
        payload = gzip.compress(payload, mtime=0)
    Path(path).write_bytes(payload)


def load_model(path: str | Path) -> dict:
    """Read a model written by :func:`save_model`, checking its format marker."""
    raw = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        raw = gzip.decompress(raw)
    model = json.loads(raw)
    if model.get("format") != FORMAT_NAME or model.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a {FORMAT_NAME} v{FORMAT_VERSION} model file")
    return model


class VectorizedPerceptron:
    """Greedy averaged-perceptron decoder over batches of tokenised sentences (numpy, float64 scores)."""

    def __init__(self, model: dict) -> None:
        self.classes: list[str] = list(model["classes"])
        n_classes = len(self.classes)
        self._feature_row = {name: row for row, name in enumerate(model["features"])}
        weights = np.zeros((len(model["features"]), n_classes))
        np.add.at(
            weights,
            (np.asarray(model["rows"], dtype=np.int64), np.asarray(model["cols"], dtype=np.int64)),
            np.asarray(model["values"], dtype=np.float64),
        )
        self._weights = weights
        class_index = {name: k for k, name in enumerate(self.classes)}
        self._tagdict = {word: class_index[tag] for word, tag in model["tagdict"].items()}
        # Tag states: the classes, then the two START symbols (prev at i=0 is START[0], prev2 is START[1]).
        states = [*self.classes, *START]
        self._start_state, self._start2_state = n_classes, n_classes + 1
        self._bias = self._sum_features(["bias"])
        self._prev_table = np.stack([self._sum_features([f"i-1 tag {s}"]) for s in states])
        self._prev2_table = np.stack([self._sum_features([f"i-2 tag {s}"]) for s in states])
        self._pair_table = np.stack(
            [np.stack([self._sum_features([f"i tag+i-2 tag {p} {p2}"]) for p2 in states]) for p in states]
        )
        # "i-1 tag+i word" weights as a sorted table keyed by state * n_norm + norm_id, searched per decoding step.
        self._norm_id: dict[str, int] = {}
        keys, key_rows = [], []
        state_index = {name: k for k, name in enumerate(states)}
        for feature, row in self._feature_row.items():
            if feature.startswith("i-1 tag+i word "):
                state, norm = feature[len("i-1 tag+i word ") :].split(" ", 1)
                norm_id = self._norm_id.setdefault(norm, len(self._norm_id))
                keys.append((state_index[state], norm_id))
                key_rows.append(row)
        n_norm = max(len(self._norm_id), 1)
        flat_keys = np.asarray([s * n_norm + n for s, n in keys], dtype=np.int64)
        order = np.argsort(flat_keys)
        self._n_norm = n_norm
        self._pair_word_keys = np.append(flat_keys[order], np.iinfo(np.int64).max)
        self._pair_word_weights = (
            np.vstack([weights[np.asarray(key_rows, dtype=np.int64)[order]], np.zeros((1, n_classes))])
            if keys
            else np.zeros((1, n_classes))
        )
        # Per word type: contribution at each offset, tag-dictionary class (-1 if none), normalised-word id (-1).
        self._type_id: dict[str, int] = {}
        self._type_offset_scores: list[np.ndarray] = []
        self._type_tagdict: list[int] = []
        self._type_norm: list[int] = []
        self._offset_table = np.zeros((0, len(OFFSETS), n_classes))
        for symbol in (*START, *END):
            self._type_of(symbol)

    def _sum_features(self, features: Sequence[str]) -> np.ndarray:
        rows = [self._feature_row[f] for f in features if f in self._feature_row]
        return self._weights[rows].sum(axis=0) if rows else np.zeros(len(self.classes))

    def _type_of(self, word: str) -> int:
        type_id = self._type_id.get(word)
        if type_id is None:
            type_id = len(self._type_offset_scores)
            self._type_id[word] = type_id
            self._type_offset_scores.append(np.stack([self._sum_features(offset_features(word, o)) for o in OFFSETS]))
            self._type_tagdict.append(self._tagdict.get(word, -1))
            padding = word in START or word in END
            self._type_norm.append(-1 if padding else self._norm_id.get(normalize_word(word), -1))
        return type_id

    def _refresh_tables(self) -> None:
        if len(self._offset_table) != len(self._type_offset_scores):
            self._offset_table = np.stack(self._type_offset_scores)
            self._tagdict_table = np.asarray(self._type_tagdict, dtype=np.int64)
            self._norm_table = np.asarray(self._type_norm, dtype=np.int64)

    def tag_ids(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Class indices (into :attr:`classes`) for each word of each sentence."""
        lengths = np.asarray([len(s) for s in sentences], dtype=np.int64)
        n_sentences = len(sentences)
        if n_sentences == 0 or lengths.sum() == 0:
            return [np.zeros(n, dtype=np.int64) for n in lengths]
        type_of = self._type_id.get
        pad = [self._type_id[s] for s in (*START, *END)]
        context: list[int] = []
        for words in sentences:
            context.extend(pad[:2])
            context.extend([type_of(w) if w in self._type_id else self._type_of(w) for w in words])
            context.extend(pad[2:])
        self._refresh_tables()
        context_types = np.asarray(context, dtype=np.int64)
        context_starts = np.concatenate([[0], np.cumsum(lengths + 4)[:-1]])
        # Static scores for every word: bias + contributions of the words at offsets -2..+2.
        word_positions = np.concatenate([np.arange(n) for n in lengths]) + np.repeat(context_starts + 2, lengths)
        static = np.broadcast_to(self._bias, (len(word_positions), len(self.classes))).copy()
        for k, offset in enumerate(OFFSETS):
            static += self._offset_table[context_types[word_positions + offset], k]
        word_types = context_types[word_positions]
        fixed = self._tagdict_table[word_types]
        norms = self._norm_table[word_types]
        word_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])

        predictions = np.empty(len(word_positions), dtype=np.int64)
        prev = np.full(n_sentences, self._start_state)
        prev2 = np.full(n_sentences, self._start2_state)
        order = np.argsort(-lengths, kind="stable")  # longest first: active sentences are a prefix
        sorted_lengths = lengths[order]
        for i in range(int(sorted_lengths[0])):
            active = order[: int(np.searchsorted(-sorted_lengths, -i, side="left"))]
            idx = word_starts[active] + i
            p, p2 = prev[active], prev2[active]
            scores = static[idx] + self._prev_table[p] + self._prev2_table[p2] + self._pair_table[p, p2]
            norm = norms[idx]
            key = np.where(norm >= 0, p * self._n_norm + norm, -1)
            slot = np.searchsorted(self._pair_word_keys, key)
            found = self._pair_word_keys[slot] == key
            scores[found] += self._pair_word_weights[slot[found]]
            # NLTK breaks score ties by the alphabetically largest label: argmax over reversed columns.
            best = len(self.classes) - 1 - np.argmax(scores[:, ::-1], axis=1)
            tags = np.where(fixed[idx] >= 0, fixed[idx], best)
            predictions[idx] = tags
            prev2[active] = p
            prev[active] = tags
        return np.split(predictions, np.cumsum(lengths)[:-1])

    def tag(self, sentences: Sequence[Sequence[str]]) -> list[list[str]]:
        """Tag strings for each word of each sentence."""
        names = np.asarray(self.classes, dtype=object)
        return [names[ids].tolist() for ids in self.tag_ids(sentences)]


def reference_tagger(model: dict) -> Callable[[Sequence[str]], list[str]]:
    """A one-sentence tagger using NLTK's pure-Python ``AveragedPerceptron.predict`` (slow; for parity checks)."""
    from nltk.tag.perceptron import AveragedPerceptron

    perceptron = AveragedPerceptron()
    perceptron.classes = set(model["classes"])
    weights: dict[str, dict[str, float]] = defaultdict(dict)
    for row, col, value in zip(model["rows"], model["cols"], model["values"], strict=True):
        weights[model["features"][row]][model["classes"][col]] = value
    perceptron.weights = dict(weights)

    def tag(words: Sequence[str]) -> list[str]:
        prev, prev2 = START
        tags = []
        for i, word in enumerate(words):
            predicted = model["tagdict"].get(word)
            if predicted is None:
                predicted, _ = perceptron.predict(dict.fromkeys(sentence_features(words, i, prev, prev2), 1))
            tags.append(predicted)
            prev2, prev = prev, predicted
        return tags

    return tag
