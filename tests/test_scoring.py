"""Scale-free scoring (raw, excess, regret) on small synthetic task reports, every figure derived by hand: the task
report, the model card, the console line, the comparison's tables and the frontier in each metric."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_aggregation import Row
from test_recipe_pretrain import _one_thread, argv, pretrained_run  # noqa: F401  (fixtures; the shared recipe run)

from robust_pretrain.data import DEFAULT_POS_TASKS
from robust_pretrain.pretraining.common import summarise_log
from robust_pretrain.pretraining.pos_mlm import recipe
from robust_pretrain.reference import ReferenceRun
from robust_pretrain.reporting.aggregation import summarize_suite
from robust_pretrain.reporting.cards import ModelCardContent, pos_tasks, render_model_card
from robust_pretrain.reporting.plots import frontier_figure, plot_comparison
from robust_pretrain.reporting.scoring import aggregate_scores, score_line, score_losses, task_mismatch
from robust_pretrain.reporting.tables import scores_markdown, suite_markdown
from robust_pretrain.reporting.task_report import task_report

LOSSES = {"a": 2.0, "b": 3.0, "c": 1.0}
REFERENCE = {"a": 1.5, "b": 2.9, "c": 0.2}
BASELINE = {"a": 2.5, "b": 3.0, "c": 0.8}


def report(a: float, b: float) -> dict:
    return {"tasks": ["a", "b"], "eval_task_loss": {"a": a, "b": b}}


def test_each_metric_names_its_worst_task_and_mean() -> None:
    scores = score_losses(LOSSES, REFERENCE, BASELINE)
    assert list(scores) == ["raw", "excess", "regret"]
    # raw: mean (2 + 3 + 1) / 3 = 2, worst b (3.0)
    assert scores["raw"] == {"tasks": LOSSES, "mean": 2.0, "worst_task": "b", "worst": 3.0}
    # excess: a 0.5, b 0.1, c 0.8 -> mean 1.4 / 3, worst c: the raw worst task b is barely above its reference
    excess = scores["excess"]
    assert excess["tasks"] == pytest.approx({"a": 0.5, "b": 0.1, "c": 0.8})
    assert excess["mean"] == pytest.approx(1.4 / 3) and excess["worst_task"] == "c"
    assert excess["worst"] == pytest.approx(0.8)
    # regret: a 2 / 2.5 = 0.8, b 1.0, c 1 / 0.8 = 1.25 -> mean 3.05 / 3, worst c
    regret = scores["regret"]
    assert regret["tasks"] == pytest.approx({"a": 0.8, "b": 1.0, "c": 1.25})
    assert regret["mean"] == pytest.approx(3.05 / 3) and (regret["worst_task"], regret["worst"]) == ("c", 1.25)
    assert score_line(scores) == (
        "raw mean 2.0000, worst 3.0000 (b) | excess mean +0.4667, worst +0.8000 (c) | "
        "regret mean 1.0167, worst 1.2500 (c)"
    )


def test_only_the_known_metrics_and_signed_excess() -> None:
    assert list(score_losses(LOSSES)) == ["raw"]
    assert list(score_losses(LOSSES, baseline=BASELINE)) == ["raw", "regret"]
    below = score_losses({"a": 1.0, "b": 2.0}, {"a": 1.5, "b": 2.25})["excess"]
    # signed, not clipped: both tasks beat the reference; the worst is the one least ahead (b: -0.25, a: -0.5)
    assert below["tasks"] == {"a": -0.5, "b": -0.25}
    assert (below["worst_task"], below["worst"], below["mean"]) == ("b", -0.25, -0.375)


def test_regret_of_the_baseline_is_one_for_every_task() -> None:
    scores = score_losses(BASELINE, baseline=BASELINE)["regret"]
    assert scores["tasks"] == {"a": 1.0, "b": 1.0, "c": 1.0} and scores["mean"] == 1.0 and scores["worst"] == 1.0


def test_comparison_scores_over_seeds() -> None:
    reports = {
        "proportional": [report(2.0, 4.0), report(3.0, 3.0)],
        "minimax": [report(2.2, 3.6), report(3.3, 2.7)],
    }
    scores = aggregate_scores(reports, {"a": 2.0, "b": 3.0}, "proportional")
    assert list(scores) == ["raw", "excess", "regret"]
    # regret: seed i over seed i of the baseline; the baseline itself is exactly 1 everywhere
    base = scores["regret"]["proportional"]
    assert base["tasks"] == {t: {"mean": 1.0, "std": 0.0} for t in "ab"}
    assert base["mean"] == base["worst"] == {"mean": 1.0, "std": 0.0}
    # minimax: a 2.2 / 2 = 3.3 / 3 = 1.1, b 3.6 / 4 = 2.7 / 3 = 0.9 in both seeds -> mean 1.0, worst 1.1 (a)
    minimax = scores["regret"]["minimax"]
    assert minimax["tasks"]["a"]["mean"] == pytest.approx(1.1) and minimax["tasks"]["b"]["mean"] == pytest.approx(0.9)
    assert minimax["mean"]["mean"] == pytest.approx(1.0) and minimax["worst"]["mean"] == pytest.approx(1.1)
    assert minimax["worst_tasks"] == ["a"]
    # excess of proportional over (2, 3): seed 1 (0, 1) -> mean 0.5, worst 1 (b); seed 2 (1, 0) -> 0.5, 1 (a)
    excess = scores["excess"]["proportional"]
    assert excess["mean"] == {"mean": 0.5, "std": 0.0} and excess["worst"] == {"mean": 1.0, "std": 0.0}
    assert excess["worst_tasks"] == ["a", "b"]
    assert excess["per_seed"] == [
        {"mean": 0.5, "worst": 1.0, "worst_task": "b"},
        {"mean": 0.5, "worst": 1.0, "worst_task": "a"},
    ]
    # raw: proportional b = 4, 3 -> 3.5 ± sqrt(0.5)
    assert scores["raw"]["proportional"]["tasks"]["b"] == {"mean": 3.5, "std": pytest.approx(0.5**0.5)}

    markdown = scores_markdown(scores, "proportional", "runs/reference")
    _, excess_part, regret_part = markdown.split("Metric: ")
    assert "Metric: regret L_t / L_t(baseline)" in markdown and "baseline run: `proportional`" in markdown
    assert "Metric: excess L_t - ref_t" in markdown and "reference run: `runs/reference`" in markdown
    assert "| **worst** | 1.0000 | 1.1000 ± 0.0000 |" in regret_part  # baseline 1 exactly; minimax 1.1 (rounding)
    assert "| **mean** | +0.5000 | " in excess_part and "| worst task | a, b | " in excess_part
    without = scores_markdown(aggregate_scores(reports, None, "proportional"), "proportional", None)
    assert "Metric: excess" not in without and "No excess table: no reference run is known" in without


def test_frontier_in_each_metric(tmp_path: Path) -> None:
    reports = {"proportional": [report(2.0, 4.0)], "minimax": [report(2.2, 3.6)]}
    scores = aggregate_scores(reports, {"a": 1.0, "b": 3.0}, "proportional")
    figure = frontier_figure(scores)
    expected = {  # (mean, worst) per run: raw, excess over (1, 3), regret against proportional
        "raw": {"proportional": (3.0, 4.0), "minimax": (2.9, 3.6)},
        "excess": {"proportional": (1.0, 1.0), "minimax": (0.9, 1.2)},
        "regret": {"proportional": (1.0, 1.0), "minimax": (1.0, 1.1)},
    }
    assert len(figure.axes) == 3
    for ax, metric in zip(figure.axes, ("raw", "excess", "regret"), strict=True):
        assert ax.get_title() == f"trade-off frontier: {metric}"
        points = {c.get_label(): tuple(c.get_offsets()[0]) for c in ax.collections}
        assert points == {run: pytest.approx(point) for run, point in expected[metric].items()}
    (regret_only,) = frontier_figure(scores, ["regret"]).axes
    assert regret_only.get_xlabel() == "mean over tasks: regret L_t / L_t(baseline)"
    plot_comparison(scores, tmp_path, frontier=True)
    assert (tmp_path / "comparison_tasks.png").is_file() and (tmp_path / "frontier.png").is_file()


def test_task_mismatch_names_each_difference() -> None:
    assert task_mismatch(["a", "b"], ["b", "a"], "the reference") is None
    assert task_mismatch(["a", "b"], ["a", "c"], "the reference") == (
        "the reference does not have the runs' tasks ['a', 'b']: it lacks ['b']; it has tasks the runs lack ['c']"
    )


def test_reference_run_is_read_or_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--reference_run .*: no such directory"):
        ReferenceRun.load(tmp_path / "missing", "--reference_run")
    with pytest.raises(ValueError, match="--reference_run .*: no task_report.json"):
        ReferenceRun.load(tmp_path, "--reference_run")
    (tmp_path / "task_report.json").write_text(json.dumps({"tasks": ["a", "b"], "eval_task_loss": {"a": 1.0}}))
    partial = ReferenceRun.load(tmp_path, "--reference_run")
    with pytest.raises(ValueError, match=r"no held-out loss for task\(s\) \['b'\]"):
        partial.reference_losses(["a", "b"])
    (tmp_path / "task_report.json").write_text(json.dumps(report(1.0, 2.0)))
    assert ReferenceRun.load(tmp_path, "--reference_run").losses == {"a": 1.0, "b": 2.0}


def test_task_report_scores_against_the_runs_reference(tmp_path: Path) -> None:
    tasks = list(DEFAULT_POS_TASKS)
    losses = {name: 2.0 + i for i, name in enumerate(tasks)}  # 2, 3, 4, ...
    reference = [loss - (0.5 if i == 0 else 0.1) for i, loss in enumerate(losses.values())]  # task 0: +0.5 excess
    metrics = {f"eval_task_loss/{name}": loss for name, loss in losses.items()}
    settings = {"weighting": "minimax", "settings": {"weighting": "minimax", "reference_losses": reference}}
    scored = task_report(tasks, [], metrics, settings)
    assert scored["reference_losses"] == dict(zip(tasks, reference, strict=True))
    assert list(scored["scores"]) == ["raw", "excess"]
    assert scored["scores"]["raw"]["worst_task"] == tasks[-1]
    excess = scored["scores"]["excess"]
    assert (excess["worst_task"], excess["worst"]) == (tasks[0], pytest.approx(0.5))
    mean_excess = (0.5 + 0.1 * (len(tasks) - 1)) / len(tasks)
    assert excess["mean"] == pytest.approx(mean_excess)
    plain = task_report(tasks, [], metrics, {"weighting": "average", "settings": {"weighting": "average"}})
    assert plain["reference_losses"] is None and list(plain["scores"]) == ["raw"]

    content = ModelCardContent(
        architecture="BertForMaskedLM",
        tasks=pos_tasks(dict(DEFAULT_POS_TASKS), unassigned_tags=[], tagger="a tagger"),
        report={**scored, "final_weights": {}},
    )
    card = render_model_card(tmp_path, content)
    body = card.text
    assert "**Excess over the reference" in body
    assert f"mean {mean_excess:.4f} · worst 0.5000 ({tasks[0]}).**" in body
    row = next(line for line in body.splitlines() if line.startswith(f"| {tasks[0]} |"))
    assert row.rstrip().endswith("| 2.0000 | 0.5000 |")  # held-out loss, then its excess
    metrics_in_card = {r.metric_name: r.metric_value for r in card.data.eval_results}
    assert metrics_in_card["worst task excess MLM loss over the reference"] == 0.5
    assert metrics_in_card["mean task excess MLM loss over the reference"] == round(mean_excess, 4)
    plain_body = render_model_card(tmp_path, ModelCardContent(**{**content.__dict__, "report": plain})).text
    assert "excess" not in plain_body


def test_console_line_names_the_worst_task_by_excess() -> None:
    reference = {"a": 0.5, "b": 2.9}
    train = {"step": 3, "loss": 2.0, "task_loss/a": 1.0, "task_loss/b": 3.0, "task_weight/b": 0.7}
    # raw worst b (3.0); excess a 0.5, b 0.1 -> mean 0.3, worst a
    assert summarise_log(train, 10, reference) == (
        "step 3/10 | loss 2.0000 | worst task b 3.0000 (weight 0.700) | excess mean +0.3000, worst +0.5000 (a)"
    )
    evaluation = {"eval_mean_task_loss": 2.0, "eval_worst_task_loss": 3.0, "eval_task_loss/a": 1.0}
    evaluation["eval_task_loss/b"] = 3.0
    assert summarise_log(evaluation, 10, reference) == (
        "eval mean task loss 2.0000 | worst 3.0000 (b) | eval excess mean +0.3000, worst +0.5000 (a)"
    )
    assert summarise_log(evaluation, 10) == "eval mean task loss 2.0000 | worst 3.0000 (b)"


@pytest.mark.slow
def test_recipe_run_against_a_reference_reports_its_excess(pretrained_run, tmp_path: Path, capfd) -> None:  # noqa: F811
    """A tiny PoS run trained with loss_normalization='excess' against the shared demo run's held-out losses: its
    task report, card and console state the signed excess of every task, derived from the two reports."""
    reference_dir, _ = pretrained_run
    reference = ReferenceRun.load(reference_dir).losses
    output_dir = tmp_path / "excess"
    values = [str(reference[task]) for task in reference]
    capfd.readouterr()
    result = recipe.run(argv(output_dir, "--loss_normalization", "excess", "--reference_losses", *values))
    console = capfd.readouterr().out
    report = json.loads((output_dir / "task_report.json").read_text())
    assert report == json.loads(json.dumps(result["report"]))
    losses = report["eval_task_loss"]
    excess = {task: losses[task] - reference[task] for task in reference}
    worst = max(excess, key=excess.get)
    scores = report["scores"]
    assert scores["excess"]["tasks"] == pytest.approx(excess, abs=1e-12)
    assert scores["excess"]["worst_task"] == worst and scores["raw"]["worst_task"] == report["worst_task"]
    mean = sum(excess.values()) / len(excess)
    assert scores["excess"]["mean"] == pytest.approx(mean)
    assert f"held-out scores: raw mean {report['eval_mean_task_loss']:.4f}" in console
    assert f"excess mean {mean:+.4f}, worst {excess[worst]:+.4f} ({worst})" in console
    assert f"eval excess mean {mean:+.4f}, worst {excess[worst]:+.4f} ({worst})" in console  # the evaluation's line
    card = (output_dir / "README.md").read_text()
    assert f"mean {mean:.4f} · worst {excess[worst]:.4f} ({worst}).**" in card


def test_suite_upstream_rows(tmp_path: Path) -> None:
    """The downstream suite's summary scores each checkpoint's pre-training run from its task_report.json."""
    runs = {"base": (2.0, 4.0), "robust": (2.4, 3.6), "other": (1.0, 1.0)}
    for name, (a, b) in runs.items():
        (tmp_path / name).mkdir()
        report_of = {**report(a, b), "settings": {"reference_losses": [1.5, 3.5]}}
        if name == "other":
            report_of = {"tasks": ["x", "y"], "eval_task_loss": {"x": a, "y": b}}
        (tmp_path / name / "task_report.json").write_text(json.dumps(report_of))
    checkpoints = [str(tmp_path / name) for name in runs] + ["org/hub-model"]  # a Hub id has no report
    cells = [
        {"checkpoint": checkpoint, "task": "rte", "seed": 1, "score": 60.0 + i, "metrics": {}}
        for i, checkpoint in enumerate(checkpoints)
    ]
    summary = summarize_suite(cells, [Row("rte", "RTE")], [1], checkpoints[0])
    upstream = summary["upstream"]
    assert upstream["tasks"] == ["a", "b"] and upstream["skipped"] == [checkpoints[2]]
    assert upstream["baseline"] == checkpoints[0] and upstream["reference_losses"] == {"a": 1.5, "b": 3.5}
    robust = {metric: upstream["scores"][metric][checkpoints[1]] for metric in ("raw", "excess", "regret")}
    # raw (2.4, 3.6): mean 3.0, worst b; excess over (1.5, 3.5): (0.9, 0.1), worst a; regret (1.2, 0.9), worst a
    assert robust["raw"]["mean"]["mean"] == pytest.approx(3.0) and robust["raw"]["worst_tasks"] == ["b"]
    assert robust["excess"]["worst"]["mean"] == pytest.approx(0.9) and robust["excess"]["worst_tasks"] == ["a"]
    assert robust["regret"]["tasks"]["b"]["mean"] == pytest.approx(0.9) and robust["regret"]["worst_tasks"] == ["a"]
    assert upstream["scores"]["regret"][checkpoints[0]]["worst"]["mean"] == 1.0
    markdown = suite_markdown(summary)
    assert "Upstream: held-out scores of each checkpoint's pre-training run" in markdown
    assert "Not scored (other tasks than ['a', 'b']): other." in markdown
    assert "| robust | 2.4000 | 3.6000 | 3.0000 | 3.6000 (b) |" in markdown
    assert "| robust | +0.9000 | +0.1000 | +0.5000 | +0.9000 (a) |" in markdown
    assert "| robust | 1.2000 | 0.9000 | 1.0500 | 1.2000 (a) |" in markdown
    assert "Metric: regret L_t / L_t(baseline) (lower is better; the baseline is 1 on every task); baseline: base." in (
        markdown
    )
    hub_only = summarize_suite(cells[3:], [Row("rte", "RTE")], [1], None)
    assert hub_only["upstream"] is None and "Upstream" not in suite_markdown(hub_only)
