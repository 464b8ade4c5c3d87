"""Embedded UD English-EWT corpus and the word tokenizer."""

from __future__ import annotations

import pytest

from robust_pretrain.data import load_embedded_corpus
from robust_pretrain.data.conllu import read_conllu
from robust_pretrain.data.corpus import paragraphs
from robust_pretrain.data.word_tokenizer import word_tokenize


def test_embedded_corpus_matches_the_treebank_paragraphs(shared_data):
    test = load_embedded_corpus("test")
    assert test.column_names == ["text"]
    assert list(test["text"]) == paragraphs(read_conllu(shared_data / "ud_ewt" / "en_ewt-ud-test.conllu"))
    train = load_embedded_corpus("train")
    expected_train = [text for split in ("train", "dev")
                      for text in paragraphs(read_conllu(shared_data / "ud_ewt" / f"en_ewt-ud-{split}.conllu"))]
    assert list(train["text"]) == expected_train
    assert len(train) > 3000 and all(text and "\n" not in text for text in train["text"])
    with pytest.raises(ValueError, match="unknown split 'validation'"):
        load_embedded_corpus("validation")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("I don't know, can't you?", ["I", "do", "n't", "know", ",", "ca", "n't", "you", "?"]),
        ("John's car; we'll go. Isn’t O'Brien's?", ["John", "'s", "car", ";", "we", "'ll", "go", ".", "Is", "n’t",
                                                   "O'Brien", "'s", "?"]),
        ("A search-engine for the U.S. costs $3.14", ["A", "search", "-", "engine", "for", "the", "U.S.", "costs",
                                                      "$", "3.14"]),
        ("See https://x.org/a?b=1, or me@x.org.", ["See", "https://x.org/a?b=1", ",", "or", "me@x.org", "."]),
        ("Wow!!! 😀🎉 naïve e\u0301cole 東京", ["Wow", "!!!", "😀", "🎉", "naïve", "e\u0301cole", "東京"]),
        ("", []),
        (" \n\t ", []),
    ],
)
def test_word_tokenizer_follows_ewt_conventions(text, words):
    assert word_tokenize(text) == words


def test_word_tokenizer_agrees_with_ewt_tokens(shared_data):
    """On raw EWT sentences the regex tokenizer reproduces most gold syntactic words."""
    sentences = list(read_conllu(shared_data / "ud_ewt" / "en_ewt-ud-dev.conllu"))
    same = sum(word_tokenize(s.text) == s.words for s in sentences)
    assert same / len(sentences) >= 0.85
