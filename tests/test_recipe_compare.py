"""``robust_pretrain.pretraining.compare`` (``recipes/compare_weightings.py``): strategies x seeds (+ a sweep) on a
tiny budget; the table matches the runs."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_recipe_pretrain import (  # noqa: F401  (_one_thread: fixture)
    DEMO_CONFIG,
    PNG_MAGIC,
    _one_thread,
    assert_png,
    corpus_texts,
    write_texts,
)

from robust_pretrain.cli import UsageError
from robust_pretrain.pretraining import compare
from robust_pretrain.pretraining.pos_mlm import recipe as pretrain

OVERRIDES = [
    "--max_steps", "2", "--warmup_steps", "0", "--vocab_size", "1000", "--max_seq_length", "64",
    "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "32", "--logging_steps", "1",
    "--max_eval_samples", "32", "--disable_tqdm", "true",
]  # fmt: skip


@pytest.fixture
def recipe_calls(monkeypatch) -> list[list[str]]:
    """Each run's command, executed in-process by the pretraining recipe's ``main`` instead of a new interpreter."""
    calls: list[list[str]] = []
    real_run = subprocess.run

    def run(command, check=False, **kwargs):
        if command[:1] != [sys.executable]:  # not ours (matplotlib's font cache runs fc-list)
            return real_run(command, check=check, **kwargs)
        assert check is True
        assert command[:3] == [sys.executable, "-m", "robust_pretrain.pretraining.pos_mlm.recipe"]
        calls.append(command)
        pretrain.run(command[3:])
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(compare.subprocess, "run", run)
    return calls


def option(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def table_rows(markdown: str) -> dict[str, list[str]]:
    """The first Markdown table in ``markdown``: first cell -> the other cells."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    rows = {}
    for line in [lines[start], *lines[start + 2 :]]:  # the header, then the rows below its separator
        if not line.startswith("| "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def cell(values: list[float]) -> str:
    mean, std = float(np.mean(values)), float(np.std(values, ddof=1))
    return f"{mean:.4f} ± {std:.4f}"


@pytest.mark.slow
def test_compare_strategies_seeds_and_sweep(tmp_path: Path, recipe_calls: list[list[str]], capsys) -> None:
    data = tmp_path / "data"
    data.mkdir()
    train = write_texts(data / "train.txt", corpus_texts(48))
    validation = write_texts(data / "validation.txt", corpus_texts(60, offset=1500))
    out = tmp_path / "compare"
    argv = ["--config", str(DEMO_CONFIG), "--strategies", "average", "minimax", "--seeds", "1", "2"]
    argv += ["--sweep", "alpha=0.5,4", "--output_dir", str(out), "--"]
    argv += [*OVERRIDES, "--train_file", str(train), "--validation_file", str(validation)]
    result = compare.run(argv)

    runs = {"average": {}, "minimax-alpha=0.5": {"alpha": "0.5"}, "minimax-alpha=4": {"alpha": "4"}}
    assert list(result["runs"]) == list(runs)
    assert len(recipe_calls) == 6
    planned = [(option(c, "--weighting"), option(c, "--seed"), option(c, "--alpha")) for c in recipe_calls]
    assert planned == [
        ("average", "1", None), ("average", "2", None),
        ("minimax", "1", "0.5"), ("minimax", "2", "0.5"),
        ("minimax", "1", "4"), ("minimax", "2", "4"),
    ]  # fmt: skip
    assert all(option(c, "--max_steps") == "2" and option(c, "--config") == str(DEMO_CONFIG) for c in recipe_calls)

    reports = {
        run: [json.loads((out / run / f"seed-{seed}" / "task_report.json").read_text()) for seed in (1, 2)]
        for run in runs
    }
    for run, options in runs.items():
        for seed, report in zip((1, 2), reports[run], strict=True):
            assert report["settings"]["seed"] == seed and report["train_steps"] == 2
            assert report["weighting"] == run.split("-")[0]
            if options:
                assert report["settings"]["alpha"] == float(options["alpha"])  # the sweep reached the run
        assert reports[run][0]["eval_task_loss"] != reports[run][1]["eval_task_loss"]  # seeds differ
    # a larger alpha concentrates more weight on the worst task
    top = {run: max(r["final_weights"].values()) for run, seeds in reports.items() for r in seeds[:1]}
    assert top["minimax-alpha=4"] > top["minimax-alpha=0.5"]

    saved = json.loads((out / "comparison.json").read_text())
    assert saved == json.loads(json.dumps(result))
    assert saved["seeds"] == [1, 2] and saved["sweeps"] == ["alpha=0.5,4"] and saved["overrides"][:2] == OVERRIDES[:2]
    markdown = (out / "comparison.md").read_text()
    raw_part, regret_part = markdown.split("Metric: regret")
    raw_part = raw_part.split("Metric: excess")[0]
    assert raw_part.startswith("Metric: raw held-out loss L_t")
    rows = {**table_rows(raw_part), **table_rows(raw_part.split("Relative change against")[1])}
    assert rows["task"] == list(runs)
    tasks = reports["average"][0]["tasks"]
    for i, run in enumerate(runs):
        table = saved["runs"][run]
        assert table["seeds"] == 2
        for task in tasks:
            values = [r["eval_task_loss"][task] for r in reports[run]]
            assert table["task_loss"][task]["mean"] == pytest.approx(sum(values) / 2, rel=1e-12)
            assert table["task_loss"][task]["std"] == pytest.approx(abs(values[0] - values[1]) / 2**0.5, rel=1e-9)
            assert rows[task][i] == cell(values)
        means = [r["eval_mean_task_loss"] for r in reports[run]]
        worsts = [r["eval_worst_task_loss"] for r in reports[run]]
        assert table["mean_task_loss"] == pytest.approx({"mean": np.mean(means), "std": np.std(means, ddof=1)})
        assert table["worst_task_loss"] == pytest.approx({"mean": np.mean(worsts), "std": np.std(worsts, ddof=1)})
        assert rows["**mean**"][i] == cell(means) and rows["**worst**"][i] == cell(worsts)
        assert table["worst_tasks"] == sorted({r["worst_task"] for r in reports[run]})
        assert rows["worst task"][i] == ", ".join(table["worst_tasks"])
    base_mean = statistics.fmean(r["eval_mean_task_loss"] for r in reports["average"])
    base_worst = statistics.fmean(r["eval_worst_task_loss"] for r in reports["average"])
    for run in ("minimax-alpha=0.5", "minimax-alpha=4"):
        mean = statistics.fmean(r["eval_mean_task_loss"] for r in reports[run])
        worst = statistics.fmean(r["eval_worst_task_loss"] for r in reports[run])
        assert rows[run] == [f"{mean / base_mean - 1:+.1%}", f"{worst / base_worst - 1:+.1%}"]
    for name in ("comparison_tasks.png", "frontier.png"):
        assert_png(out / name)

    # a second call re-uses every finished run, and says so
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("task_report.json")}
    assert len(mtimes) == 6
    capsys.readouterr()
    again = compare.run(argv)
    reused = [line for line in capsys.readouterr().out.splitlines() if line.startswith("= reusing ")]
    assert reused == [
        f"= reusing {out / run / f'seed-{seed}'} (finished with the same settings)" for run in runs for seed in (1, 2)
    ]
    assert len(recipe_calls) == 6
    assert {p: p.stat().st_mtime_ns for p in out.rglob("task_report.json")} == mtimes
    assert again["runs"] == result["runs"]

    # regret against the default baseline (the first run: no proportional run), excess over a reference run
    assert result["baseline"] == "average" and "No excess table" in markdown
    regret = table_rows(regret_part)
    for task in tasks:
        assert regret[task][0] == "1.0000"  # the baseline against itself, seed by seed
        ratios = [r["eval_task_loss"][task] / b["eval_task_loss"][task] for r, b in zip(reports["minimax-alpha=4"],
                  reports["average"], strict=True)]  # fmt: skip
        assert regret[task][2] == cell(ratios)
    scored = compare.run(
        [*argv[: argv.index("--")], "--reference_run", str(out / "average" / "seed-1"), *argv[argv.index("--") :]]
    )
    assert len(recipe_calls) == 6 and scored["reference_run"] == str(out / "average" / "seed-1")
    excess_part = (out / "comparison.md").read_text().split("Metric: excess")[1]
    excess = table_rows(excess_part)
    assert excess["task"] == list(runs)
    for task in tasks:
        differences = [
            r["eval_task_loss"][task] - reports["average"][0]["eval_task_loss"][task] for r in reports["average"]
        ]
        assert (
            differences[0] == 0.0
            and excess[task][0] == f"{statistics.fmean(differences):+.4f} ± {statistics.stdev(differences):.4f}"
        )
    assert scored["scores"]["excess"]["average"]["per_seed"][0]["worst"] == 0.0  # the reference against itself
    assert (out / "frontier.png").read_bytes()[:8] == PNG_MAGIC


