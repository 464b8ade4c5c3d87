"""The suite serves any task family: a toy dense family (per-pixel segmentation, classification, depth) registered at
run time, with real fine-tuning of a tiny torch encoder on generated images, run through the same command as GLUE."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from robust_pretrain.evaluation import suite
from robust_pretrain.evaluation.checkpoints import checkpoint_key
from robust_pretrain.evaluation.tasks import (
    ModelIndexTarget,
    RunSettings,
    SuiteTask,
    TaskFamily,
    TaskRunResult,
    get_family,
    register_family,
)
from robust_pretrain.reporting.aggregation import summarize_suite

CLASSES, CHANNELS, SIZE, FEATURES = 3, 3, 4, 8


@dataclass
class ToyDenseArguments:
    output_dir: str = field(metadata={"help": "Suite directory."})
    learning_rate: float = field(default=0.05, metadata={"help": "Adam learning rate."})
    max_steps: int = field(default=25, metadata={"help": "Training steps."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Evaluate the first N images only."})


def _images(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images; a pixel's class is its brightest channel, its depth the sum of its channels."""
    images = torch.rand(count, CHANNELS, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))
    return images, images.argmax(dim=1)


def _targets(kind: str, images: torch.Tensor, pixel_classes: torch.Tensor) -> torch.Tensor:
    if kind == "semseg":
        return pixel_classes
    if kind == "classification":
        return images.mean(dim=(2, 3)).argmax(dim=1)
    return images.sum(dim=1)


def mean_iou(predictions: np.ndarray, labels: np.ndarray) -> float:
    ious = []
    for label in range(CLASSES):
        union = np.sum((predictions == label) | (labels == label))
        if union:
            ious.append(np.sum((predictions == label) & (labels == label)) / union)
    return 100.0 * float(np.mean(ious))


def _score(kind: str, predictions: np.ndarray, labels: np.ndarray) -> float:
    if kind == "semseg":
        return mean_iou(predictions, labels)
    if kind == "classification":
        return 100.0 * float(np.mean(predictions == labels))
    return float(np.sqrt(np.mean((predictions - labels) ** 2)))


