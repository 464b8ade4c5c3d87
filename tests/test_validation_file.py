"""``--validation_file``: the causal-LM recipe's held-out texts come from a file of their own (the same text and
domain columns), not from a share of the training file; bad combinations are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robust_pretrain.cli import UsageError
from robust_pretrain.pretraining.causal_lm import recipe as causal_lm
from robust_pretrain.pretraining.causal_lm.data import load_domain_texts


def _jsonl(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"text": text, "lang": lang}) + "\n" for text, lang in rows))
    return path


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    train = [(f"train {lang} {i}", lang) for lang in ("fi", "en", "ga") for i in range(7)]
    held_out = [(f"test {lang} {i}", lang) for lang in ("ga", "fi", "en") for i in range(3)]
    return _jsonl(tmp_path / "train.jsonl", train), _jsonl(tmp_path / "test.jsonl", held_out)


def _data_args(*argv: str):
    return causal_lm.parse_arguments(["--output_dir", "unused", "--domain_column", "lang", *argv])[1]


def test_the_held_out_texts_are_the_validation_file_and_every_training_text_trains(files):
    train, held_out = files
    texts = load_domain_texts(_data_args("--train_file", str(train), "--validation_file", str(held_out)))
    assert texts.names == ["en", "fi", "ga"]
    assert sorted(texts.train["text"]) == sorted(f"train {lang} {i}" for lang in texts.names for i in range(7))
    pairs = sorted(zip(texts.validation["text"], texts.validation["domain"], strict=True))
    assert pairs == sorted((f"test {lang} {i}", texts.names.index(lang)) for lang in texts.names for i in range(3))


def test_a_held_out_domain_the_training_data_lacks_is_refused(files, tmp_path):
    train, _ = files
    other = _jsonl(tmp_path / "other.jsonl", [("x", "fi"), ("y", "sv")])
    with pytest.raises(UsageError, match="--validation_file .*other.jsonl has domains the training data lacks: sv"):
        load_domain_texts(_data_args("--train_file", str(train), "--validation_file", str(other)))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--validation_file", "{test}"], "--validation_file is the held-out data of --train_file / --dataset_name"),
        (
            ["--train_file", "{train}", "--domain_column", "lang", "--validation_file", "{test}",
             "--validation_split_percentage", "10"],
            "--validation_split_percentage: not used with --validation_file",
        ),
        (
            ["--train_file", "{train}", "--domain_column", "lang", "--validation_file", "{tmp}/missing.jsonl"],
            "--validation_file",
        ),
    ],
)  # fmt: skip
def test_bad_combinations_are_refused_in_one_line_before_any_work(files, tmp_path, capsys, extra, message):
    train, test = files
    fill = {"{train}": str(train), "{test}": str(test), "{tmp}": str(tmp_path)}
    argv = [fill.get(arg, arg.replace("{tmp}", str(tmp_path))) for arg in extra]
    out = tmp_path / "out"
    assert causal_lm.main(["--config", "decoder_demo", "--output_dir", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()
