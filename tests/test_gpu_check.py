"""benchmarks/gpu_check.py's dry run: every part of the GPU check runs on the CPU at tiny sizes, so it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from processes import REPO_ROOT, checkout_env


@pytest.mark.slow
def test_gpu_check_dry_run_runs_every_part_and_records_the_sync_counts(tmp_path):
    command = [
        sys.executable,
        str(REPO_ROOT / "benchmarks" / "gpu_check.py"),
        "--dry-run",
        "--results",
        str(tmp_path / "check"),
    ]
    result = subprocess.run(command, env=checkout_env(OMP_NUM_THREADS="1"), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "check.json").read_text())
    parts = {part["part"]: part for part in report["parts"]}
    assert list(parts) == [
        "decoder_step",
        "sync_count",
        "autocast_bf16",
        "autocast_fp16",
        "compile",
        "step_benchmark",
        "gpu_tests",
    ]
    assert all(part["status"] == "ok" for part in parts.values())
    assert report["mode"].startswith("dry run")
    assert "tests collected" in parts["gpu_tests"]["result"]["summary"][0]  # the GPU-only tests exist
    # on the CPU Accelerate autocasts bf16, not fp16 (that run trains in fp32); both train to finite task losses
    assert parts["autocast_bf16"]["result"]["autocast"] and not parts["autocast_fp16"]["result"]["autocast"]
    assert all(parts[p]["result"]["task_losses_finite"] for p in ("autocast_bf16", "autocast_fp16"))
    assert parts["compile"]["result"]["max_abs_parameter_difference_vs_eager"] == 0.0  # backend eager: same kernels
    syncs = parts["sync_count"]["result"]
    for weighting in ("minimax", "proportional"):
        assert syncs[weighting]["counted_ops"] <= syncs["plain-sparse-head"]["counted_ops"] + 2
    # a decoder step within the plain one's syncs + 2 (accumulation 2: the trainer's two host transfers)
    assert 0 < syncs["plain-causal-lm"]["counted_ops"] < syncs["minimax-causal-lm"]["counted_ops"]
    assert syncs["minimax-causal-lm"]["counted_ops"] <= syncs["plain-causal-lm"]["counted_ops"] + 2
    assert "test_gpu_check.py" not in parts["gpu_tests"]["result"]["command"]  # its own dry run is not re-run
    (run,) = parts["step_benchmark"]["result"]["runs"]
    configs = [row["config"] for row in run["results"]]
    assert configs == ["plain-full-logits", "plain-sparse-head", "minimax", "proportional", "average"]
    assert all(row["model_tflops_per_s"] >= 0 and "mfu" in row for row in run["results"])
    first, accumulated = parts["decoder_step"]["result"]["runs"]  # two shapes in the dry run
    common = ["plain", "checkpointed16", "torch-lce-mean", "minimax-full", "minimax-default", "minimax-simultaneous"]
    assert [row["config"] for row in first["results"]] == [*common, "minimax-chunk4", "minimax-chunk64"]
    assert [row["config"] for row in accumulated["results"]] == common
    assert [row["accumulation"] for row in accumulated["results"]] == [2] * len(common)
    for run in (first, accumulated):
        assert run["results"][0]["time_ratio_to_plain"] == 1.0 and run["setup"]["flops_per_step"] > 0
        # the head's share of the step's FLOPs, 6 V h D / (6 N D + 12 L h s D), on every row, and the MFU field
        assert all(0 < row["head_share"] < 1 and "mfu" in row for row in run["results"])
    assert first["results"][0]["head_share"] > accumulated["results"][0]["head_share"]  # 1 layer against 2
    text = (tmp_path / "check.md").read_text()
    assert "## step_benchmark" in text and "## decoder_step" in text and "| minimax-chunk4 |" in text
    assert "| minimax-simultaneous |" in text
