"""The PoS pre-training recipe, SIGKILLed after a checkpoint and rerun with the same command, ends with parameters
bit-identical (CPU) to an uninterrupted run: masking, data order, dropout and optimiser state all resume exactly; also
with task-weighted sampling (the sampling weights of the steps before the checkpoint are restored)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from processes import checkout_env, wait_for_checkpoint
from safetensors.torch import load_file

from robust_pretrain.data import load_ewt_corpus
from robust_pretrain.pretraining.common import last_complete_checkpoint

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "pretrain_pos_mlm.py"
MAX_STEPS = 30
STEPS_PER_EPOCH = 3  # 24 training blocks, batches of 8: the run spans 10 epochs


TASK_SAMPLING = ["--masking", "per_example", "--task_sampling", "online", "--weighting", "minimax"]


def _command(train_file: Path, output_dir: Path, extra: list[str]) -> list[str]:
    return [
        sys.executable, str(RECIPE),
        "--train_file", str(train_file),
        "--vocab_size", "1000",  # a WordPiece tokenizer trained by the recipe (the same in every run)
        "--model_size", "tiny",
        "--max_seq_length", "64",
        "--max_train_samples", str(8 * STEPS_PER_EPOCH),
        "--max_eval_samples", "8",
        "--per_device_train_batch_size", "8",
        "--per_device_eval_batch_size", "8",
        "--max_steps", str(MAX_STEPS),
        "--save_steps", "1",
        "--logging_steps", "1",
        "--learning_rate", "1e-3",
        "--warmup_steps", "0",
        "--seed", "7",
        "--use_cpu", "true",
        "--disable_tqdm", "true",
        "--output_dir", str(output_dir),
        *extra,
    ]  # fmt: skip


def _losses(output_dir: Path) -> list[float]:
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


def _train_loss(output_dir: Path) -> float:
    return json.loads((output_dir / "train_results.json").read_text())["train_loss"]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], TASK_SAMPLING], ids=["per_token", "task_sampling"])
def test_killed_and_rerun_recipe_matches_an_uninterrupted_run(tmp_path: Path, extra: list[str]) -> None:
    train_file = tmp_path / "train.txt"
    train_file.write_text("\n".join(load_ewt_corpus("train")["text"][:60]) + "\n", encoding="utf-8")
    env = checkout_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    reference_dir, resumed_dir = tmp_path / "uninterrupted", tmp_path / "resumed"
    with open(tmp_path / "uninterrupted.log", "w") as reference_log, open(tmp_path / "killed.log", "w") as killed_log:
        reference = subprocess.Popen(
            _command(train_file, reference_dir, extra),
            env=env,
            stdout=reference_log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
        killed = subprocess.Popen(
            _command(train_file, resumed_dir, extra), env=env, stdout=killed_log, stderr=subprocess.STDOUT, cwd=tmp_path
        )
        try:
            # into the second epoch
            wait_for_checkpoint(killed, resumed_dir / "checkpoint-4", tmp_path / "killed.log", timeout=300)
        finally:
            killed.kill()
            killed.wait()
        assert reference.wait(timeout=600) == 0, (tmp_path / "uninterrupted.log").read_text()[-3000:]
    assert killed.returncode == -9
    assert not (resumed_dir / "model.safetensors").exists()
    # the kill may land while a checkpoint is written: the rerun resumes from the last complete one
    steps_done = int(Path(last_complete_checkpoint(resumed_dir)).name.split("-")[1])
    assert 4 <= steps_done < MAX_STEPS

    rerun = subprocess.run(
        _command(train_file, resumed_dir, extra), env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]

    losses = _losses(reference_dir)
    assert len(losses) == MAX_STEPS and _losses(resumed_dir) == losses
    # the rerun resumed (its train_loss averages only the steps it trained) rather than starting afresh
    assert _train_loss(reference_dir) == pytest.approx(sum(losses) / MAX_STEPS, rel=1e-5)
    resumed_steps = losses[steps_done:]
    assert _train_loss(resumed_dir) == pytest.approx(sum(resumed_steps) / len(resumed_steps), rel=1e-5)
    expected = load_file(reference_dir / "model.safetensors")
    resumed = load_file(resumed_dir / "model.safetensors")
    assert expected.keys() == resumed.keys() and len(expected) > 10
    assert all(torch.equal(expected[name], resumed[name]) for name in expected)
    if extra:  # the sampling weights followed minimax (not uniform) and were restored: the same history
        states = [json.loads((d / "weighting_state.json").read_text())["state"] for d in (reference_dir, resumed_dir)]
        assert states[0] == states[1] and states[0]["name"] == "TaskSamplingWeighting"
        history = states[0]["schedule"]["history"]
        assert sorted(history, key=int) == [str(s) for s in range(MAX_STEPS - 3, MAX_STEPS + 1)]  # the last 4 steps
        assert max(history[str(MAX_STEPS)]) > 1.01 / 9