def read_predictions(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``index  prediction  label`` rows; dense values are space-separated pixel values."""
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:]]
    return tuple(np.array([[float(v) for v in row[column].split()] for row in rows]) for column in (1, 2))


def run_toy_task(
    kind: str, checkpoint: str, seed: int, output_dir: Path, options: Sequence[Any], save_model: bool
) -> TaskRunResult:
    """Fine-tune the checkpoint's 1x1-conv encoder with a fresh head; evaluate on held-out generated images."""
    (args,) = options
    torch.manual_seed(seed)
    encoder = nn.Conv2d(CHANNELS, FEATURES, 1)
    encoder.load_state_dict(torch.load(Path(checkpoint) / "encoder.pt"))
    outputs = 1 if kind == "depth" else CLASSES
    head = nn.Conv2d(FEATURES, outputs, 1)
    optimizer = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=args.learning_rate)
    train_images, train_classes = _images(64, seed=0)
    train_targets = _targets(kind, train_images, train_classes)

    def forward(images: torch.Tensor) -> torch.Tensor:
        logits = head(torch.relu(encoder(images)))
        return logits.mean(dim=(2, 3)) if kind == "classification" else logits.squeeze(1) if kind == "depth" else logits

    for _ in range(args.max_steps):
        batch = torch.randint(0, 64, (16,))
        output = forward(train_images[batch])
        target = train_targets[batch]
        loss = (
            nn.functional.mse_loss(output, target) if kind == "depth" else nn.functional.cross_entropy(output, target)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    eval_images, eval_classes = _images(args.max_eval_samples or 12, seed=1)
    with torch.no_grad():
        output = forward(eval_images)
    predictions = (output if kind == "depth" else output.argmax(dim=1)).numpy()
    labels = _targets(kind, eval_images, eval_classes).numpy()
    lines = ["index\tprediction\tlabel"] + [
        f"{i}\t{' '.join(map(repr, p.ravel().tolist()))}\t{' '.join(map(repr, y.ravel().tolist()))}"
        for i, (p, y) in enumerate(
            zip(predictions.reshape(len(labels), -1), labels.reshape(len(labels), -1), strict=True)
        )
    ]
    (output_dir / f"predictions_{kind}.txt").write_text("\n".join(lines) + "\n")
    if save_model:
        torch.save({"encoder": encoder.state_dict(), "head": head.state_dict()}, output_dir / "model.pt")
    score = _score(kind, predictions.astype(np.float64), labels.astype(np.float64))
    return TaskRunResult(metrics={TOY_METRICS[kind]: score}, prediction_files=(f"predictions_{kind}.txt",))


TOY_METRICS = {"semseg": "mean_iou", "classification": "accuracy", "depth": "rmse"}


def _toy_row(kind: str) -> SuiteTask:
    metric = TOY_METRICS[kind]
    target = ModelIndexTarget(
        task_type=f"toy-{kind}", dataset_type="generated", dataset_name="toy", dataset_split="eval"
    )
    return SuiteTask(
        name=kind,
        family="toy-dense",
        display_name=kind.capitalize(),
        primary_metric=metric,
        higher_is_better=kind != "depth",
        run=lambda *args, **kwargs: run_toy_task(kind, *args, **kwargs),
        card_metrics={metric: (metric, target)},
    )


def _check_toy_inputs(checkpoints: Sequence[str], tasks: Sequence[SuiteTask], options: Sequence[Any]) -> None:
    for checkpoint in checkpoints:
        if not (Path(checkpoint) / "encoder.pt").is_file():
            raise FileNotFoundError(f"{checkpoint}: no encoder.pt")


def _toy_settings(options: Sequence[Any]) -> RunSettings:
    (args,) = options
    settings = {k: v for k, v in dataclasses.asdict(args).items() if k != "output_dir"}
    limits = {} if args.max_eval_samples is None else {"max_eval_samples": args.max_eval_samples}
    return RunSettings(settings=settings, limits=limits)


TOY_FAMILY = TaskFamily(
    name="toy-dense",
    description="Toy dense scores",
    tasks=tuple(_toy_row(kind) for kind in TOY_METRICS),
    default_tasks=("semseg", "classification"),
    option_types=(ToyDenseArguments,),
    run_settings=_toy_settings,
    check_inputs=_check_toy_inputs,
)


@pytest.fixture
def toy_checkpoints(tmp_path: Path) -> dict[str, Path]:
    register_family(TOY_FAMILY)
    paths = {}
    for name, seed in (("random", 0), ("other", 1)):
        torch.manual_seed(seed)
        paths[name] = tmp_path / name
        paths[name].mkdir()
        torch.save(nn.Conv2d(CHANNELS, FEATURES, 1).state_dict(), paths[name] / "encoder.pt")
    return paths


def _argv(checkpoints: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["--family", "toy-dense", "--checkpoints", str(checkpoints["other"]), "--baseline",
            str(checkpoints["random"]), "--seeds", "1", "2", "--output_dir", str(out), *extra]  # fmt: skip


def _cell_dir(out: Path, cell: dict) -> Path:
    return out / "cells" / checkpoint_key(cell["checkpoint"]) / cell["task"] / f"seed{cell['seed']}"


def test_dense_family_through_the_suite_command(toy_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    torch.set_num_threads(1)
    out = tmp_path / "suite"
    summary = suite.run(_argv(toy_checkpoints, out))
    assert summary["tasks"] == ["semseg", "classification"] and summary["family"] == "toy-dense"
    cells = [json.loads(path.read_text()) for path in sorted((out / "cells").glob("*/*/seed*/cell.json"))]
    assert len(cells) == 8
    for cell in cells:  # the reported score is the metric recomputed from the per-example predictions
        predictions, labels = read_predictions(_cell_dir(out, cell) / cell["prediction_files"][0])
        assert len(predictions) == 12 and cell["score"] == _score(cell["task"], predictions, labels)
    for checkpoint, entry in summary["checkpoints"].items():
        scores = {
            task: [c["score"] for c in cells if c["checkpoint"] == checkpoint and c["task"] == task]
            for task in ("semseg", "classification")
        }
        means = {task: float(np.mean(values)) for task, values in scores.items()}
        assert entry["tasks"]["semseg"]["std"] == pytest.approx(float(np.std(scores["semseg"], ddof=1)))
        assert entry["average"] == pytest.approx(np.mean(list(means.values())))
        assert entry["worst_task"] == min(means, key=means.get)
        assert entry["worst_score"] == pytest.approx(min(means.values()))
    other = summary["checkpoints"][str(toy_checkpoints["other"])]
    random = summary["checkpoints"][str(toy_checkpoints["random"])]
    assert other["delta"]["worst_score"] == pytest.approx(other["worst_score"] - random["worst_score"])
    markdown = (out / "toy-dense_suite.md").read_text()
    assert "| checkpoint | Semseg (mean_iou) | Classification (accuracy) | average | worst task |" in markdown
    worst = other["worst_task"].capitalize()
    assert f"| {other['average']:.1f} | {other['worst_score']:.1f} ({worst}) |" in markdown
    index = json.loads(next((out / "model_cards").glob("other-*/model_index.json")).read_text())
    assert {r["metrics"][0]["type"] for r in index["model-index"][0]["results"]} == {"mean_iou", "accuracy"}
    assert not (toy_checkpoints["other"] / "README.md").exists()

    assert suite.run(_argv(toy_checkpoints, out)) == summary  # every cell reused
    before = {path: path.stat().st_mtime_ns for path in (out / "cells").glob("*/semseg/*/cell.json")}
    changed = suite.run(_argv(toy_checkpoints, out, "--learning_rate", "0.02"))
    assert {path: path.stat().st_mtime_ns for path in (out / "cells").glob("*/semseg/*/cell.json")} != before
    assert (
        changed["checkpoints"][str(toy_checkpoints["other"])]["tasks"]["semseg"]["scores"]
        != (other["tasks"]["semseg"]["scores"])
    )


def test_lower_is_better_tasks_and_bad_selections(
    toy_checkpoints: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.set_num_threads(1)
    summary = suite.run(_argv(toy_checkpoints, tmp_path / "depth", "--tasks", "depth", "--max_eval_samples", "5"))
    entry = summary["checkpoints"][str(toy_checkpoints["other"])]
    assert entry["worst_task"] == "depth" and summary["higher_is_better"] is False
    assert summary["limits"] == {"max_eval_samples": 5}
    markdown = (tmp_path / "depth" / "toy-dense_suite.md").read_text()
    assert "worst task = highest mean score" in markdown and "max_eval_samples=5" in markdown

    family = get_family("toy-dense")
    depth = family.task("depth")
    tasks = [depth, dataclasses.replace(depth, name="depth2", display_name="Depth2")]
    cells = [{"checkpoint": "a", "task": task, "seed": 1, "score": rmse, "metrics": {"rmse": rmse}}
             for task, rmse in (("depth", 0.5), ("depth2", 0.7))]  # fmt: skip
    lower = summarize_suite(cells, tasks, [1], None)["checkpoints"]["a"]
    assert (lower["worst_task"], lower["worst_score"], lower["average"]) == ("depth2", 0.7, pytest.approx(0.6))
    with pytest.raises(ValueError, match="mix metrics where higher is better with metrics where lower is better"):
        suite.SuiteArguments(checkpoints=["a"], family="toy-dense", tasks=["depth", "semseg"])
    with pytest.raises(ValueError, match="Unknown toy-dense task 'rte'; expected one of: semseg, classification"):
        suite.SuiteArguments(checkpoints=["a"], family="toy-dense", tasks=["rte"])
    with pytest.raises(ValueError, match="unknown option --glue_dir"):
        suite.run(_argv(toy_checkpoints, tmp_path / "bad", "--glue_dir", "x"))
    with pytest.raises(FileNotFoundError, match="no encoder.pt"):
        suite.run(["--family", "toy-dense", "--checkpoints", str(tmp_path), "--output_dir", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()
    nope = tmp_path / "runs" / "nope"
    missing = ["--checkpoints", str(toy_checkpoints["other"]), "--baseline", str(nope), "--output_dir", "x"]
    assert suite.main(["--family", "toy-dense", *missing]) == 2
    error = capsys.readouterr().err
    assert f"robust-pretrain-suite: error: --baseline {nope}: no such checkpoint directory" in " ".join(error.split())
    assert "Traceback" not in error
