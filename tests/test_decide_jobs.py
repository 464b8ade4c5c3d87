"""robust-pretrain-decide's cells as jobs: --plan trains nothing, --cell runs one (after its seed's natural cell),
--report aggregates (refusing while cells are missing); cells run as concurrent processes in one folder give the
sequential run's verdict bit for bit, and a cell runs once however many jobs start it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_decide import FakeCells, fake_domains

from robust_pretrain.cli import UsageError
from robust_pretrain.pretraining.decide import recipe as decide
from robust_pretrain.pretraining.decide.cells import cell_lock

WORKER = Path(__file__).with_name("decide_cell_worker.py")
OPTIONS = ["--seeds", "1", "2", "--arms", "minimax", "--max_steps", "8"]


def jobs(root: Path, *modes: list[str], seconds: float = 1.0) -> list[subprocess.CompletedProcess]:
    """Run one decide process per mode at once; their results."""
    env = {**os.environ, "FAKE_CELL_SECONDS": str(seconds)}
    argv = [sys.executable, str(WORKER), "--output_dir", str(root), *OPTIONS]
    started = [
        subprocess.Popen([*argv, *mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for mode in modes
    ]
    return [subprocess.CompletedProcess(p.args, p.wait(), *p.communicate()) for p in started]


def in_process(root: Path, *mode: str) -> dict:
    parser = decide.OptionParser(decide.DecideArguments, allow_abbrev=False)
    namespace, passed = parser.parse_known_args(["--output_dir", str(root), *OPTIONS, *mode])
    return decide.decide(decide.DecideArguments(**vars(namespace)), passed, FakeCells(root), read_domains=fake_domains)


def test_cells_as_concurrent_jobs_give_the_sequential_verdict_bit_for_bit(tmp_path):
    sequential, parallel = tmp_path / "sequential", tmp_path / "jobs"
    in_process(sequential)
    planned = in_process(parallel, "--plan")
    assert [c["cell"] for c in planned["cells"]] == [
        "natural:1",
        "sampling_control:1",
        "minimax:1",
        "natural:2",
        "sampling_control:2",
        "minimax:2",
    ]
    assert not (parallel / "cells").exists()  # --plan trains nothing
    with pytest.raises(UsageError, match=r"cell minimax:1 needs the finished cell natural:1"):
        in_process(parallel, "--cell", "minimax:1")
    with pytest.raises(UsageError, match=r"cells not finished: natural:1, sampling_control:1, minimax:1, natural:2"):
        in_process(parallel, "--report")
    naturals = jobs(parallel, ["--cell", "natural:1"], ["--cell", "natural:2"])
    assert [job.returncode for job in naturals] == [0, 0], [job.stderr for job in naturals]
    for arm in ("minimax", "sampling_control"):  # in any order, each as its own job
        for seed in (2, 1):
            in_process(parallel, "--cell", f"{arm}:{seed}")
    in_process(parallel, "--report")
    for name in ("decision.json", "decision.md"):
        assert (parallel / name).read_bytes() == (sequential / name).read_bytes(), name
    minimax = json.loads((parallel / "decision.json").read_text())["arms"]["minimax"]
    assert minimax["difference"]["mean"] == pytest.approx(-0.275)


def test_a_cell_runs_once_however_many_jobs_start_it(tmp_path):
    root = tmp_path / "d"
    in_process(root, "--plan")
    first, second = jobs(root, ["--cell", "natural:1"], ["--cell", "natural:1"], seconds=3.0)
    codes = sorted([first.returncode, second.returncode])
    assert codes == [0, 2], (first.stderr, second.stderr)
    refused = first if first.returncode == 2 else second
    assert "cell natural:1 is being run by another process" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    record = json.loads((root / "cells" / "natural" / "seed-1" / "decide_cell.json").read_text())
    assert record["options"][-4:] == ["--seed", "1", "--weighting", "proportional"]
    # the lock holds within one process too, and is released with its holder
    with cell_lock(root, "minimax", 1):
        with pytest.raises(UsageError, match="cell minimax:1 is being run by another process"):
            with cell_lock(root, "minimax", 1):
                pass
    with cell_lock(root, "minimax", 1):
        pass
