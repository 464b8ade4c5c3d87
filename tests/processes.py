"""Launching a test's subprocess on this checkout, and waiting on it until a checkpoint it writes appears."""

import os
import subprocess
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TESTS = REPO_ROOT / "tests"


def checkout_env(**variables: str) -> dict[str, str]:
    """The environment for a test's subprocess (``python``, ``torchrun``, ``accelerate launch``): this checkout's root,
    then ``tests/``, first on ``PYTHONPATH``, so every process imports the ``robust_pretrain`` under test rather than
    whatever copy the environment has installed (and the test helpers such as ``tiny_training``); plus ``variables``."""
    inherited = os.environ.get("PYTHONPATH")
    path = os.pathsep.join([str(REPO_ROOT), str(TESTS), *([inherited] if inherited else [])])
    return {**os.environ, **variables, "PYTHONPATH": path}


def wait_for_checkpoint(process: subprocess.Popen, checkpoint: Path, log: Path, timeout: float) -> None:
    """Return once ``checkpoint/trainer_state.json`` exists; fail with the log's tail if ``process`` ends first, or
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (checkpoint / "trainer_state.json").is_file():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {checkpoint.name} after {timeout:.0f} s"
        time.sleep(0.05)
