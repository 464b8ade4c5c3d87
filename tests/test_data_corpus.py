"""UD English-EWT corpus (read from the CoNLL-U files, locally or from a Hub dataset repo) and the word tokenizer."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from huggingface_hub import HfApi
from local_hub import DEFAULT_TOKEN, DEFAULT_USER

from robust_pretrain.data import load_ewt_corpus
from robust_pretrain.data.conllu import read_conllu
from robust_pretrain.data.corpus import DEFAULT_UD_DIR, paragraphs
from robust_pretrain.data.word_tokenizer import word_tokenize


def test_corpus_is_the_treebank_paragraphs(shared_data):
    ud_dir = shared_data / "ud_ewt"
    assert DEFAULT_UD_DIR.resolve() == ud_dir.resolve()
    test = load_ewt_corpus("test")
    assert test.column_names == ["text"] and test.split == "test"
    assert list(test["text"]) == paragraphs(read_conllu(ud_dir / "en_ewt-ud-test.conllu"))
    train = load_ewt_corpus("train", ud_dir=str(ud_dir))
    expected_train = [
        text for split in ("train", "dev") for text in paragraphs(read_conllu(ud_dir / f"en_ewt-ud-{split}.conllu"))
    ]
    assert list(train["text"]) == expected_train
    assert len(train) > 3000 and all(text and "\n" not in text for text in train["text"])
    with pytest.raises(ValueError, match="unknown split 'validation'"):
        load_ewt_corpus("validation")


def test_missing_corpus_names_the_folder_and_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"UD English-EWT folder not found: {tmp_path / 'nope'}") as error:
        load_ewt_corpus("test", tmp_path / "nope")
    assert "github.com/UniversalDependencies/UD_English-EWT" in str(error.value)
    (tmp_path / "en_ewt-ud-train.conllu").write_text("")
    with pytest.raises(FileNotFoundError, match=r"en_ewt-ud-dev\.conllu not found"):
        load_ewt_corpus("train", tmp_path)


def test_corpus_from_a_hub_dataset_repo(local_hub, shared_data, tmp_path):
    with open(shared_data / "ud_ewt" / "en_ewt-ud-test.conllu", encoding="utf-8") as handle:
        head = "".join(itertools.islice(handle, 400)).rsplit("\n\n", 1)[0] + "\n\n"  # whole sentences
    (tmp_path / "en_ewt-ud-test.conllu").write_text(head, encoding="utf-8")
    repo_id = f"{DEFAULT_USER}/ud-ewt"
    api = HfApi(token=DEFAULT_TOKEN)
    api.create_repo(repo_id, repo_type="dataset")
    api.upload_folder(folder_path=str(tmp_path), path_in_repo="UD_English-EWT", repo_id=repo_id, repo_type="dataset")
    corpus = load_ewt_corpus("test", f"hf://datasets/{repo_id}/UD_English-EWT")
    expected = paragraphs(read_conllu(tmp_path / "en_ewt-ud-test.conllu"))
    assert len(expected) >= 3 and list(corpus["text"]) == expected
    with pytest.raises(ValueError, match="expected hf://datasets/<owner>/<name>"):
        load_ewt_corpus("test", "hf://datasets/just-a-name")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("I don't know, can't you?", ["I", "do", "n't", "know", ",", "ca", "n't", "you", "?"]),
        (
            "John's car; we'll go. Isn’t O'Brien's?",
            ["John", "'s", "car", ";", "we", "'ll", "go", ".", "Is", "n’t", "O'Brien", "'s", "?"],
        ),
        (
            "A search-engine for the U.S. costs $3.14",
            ["A", "search", "-", "engine", "for", "the", "U.S.", "costs", "$", "3.14"],
        ),
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


def test_recipe_names_a_missing_ud_dir(tmp_path):
    from robust_pretrain.cli import UsageError
    from robust_pretrain.pretraining.pos_mlm import recipe as pos_mlm

    with pytest.raises(UsageError, match=f"--ud_dir: UD English-EWT folder not found: {tmp_path / 'nope'}"):
        pos_mlm.run(["--ud_dir", str(tmp_path / "nope"), "--output_dir", str(tmp_path / "out"), "--max_steps", "1"])
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_ud_dir_defaults_to_the_environment_variable_then_to_the_current_directory(shared_data, tmp_path, monkeypatch):
    from robust_pretrain.data.corpus import UD_DIR_ENV, resolve_ud_dir

    run_dir = tmp_path / "project"
    run_dir.mkdir()
    monkeypatch.chdir(run_dir)
    monkeypatch.setenv(UD_DIR_ENV, str(shared_data / "ud_ewt"))
    assert resolve_ud_dir() == shared_data / "ud_ewt"
    assert resolve_ud_dir(tmp_path) == tmp_path  # an explicit folder wins
    monkeypatch.delenv(UD_DIR_ENV)
    (tmp_path / "shared" / "data" / "ud_ewt").mkdir(parents=True)
    assert resolve_ud_dir().resolve() == tmp_path / "shared" / "data" / "ud_ewt"  # ../shared/data/ud_ewt from the cwd


def test_a_missing_default_ud_dir_is_named_from_the_current_directory_with_how_to_point_at_it(tmp_path, monkeypatch):
    import robust_pretrain
    from robust_pretrain.data.corpus import UD_DIR_ENV, resolve_ud_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(UD_DIR_ENV, raising=False)
    with pytest.raises(FileNotFoundError) as error:
        resolve_ud_dir()
    message = str(error.value)
    expected = f"UD English-EWT folder not found: {tmp_path.parent / 'shared' / 'data' / 'ud_ewt'} (the default, "
    assert message.startswith(expected) and "--ud_dir" in message and f"${UD_DIR_ENV}" in message
    assert str(Path(robust_pretrain.__file__).parents[1]) not in message  # nothing relative to the package
    monkeypatch.setenv(UD_DIR_ENV, str(tmp_path / "elsewhere"))
    with pytest.raises(FileNotFoundError, match=re.escape(f"not found: {tmp_path / 'elsewhere'} (from ${UD_DIR_ENV})")):
        resolve_ud_dir()
