"""FSDP on 2 CPU processes (gloo): Accelerate's FSDP2 path equals DDP; an FSDP config on CPU says it runs DDP.

Accelerate never selects FSDP on CPU (an FSDP config runs DDP there), so the sharded runs force its FSDP2 path onto the
2-process CPU state (``tiny_training.py --fsdp2``, see its docstring): the Trainer then shards the model with
Accelerate's ``fsdp2_prepare_model`` (torch ``fully_shard`` per BertLayer, plus the embeddings/head group and the root)
and writes sharded checkpoints. Both sides train a BERT whose decoder has its own output bias (``--untie_mlm_bias``):
Accelerate's FSDP2 wrapping refuses the parameter BERT shares between ``cls.predictions.bias`` and
``cls.predictions.decoder.bias`` (ValueError from torch's duplicate-parameter check).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from ports import free_port
from processes import checkout_env
from safetensors.torch import load_file
from transformers import BertForMaskedLM

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "tiny_training.py"
CONFIGS = REPO / "recipes" / "accelerate_configs"
# 2 processes x 4 sequences, 4 optimizer steps, sharded checkpoints at steps 2 and 4
COMMON = ["--num_examples", "16", "--batch_size", "4", "--max_steps", "4", "--save_steps", "2", "--untie_mlm_bias"]
# Measured here (2 cores, torch 2.13): 0.0 for gradients, weights and final parameters in 32 FSDP2 runs against DDP,
# at OMP_NUM_THREADS 1 and 2. Not guaranteed elsewhere: another machine measured 1.2e-10, and DDP itself moves by 6e-8
# between 1 and 2 threads; a reordered fp32 sum moves a parameter of size 1 by ~1e-7, which this admits.
TOLERANCE = 1e-6


def torchrun(out: Path, *args: str, port: int, check: bool = True) -> subprocess.CompletedProcess:
    env = checkout_env(OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    result = subprocess.run([*command, str(SCRIPT), "--out", str(out), *args], env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"run failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def run_info(out: Path, rank: int = 0) -> dict:
    return json.loads((out / f"run-rank{rank}.json").read_text())


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def weights_difference(path: Path, reference: Path, skip: int = 0) -> float:
    """Largest difference between two runs' task weights, step by step (skipping the reference's first steps)."""
    weights = torch.tensor(json.loads(path.read_text()))
    expected = torch.tensor(json.loads(reference.read_text()))[skip:]
    assert weights.shape == expected.shape
    return float((weights - expected).abs().max())


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    torchrun(out, *COMMON, port=free_port())
    return out


@pytest.mark.slow
def test_fsdp2_sharded_training_equals_ddp(ddp_run, tmp_path):
    fsdp = tmp_path / "fsdp2"
    torchrun(fsdp, *COMMON, "--fsdp2", port=free_port())
    for rank in (0, 1):
        info = run_info(fsdp, rank)
        assert (info["distributed_type"], info["wrapped_model"]) == ("FSDP", "FSDPBertForMaskedLM")
        assert info["dtensor_parameters"]  # every parameter is a DTensor shard
    reference = run_info(ddp_run)
    assert (reference["distributed_type"], reference["wrapped_model"]) == ("MULTI_CPU", "DistributedDataParallel")
    # first step's gradients (gathered from the shards), every step's task weights, final parameters
    ddp_grads = load_file(ddp_run / "grads-rank0.safetensors")
    for rank in (0, 1):
        assert max_difference(ddp_grads, load_file(fsdp / f"grads-rank{rank}.safetensors")) <= TOLERANCE
        assert weights_difference(fsdp / f"weights-rank{rank}.json", ddp_run / "weights-rank0.json") <= TOLERANCE
    ddp_final = load_file(ddp_run / "final" / "model.safetensors")
    assert max_difference(ddp_final, load_file(fsdp / "final" / "model.safetensors")) <= TOLERANCE
    reloaded = dict(BertForMaskedLM.from_pretrained(fsdp / "final").named_parameters())
    assert max(float((reloaded[k].detach() - ddp_final[k]).abs().max()) for k in ddp_final) <= TOLERANCE
    # sharded checkpoints: one file per rank, with the weighting state beside them
    for step in (2, 4):
        checkpoint = fsdp / f"checkpoint-{step}"
        assert sorted(p.name for p in (checkpoint / "pytorch_model_fsdp_0").glob("*.distcp")) == [
            "__0_0.distcp",
            "__1_0.distcp",
        ]
        assert (checkpoint / "weighting_state.json").is_file()
    # a checkpoint-style (sharded) save into a folder that does not exist yet still writes the weighting state
    state = json.loads((fsdp / "final" / "weighting_state.json").read_text())
    assert json.loads((fsdp / "sharded-save" / "weighting_state.json").read_text()) == state
    assert state["step_weights"] == pytest.approx(
        json.loads((ddp_run / "final" / "weighting_state.json").read_text())["step_weights"], abs=TOLERANCE
    )


@pytest.mark.slow
def test_fsdp2_resume_from_sharded_checkpoint_after_sigkill_equals_ddp(ddp_run, tmp_path):
    out = tmp_path / "killed"
    crashed = torchrun(out, *COMMON, "--fsdp2", "--kill_after_save", "2", port=free_port(), check=False)
    assert crashed.returncode != 0 and not (out / "final").exists()
    torchrun(out, *COMMON, "--fsdp2", "--resume", port=free_port())
    final = load_file(out / "final" / "model.safetensors")
    assert max_difference(load_file(ddp_run / "final" / "model.safetensors"), final) <= TOLERANCE
    assert weights_difference(out / "weights-rank0.json", ddp_run / "weights-rank0.json", skip=2) <= TOLERANCE


@pytest.mark.slow
def test_learnable_weighting_under_fsdp2_is_refused_with_the_reason(tmp_path):
    result = torchrun(
        tmp_path / "gradnorm", *COMMON, "--fsdp2", "--weighting", "gradnorm", port=free_port(), check=False
    )
    assert result.returncode != 0
    assert "weighting='gradnorm' learns parameters that are not the model's" in result.stderr
    assert "DTensor" in result.stderr and "Train it with DDP" in result.stderr


@pytest.mark.slow
def test_fsdp_config_on_cpu_runs_ddp_and_says_so(tmp_path):
    """The shipped fsdp2.yaml with use_cpu: Accelerate runs DDP; the trainer warns instead of pretending."""
    config = yaml.safe_load((CONFIGS / "fsdp2.yaml").read_text())
    assert config["distributed_type"] == "FSDP" and config["fsdp_config"]["fsdp_version"] == 2
    config.update(use_cpu=True, num_processes=2, mixed_precision="no", main_process_port=free_port())
    (tmp_path / "fsdp2_cpu.yaml").write_text(yaml.safe_dump(config))
    env = checkout_env(OMP_NUM_THREADS="1")
    out = tmp_path / "run"
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(tmp_path / "fsdp2_cpu.yaml")]
    result = subprocess.run(
        [*launch, str(SCRIPT), "--out", str(out), "--untie_mlm_bias"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        info = run_info(out, rank)
        assert (info["distributed_type"], info["wrapped_model"], info["dtensor_parameters"]) == (
            "MULTI_CPU",
            "DistributedDataParallel",
            False,
        )
    assert result.stderr.count("FSDP was requested") == 2  # one warning per process
    assert "nothing is sharded" in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="GPU-only: Accelerate's FSDP path needs 2 CUDA devices (none here)"
)
def test_gpu_accelerate_fsdp2_config_equals_ddp(tmp_path):
    env = checkout_env()
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2"]
    args = [*COMMON, "--gpu"]
    subprocess.run(
        [*launch, "--config_file", str(CONFIGS / "fsdp2.yaml"), "--mixed_precision", "no", "--main_process_port",
         str(free_port()), str(SCRIPT), "--out", str(tmp_path / "fsdp"), *args],
        env=env, check=True,
    )  # fmt: skip
    subprocess.run(
        [
            *launch,
            "--multi_gpu",
            "--main_process_port",
            str(free_port()),
            str(SCRIPT),
            "--out",
            str(tmp_path / "ddp"),
            *args,
        ],
        env=env,
        check=True,
    )
    info = run_info(tmp_path / "fsdp")
    assert (info["distributed_type"], info["dtensor_parameters"]) == ("FSDP", True)
    a = load_file(tmp_path / "ddp" / "final" / "model.safetensors")
    b = load_file(tmp_path / "fsdp" / "final" / "model.safetensors")
    assert max_difference(a, b) <= 1e-5  # GPU reductions run in another order