def test_no_sweep_no_frontier(tmp_path: Path, monkeypatch) -> None:
    """Finished runs are read, not re-run; without --sweep there is no frontier plot; std is 0 with one seed."""
    out = tmp_path / "compare"
    for run, loss in (("average", 2.0), ("minimax", 1.5)):
        report = {
            "tasks": ["a", "b"],
            "eval_task_loss": {"a": loss, "b": loss + 1},
            "eval_mean_task_loss": loss + 0.5,
            "eval_worst_task_loss": loss + 1,
            "worst_task": "b",
        }
        (out / run / "seed-7").mkdir(parents=True)
        (out / run / "seed-7" / "task_report.json").write_text(json.dumps(report))
        cli = argparse.Namespace(config=None, launcher="")
        settings = compare.run_settings(["--weighting", run, "--seed", "7"], cli)
        (out / run / "seed-7" / compare.RUN_SETTINGS_NAME).write_text(json.dumps(settings))
    real_run = subprocess.run

    def run(command, **kwargs):
        if command[:1] == [sys.executable]:
            pytest.fail(f"a finished run was re-run: {command}")
        return real_run(command, **kwargs)  # matplotlib's font cache runs fc-list

    monkeypatch.setattr(compare.subprocess, "run", run)
    result = compare.run(["--strategies", "average", "minimax", "--seeds", "7", "--output_dir", str(out)])
    assert result["runs"]["minimax"]["worst_task_loss"] == {"mean": 2.5, "std": 0.0}
    markdown = (out / "comparison.md").read_text()
    assert "| **worst** | 3.0000 | 2.5000 |" in markdown
    assert "| minimax | -20.0% | -16.7% |" in markdown
    assert (out / "comparison_tasks.png").is_file() and not (out / "frontier.png").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sweep", "alpha"], "--sweep must look like setting=v1,v2,..., got 'alpha'"),
        (["--sweep", "alpha=,"], "--sweep must look like setting=v1,v2,..., got 'alpha=,'"),
        (["--sweep", "=1,2"], "--sweep must look like setting=v1,v2,..., got '=1,2'"),
        (["--sweep", "alpah=1,2"], "--sweep 'alpah' is a setting of none of the strategies"),
        (["--strategies", "average", "--sweep", "alpha=1,2"], r"none of the strategies \['average'\]; it applies to"),
        (["--strategies", "average", "minmax"], "unknown strategy 'minmax'; choose from"),
        (["--config", "missing.yaml"], "--config missing.yaml: config file not found"),
    ],
)
def test_bad_arguments(tmp_path: Path, monkeypatch, capsys, args: list[str], message: str) -> None:
    def run(command, **kwargs):
        raise AssertionError(f"a run was started: {command}")

    monkeypatch.setattr(compare.subprocess, "run", run)
    out = tmp_path / "compare"
    assert compare.main([*args, "--output_dir", str(out)]) == 2  # a usage error, before any run
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.slow
def test_changed_settings_are_not_reused(tmp_path: Path, recipe_calls: list[list[str]], capsys) -> None:
    """A run is reused only with the same settings: a larger max_steps extends it, other data content is refused."""
    train = write_texts(tmp_path / "train.txt", corpus_texts(32))
    validation = write_texts(tmp_path / "validation.txt", corpus_texts(60, offset=1500))  # every task has targets
    out = tmp_path / "compare"

    def compare_with(*overrides: str) -> dict:
        argv = ["--config", str(DEMO_CONFIG), "--strategies", "minimax", "--output_dir", str(out), "--", *OVERRIDES]
        return compare.run([*argv, "--train_file", str(train), "--validation_file", str(validation), *overrides])

    run_dir = out / "minimax" / "seed-42"
    compare_with("--max_steps", "1")
    compare_with("--max_steps", "1")
    assert len(recipe_calls) == 1
    assert f"= reusing {run_dir} (finished with the same settings)" in capsys.readouterr().out
    result = compare_with("--max_steps", "2")  # the overrides come after the shared ones: max_steps 2 wins
    assert len(recipe_calls) == 2 and "= reusing" not in capsys.readouterr().out
    assert json.loads((run_dir / "trainer_state.json").read_text())["global_step"] == 2  # extended, not restarted
    assert result["runs"]["minimax"]["mean_task_loss"]["mean"] == pytest.approx(
        json.loads((run_dir / "task_report.json").read_text())["eval_mean_task_loss"]
    )
    write_texts(train, corpus_texts(32, offset=700))  # same file name, other text
    with pytest.raises(UsageError, match="train_file_sha256"):
        compare_with("--max_steps", "2")
    assert len(recipe_calls) == 3


def test_several_sweeps_one_setting_at_a_time() -> None:
    runs = compare.plan_runs(["proportional", "minimax"], ["alpha=0.5,1", "weight_floor=0.5"])
    assert runs == [
        ("proportional", "proportional", {}),
        ("minimax-alpha=0.5", "minimax", {"alpha": "0.5"}),
        ("minimax-alpha=1", "minimax", {"alpha": "1"}),
        ("minimax-weight_floor=0.5", "minimax", {"weight_floor": "0.5"}),
    ]
    with pytest.raises(ValueError, match="--sweep 'dwa_window' is a setting of none of the strategies"):
        compare.plan_runs(["minimax"], ["alpha=1", "dwa_window=5"])
