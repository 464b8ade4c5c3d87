"""Tagger backends: shipped model accuracy and decoder parity, NLTK backend, callable backends."""

from __future__ import annotations

import pickle

import nltk
import pytest

from robust_pretrain.data import get_tagger
from robust_pretrain.data.conllu import read_conllu, upos_accuracy
from robust_pretrain.data.perceptron import VectorizedPerceptron, load_model, reference_tagger
from robust_pretrain.data.taggers import SHIPPED_MODEL_PATH, NltkTagger, ShippedTagger, penn_to_upos
from robust_pretrain.data.word_tokenizer import script_upos, word_tokenize

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "I don't think she'll like the new restaurant on Main Street.",
    "Wow, that was amazing!",
    "",
]


@pytest.fixture(scope="module")
def ewt_test(shared_data):
    return list(read_conllu(shared_data / "ud_ewt" / "en_ewt-ud-test.conllu"))


@pytest.fixture
def nltk_data(shared_data, monkeypatch):
    monkeypatch.setattr(nltk.data, "path", [str(shared_data / "nltk_data")])


def test_shipped_tagger_upos_accuracy_on_ewt_test(ewt_test):
    predicted = get_tagger("shipped").tag_words([s.words for s in ewt_test])
    assert sum(len(tags) for tags in predicted) == 25094
    assert upos_accuracy(predicted, ewt_test) >= 23946 / 25094  # 95.43 %, the accuracy of the shipped model


def test_vectorised_decoder_matches_pure_python_perceptron(ewt_test):
    model = load_model(SHIPPED_MODEL_PATH)
    reference = reference_tagger(model)
    sample = [s.words for s in ewt_test[:150]]
    decoder = VectorizedPerceptron(model)  # fresh: every word type is new to it
    cold = decoder.tag(sample)
    assert decoder.tag(sample) == cold  # its per-type cache changes nothing
    slow = [reference(words) for words in sample]
    mismatches = sum(a != b for f, s in zip(cold, slow, strict=True) for a, b in zip(f, s, strict=True))
    assert mismatches <= 1  # only float summation order differs


def test_shipped_tagger_spans_and_batching():
    tagger = get_tagger()
    tagged = tagger(SENTENCES)
    assert tagged[-1] == []
    for text, words in zip(SENTENCES, tagged, strict=True):
        starts = [start for start, _, _ in words]
        assert starts == sorted(starts)
        assert all(text[start:end].strip() == text[start:end] != "" for start, end, _ in words)
    words = [(SENTENCES[1][s:e], tag) for s, e, tag in tagged[1]]
    assert words[:4] == [("I", "PRON"), ("do", "AUX"), ("n't", "PART"), ("think", "VERB")]
    assert ("Street", "PROPN") in words
    assert [tagger([text])[0] for text in SENTENCES] == tagged  # batch composition does not change tags


def test_shipped_tagger_pickles_without_the_model():
    tagger = ShippedTagger()
    tagger(SENTENCES)  # loads the model
    payload = pickle.dumps(tagger)
    assert len(payload) < 1000
    assert pickle.loads(payload)(SENTENCES) == tagger(SENTENCES)


def test_nltk_backend_matches_pos_tag(nltk_data):
    tagger = get_tagger("nltk")
    tagged = pickle.loads(pickle.dumps(tagger))(SENTENCES)
    shipped = get_tagger("shipped")(SENTENCES)
    assert [[(s, e) for s, e, _ in words] for words in tagged] == [[(s, e) for s, e, _ in w] for w in shipped]
    fox = [tag for _, _, tag in tagged[0]]
    assert fox == ["DET", "ADJ", "NOUN", "NOUN", "VERB", "ADP", "DET", "ADJ", "NOUN", "PUNCT"]
    for text, words in zip(SENTENCES, tagged, strict=True):
        penn = nltk.pos_tag([text[s:e] for s, e, _ in words]) if words else []
        assert [tag for _, _, tag in words] == [penn_to_upos(tag) for _, tag in penn]


def test_penn_to_upos_refines_the_universal_map(nltk_data):
    expected = {
        "NNP": "PROPN",
        "NN": "NOUN",
        "MD": "AUX",
        "UH": "INTJ",
        "CC": "CCONJ",
        "TO": "PART",
        ".": "PUNCT",
        "PRP$": "PRON",
        "VBZ": "VERB",
        "CD": "NUM",
        "IN": "ADP",
        "WDT": "DET",
    }
    assert {tag: penn_to_upos(tag) for tag in expected} == expected


def test_nltk_backend_without_data_names_the_download(tmp_path, monkeypatch):
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    with pytest.raises(LookupError, match=r"nltk\.download\('averaged_perceptron_tagger_eng'\)") as error:
        NltkTagger()
    assert "universal_tagset" in str(error.value)


