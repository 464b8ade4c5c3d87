"""Waiting on a test's subprocess: until a checkpoint it writes appears (to kill it there), failing with its log."""

import subprocess
import time
from pathlib import Path


def wait_for_checkpoint(process: subprocess.Popen, checkpoint: Path, log: Path, timeout: float) -> None:
    """Return once ``checkpoint/trainer_state.json`` exists; fail with the log's tail if ``process`` ends first, or
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (checkpoint / "trainer_state.json").is_file():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {checkpoint.name} after {timeout:.0f} s"
        time.sleep(0.05)
