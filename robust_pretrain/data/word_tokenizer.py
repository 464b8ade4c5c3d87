"""Regex word tokenizer with character spans, close to UD English-EWT conventions, needing no downloaded data.

Conventions (as in EWT): clitics split off (``don't`` -> ``do n't``, ``can't`` -> ``ca n't``, ``John's`` ->
``John 's``, ``we'll`` -> ``we 'll``; straight or curly apostrophes), hyphenated compounds split at the hyphen
(``search-engine`` -> ``search - engine``), punctuation and symbols are separate tokens (a run of the same mark such
as ``...`` or ``!!`` stays one token). URLs, e-mail addresses, dotted abbreviations (``U.S.``) and numbers with
internal ``.,:/`` (``3.14``, ``1,000``, ``10:30``) stay whole. Letters include non-ASCII letters and combining marks.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

_LETTER = r"[^\W_]"
_WORD_CHAR = r"[^\W_]|[\u0300-\u036f]"
_CLITIC = r"['’](?:s|re|ve|ll|m|d)(?![^\W_])"
_TOKEN_PATTERN = re.compile(
    rf"""
    [^\W\d_]+(?=[\s,;!?")\]]|\.(?:\s|$)|$)                  # fast path: plain letters, then space/punctuation
    | (?:https?://|www\.)[^\s<>"]*[^\s<>".,;:!?'’)\]}}]     # URL (trailing punctuation left out)
    | [\w.+-]+@\w[\w-]*(?:\.\w[\w-]*)+                    # e-mail address
    | (?:{_LETTER}\.){{2,}}                               # dotted abbreviation: U.S., e.g.
    | \d+(?:[.,:/]\d+)+                                   # number with internal separators
    | (?:{_WORD_CHAR})+?(?=n['’]t(?![^\W_]))              # stem before n't: do|n't, ca|n't
    | n['’]t(?![^\W_])                                    # negation clitic
    | (?<=[^\W_]){_CLITIC}                                # 's 're 've 'll 'm 'd after a word
    | (?:{_WORD_CHAR}|_)+(?:(?!{_CLITIC})['’](?:{_WORD_CHAR})+)*  # word, maybe with inner apostrophes (O'Brien)
    | ([^\w\s])\1*                                        # punctuation/symbol run
    """,
    re.VERBOSE | re.IGNORECASE,
)


def word_spans(text: str) -> list[tuple[int, int]]:
    """Character ``(start, end)`` spans of the words of ``text``; whitespace is never part of a word."""
    return [match.span() for match in _TOKEN_PATTERN.finditer(text)]


def word_tokenize(text: str) -> list[str]:
    """The words of ``text`` as strings (see :func:`word_spans`)."""
    return [text[start:end] for start, end in word_spans(text)]


SENTENCE_SEARCH_CHARS = 500
"""How far back from a piece's size limit :func:`text_pieces` looks for a sentence end."""


def text_pieces(text: str, max_chars: int) -> list[str]:
    """``text`` cut into pieces of at most ``max_chars`` characters that join back into it, for bounded tagging.

    A piece ends after the last sentence end (a word made only of ``.!?``, as in :func:`sentence_ranges`, so the
    pieces tag like the whole text) in its last :data:`SENTENCE_SEARCH_CHARS` characters, else after its last word,
    else (one word longer than ``max_chars``) at ``max_chars``. Only those tails are word-tokenised; texts within
    the limit come back whole.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    pieces = []
    start = 0
    while len(text) - start > max_chars:
        limit = start + max_chars
        # words never hold whitespace, so tokenising from a whitespace gives the words of the whole text
        space = max(
            text.rfind(" ", start, limit - SENTENCE_SEARCH_CHARS),
            text.rfind("\n", start, limit - SENTENCE_SEARCH_CHARS),
        )
        sentence_end = word_end = start
        for match in _TOKEN_PATTERN.finditer(text, max(space, start)):
            if match.end() > limit:
                break
            word_end = match.end()
            if match.group().strip(".!?") == "":
                sentence_end = word_end
        cut = sentence_end if sentence_end > start else word_end if word_end > start else limit
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def sentence_ranges(words: list[str]) -> list[tuple[int, int]]:
    """Split a word sequence into sentences: ``[start, end)`` ranges ending after words made only of ``.!?``.

    Taggers are trained on sentences, so multi-sentence texts (paragraphs) are tagged sentence by sentence.
    """
    ranges = []
    start = 0
    for index, word in enumerate(words):
        if word.strip(".!?") == "":
            ranges.append((start, index + 1))
            start = index + 1
    if start < len(words):
        ranges.append((start, len(words)))
    return ranges


@lru_cache(maxsize=65536)
def script_upos(word: str) -> str | None:
    """The UPOS tag of a word an English tagger cannot judge from its own training: None if it is ASCII (the
    tagger has seen such words and symbols) or has a Latin letter or a digit (the tagger decides); else ``X`` when
    it has letters of another script (a foreign word, as UD tags foreign words), ``PUNCT`` when it is punctuation
    only (``。``, ``،``, ``«``), ``SYM`` otherwise (symbols, emoji)."""
    if word.isascii():
        return None
    categories = []
    for char in word:
        if char.isdigit() or (char.isalpha() and unicodedata.name(char, "").startswith("LATIN")):
            return None
        categories.append(unicodedata.category(char))
    if any(category.startswith("L") for category in categories):
        return "X"
    return "PUNCT" if all(category.startswith("P") for category in categories) else "SYM"
