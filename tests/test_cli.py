"""Console entry points: an expected user error is one paragraph naming the file or option, and exit status 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest
from processes import checkout_env
from test_recipe_pretrain import (  # noqa: F401  (_one_thread: fixture)
    DEMO_CONFIG,
    MINILM,
    RECIPES,
    TINY,
    _one_thread,
    checkpoint_argv,
    corpus_texts,
    write_texts,
)

from robust_pretrain.cli import (
    TRACEBACK_ENV,
    UsageError,
    check_checkpoint,
    looks_like_path,
    run_console,
)
from robust_pretrain.pretraining import compare
from robust_pretrain.pretraining.pos_mlm import recipe as pos_mlm

PROG = "robust-pretrain-pos-mlm"


def console(capsys, argv: list[str]) -> tuple[int, str]:
    """Run the pre-training console entry point in-process; (exit status, stderr)."""
    capsys.readouterr()
    status = pos_mlm.main(["--config", str(DEMO_CONFIG), *TINY, *argv])
    return status, capsys.readouterr().err


def assert_one_paragraph(err: str, *fragments: str, prog: str = PROG) -> None:
    """stderr ends with the error as one line (progress bars of data loading may come before it), no traceback."""
    assert "Traceback" not in err, err
    last = err.rstrip("\n").split("\n")[-1]
    assert last.startswith(f"{prog}: error: "), err
    for fragment in fragments:
        assert fragment in last, (fragment, last)
    assert last.endswith("(run with --traceback or ROBUST_PRETRAIN_TRACEBACK=1 for the traceback)")


@pytest.fixture
def model_copy(tmp_path: Path) -> Path:
    """A copy of all-MiniLM-L6-v2 (config, tokenizer, weights) that a test may damage."""
    folder = tmp_path / "minilm"
    shutil.copytree(MINILM, folder)
    return folder


def test_bad_training_files(tmp_path: Path, capsys) -> None:
    output_dir = tmp_path / "out"
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(bytes(range(256)) * 8)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("the caf\xe9 is open .\n".encode("latin-1") * 20)
    malformed = tmp_path / "broken.jsonl"
    malformed.write_text('{"text": "the cat sat ."}\n{"text": the dog\n')
    cases = {
        empty: "is empty: give a file with one text per line",
        binary: "is not text (NUL byte at offset 0); is it a binary file?",
        latin1: "is not UTF-8 text (invalid byte at offset 7)",
        malformed: "as json data:",
    }
    for path, message in cases.items():
        status, err = console(capsys, ["--output_dir", str(output_dir), "--train_file", str(path)])
        assert status == 2
        assert_one_paragraph(err, str(path), message)
    assert not output_dir.exists()


def test_bad_checkpoints(tmp_path: Path, model_copy: Path, capsys, small_train: Path) -> None:
    data = ["--output_dir", str(tmp_path / "out"), "--train_file", str(small_train)]
    empty = tmp_path / "empty-model"
    empty.mkdir()
    status, err = console(capsys, [*data, "--model_name_or_path", str(empty)])
    assert status == 2
    assert_one_paragraph(err, f"--model_name_or_path {empty} is not a saved model: it has no config.json")

    weights = model_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    status, err = console(capsys, [*data, "--model_name_or_path", str(model_copy)])
    assert status == 2
    assert_one_paragraph(err, f"--model_name_or_path {model_copy}: model.safetensors cannot be read", "truncated")

    missing = tmp_path / "outputs" / "nope"
    status, err = console(capsys, [*data, "--model_name_or_path", str(missing)])
    assert status == 2
    assert_one_paragraph(err, f"--model_name_or_path {missing}: no such checkpoint directory")
    assert not (tmp_path / "out").exists()


def test_max_seq_length_beyond_the_model(tmp_path: Path, capsys, small_train: Path) -> None:
    argv = checkpoint_argv(tmp_path / "out", "--train_file", str(small_train), "--model_name_or_path", str(MINILM))
    capsys.readouterr()
    status, err = pos_mlm.main([*argv, "--max_seq_length", "1024"]), capsys.readouterr().err
    assert status == 2
    assert_one_paragraph(err, "--max_seq_length 1024 exceeds the 512 positions of --model_name_or_path", "at most 512")
    status, err = pos_mlm.main([*argv, "--max_seq_length", "50000000"]), capsys.readouterr().err
    assert status == 2
    assert_one_paragraph(err, "--max_seq_length must be between 8 and 8192 tokens, got 50000000")


def test_bad_config_file(tmp_path: Path, capsys) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("max_steps: [1, 2\n")
    capsys.readouterr()
    assert pos_mlm.main(["--config", str(config)]) == 2
    assert_one_paragraph(capsys.readouterr().err, f"--config {config} is not valid YAML")


def test_traceback_on_request(tmp_path: Path, capsys, monkeypatch) -> None:
    argv = ["--config", str(DEMO_CONFIG), "--output_dir", str(tmp_path / "out"), "--max_steps", "0"]
    with pytest.raises(UsageError, match="--max_steps must be a positive number"):
        pos_mlm.main([*argv, "--traceback"])
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    with pytest.raises(UsageError, match="--max_steps must be a positive number"):
        pos_mlm.main(argv)
    monkeypatch.setenv(TRACEBACK_ENV, "0")
    assert pos_mlm.main(argv) == 2


def test_run_console_passes_bugs_through() -> None:
    """Only expected errors become a message: anything else is a bug and keeps its traceback."""

    def buggy(argv: list[str]) -> None:
        raise KeyError("bug")

    assert run_console(lambda argv: None, [], prog="x") == 0
    with pytest.raises(KeyError):
        run_console(buggy, [], prog="x")


@pytest.mark.parametrize(
    ("name", "path_like"),
    [
        ("bert-base-uncased", False),
        ("sentence-transformers/all-MiniLM-L6-v2", False),
        ("./model", True),
        ("../outputs/demo", True),
        ("/abs/model", True),
        ("~/model", True),
        ("outputs/demo/checkpoint-10", True),
        ("bad name/with space", True),
        ("a--b/c", True),
    ],
)
def test_looks_like_path(name: str, path_like: bool) -> None:
    assert looks_like_path(name) is path_like


def test_looks_like_path_by_existing_folder(tmp_path: Path, monkeypatch) -> None:
    """``outputs/nope`` is a Hub id in form, but with a local ``outputs/`` folder it is meant as a path."""
    monkeypatch.chdir(tmp_path)
    assert not looks_like_path("outputs/nope")
    (tmp_path / "outputs").mkdir()
    assert looks_like_path("outputs/nope")
    with pytest.raises(UsageError, match="--model_name_or_path outputs/nope: no such checkpoint directory"):
        check_checkpoint("outputs/nope")
    check_checkpoint(str(MINILM))  # a complete local model


def test_hub_ids_offline_must_be_in_the_cache(tmp_path: Path, monkeypatch) -> None:
    """Online a Hub id is left to the Hub client; offline (as in these tests) only a cached one can load."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(UsageError, match="--model_name_or_path some-user/some-model: no such local directory, and "
                                         "not in the Hub cache"):  # fmt: skip
        check_checkpoint("some-user/some-model")
    snapshot = tmp_path / "models--some-user--some-model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--some-user--some-model" / "refs").mkdir()
    (tmp_path / "models--some-user--some-model" / "refs" / "main").write_text("abc123")
    check_checkpoint("some-user/some-model")
    monkeypatch.setattr("robust_pretrain.cli.is_offline_mode", lambda: False)
    check_checkpoint("other-user/other-model")


