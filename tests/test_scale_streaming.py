"""``--streaming true`` in the PoS recipe: a local corpus of several files read as a ``datasets`` IterableDataset by 2
processes (Accelerate shards it by file: each process reads its own files), tagged and packed on the fly in a
DataLoader worker; a run SIGKILLed after a checkpoint and rerun ends exactly like an uninterrupted one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from ports import free_port
from processes import checkout_env, wait_for_checkpoint
from safetensors.torch import load_file
from transformers import AutoTokenizer

from robust_pretrain.cli import UsageError
from robust_pretrain.data import load_ewt_corpus
from robust_pretrain.pretraining.common import last_complete_checkpoint
from robust_pretrain.pretraining.pos_mlm import recipe
from robust_pretrain.pretraining.pos_mlm.model import train_wordpiece_tokenizer

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "pretrain_pos_mlm.py"
MAX_STEPS = 30


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """4 training files (shards), a validation file and a WordPiece tokenizer trained on the training texts."""
    folder = tmp_path_factory.mktemp("corpus")
    texts = [t.replace("\n", " ") for t in load_ewt_corpus("train")["text"][:240]]
    for shard in range(4):
        (folder / f"part-{shard}.txt").write_text("\n".join(texts[shard::4]) + "\n")
    # every task must have held-out words: the first EWT test texts have no interjection, hence the "oh"
    held_out = [t.replace("\n", " ") + " Oh , thanks ." for t in load_ewt_corpus("test")["text"][:30]]
    (folder / "valid.txt").write_text("\n".join(held_out))
    train_wordpiece_tokenizer(texts, 600).save_pretrained(folder / "tokenizer")
    return {"train": folder / "part-*.txt", "validation": folder / "valid.txt", "tokenizer": folder / "tokenizer"}


def recipe_args(corpus: dict[str, Path], output_dir: Path, max_steps: int = MAX_STEPS) -> list[str]:
    return [
        "--streaming", "true",
        "--train_file", str(corpus["train"]), "--validation_file", str(corpus["validation"]),
        "--tokenizer_name", str(corpus["tokenizer"]),
        "--model_size", "tiny", "--max_seq_length", "64", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "16", "--max_eval_samples", "16",
        "--max_steps", str(max_steps), "--save_steps", "1", "--logging_steps", "1", "--warmup_steps", "0",
        "--learning_rate", "1e-3",
        "--dataloader_num_workers", "1", "--use_cpu", "true", "--seed", "7", "--disable_tqdm", "true",
        "--output_dir", str(output_dir),
    ]  # fmt: skip


def launch(corpus: dict[str, Path], output_dir: Path, log: Path, max_steps: int = MAX_STEPS) -> subprocess.Popen:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command = [*torchrun, "--master_port", str(free_port()), str(RECIPE), *recipe_args(corpus, output_dir, max_steps)]
    env = checkout_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with open(log, "w") as stream:  # the child keeps its own copy of the file descriptor
        return subprocess.Popen(command, env=env, stdout=stream, stderr=subprocess.STDOUT)


def losses(output_dir: Path) -> list[float]:
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


def kill_after(process: subprocess.Popen, checkpoint: Path, log: Path) -> None:
    """SIGKILL a torchrun launch once ``checkpoint`` is complete: its workers (in sessions of their own), then it."""
    try:
        wait_for_checkpoint(process, checkpoint, log, timeout=300)
    finally:
        for child in [*psutil.Process(process.pid).children(recursive=True), psutil.Process(process.pid)]:
            child.send_signal(signal.SIGKILL)
        process.wait()


def assert_same_parameters(expected_dir: Path, resumed_dir: Path) -> None:
    expected, resumed = load_file(expected_dir / "model.safetensors"), load_file(resumed_dir / "model.safetensors")
    assert expected.keys() == resumed.keys()
    differences = {k: (expected[k] - resumed[k]).abs().max().item() for k in expected}
    assert all(torch.equal(expected[k], resumed[k]) for k in expected), max(differences.values())


@pytest.mark.slow
def test_streaming_run_killed_after_a_checkpoint_resumes_exactly(corpus, tmp_path):
    reference_dir, resumed_dir = tmp_path / "uninterrupted", tmp_path / "resumed"
    reference = launch(corpus, reference_dir, tmp_path / "uninterrupted.log")
    kill_after(
        launch(corpus, resumed_dir, tmp_path / "killed.log"), resumed_dir / "checkpoint-4", tmp_path / "killed.log"
    )
    assert reference.wait(timeout=600) == 0, (tmp_path / "uninterrupted.log").read_text()[-3000:]
    assert not (resumed_dir / "model.safetensors").exists()
    steps_done = int(Path(last_complete_checkpoint(resumed_dir)).name.split("-")[1])
    assert 4 <= steps_done < MAX_STEPS

    rerun = launch(corpus, resumed_dir, tmp_path / "rerun.log")
    assert rerun.wait(timeout=600) == 0, (tmp_path / "rerun.log").read_text()[-3000:]
    assert len(losses(reference_dir)) == MAX_STEPS and losses(resumed_dir) == losses(reference_dir)
    assert_same_parameters(reference_dir, resumed_dir)
    log = (tmp_path / "uninterrupted.log").read_text()
    assert "each process reads 2 of the 4 files" in log


WRAP_STEPS, WRAP_KILL_AFTER = 16, 8


@pytest.fixture(scope="module")
def short_corpus(corpus, tmp_path_factory) -> dict[str, Path]:
    """4 short files of uneven length (process 0 reads files 0-1, process 1 files 2-3): each process's share of the
    stream holds a few batches only, so both wrap, at different steps, long before the checkpoint the run is killed
    after."""
    folder = tmp_path_factory.mktemp("short_corpus")
    texts = [t.replace("\n", " ") for t in load_ewt_corpus("train")["text"] if 10 <= len(t.split()) <= 30][:18]
    for shard, (start, stop) in enumerate([(0, 5), (5, 11), (11, 14), (14, 18)]):
        (folder / f"part-{shard}.txt").write_text("\n".join(texts[start:stop]) + "\n")
    return {**corpus, "train": folder / "part-*.txt"}


@pytest.mark.slow
def test_streaming_resume_is_exact_after_the_streams_wrapped(short_corpus, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(short_corpus["tokenizer"])
    block = 64 - 2  # [CLS] ... [SEP]
    blocks_per_pass = []  # each process's share of the stream
    for files in (["part-0.txt", "part-1.txt"], ["part-2.txt", "part-3.txt"]):
        texts = [line for name in files for line in (short_corpus["train"].parent / name).read_text().splitlines()]
        tokens = sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
        blocks_per_pass.append(-(-tokens // block))
    batches_before_kill = 4 * WRAP_KILL_AFTER
    assert all(2 * blocks < batches_before_kill for blocks in blocks_per_pass), blocks_per_pass  # wrapped twice
    assert blocks_per_pass[0] != blocks_per_pass[1]  # at different steps

    reference_dir, resumed_dir = tmp_path / "uninterrupted", tmp_path / "resumed"
    reference = launch(short_corpus, reference_dir, tmp_path / "uninterrupted.log", WRAP_STEPS)
    killed_log = tmp_path / "killed.log"
    kill_after(
        launch(short_corpus, resumed_dir, killed_log, WRAP_STEPS),
        resumed_dir / f"checkpoint-{WRAP_KILL_AFTER}",
        killed_log,
    )
    assert reference.wait(timeout=600) == 0, (tmp_path / "uninterrupted.log").read_text()[-3000:]
    steps_done = int(Path(last_complete_checkpoint(resumed_dir)).name.split("-")[1])
    assert WRAP_KILL_AFTER <= steps_done < WRAP_STEPS and not (resumed_dir / "model.safetensors").exists()

    rerun = launch(short_corpus, resumed_dir, tmp_path / "rerun.log", WRAP_STEPS)
    assert rerun.wait(timeout=600) == 0, (tmp_path / "rerun.log").read_text()[-3000:]
    assert len(losses(reference_dir)) == WRAP_STEPS and losses(resumed_dir) == losses(reference_dir)
    assert_same_parameters(reference_dir, resumed_dir)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--tokenizer_name": None}, "--streaming: a tokenizer cannot be trained on a stream"),
        ({"--validation_file": None}, "--streaming needs held-out data"),
        ({"--train_file": "nothing-*.txt"}, "--train_file nothing-\\*.txt: no file matches"),
        ({"--max_steps": "-1"}, "--streaming needs --max_steps"),
    ],
)
def test_streaming_refuses_what_a_stream_cannot_do(corpus, tmp_path, change, message):
    args = recipe_args(corpus, tmp_path / "out")
    for option, value in change.items():
        index = args.index(option)
        if value is None:
            del args[index : index + 2]
        else:
            args[index + 1] = value
    with pytest.raises(UsageError, match=message):
        recipe.run(args)
