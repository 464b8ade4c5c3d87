"""Domain-weighted sampling across processes and restarts: 2 gloo processes draw the rows of the same global draw as
one process with their global batch (the same sampling weights, losses and model), and a run SIGKILLed after a
checkpoint and rerun ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ports import free_port
from processes import checkout_env, wait_for_checkpoint
from safetensors.torch import load_file
from test_recipe_causal_lm import DOMAINS, write_domain_files

from robust_pretrain.pretraining.common import last_complete_checkpoint

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "pretrain_causal_lm.py"
MAX_STEPS = 12


def _command(tmp_path: Path, output: str, batch_size: int, *extra: str) -> list[str]:
    return [
        str(RECIPE),
        "--domain_files", *write_domain_files(tmp_path, texts_per_domain=30),
        "--task_sampling", "online",
        "--weighting", "minimax", "--alpha", "4",
        "--vocab_size", "400",
        "--max_seq_length", "32",
        "--per_device_train_batch_size", str(batch_size),
        "--per_device_eval_batch_size", "16",
        "--max_steps", str(MAX_STEPS),
        "--logging_steps", "1",
        "--learning_rate", "3e-3",
        "--warmup_steps", "0",
        "--seed", "11",
        "--use_cpu", "true",
        "--disable_tqdm", "true",
        "--output_dir", str(tmp_path / output),
        *extra,
    ]  # fmt: skip


def _logs(output_dir: Path) -> list[dict]:
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "loss" in entry]


@pytest.mark.slow
def test_two_gloo_processes_draw_as_one_process_with_their_global_batch(tmp_path):
    env = checkout_env(OMP_NUM_THREADS="1")
    single = subprocess.run(
        [sys.executable, *_command(tmp_path, "single", 8, "--save_strategy", "no")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    pair = subprocess.run(
        [*launch, *_command(tmp_path, "pair", 4, "--save_strategy", "no")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert pair.returncode == 0, pair.stderr[-3000:]
    one, two = _logs(tmp_path / "single"), _logs(tmp_path / "pair")
    assert len(one) == len(two) == MAX_STEPS
    sampling = [[entry[f"task_sampling_weight/{name}"] for name in DOMAINS] for entry in one]
    assert sampling[-1] != pytest.approx([1 / 3] * 3, abs=0.01)  # minimax moved the weights
    for first, second in zip(one, two, strict=True):
        for key in ("loss", *(f"task_sampling_weight/{name}" for name in DOMAINS)):
            assert second[key] == pytest.approx(first[key], rel=1e-4, abs=1e-6), (first["step"], key)
        # the same sequences were drawn: each domain's share of the step's targets is the same
        for name in DOMAINS:
            assert second[f"task_weight/{name}"] == pytest.approx(first[f"task_weight/{name}"], abs=1e-6)
    expected, got = (
        load_file(tmp_path / "single" / "model.safetensors"),
        load_file(tmp_path / "pair" / "model.safetensors"),
    )
    assert all(torch.allclose(expected[name], got[name], atol=1e-4) for name in expected)


@pytest.mark.slow
def test_killed_and_rerun_sampling_run_matches_an_uninterrupted_one(tmp_path):
    env = checkout_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    saving = ["--save_steps", "1"]
    reference = subprocess.run(
        [sys.executable, *_command(tmp_path, "uninterrupted", 4, *saving)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert reference.returncode == 0, reference.stderr[-3000:]
    resumed_dir = tmp_path / "resumed"
    command = [sys.executable, *_command(tmp_path, "resumed", 4, *saving)]
    with open(tmp_path / "killed.log", "w") as log:
        killed = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_checkpoint(killed, resumed_dir / "checkpoint-5", tmp_path / "killed.log", timeout=300)
        finally:
            killed.kill()
            killed.wait()
    assert killed.returncode == -9 and not (resumed_dir / "model.safetensors").exists()
    steps_done = int(Path(last_complete_checkpoint(resumed_dir)).name.split("-")[1])
    assert 5 <= steps_done < MAX_STEPS
    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert _logs(resumed_dir) == _logs(tmp_path / "uninterrupted")
    expected = load_file(tmp_path / "uninterrupted" / "model.safetensors")
    resumed = load_file(resumed_dir / "model.safetensors")
    assert all(torch.equal(expected[name], resumed[name]) for name in expected)
    reports = [json.loads((d / "task_report.json").read_text()) for d in (tmp_path / "uninterrupted", resumed_dir)]
    # the time-averaged weights are those of every step, also across the restart
    assert reports[1]["mixture_weights"] == pytest.approx(reports[0]["mixture_weights"], abs=1e-9)
