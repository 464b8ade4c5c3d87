"""A robust-pretrain-decide job with fake cells (tests/test_decide.py's reports, each taking FAKE_CELL_SECONDS) in its
own process, for tests/test_decide_jobs.py: argv as decide's; exit 2 and one line for a refusal."""

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from test_decide import fake_domains, fake_report  # noqa: E402

from robust_pretrain.cli import run_console  # noqa: E402
from robust_pretrain.pretraining.decide import recipe as decide  # noqa: E402


def slow_cell(recipe: str, cell: Path, options: list[str]) -> dict[str, Any]:
    time.sleep(float(os.environ.get("FAKE_CELL_SECONDS", "0")))
    return fake_report(options)


def run(argv: list[str]) -> dict[str, Any]:
    parser = decide.OptionParser(decide.DecideArguments, allow_abbrev=False)
    namespace, passed = parser.parse_known_args(decide.merge_repeats(argv))
    return decide.decide(decide.DecideArguments(**vars(namespace)), passed, slow_cell, read_domains=fake_domains)


if __name__ == "__main__":
    sys.exit(run_console(run, prog="robust-pretrain-decide"))