@pytest.mark.slow
def test_recipe_script_exit_status(tmp_path: Path) -> None:
    """``recipes/pretrain_pos_mlm.py`` as a user runs it: status 2, the message, no traceback."""
    command = [sys.executable, str(RECIPES / "pretrain_pos_mlm.py"), "--config", str(DEMO_CONFIG)]
    command += ["--output_dir", str(tmp_path / "out"), "--mlm_probability", "0"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=checkout_env())
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "robust-pretrain-pos-mlm: error: --mlm_probability must be in (0, 1], got 0.0" in proc.stderr


def test_compare_run_failure_is_one_paragraph(tmp_path: Path, capsys, monkeypatch) -> None:
    """A run that fails inside a comparison ends the comparison with status 2, naming the run and its command."""

    def failing(command, check=False, **kwargs):
        raise subprocess.CalledProcessError(2, command)

    monkeypatch.setattr(compare.subprocess, "run", failing)
    out = tmp_path / "compare"
    assert compare.main(["--strategies", "minimax", "--output_dir", str(out)]) == 2
    assert_one_paragraph(
        capsys.readouterr().err,
        f"the run in {out / 'minimax' / 'seed-42'} failed (exit status 2); its message is above.",
        "-m robust_pretrain.pretraining.pos_mlm.recipe --weighting minimax --seed 42 --output_dir",
        prog="robust-pretrain-compare",
    )
    assert not (out / "minimax" / "seed-42" / compare.RUN_SETTINGS_NAME).exists()


@pytest.fixture
def small_train(tmp_path: Path) -> Path:
    return write_texts(tmp_path / "train.txt", corpus_texts(24))


def test_run_config_records_the_data_content(tmp_path: Path) -> None:
    """``compare.run_settings`` fingerprints every file an option names, so edited data is another setting."""
    import argparse

    train = write_texts(tmp_path / "train.txt", corpus_texts(4))
    cli = argparse.Namespace(config=str(DEMO_CONFIG), launcher="")
    before = compare.run_settings(["--train_file", str(train)], cli)
    assert set(before["files"]) == {str(train)} and before["config"]["max_steps"] == 1000
    write_texts(train, corpus_texts(4, offset=10))
    after = compare.run_settings(["--train_file", str(train)], cli)
    assert json.dumps(before) != json.dumps(after) and before["options"] == after["options"]


def test_a_failed_attempt_does_not_block_its_corrected_rerun(tmp_path: Path) -> None:
    """``run_config.json`` of an attempt that saved nothing (it failed or was refused) binds nothing; once the run
    saved a checkpoint, other settings are refused. A user's own files are never touched."""
    from robust_pretrain.output_dir import RUN_CONFIG_NAME, checkpoint_to_resume

    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / RUN_CONFIG_NAME).write_text(json.dumps({"alpha": 1e9, "max_steps": 4}))
    assert checkpoint_to_resume(out, {"alpha": 1.0, "max_steps": 4}, overwrite=False) is None
    (out / "checkpoint-2").mkdir()
    (out / "checkpoint-2" / "trainer_state.json").write_text("{}")
    with pytest.raises(UsageError, match=r"holds a run with other settings \(alpha: 1000000000.0 -> 1.0\)"):
        checkpoint_to_resume(out, {"alpha": 1.0, "max_steps": 4}, overwrite=False)
    assert checkpoint_to_resume(out, {"alpha": 1e9, "max_steps": 4}, overwrite=False) == str(out / "checkpoint-2")
    assert (out / "notes.txt").read_text() == "mine"
