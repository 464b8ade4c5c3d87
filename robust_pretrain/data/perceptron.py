"""Averaged-perceptron UPOS tagger: training with NLTK's ``AveragedPerceptron``, JSON storage, vectorised decoding.

The feature set extends the one of NLTK's ``PerceptronTagger`` with word shapes (capitalisation matters for PROPN),
more prefixes/suffixes, word bigrams and jackknifed ambiguity classes (the tags a word had in training). Every
feature is a function of one word at a fixed offset (-2..+2), of two adjacent words, or of the previous tags, so a
token's score is ``bias + sum_offsets contribution[word at offset] + bigram terms + tag-dependent terms``: word
contributions are cached per word type, two-key features are looked up in integer-indexed tables, and greedy
left-to-right decoding runs position by position over a whole batch of sentences with numpy, giving the same tags
as the pure-Python perceptron (up to float summation order).
"""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from itertools import repeat
from pathlib import Path

import numpy as np

from robust_pretrain.data.word_tokenizer import script_upos

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
    if word.isascii() and word.isalnum():  # common cases without a loop over the characters
        if word.isalpha():
            if word.islower():
                return "x"
            if word.isupper():
                return "X"
            if word[0].isupper() and word[1:].islower():
                return "Xx"
        elif word.isdigit():
            return "d"
    symbols: list[str] = []
    for char in word:
        symbol = "X" if char.isupper() else "x" if char.islower() else "d" if char.isdigit() else char
        if not symbols or symbols[-1] != symbol:
            symbols.append(symbol)
    return "".join(symbols[:4])


PAIR_SEPARATOR = "\x1f"
PAIR_TEMPLATES = (("i-1 word+i word", -1), ("i word+i+1 word", 0))
"""Word-bigram features: (name, offset of the left word); the right word is the next one."""
LEXICON_MIN_SHARE = 0.1
MAX_CACHED_TYPES = 100_000
"""The decoder caches per-word-type scores; past this many types the cache starts afresh (memory bound)."""


def _padding(word: str) -> bool:
    return word in START or word in END


def fixed_tag(word: str, tagdict: dict[str, str], lexicon: dict[str, str]) -> str | None:
    """The tag a word gets without scoring, or None: its tag-dictionary entry; else, for a word never seen in training
    with no Latin letter or digit, the tag of its script (:func:`~robust_pretrain.data.word_tokenizer.script_upos`:
    ``X`` for other scripts, ``PUNCT``, ``SYM``); an English model has no evidence to call it a noun."""
    tag = tagdict.get(word)
    if tag is None and normalize_word(word) not in lexicon:
        tag = script_upos(word)
    return tag


def context_norm(word: str) -> str:
    """Normalised form of a context entry (START/END padding symbols stay as they are)."""
    return word if _padding(word) else normalize_word(word)


