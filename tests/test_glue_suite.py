"""glue_suite: table (mean ± std, average, worst task, deltas), resume by counting runs, model cards, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from huggingface_hub import ModelCard
from test_glue_support import make_tiny_bert

from robust_pretrain.glue import GlueDataArguments, GlueTrainingArguments, LoraArguments, suite
from robust_pretrain.glue.suite import GlueSuiteArguments, run_suite

# Primary scores (0-1) per (checkpoint, task, seed): base is worst on CoLA, robust on RTE.
SCORES = {
    ("base", "rte"): {1: 0.60, 2: 0.62},
    ("base", "cola"): {1: 0.30, 2: 0.34},
    ("base", "stsb"): {1: 0.80, 2: 0.80},
    ("robust", "rte"): {1: 0.58, 2: 0.60},
    ("robust", "cola"): {1: 0.62, 2: 0.64},
    ("robust", "stsb"): {1: 0.79, 2: 0.81},
}
USER_CARD = """---
license: mit
tags:
- my-tag
custom_field: keep me
model-index:
- name: base
  results:
  - task:
      type: question-answering
    dataset:
      name: SQuAD
      type: squad
    metrics:
    - type: f1
      value: 88.0
  - task:
      type: text-classification
    dataset:
      name: GLUE RTE
      type: nyu-mll/glue
      config: rte
      split: validation
    metrics:
    - type: accuracy
      value: 71.0
      name: my own RTE run
---
# Base model

Hand-written notes that must survive.
"""


class FakeFinetune:
    """Stands in for run_finetune: returns SCORES and counts calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def __call__(self, run_args, data_args, lora_args, training_args, save_model) -> dict[str, float]:
        name, task, seed = Path(run_args.model_name_or_path).name, run_args.task_name, training_args.seed
        self.calls.append((name, task, seed))
        score = SCORES[(name, task)][seed]
        metric = {"rte": "accuracy", "cola": "matthews_correlation", "stsb": "spearmanr"}[task]
        extra = {"eval_pearson": score - 0.01} if task == "stsb" else {}
        return {f"eval_{metric}": score, "eval_loss": 0.5, **extra}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeFinetune:
    runner = FakeFinetune()
    monkeypatch.setattr(suite, "run_finetune", runner)
    return runner


@pytest.fixture
def checkpoints(tmp_path: Path) -> dict[str, Path]:
    paths = {}
    for name in ("base", "robust"):
        paths[name] = tmp_path / name
        paths[name].mkdir()
        (paths[name] / "config.json").write_text("{}")
    (paths["base"] / "README.md").write_text(USER_CARD)
    return paths


def _run(checkpoints: dict[str, Path], out: Path, lora: LoraArguments | None = None, **training) -> dict:
    args = GlueSuiteArguments(
        checkpoints=[str(checkpoints["robust"])],
        baseline=str(checkpoints["base"]),
        tasks=["rte", "cola", "stsb"],
        seeds=[1, 2],
    )
    training_args = GlueTrainingArguments(output_dir=str(out), **training)
    return run_suite(args, GlueDataArguments(), lora or LoraArguments(), training_args)


