"""The objective experiment's scorer (scripts/objective_evidence.py): scores and the pre-registered decision rule on
hand-made runs whose outcome is derived by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "objective_evidence.py"
REFERENCE = {"noun": 4.0, "determiner": 1.0}
PROVENANCE = {"tasks": ["noun", "determiner"], "tokenizer": "abc"}


def write_run(runs: Path, folder: str, seed: int, losses: dict[str, float], steps: int = 10, **provenance) -> None:
    directory = runs / folder / f"seed-{seed}"
    directory.mkdir(parents=True, exist_ok=True)
    report = {"eval_task_loss": losses, "train_steps": steps, "provenance": {**PROVENANCE, **provenance}}
    (directory / "task_report.json").write_text(json.dumps(report))


def make_runs(runs: Path, excess_noun: float) -> None:
    """proportional: excess (noun +1.0, determiner +0.2), mean raw 3.1 on both seeds. The other arms as below."""
    write_run(runs, "reference/proportional", 42, REFERENCE, steps=40)
    arms = {
        "arms/proportional": {"noun": 5.0, "determiner": 1.2},
        "arms/average": {"noun": 5.5, "determiner": 1.0},
        "arms/minimax-alpha_auto=false": {"noun": 5.0, "determiner": 2.0},
        # worst excess = excess_noun, mean raw (4 + excess_noun + 1.3) / 2
        "excess/minimax": {"noun": REFERENCE["noun"] + excess_noun, "determiner": 1.3},
        # worst excess 0.8 (0.8x proportional's) but mean raw (4.6 + 1.8) / 2 = 3.2 = 1.032x: fails on the mean
        "arms/minimax-alpha_auto=true": {"noun": 4.6, "determiner": 1.8},
        "excess/group_dro": {"noun": 4.8, "determiner": 1.4},
    }
    for folder, losses in arms.items():
        for seed in (42, 43):
            write_run(runs, folder, seed, losses)


def score(runs: Path, output: Path) -> dict:
    command = [sys.executable, str(SCRIPT), "--runs", str(runs), "--output", str(output), "--command", "made by hand"]
    subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(output.with_suffix(".json").read_text())


@pytest.mark.parametrize(
    ("excess_noun", "meets"),
    [
        (0.89, True),
        (0.91, False),
    ],  # the bar is 0.90 x proportional's worst excess (1.0); mean raw 3.095 / 3.105 < 3.162
)
def test_decision_rule_at_the_bar(tmp_path: Path, excess_noun: float, meets: bool) -> None:
    make_runs(tmp_path / "runs", excess_noun)
    result = score(tmp_path / "runs", tmp_path / "out" / "objective")
    verdict = result["decision"]["verdicts"]["minimax excess"]
    assert verdict["worst_excess_vs_proportional"] == pytest.approx(excess_noun / 1.0)
    assert verdict["mean_raw_vs_proportional"] == pytest.approx((4 + excess_noun + 1.3) / 2 / 3.1)
    assert verdict["meets_bar"] is meets and verdict["seed_robust"] is meets
    assert result["decision"]["supported"] is meets
    assert result["decision"]["recommended"] == ("minimax excess" if meets else None)
    automatic = result["decision"]["verdicts"]["minimax automatic α"]
    assert automatic["worst_excess_vs_proportional"] == pytest.approx(0.8)
    assert automatic["mean_raw_vs_proportional"] == pytest.approx(3.2 / 3.1)
    assert not automatic["meets_bar"]
    # arms outside the rule get the same check, reported apart: group_dro excess (worst 0.8, mean 3.1) passes it
    outside = result["decision"]["outside_the_rule"]
    assert set(outside) == {"average", "minimax raw α=1 (paper)", "group_dro excess"}
    assert outside["group_dro excess"]["worst_excess_vs_proportional"] == pytest.approx(0.8)
    assert outside["group_dro excess"]["meets_bar"]
    markdown = (tmp_path / "out" / "objective.md").read_text()
    assert ("Supported: minimax excess" in markdown) is meets
    assert "| group_dro excess | 0.800 | 1.000 | yes | yes |" in markdown
    assert (tmp_path / "out" / "objective_frontier.png").stat().st_size > 0
    # scores: excess over the reference and regret against proportional of the same seed
    scores = result["arms"]["minimax raw α=1 (paper)"]["seeds"]["42"]
    assert scores["excess"]["worst"] == pytest.approx(1.0) and scores["excess"]["worst_task"] == "noun"
    assert scores["regret"]["worst"] == pytest.approx(2.0 / 1.2) and scores["regret"]["worst_task"] == "determiner"


def test_provenance_mismatch_is_refused(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    make_runs(runs, 0.5)
    (runs / "excess/group_dro/seed-43/task_report.json").unlink()
    write_run(runs, "excess/group_dro", 43, {"noun": 4.8, "determiner": 1.4}, tokenizer="other")
    command = [sys.executable, str(SCRIPT), "--runs", str(runs), "--output", str(tmp_path / "out")]
    finished = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert finished.returncode != 0
    assert "group_dro/seed-43: tokenizer differs from the reference run's" in finished.stderr
