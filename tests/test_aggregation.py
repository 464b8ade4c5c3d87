"""One aggregation of per-task results (robust_pretrain.reporting.aggregation): expected values derived by hand."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from robust_pretrain.reporting.aggregation import (
    aggregate_runs,
    deltas,
    mean_std,
    relative_change,
    standard_errors,
    summarize_suite,
    task_summary,
    worst_task,
)
from robust_pretrain.reporting.tables import comparison_markdown, suite_markdown


def test_mean_and_sample_std() -> None:
    # 2, 4, 9: mean 5, squared deviations 9 + 1 + 16 = 26, sample variance 26 / 2 = 13
    assert mean_std([2.0, 4.0, 9.0]) == {"mean": 5.0, "std": pytest.approx(math.sqrt(13))}
    assert mean_std([7.5]) == {"mean": 7.5, "std": 0.0}  # one seed: no spread


def test_worst_task_follows_the_metric_direction() -> None:
    scores = {"cola": 30.0, "rte": 55.0, "sst2": 80.0}
    assert worst_task(scores, higher_is_better=True) == "cola"
    assert worst_task(scores, higher_is_better=False) == "sst2"  # losses: the highest is the worst
    assert worst_task({"a": 1.0, "b": 1.0}, higher_is_better=True) == "a"  # a tie names the first task


def test_summary_and_deltas_against_a_baseline() -> None:
    base = {"tasks": {"a": mean_std([60.0, 62.0]), "b": mean_std([40.0, 44.0])}}
    base.update(task_summary({"a": 61.0, "b": 42.0}, higher_is_better=True))
    other = {"tasks": {"a": mean_std([56.0, 58.0]), "b": mean_std([50.0, 50.0])}}
    other.update(task_summary({"a": 57.0, "b": 50.0}, higher_is_better=True))
    assert base["average"] == 51.5 and base["worst_task"] == "b" and base["worst_score"] == 42.0
    assert other["average"] == 53.5 and other["worst_task"] == "b" and other["worst_score"] == 50.0

    # per task: 57 - 61 = -4, 50 - 42 = +8; average 53.5 - 51.5 = +2; worst 50 - 42 = +8
    assert deltas(other, base, ["a", "b"]) == {"tasks": {"a": -4.0, "b": 8.0}, "average": 2.0, "worst_score": 8.0}
    assert relative_change(0.9, 1.2) == pytest.approx(-0.25)


def test_standard_errors_welch() -> None:
    # baseline 1, 3 (mean 2, variance 2); other 4, 6, 8 (mean 6, variance 4): SE = sqrt(2/2 + 4/3) = sqrt(7/3)
    assert standard_errors([1.0, 3.0], [4.0, 6.0, 8.0]) == pytest.approx(4 / math.sqrt(7 / 3))
    assert standard_errors([5.0, 5.0], [5.0, 5.0]) == 0.0
    assert standard_errors([5.0, 5.0], [4.0, 4.0]) == -math.inf  # a difference without any spread


@dataclass(frozen=True)
class Row:
    """The fields of a suite task row that the summary reads."""

    name: str
    display_name: str
    higher_is_better: bool = True
    family: str = "toy"

    @property
    def header(self) -> str:
        return f"{self.display_name} (acc)"


def test_suite_summary_of_cells() -> None:
    cells = [
        {"checkpoint": checkpoint, "task": task, "seed": seed, "score": score, "metrics": {"accuracy": score / 100}}
        for checkpoint, task, seed, score in [
            ("runs/base", "a", 1, 70.0),
            ("runs/base", "a", 2, 74.0),
            ("runs/base", "b", 1, 50.0),
            ("runs/base", "b", 2, 50.0),
            ("runs/robust", "a", 1, 68.0),
            ("runs/robust", "a", 2, 68.0),
            ("runs/robust", "b", 1, 55.0),
            ("runs/robust", "b", 2, 59.0),
        ]
    ]
    summary = summarize_suite(cells, [Row("a", "A"), Row("b", "B")], [1, 2], "runs/base", "toy scores")
    base, robust = summary["checkpoints"]["runs/base"], summary["checkpoints"]["runs/robust"]
    # base: a 72 ± sqrt(8), b 50 ± 0, average 61, worst b; robust: a 68, b 57 ± sqrt(8), average 62.5, worst b
    assert base["tasks"]["a"]["mean"] == 72 and base["tasks"]["a"]["std"] == pytest.approx(math.sqrt(8))
    assert base["tasks"]["a"]["metrics"] == {"accuracy": pytest.approx(0.72)}
    assert (base["average"], base["worst_task"], base["worst_score"]) == (61, "b", 50)
    assert (robust["average"], robust["worst_task"], robust["worst_score"]) == (62.5, "b", 57)
    assert robust["delta"] == {"tasks": {"a": -4, "b": 7}, "average": 1.5, "worst_score": 7}
    table = suite_markdown(summary)
    assert "| runs/robust | 68.0 ± 0.0 | 57.0 ± 2.8 | 62.5 | 57.0 (B) |" in table
    assert "| runs/robust | -4.0 | +7.0 | +1.5 | +7.0 |" in table


def test_comparison_of_strategies_over_seeds() -> None:
    def report(a: float, b: float) -> dict:
        return {
            "tasks": ["a", "b"],
            "eval_task_loss": {"a": a, "b": b},
            "eval_mean_task_loss": (a + b) / 2,
            "eval_worst_task_loss": max(a, b),
            "worst_task": "a" if a >= b else "b",
        }

    table = aggregate_runs({"average": [report(2.0, 4.0), report(2.0, 6.0)], "minimax": [report(3.0, 3.0)]})
    # average: a 2 ± 0, b 5 ± sqrt(2), mean (3 + 4) / 2 = 3.5 ± sqrt(0.5), worst 5 ± sqrt(2); minimax: one seed
    assert table["average"]["task_loss"]["b"] == {"mean": 5.0, "std": pytest.approx(math.sqrt(2))}
    assert table["average"]["mean_task_loss"] == {"mean": 3.5, "std": pytest.approx(math.sqrt(0.5))}
    assert table["average"]["worst_tasks"] == ["b"] and table["average"]["seeds"] == 2
    assert table["minimax"]["worst_task_loss"] == {"mean": 3.0, "std": 0.0}
    # against average: mean 3 / 3.5 - 1 = -14.3 %, worst 3 / 5 - 1 = -40.0 %
    assert "| minimax | -14.3% | -40.0% |" in comparison_markdown(table, "average")


def test_runs_are_scored_on_the_tasks_every_run_has_held_out_losses_for():
    """A task with no held-out target in one run (a small max_eval_samples) is left out of every run's scores, and
    the mean and worst task of the reports that had it are recomputed over the common tasks."""
    from robust_pretrain.reporting.aggregation import aggregate_runs, restrict_to_common_tasks
    from robust_pretrain.reporting.scoring import aggregate_scores
    from robust_pretrain.reporting.tables import comparison_markdown

    def report(losses: dict[str, float]) -> dict:
        worst = max(losses, key=losses.get)
        return {
            "tasks": ["a", "b", "c"],
            "eval_task_loss": losses,
            "eval_mean_task_loss": sum(losses.values()) / len(losses),
            "eval_worst_task_loss": losses[worst],
            "worst_task": worst,
        }

    reports = {
        "proportional": [report({"a": 1.0, "b": 2.0, "c": 9.0})],
        "minimax": [report({"a": 1.5, "b": 3.0})],
    }
    restricted, left_out = restrict_to_common_tasks(reports)
    assert left_out == ["c"]
    base = restricted["proportional"][0]
    assert base["tasks"] == ["a", "b"] and base["eval_mean_task_loss"] == 1.5
    assert base["worst_task"] == "b" and base["eval_worst_task_loss"] == 2.0
    table = aggregate_runs(restricted)
    assert table["minimax"]["mean_task_loss"]["mean"] == 2.25
    scores = aggregate_scores(restricted, None, "proportional")
    assert scores["regret"]["minimax"]["worst"]["mean"] == 1.5
    assert "| c |" not in comparison_markdown(table, "proportional")
    unchanged, none_left_out = restrict_to_common_tasks({"proportional": reports["proportional"]})
    assert none_left_out == [] and unchanged["proportional"][0] is reports["proportional"][0]