def test_callable_backend_is_used_and_checked():
    def whole_text_is_a_noun(texts):
        return [[(0, len(t), "NOUN")] if t else [] for t in texts]

    tagger = get_tagger(whole_text_is_a_noun)
    assert tagger(["hello world", ""]) == [[(0, 11, "NOUN")], []]
    assert tagger.fingerprint == get_tagger(whole_text_is_a_noun).fingerprint
    with pytest.raises(ValueError, match="one list of words per text"):
        get_tagger(lambda texts: [])(["a"])
    with pytest.raises(ValueError, match="unknown UPOS tag 'NN'"):
        get_tagger(lambda texts: [[(0, 1, "NN")]])(["a"])
    with pytest.raises(ValueError, match=r"span \(0, 5\)"):
        get_tagger(lambda texts: [[(0, 5, "NOUN")]])(["a"])
    with pytest.raises(ValueError, match="unknown tagger backend 'spacy'"):
        get_tagger("spacy")
    with pytest.raises(TypeError, match="must be 'shipped', 'nltk' or a callable"):
        get_tagger(42)


def test_decoder_type_cache_is_bounded(ewt_test, monkeypatch):
    import robust_pretrain.data.perceptron as perceptron

    decoder = perceptron.VectorizedPerceptron(load_model(SHIPPED_MODEL_PATH))
    sample = [s.words for s in ewt_test[:100]]
    expected = decoder.tag(sample)
    monkeypatch.setattr(perceptron, "MAX_CACHED_TYPES", 10)
    assert [decoder.tag([words])[0] for words in sample] == expected  # the cache restarts many times
    assert len(decoder._type_id) <= 10 + max(len(words) for words in sample) + 4


FOREIGN = {  # real sentences; words of other scripts are X, their punctuation PUNCT, symbols and emoji SYM
    "chinese": ("北京是中国的首都，我们今天去公园散步了。", ["X", "PUNCT", "X", "PUNCT"]),
    "japanese": ("東京は日本の首都です。", ["X", "PUNCT"]),
    "arabic": ("ذهبنا إلى الحديقة اليوم، وكان الطقس جميلا.", ["X", "X", "X", "X", "PUNCT", "X", "X", "X", "PUNCT"]),
    "russian": ("Мы сегодня гуляли в парке «Сокольники».", ["X", "X", "X", "X", "X", "PUNCT", "X", "PUNCT", "PUNCT"]),
    "emoji": ("😀 🎉🎉 ❤️ 👍🏽", ["SYM", "SYM", "SYM", "SYM", "SYM", "SYM"]),
}


@pytest.mark.parametrize("backend", ["shipped", "nltk"])
@pytest.mark.parametrize("language", sorted(FOREIGN))
def test_words_of_other_scripts_are_not_english_nouns(backend, language, request):
    if backend == "nltk":
        request.getfixturevalue("nltk_data")
    text, expected = FOREIGN[language]
    assert [tag for _, _, tag in get_tagger(backend)([text])[0]] == expected


@pytest.mark.parametrize("backend", ["shipped", "nltk"])
def test_english_words_keep_their_tags_next_to_foreign_ones(backend, request):
    if backend == "nltk":
        request.getfixturevalue("nltk_data")
    text = "I bought 三本书 in the café near Красная площадь with my 😀 friend ."
    words = [(text[start:end], tag) for start, end, tag in get_tagger(backend)([text])[0]]
    assert words == [
        ("I", "PRON"), ("bought", "VERB"), ("三本书", "X"), ("in", "ADP"), ("the", "DET"), ("café", "NOUN"),
        ("near", "ADP"), ("Красная", "X"), ("площадь", "X"), ("with", "ADP"), ("my", "PRON"), ("😀", "SYM"),
        ("friend", "NOUN"), (".", "PUNCT"),
    ]  # fmt: skip


def test_script_tags_are_decoded_like_the_pure_python_perceptron():
    model = load_model(SHIPPED_MODEL_PATH)
    sentences = [word_tokenize(text) for text, _ in FOREIGN.values()]
    sentences.append(word_tokenize("I bought 三本书 in the café near Красная площадь with my 😀 friend ."))
    assert VectorizedPerceptron(model).tag(sentences) == [reference_tagger(model)(words) for words in sentences]


@pytest.mark.parametrize(
    ("word", "tag"),
    [("公园", "X"), ("。", "PUNCT"), ("،", "PUNCT"), ("«", "PUNCT"), ("😀", "SYM"), ("₹", "SYM"), ("α", "X"),
     ("\u200d", "SYM"), ("café", None), ("Ωmega", None), ("٣", None), ("x²", None), ("...", None), ("$", None)],
)  # fmt: skip
def test_script_upos(word, tag):
    assert script_upos(word) == tag
