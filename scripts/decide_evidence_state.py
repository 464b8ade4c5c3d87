"""Carry a resumable ``robust-pretrain-decide`` run across sessions whose checkouts start empty: ``save`` copies the
JSON files that let a rerun reuse every finished seed (its cells' task reports, stage records and weights files; the
protocol) into a committed folder, ``restore`` puts back what is missing. Models and tokenizers never go along:
finished cells are reused from their reports alone.

    python scripts/decide_evidence_state.py save RUN STATE      # RUN: the --output_dir, STATE: the committed folder
    python scripts/decide_evidence_state.py restore RUN STATE
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

KEPT = ("task_report.json", "stage.json", "decide_cell.json")


def finished(cell: Path) -> bool:
    """A cell's report is written (a doremi cell's: its main stage's)."""
    return (cell / "task_report.json").is_file() or (cell / "main" / "task_report.json").is_file()


def kept_files(run: Path) -> list[Path]:
    """The files of ``run`` (a decide output folder) that a rerun needs to reuse what finished: the protocol, and the
    reports, stage records and weights files of every seed whose arms have all finished (a seed cut short is
    retrained: its arms need the natural run's tokenizer, which is not kept)."""
    files = [run / "protocol.json"] if (run / "protocol.json").is_file() else []
    arms = [arm for arm in (run / "cells").iterdir() if arm.is_dir()] if (run / "cells").is_dir() else []
    seeds = {cell.name for arm in arms for cell in arm.iterdir()}
    for seed in sorted(seeds):
        cells = [arm / seed for arm in arms]
        if all(finished(cell) for cell in cells):
            for cell in cells:
                files += [p for p in cell.rglob("*.json") if p.name in KEPT or p.name.endswith("weights.json")]
    return sorted(set(files))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["save", "restore"])
    parser.add_argument("run", type=Path, help="the decide --output_dir")
    parser.add_argument("state", type=Path, help="the committed folder")
    cli = parser.parse_args()
    if cli.action == "save":
        shutil.rmtree(cli.state, ignore_errors=True)
        for path in kept_files(cli.run):
            target = cli.state / path.relative_to(cli.run)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        print(f"saved {len(kept_files(cli.run))} files of {cli.run} to {cli.state}")
    elif cli.state.is_dir():
        restored = 0
        for path in cli.state.rglob("*.json"):
            target = cli.run / path.relative_to(cli.state)
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
                restored += 1
        print(f"restored {restored} files of {cli.state} into {cli.run}")


if __name__ == "__main__":
    main()