def test_table_worst_case_and_deltas(fake: FakeFinetune, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    summary = _run(checkpoints, tmp_path / "suite")
    assert len(fake.calls) == 12
    base = summary["checkpoints"][str(checkpoints["base"])]
    robust = summary["checkpoints"][str(checkpoints["robust"])]
    assert base["tasks"]["rte"]["mean"] == pytest.approx(61.0)
    assert base["tasks"]["rte"]["std"] == pytest.approx(2**0.5)
    assert base["average"] == pytest.approx((61 + 32 + 80) / 3)
    assert (base["worst_task"], base["worst_score"]) == ("cola", pytest.approx(32.0))
    assert (robust["worst_task"], robust["worst_score"]) == ("rte", pytest.approx(59.0))
    assert robust["delta"]["worst_score"] == pytest.approx(27.0)
    assert robust["delta"]["tasks"] == {"rte": pytest.approx(-2.0), "cola": pytest.approx(31.0), "stsb": 0.0}
    assert robust["delta"]["average"] == pytest.approx((59 + 63 + 80 - 61 - 32 - 80) / 3)
    assert robust["tasks"]["stsb"]["metrics"] == {"spearmanr": pytest.approx(80.0), "pearson": pytest.approx(79.0)}

    assert json.loads((tmp_path / "suite" / "glue_suite.json").read_text()) == json.loads(json.dumps(summary))
    markdown = (tmp_path / "suite" / "glue_suite.md").read_text()
    assert "| base | 61.0 ± 1.4 | 32.0 ± 2.8 | 80.0 ± 0.0 | 57.7 | 32.0 (CoLA) |" in markdown
    assert "| robust | 59.0 ± 1.4 | 63.0 ± 1.4 | 80.0 ± 1.4 | 67.3 | 59.0 (RTE) |" in markdown
    assert "| robust | -2.0 | +31.0 | +0.0 | +9.7 | +27.0 |" in markdown


def test_model_cards_keep_user_content(fake: FakeFinetune, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    _run(checkpoints, tmp_path / "suite")
    _run(checkpoints, tmp_path / "suite")  # refreshing must not duplicate entries
    card = ModelCard.load(checkpoints["base"] / "README.md")
    assert card.text.strip() == "# Base model\n\nHand-written notes that must survive."
    assert card.data.license == "mit" and card.data.tags == ["my-tag"]
    assert card.data.to_dict()["custom_field"] == "keep me"
    results = {
        (r.dataset_config, r.dataset_name, r.metric_type, r.metric_name): r.metric_value for r in card.data.eval_results
    }
    assert results[(None, "SQuAD", "f1", None)] == 88.0
    assert results[("rte", "GLUE RTE", "accuracy", "my own RTE run")] == 71.0
    ours = {(cfg, metric): value for (cfg, _, metric, name), value in results.items() if name and "mean over 2" in name}
    assert ours == {("rte", "accuracy"): 61.0, ("cola", "matthews_correlation"): 32.0, ("stsb", "spearmanr"): 80.0,
                    ("stsb", "pearson"): 79.0}  # fmt: skip
    assert len(card.data.eval_results) == 6

    _run(checkpoints, tmp_path / "lora-suite", lora=LoraArguments(use_lora=True))  # kept apart from full fine-tuning
    card = ModelCard.load(checkpoints["base"] / "README.md")
    assert len(card.data.eval_results) == 10
    assert sum("lora fine-tuning" in (r.metric_name or "") for r in card.data.eval_results) == 4

    created = ModelCard.load(checkpoints["robust"] / "README.md")
    assert created.data.model_name == "robust"
    assert {(r.dataset_config, r.metric_type): r.metric_value for r in created.data.eval_results}[
        ("rte", "accuracy")
    ] == 59.0


def test_resume_counts_runs(fake: FakeFinetune, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    first = _run(checkpoints, tmp_path / "suite")
    assert len(fake.calls) == 12
    assert _run(checkpoints, tmp_path / "suite") == first
    assert len(fake.calls) == 12  # everything reused
    cells = sorted((tmp_path / "suite" / "cells").glob("robust-*/cola/seed2/cell.json"))
    assert len(cells) == 1
    cells[0].unlink()
    _run(checkpoints, tmp_path / "suite")
    assert fake.calls[12:] == [("robust", "cola", 2)]
    _run(checkpoints, tmp_path / "suite", learning_rate=3e-5)  # changed settings invalidate every cell
    assert len(fake.calls) == 13 + 12


def test_bad_input_fails_before_any_run(
    fake: FakeFinetune, checkpoints: dict[str, Path], tmp_path: Path, shared_data: Path
) -> None:
    training = GlueTrainingArguments(output_dir=str(tmp_path / "suite"))
    missing = GlueSuiteArguments(checkpoints=[str(checkpoints["base"]), str(tmp_path / "nope")], tasks=["rte"])
    with pytest.raises(FileNotFoundError, match="nope.*does not exist"):
        run_suite(missing, GlueDataArguments(), LoraArguments(), training)
    absent_task = GlueSuiteArguments(checkpoints=[str(checkpoints["base"])], tasks=["rte", "qqp"])
    with pytest.raises(FileNotFoundError, match="QQP/train.tsv not found"):
        run_suite(absent_task, GlueDataArguments(glue_dir=str(shared_data / "glue")), LoraArguments(), training)
    assert fake.calls == []
    with pytest.raises(ValueError, match="Unknown GLUE task 'glue'"):
        GlueSuiteArguments(checkpoints=["x"], tasks=["glue"])
    with pytest.raises(ValueError, match="--seeds has duplicates"):
        GlueSuiteArguments(checkpoints=["x"], seeds=[1, 1])


def test_cli_with_config_runs_real_cells(tmp_path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    first, second = make_tiny_bert(tmp_path / "tiny-a", seed=0), make_tiny_bert(tmp_path / "tiny-b", seed=1)
    calls = []
    real = suite.run_finetune
    monkeypatch.setattr(
        suite, "run_finetune", lambda *args, **kwargs: calls.append(args[0].task_name) or real(*args, **kwargs)
    )
    config = {
        "checkpoints": [str(second)],
        "baseline": str(first),
        "tasks": ["rte", "wnli"],
        "seeds": [3],
        "glue_dir": str(shared_data / "glue"),
        "max_train_samples": 16,
        "max_eval_samples": 16,
        "max_steps": 1,
        "output_dir": str(tmp_path / "suite"),
    }
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(config))
    argv = ["--config", str(tmp_path / "suite.yaml"), "--disable_tqdm", "true"]
    summary = suite.main(argv)
    assert calls == ["rte", "wnli", "rte", "wnli"]
    for cell_file in (tmp_path / "suite" / "cells").glob("*/*/seed3/cell.json"):
        cell = json.loads(cell_file.read_text())
        saved = json.loads((cell_file.parent / "eval_results.json").read_text())
        assert cell["primary_score"] == pytest.approx(100 * saved["eval_accuracy"])
        assert saved["eval_samples"] == 16
        assert not (cell_file.parent / "model.safetensors").exists()
    assert len(list((tmp_path / "suite" / "cells").glob("*/*/seed3/cell.json"))) == 4
    assert summary["checkpoints"][str(second)]["worst_task"] in ("rte", "wnli")
    assert "Δ worst" in (tmp_path / "suite" / "glue_suite.md").read_text()
    suite.main(argv)
    assert len(calls) == 4


def test_checkpoint_spellings_and_label_collisions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for run in ("a", "b"):
        (tmp_path / run / "final").mkdir(parents=True)
        (tmp_path / run / "final" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    args = GlueSuiteArguments(checkpoints=["a/final", "b/final"], baseline=str(tmp_path / "a" / "final"), tasks=["rte"])
    assert args.checkpoints == ["a/final", "b/final"] and args.baseline == "a/final"
    with pytest.raises(ValueError, match="--checkpoints has duplicates"):
        GlueSuiteArguments(checkpoints=["a/final", "./a/final"], tasks=["rte"])
    cells = [
        {
            "checkpoint": name,
            "task": "rte",
            "seed": 1,
            "primary_score": score,
            "eval_metrics": {"eval_accuracy": score / 100},
        }
        for name, score in (("a/final", 50.0), ("b/final", 60.0))
    ]
    summary = suite.summarize(cells, ["rte"], [1], "a/final")
    assert [entry["label"] for entry in summary["checkpoints"].values()] == ["a/final", "b/final"]
    assert "| b/final | +10.0 | +10.0 | +10.0 |" in suite.render_markdown(summary)
