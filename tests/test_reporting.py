"""Task report and trajectory plot of a real (tiny) MinimaxTrainer run, including runs shorter than logging_steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_training import TASKS, as_dataset, masked_examples, tiny_bert

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments
from robust_pretrain.reporting import plot_task_trajectories, task_report, trajectory_figure
from robust_pretrain.reporting.cards import ModelCardContent, pos_tasks, render_model_card


def train(tmp_path: Path, max_steps: int, logging_steps: int, logging_strategy: str = "steps") -> MinimaxTrainer:
    args = MinimaxTrainingArguments(
        output_dir=str(tmp_path / "out"),
        task_names=TASKS,
        weighting="minimax",
        alpha=5.0,
        per_device_train_batch_size=4,
        max_steps=max_steps,
        logging_steps=logging_steps,
        logging_strategy=logging_strategy,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        seed=7,
        disable_tqdm=True,
        save_strategy="no",
    )
    trainer = MinimaxTrainer(model=tiny_bert(), args=args, train_dataset=as_dataset(masked_examples(16)))
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> MinimaxTrainer:
    """2 optimizer steps logging no training step (MinimaxTrainer logs the last step of a run shorter than
    logging_steps, so only logging_strategy 'no' leaves the log without any)."""
    return train(tmp_path_factory.mktemp("short"), max_steps=2, logging_steps=5, logging_strategy="no")


def test_short_run_reports_its_final_weights(short_run: MinimaxTrainer, tmp_path: Path) -> None:
    history = short_run.state.log_history
    assert not any("task_weight/verb" in entry for entry in history)  # the situation of the issue
    final = short_run.step_weights.tolist()
    assert len(set(final)) > 1 and sum(final) == pytest.approx(1.0)  # minimax weights, not uniform

    report = task_report(TASKS, history, {}, {"weighting": "minimax"}, final_weights=final)

    assert report["train_steps"] == 2
    assert report["final_weights"] == dict(zip(TASKS, final, strict=True))
    content = ModelCardContent(
        architecture="BertForMaskedLM",
        tasks=pos_tasks({name: ["NOUN"] for name in TASKS}, unassigned_tags=[], tagger="a tagger"),
        report=report,
    )
    body = render_model_card(tmp_path, content).text
    for name, weight in zip(TASKS, final, strict=True):
        row = next(line for line in body.splitlines() if line.startswith(f"| {name} | "))
        assert row.split("|")[3].strip() == f"{weight:.4f}"  # no "n/a" weight in the card


def test_short_run_plot_says_there_is_nothing_to_draw(short_run: MinimaxTrainer, tmp_path: Path) -> None:
    figure = trajectory_figure(TASKS, short_run.state.log_history)

    for axes in figure.axes:
        assert not axes.lines
        (text,) = axes.texts
        assert text.get_text().startswith("nothing to draw: no task")
        assert "the run's 2 steps ended before its first logging step" in text.get_text()
    path = plot_task_trajectories(TASKS, short_run.state.log_history, tmp_path / "task_weights.png")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_logged_weights_win_when_the_log_reaches_the_last_step(tmp_path: Path) -> None:
    trainer = train(tmp_path, max_steps=2, logging_steps=2)
    (logged,) = [entry for entry in trainer.state.log_history if "task_weight/verb" in entry]
    assert logged["step"] == 2

    report = task_report(TASKS, trainer.state.log_history, {}, {}, final_weights=[0.0, 0.0, 1.0])
    assert report["final_weights"] == {name: logged[f"task_weight/{name}"] for name in TASKS}

    figure = trajectory_figure(TASKS, trainer.state.log_history)
    weights_axes, loss_axes = figure.axes
    assert not weights_axes.texts and len(weights_axes.lines) == len(TASKS)
    for line in weights_axes.lines:  # one logged step: a marked point, not an invisible one-point line
        assert list(line.get_xdata()) == [2] and line.get_marker() == "o"
    assert {line.get_label() for line in loss_axes.lines} <= set(TASKS) and loss_axes.get_legend() is not None


def test_plot_names_no_logging_reason_when_steps_were_logged() -> None:
    history = [{"step": 5, "loss": 2.0, "task_weight/verb": 1.0, "task_weight/noun": 0.0}]  # no task losses logged
    weights_axes, loss_axes = trajectory_figure(["verb", "noun"], history).axes

    assert len(weights_axes.lines) == 2 and not weights_axes.texts
    assert [text.get_text() for text in loss_axes.texts] == ["nothing to draw: no task losses were logged"]


def test_final_weights_without_any_step_are_ignored() -> None:
    report = task_report(TASKS, [], {}, {}, final_weights=[0.2, 0.3, 0.5])
    assert report["final_weights"] == {} and report["train_steps"] == 0