def build_lexicon(sentences: Sequence[tuple[Sequence[str], Sequence[str]]]) -> dict[str, str]:
    """Ambiguity classes: normalised word -> ``|``-joined tags holding at least 10% of its occurrences."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for words, tags in sentences:
        for word, tag in zip(words, tags, strict=True):
            counts[normalize_word(word)][tag] += 1
    return {
        word: "|".join(sorted(t for t, n in tag_counts.items() if n >= LEXICON_MIN_SHARE * tag_counts.total()))
        for word, tag_counts in counts.items()
    }


WORD_ATTRIBUTES = (
    "norm", "shape", "ambiguity", "suffix3", "prefix1", "lower_suffix2", "lower_suffix1", "lower_suffix4",
    "lower_prefix2", "lower_prefix3", "norm_suffix3", "suffix2_lower",
)  # fmt: skip
"""What :meth:`Featurizer.attributes` computes for a word, in this order."""
_NEIGHBOUR_TEMPLATES = (
    ("word", "norm"),
    ("suffix", "norm_suffix3"),
    ("shape", "shape"),
    ("suffix2", "suffix2_lower"),
    ("amb", "ambiguity"),
)
OFFSET_TEMPLATES: dict[int, tuple[tuple[str, str], ...]] = {
    -2: (("i-2 word", "norm"),),
    -1: tuple((f"i-1 {name}", attribute) for name, attribute in _NEIGHBOUR_TEMPLATES),
    0: (("i suffix", "suffix3"), ("i pref1", "prefix1"), ("i word", "norm"), ("i shape", "shape"),
        ("i suffix2", "lower_suffix2"), ("i suffix1", "lower_suffix1"), ("i suffix4", "lower_suffix4"),
        ("i pref2", "lower_prefix2"), ("i pref3", "lower_prefix3"), ("i amb", "ambiguity")),
    1: tuple((f"i+1 {name}", attribute) for name, attribute in _NEIGHBOUR_TEMPLATES),
    2: (("i+2 word", "norm"),),
}  # fmt: skip
"""Per offset from the word being tagged, the features a word there contributes: ``f"{template} {attribute}"``."""


class Featurizer:
    """Feature templates; ``lexicon`` (ambiguity classes) is stored with the model."""

    def __init__(self, lexicon: dict[str, str]) -> None:
        self.lexicon = lexicon

    def attributes(self, word: str) -> tuple[str, ...]:
        """The values of :data:`WORD_ATTRIBUTES` for a raw token or a START/END padding symbol.

        Padding symbols are their own normalised form, shape and ambiguity class.
        """
        lower = word.lower()
        if _padding(word):
            norm = shape = ambiguity = word
        else:
            norm = normalize_word(word)
            shape = word_shape(word)
            ambiguity = self.lexicon.get(norm, "?")
        return (
            norm,
            shape,
            ambiguity,
            word[-3:],
            word[:1],
            lower[-2:],
            lower[-1:],
            lower[-4:],
            lower[:2],
            lower[:3],
            norm[-3:],
            word[-2:].lower(),
        )

    def offset_features(self, word: str, offset: int) -> list[str]:
        """Features the word contributes when it sits ``offset`` positions from the word being tagged."""
        if offset not in OFFSET_TEMPLATES:
            raise ValueError(f"offset must be one of {OFFSETS}, got {offset}")
        values = dict(zip(WORD_ATTRIBUTES, self.attributes(word), strict=True))
        return [f"{template} {values[attribute]}" for template, attribute in OFFSET_TEMPLATES[offset]]

    def sentence_features(self, words: Sequence[str], i: int, prev: str, prev2: str) -> list[str]:
        """All features of word ``i`` of ``words`` (reference implementation, used for training)."""
        context = [*START, *words, *END]
        position = i + len(START)
        features = ["bias"]
        for offset in OFFSETS:
            features.extend(self.offset_features(context[position + offset], offset))
        for name, left in PAIR_TEMPLATES:
            pair = (context_norm(context[position + left]), context_norm(context[position + left + 1]))
            features.append(f"{name} {PAIR_SEPARATOR.join(pair)}")
        features.extend(tag_features(prev, prev2, normalize_word(words[i])))
        return features


def tag_features(prev: str, prev2: str, norm: str) -> list[str]:
    """Features that depend on the two previously predicted tags (``norm`` = normalised current word)."""
    return [f"i-1 tag {prev}", f"i-2 tag {prev2}", f"i tag+i-2 tag {prev} {prev2}", f"i-1 tag+i word {prev} {norm}"]


def train_perceptron(
    sentences: Sequence[tuple[Sequence[str], Sequence[str]]], n_iter: int = 8, seed: int = 0, lexicon_folds: int = 10
) -> dict:
    """Train NLTK's ``AveragedPerceptron`` on ``(words, tags)`` sentences; return the JSON-ready model dict.

    Training order is shuffled with ``random.Random(seed)`` after each pass, so a seed fixes the result. Ambiguity
    classes are jackknifed: a training sentence sees the lexicon built from the other ``lexicon_folds - 1`` folds,
    so the model learns how much to trust them on words it has rarely seen; the shipped lexicon uses all data.
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
        total = tag_counts.total()
        if total >= TAGDICT_MIN_COUNT and mode / total >= TAGDICT_MIN_PURITY:
            tagdict[word] = tag
    fold_featurizers = [
        Featurizer(build_lexicon([s for n, s in enumerate(sentences) if n % lexicon_folds != fold]))
        for fold in range(lexicon_folds)
    ]

    model = AveragedPerceptron()
    model.classes = set(classes)
    order = list(enumerate(sentences))
    rng = random.Random(seed)
    for _ in range(n_iter):
        for index, (words, tags) in order:
            featurizer = fold_featurizers[index % lexicon_folds]
            prev, prev2 = START
            for i, word in enumerate(words):
                guess = tagdict.get(word)
                if guess is None:
                    features = dict.fromkeys(featurizer.sentence_features(words, i, prev, prev2), 1)
                    guess, _ = model.predict(features)
                    model.update(tags[i], guess, features)
                prev2, prev = prev, guess
        rng.shuffle(order)
    model.average_weights()
    return encode_model(model.weights, tagdict, classes, build_lexicon(sentences))


def encode_model(
    weights: dict[str, dict[str, float]], tagdict: dict[str, str], classes: Sequence[str], lexicon: dict[str, str]
) -> dict:
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
        "lexicon": lexicon,
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
        self._featurizer = Featurizer(model["lexicon"])
        self._feature_row = {name: row for row, name in enumerate(model["features"])}
        weights = np.zeros((len(model["features"]), n_classes))
        rows, cols = np.asarray(model["rows"], dtype=np.int64), np.asarray(model["cols"], dtype=np.int64)
        weights[rows, cols] = model["values"]  # (feature, class) pairs are unique
        self._weights = weights
        class_index = {name: k for k, name in enumerate(self.classes)}
        self._class_index = class_index
        self._tagdict: dict[str, str] = model["tagdict"]
        # Tag states: the classes, then the two START symbols (prev at i=0 is START[0], prev2 is START[1]).
        states = [*self.classes, *START]
        self._start_state, self._start2_state = n_classes, n_classes + 1
        self._bias = self._sum_features(["bias"])
        self._prev_table = np.stack([self._sum_features([f"i-1 tag {s}"]) for s in states])
        self._prev2_table = np.stack([self._sum_features([f"i-2 tag {s}"]) for s in states])
        self._pair_table = np.stack(
            [np.stack([self._sum_features([f"i tag+i-2 tag {p} {p2}"]) for p2 in states]) for p in states]
        )
        # Features keyed by two values ("i-1 tag+i word", word bigrams) are indexed by numbers from one vocabulary
        # of normalised words.
        self._word_id: dict[str, int] = {}
        state_index = {name: k for k, name in enumerate(states)}
        tag_word_keys, bigram_keys = [], []
        for feature, row in self._feature_row.items():
            if feature.startswith("i-1 tag+i word "):
                state, norm = feature[len("i-1 tag+i word ") :].split(" ", 1)
                tag_word_keys.append((state_index[state], self._word_number(norm), row))
            for template, (name, _) in enumerate(PAIR_TEMPLATES):
                if feature.startswith(name + " "):
                    left, right = feature[len(name) + 1 :].split(PAIR_SEPARATOR)
                    bigram_keys.append((template, self._word_number(left), self._word_number(right), row))
        self._n_words = max(len(self._word_id), 1)
        # "i-1 tag+i word" as a dense (word slot, previous state) table over the words that have such features;
        # the last slot is all zeros, for every other word.
        tag_word_vocab = sorted({w for _, w, _ in tag_word_keys})
        self._tag_word_slot = np.full(self._n_words + 1, len(tag_word_vocab), dtype=np.int64)
        self._tag_word_slot[tag_word_vocab] = np.arange(len(tag_word_vocab))
        self._tag_word = np.zeros((len(tag_word_vocab) + 1, len(states), n_classes))
        for state, word, row in tag_word_keys:
            self._tag_word[self._tag_word_slot[word], state] = weights[row]
        self._bigram = self._key_table(
            [((t * self._n_words + a) * self._n_words + b, row) for t, a, b, row in bigram_keys]
        )
        self._attribute_tables = self._build_attribute_tables()
        self._reset_type_cache()

    def _build_attribute_tables(self) -> list[tuple[int, dict[str, int], list[int], np.ndarray]]:
        """Per word attribute: its index in :data:`WORD_ATTRIBUTES`, value -> id, the offset slots it has features
        at, and their weights ``(n_values + 1, n_slots, n_classes)`` (the last row, all zeros, for unseen values)."""
        uses: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for slot, offset in enumerate(OFFSETS):
            for template, attribute in OFFSET_TEMPLATES[offset]:
                uses[attribute].append((slot, template))
        template_use = {
            template: (attribute, position)
            for attribute, attribute_uses in uses.items()
            for position, (_, template) in enumerate(attribute_uses)
        }
        entries: dict[str, list[tuple[str, int, int]]] = defaultdict(list)  # attribute -> (value, position, row)
        for feature, row in self._feature_row.items():
            head, _, rest = feature.partition(" ")
            name, _, value = rest.partition(" ")
            use = template_use.get(f"{head} {name}")
            if use is not None:
                entries[use[0]].append((value, use[1], row))
        tables = []
        for index, attribute in enumerate(WORD_ATTRIBUTES):
            vocabulary: dict[str, int] = {}
            ids = [vocabulary.setdefault(value, len(vocabulary)) for value, _, _ in entries[attribute]]
            table = np.zeros((len(vocabulary) + 1, len(uses[attribute]), len(self.classes)))
            if ids:
                positions = [position for _, position, _ in entries[attribute]]
                table[ids, positions] = self._weights[[row for _, _, row in entries[attribute]]]
            tables.append((index, vocabulary, [slot for slot, _ in uses[attribute]], table))
        return tables

    def _word_number(self, norm: str) -> int:
        return self._word_id.setdefault(norm, len(self._word_id))

    def _key_table(self, keyed_rows: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """Sorted keys (plus a sentinel) and their weight rows (plus a zero row)."""
        keyed_rows.sort()
        keys = np.asarray([k for k, _ in keyed_rows] + [np.iinfo(np.int64).max], dtype=np.int64)
        rows = np.asarray([r for _, r in keyed_rows], dtype=np.int64)
        return keys, np.vstack([self._weights[rows], np.zeros((1, len(self.classes)))])

    @staticmethod
    def _lookup(table: tuple[np.ndarray, np.ndarray], keys: np.ndarray) -> np.ndarray:
        """Weight rows for ``keys`` (zeros where a key is absent or negative)."""
        sorted_keys, weights = table
        slots = np.searchsorted(sorted_keys, keys)
        slots[sorted_keys[slots] != keys] = len(sorted_keys) - 1
        return weights[slots]

    def _sum_features(self, features: Sequence[str]) -> np.ndarray:
        rows = [self._feature_row[f] for f in features if f in self._feature_row]
        return self._weights[rows].sum(axis=0) if rows else np.zeros(len(self.classes))

    def _reset_type_cache(self) -> None:
        """Per word type: contribution at each offset, tag-dictionary class (-1 if none), normalised-word id (-1)."""
        self._type_id: dict[str, int] = {}
        self._offset_table = np.zeros((1024, len(OFFSETS), len(self.classes)))
        self._type_tagdict = np.full(1024, -1, dtype=np.int64)
        self._type_word = np.full(1024, -1, dtype=np.int64)
        self._add_types([*START, *END])

    def _add_types(self, words: Sequence[str]) -> None:
        """Register new word types: their contributions at each offset, summed over attributes with numpy."""
        if not words:
            return
        first = len(self._type_id)
        needed = first + len(words)
        if needed > len(self._type_tagdict):  # grow the per-type arrays geometrically
            extra = max(needed, 2 * len(self._type_tagdict)) - len(self._type_tagdict)
            self._offset_table = np.concatenate([self._offset_table, np.zeros((extra, *self._offset_table.shape[1:]))])
            self._type_tagdict = np.concatenate([self._type_tagdict, np.full(extra, -1, dtype=np.int64)])
            self._type_word = np.concatenate([self._type_word, np.full(extra, -1, dtype=np.int64)])
        self._type_id.update(zip(words, range(first, needed), strict=True))
        lexicon, class_index = self._featurizer.lexicon, self._class_index
        fixed = (fixed_tag(word, self._tagdict, lexicon) for word in words)
        self._type_tagdict[first:needed] = [class_index.get(tag, -1) if tag else -1 for tag in fixed]
        columns = list(zip(*map(self._featurizer.attributes, words), strict=True))
        self._type_word[first:needed] = [self._word_id.get(norm, -1) for norm in columns[0]]
        contributions = self._offset_table[first:needed]
        for index, vocabulary, slots, table in self._attribute_tables:
            unseen = repeat(len(table) - 1, len(words))
            ids = np.fromiter(map(vocabulary.get, columns[index], unseen), dtype=np.int64, count=len(words))
            weights = table[ids]
            for position, slot in enumerate(slots):
                contributions[:, slot] += weights[:, position]

    def tag_ids(self, sentences: Sequence[Sequence[str]]) -> np.ndarray:
        """Class indices (into :attr:`classes`) of all words, sentences concatenated in order."""
        lengths = np.asarray([len(s) for s in sentences], dtype=np.int64)
        if len(sentences) == 0 or lengths.sum() == 0:
            return np.zeros(0, dtype=np.int64)
        if len(self._type_id) > MAX_CACHED_TYPES:  # bound memory on large corpora
            self._reset_type_cache()
        known = self._type_id
        self._add_types([w for w in dict.fromkeys(w for words in sentences for w in words) if w not in known])
        pad = [known[s] for s in (*START, *END)]
        context: list[int] = []
        for words in sentences:
            context.extend(pad[:2])
            context.extend([known[w] for w in words])
            context.extend(pad[2:])
        context_types = np.asarray(context, dtype=np.int64)
        context_words = self._type_word[context_types]
        context_starts = np.concatenate([[0], np.cumsum(lengths + 4)[:-1]])
        # Static scores for every word: bias + words at offsets -2..+2 + word bigrams.
        word_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        positions = np.arange(int(lengths.sum())) + np.repeat(context_starts + 2 - word_starts, lengths)
        static = np.broadcast_to(self._bias, (len(positions), len(self.classes))).copy()
        for k, offset in enumerate(OFFSETS):
            static += self._offset_table[context_types[positions + offset], k]
        for template, (_, left) in enumerate(PAIR_TEMPLATES):
            a, b = context_words[positions + left], context_words[positions + left + 1]
            keys = np.where((a >= 0) & (b >= 0), (template * self._n_words + a) * self._n_words + b, -1)
            static += self._lookup(self._bigram, keys)
        word_types = context_types[positions]
        fixed = self._type_tagdict[word_types]
        tag_word_slots = self._tag_word_slot[context_words[positions]]  # unknown words (-1) hit the zero slot

        predictions = np.empty(len(positions), dtype=np.int64)
        prev = np.full(len(sentences), self._start_state)
        prev2 = np.full(len(sentences), self._start2_state)
        order = np.argsort(-lengths, kind="stable")  # longest first: active sentences are a prefix
        sorted_lengths = lengths[order]
        active_counts = np.searchsorted(-sorted_lengths, -np.arange(sorted_lengths[0]), side="left").tolist()
        for i, n_active in enumerate(active_counts):
            active = order[:n_active]
            idx = word_starts[active] + i
            p, p2 = prev[active], prev2[active]
            scores = static[idx] + self._prev_table[p] + self._prev2_table[p2] + self._pair_table[p, p2]
            scores += self._tag_word[tag_word_slots[idx], p]
            # NLTK breaks score ties by the alphabetically largest label: argmax over reversed columns.
            best = len(self.classes) - 1 - np.argmax(scores[:, ::-1], axis=1)
            tags = np.where(fixed[idx] >= 0, fixed[idx], best)
            predictions[idx] = tags
            prev2[active] = p
            prev[active] = tags
        return predictions

    def tag_flat(self, sentences: Sequence[Sequence[str]]) -> list[str]:
        """Tag strings of all words, sentences concatenated in order."""
        return np.asarray(self.classes, dtype=object)[self.tag_ids(sentences)].tolist()

    def tag(self, sentences: Sequence[Sequence[str]]) -> list[list[str]]:
        """Tag strings for each word of each sentence."""
        flat = self.tag_flat(sentences)
        ends = np.cumsum([len(s) for s in sentences]).tolist()
        return [flat[end - len(words) : end] for words, end in zip(sentences, ends, strict=True)]


def reference_tagger(model: dict) -> Callable[[Sequence[str]], list[str]]:
    """A one-sentence tagger using NLTK's pure-Python ``AveragedPerceptron.predict`` (slow; for parity checks)."""
    from nltk.tag.perceptron import AveragedPerceptron

    perceptron = AveragedPerceptron()
    perceptron.classes = set(model["classes"])
    weights: dict[str, dict[str, float]] = defaultdict(dict)
    for row, col, value in zip(model["rows"], model["cols"], model["values"], strict=True):
        weights[model["features"][row]][model["classes"][col]] = value
    perceptron.weights = dict(weights)
    featurizer = Featurizer(model["lexicon"])

    def tag(words: Sequence[str]) -> list[str]:
        prev, prev2 = START
        tags = []
        for i, word in enumerate(words):
            predicted = fixed_tag(word, model["tagdict"], model["lexicon"])
            if predicted is None:
                features = featurizer.sentence_features(words, i, prev, prev2)
                predicted, _ = perceptron.predict(dict.fromkeys(features, 1))
            tags.append(predicted)
            prev2, prev = prev, predicted
        return tags

    return tag
