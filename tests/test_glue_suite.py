"""The suite on GLUE rows: table (mean ± std, average, worst task, deltas), resume by counting runs, model
cards (suite directory by default, never foreign or read-only checkpoints), limits, predictions, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from glue_support import make_tiny_bert
from huggingface_hub import ModelCard
from ports import free_port
from processes import checkout_env

from robust_pretrain.cli import UsageError
from robust_pretrain.evaluation import glue_tasks, suite
from robust_pretrain.evaluation.suite import SuiteArguments, run_suite
from robust_pretrain.glue import (
    GlueDataArguments,
    GlueTrainingArguments,
    LoraArguments,
    load_glue_metric,
    read_predictions,
)
from robust_pretrain.reporting.aggregation import summarize_suite
from robust_pretrain.reporting.tables import suite_markdown

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
    """Stands in for run_finetune: returns SCORES, writes the predictions file and counts calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def __call__(self, run_args, data_args, lora_args, training_args, save_model) -> dict[str, float]:
        name, task, seed = Path(run_args.model_name_or_path).name, run_args.task_name, training_args.seed
        self.calls.append((name, task, seed))
        (Path(training_args.output_dir) / f"predict_results_{task}.txt").write_text("index\tprediction\tlabel\n")
        score = SCORES[(name, task)][seed]
        metric = {"rte": "accuracy", "cola": "matthews_correlation", "stsb": "spearmanr"}[task]
        extra = {"eval_pearson": score - 0.01} if task == "stsb" else {}
        return {f"eval_{metric}": score, "eval_loss": 0.5, **extra}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeFinetune:
    runner = FakeFinetune()
    monkeypatch.setattr(glue_tasks, "run_finetune", runner)
    return runner


@pytest.fixture
def checkpoints(tmp_path: Path) -> dict[str, Path]:
    paths = {}
    for name in ("base", "robust"):  # outputs of the pre-training recipe (they carry run_config.json)
        paths[name] = tmp_path / name
        paths[name].mkdir()
        (paths[name] / "config.json").write_text("{}")
        (paths[name] / "run_config.json").write_text("{}")
    (paths["base"] / "README.md").write_text(USER_CARD)
    return paths


def _run(
    checkpoints: dict[str, Path],
    out: Path,
    lora: LoraArguments | None = None,
    data: GlueDataArguments | None = None,
    update_model_cards: bool = True,
    **training,
) -> dict:
    args = SuiteArguments(
        checkpoints=[str(checkpoints["robust"])],
        baseline=str(checkpoints["base"]),
        tasks=["rte", "cola", "stsb"],
        seeds=[1, 2],
        update_model_cards=update_model_cards,
    )
    options = (
        data or GlueDataArguments(),
        lora or LoraArguments(),
        GlueTrainingArguments(output_dir=str(out), **training),
    )
    return run_suite(args, options)


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


def test_resume_counts_runs(
    fake: FakeFinetune, checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _run(checkpoints, tmp_path / "suite")
    assert len(fake.calls) == 12
    assert _run(checkpoints, tmp_path / "suite") == first
    assert len(fake.calls) == 12  # everything reused
    monkeypatch.chdir(tmp_path)  # the same checkpoints spelled as relative paths: reused, reported under that name
    args = SuiteArguments(checkpoints=["./robust"], baseline="base", tasks=["rte", "cola", "stsb"], seeds=[1, 2])
    options = (GlueDataArguments(), LoraArguments(), GlueTrainingArguments(output_dir=str(tmp_path / "suite")))
    relative = run_suite(args, options)
    assert len(fake.calls) == 12 and list(relative["checkpoints"]) == ["base", "./robust"]
    assert relative["checkpoints"]["./robust"]["delta"] == first["checkpoints"][str(checkpoints["robust"])]["delta"]
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
    options = (GlueDataArguments(), LoraArguments(), GlueTrainingArguments(output_dir=str(tmp_path / "suite")))
    missing = SuiteArguments(checkpoints=[str(checkpoints["base"]), str(tmp_path / "nope")], tasks=["rte"])
    with pytest.raises(UsageError, match="--checkpoints .*nope: no such checkpoint directory"):
        run_suite(missing, options)
    empty = SuiteArguments(checkpoints=[str(checkpoints["base"])], baseline=str(tmp_path), tasks=["rte"])
    with pytest.raises(UsageError, match="--checkpoints .* is not a saved model: it has no config.json"):
        run_suite(empty, options)
    absent_task = SuiteArguments(checkpoints=[str(checkpoints["base"])], tasks=["rte", "qqp"])
    with pytest.raises(UsageError, match="QQP/train.tsv not found"):
        run_suite(absent_task, (GlueDataArguments(glue_dir=str(shared_data / "glue")), *options[1:]))
    assert fake.calls == []
    with pytest.raises(ValueError, match="Unknown glue task 'glue'"):
        SuiteArguments(checkpoints=["x"], tasks=["glue"])
    with pytest.raises(ValueError, match="--seeds has duplicates"):
        SuiteArguments(checkpoints=["x"], seeds=[1, 1])
    with pytest.raises(ValueError, match="Unknown task family 'nlp'"):
        SuiteArguments(checkpoints=["x"], family="nlp")
    assert SuiteArguments(checkpoints=["x"]).tasks == ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte"]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def test_default_run_leaves_foreign_and_read_only_checkpoints_byte_identical(
    fake: FakeFinetune, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    for name in ("base", "robust"):
        (checkpoints[name] / "run_config.json").unlink()  # not recipe outputs
    (checkpoints["robust"] / "README.md").write_text("# robust\n")
    checkpoints["base"].chmod(0o555)  # read-only
    (checkpoints["base"] / "README.md").chmod(0o444)
    before = {name: _snapshot(path) for name, path in checkpoints.items()}
    try:
        _run(checkpoints, tmp_path / "suite", update_model_cards=False)
        assert {name: _snapshot(path) for name, path in checkpoints.items()} == before
        assert len(fake.calls) == 12
        with pytest.raises(ValueError, match="--update_model_cards refuses") as refused:
            _run(checkpoints, tmp_path / "suite2")
        assert "base: it is read-only" in str(refused.value)
        assert "robust: it is not an output directory of this project's recipes" in str(refused.value)
        assert len(fake.calls) == 12 and not (tmp_path / "suite2").exists()  # refused before any cell
    finally:
        checkpoints["base"].chmod(0o755)
    assert {name: _snapshot(path) for name, path in checkpoints.items()} == before

    # The results are in the suite directory: a model-index JSON and a card fragment per checkpoint.
    key = next((tmp_path / "suite" / "model_cards").glob("robust-*"))
    index = json.loads((key / "model_index.json").read_text())
    assert index["checkpoint"] == str(checkpoints["robust"]) and index["model-index"][0]["name"] == "robust"
    fragment = ModelCard.load(key / "README.md")
    values = {(r.dataset_config, r.metric_type): r.metric_value for r in fragment.data.eval_results}
    assert values == {("rte", "accuracy"): 59.0, ("cola", "matthews_correlation"): 63.0, ("stsb", "pearson"): 79.0,
                      ("stsb", "spearmanr"): 80.0}  # fmt: skip


def test_update_model_cards_refuses_cache_and_installed_locations(
    fake: FakeFinetune, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    from huggingface_hub import constants

    snapshot = Path(constants.HF_HUB_CACHE) / "models--org--bert" / "snapshots" / "0123abc"
    installed = tmp_path / "venv" / "lib" / "site-packages" / "somepkg" / "model"
    for path in (snapshot, installed):
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")
        (path / "run_config.json").write_text("{}")  # would otherwise qualify
    options = (GlueDataArguments(), LoraArguments(), GlueTrainingArguments(output_dir=str(tmp_path / "suite")))
    for path, reason in (
        (snapshot, "inside the Hugging Face cache"),
        (installed, "inside an installed Python package"),
    ):
        args = SuiteArguments(checkpoints=[str(path)], tasks=["rte"], update_model_cards=True)
        with pytest.raises(ValueError, match=reason):
            run_suite(args, options)
        assert sorted(p.name for p in path.iterdir()) == ["config.json", "run_config.json"]
    assert fake.calls == []


def test_limited_runs_are_recorded_in_cards_and_tables(
    fake: FakeFinetune, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    _run(checkpoints, tmp_path / "full")
    summary = _run(checkpoints, tmp_path / "smoke", data=GlueDataArguments(max_eval_samples=64), max_steps=10)
    assert summary["limits"] == {"max_eval_samples": 64, "max_steps": 10}
    assert (
        "**Limited protocol** (not comparable with full runs): max_eval_samples=64, max_steps=10."
        in (tmp_path / "smoke" / "glue_suite.md").read_text()
    )
    card = ModelCard.load(checkpoints["robust"] / "README.md")
    full = [r for r in card.data.eval_results if "limits" not in r.metric_args]
    smoke = [r for r in card.data.eval_results if "limits" in r.metric_args]
    assert len(full) == len(smoke) == 4  # the smoke test added entries beside the full ones, replaced none
    for result in smoke:
        assert result.metric_args["limits"] == {"max_eval_samples": 64, "max_steps": 10}
        assert result.metric_name.endswith("limited protocol: max_eval_samples=64, max_steps=10)")
    cell = json.loads(next((tmp_path / "smoke" / "cells").glob("robust-*/rte/seed1/cell.json")).read_text())
    assert cell["limits"] == {"max_eval_samples": 64, "max_steps": 10}


@pytest.mark.slow
def test_cli_with_config_runs_real_cells(tmp_path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    first, second = make_tiny_bert(tmp_path / "tiny-a", seed=0), make_tiny_bert(tmp_path / "tiny-b", seed=1)
    calls = []
    real = glue_tasks.run_finetune
    monkeypatch.setattr(
        glue_tasks, "run_finetune", lambda *args, **kwargs: calls.append(args[0].task_name) or real(*args, **kwargs)
    )
    config = {
        "checkpoints": [str(second)],
        "baseline": str(first),
        "tasks": ["rte", "stsb"],
        "seeds": [3],
        "glue_dir": str(shared_data / "glue"),
        "max_train_samples": 16,
        "max_eval_samples": 16,
        "max_steps": 1,
        "output_dir": str(tmp_path / "suite"),
    }
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(config))
    argv = ["--config", str(tmp_path / "suite.yaml"), "--disable_tqdm", "true"]
    summary = suite.run(argv)
    assert calls == ["rte", "stsb", "rte", "stsb"]
    cell_files = list((tmp_path / "suite" / "cells").glob("*/*/seed3/cell.json"))
    assert len(cell_files) == 4
    for cell_file in cell_files:
        cell = json.loads(cell_file.read_text())
        task = cell["task"]
        saved = json.loads((cell_file.parent / "eval_results.json").read_text())
        primary = {"rte": "accuracy", "stsb": "spearmanr"}[task]
        assert cell["score"] == pytest.approx(100 * saved[f"eval_{primary}"])
        assert saved["eval_samples"] == 16
        assert not (cell_file.parent / "model.safetensors").exists()
        # The per-example predictions reproduce the reported score.
        assert cell["prediction_files"] == [f"predict_results_{task}.txt"]
        columns = read_predictions(task, cell_file.parent / cell["prediction_files"][0])
        assert len(columns["index"]) == 16 and columns["index"] == sorted(columns["index"])
        recomputed = load_glue_metric(task).compute(predictions=columns["prediction"], references=columns["label"])
        assert 100 * recomputed[primary] == pytest.approx(cell["score"], abs=1e-9)
    assert summary["checkpoints"][str(second)]["worst_task"] in ("rte", "stsb")
    assert "Δ worst" in (tmp_path / "suite" / "glue_suite.md").read_text()
    assert not (first / "README.md").exists() and not (second / "README.md").exists()  # default: no card edits
    suite.run(argv)
    assert len(calls) == 4


@pytest.mark.slow
def test_two_processes_run_each_cell_once_and_resume(tmp_path: Path, shared_data: Path) -> None:
    """accelerate launch / torchrun: every process trains the cell together, the main one writes; a rerun reuses."""
    tiny = make_tiny_bert(tmp_path / "tiny")
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "glue_suite.py"
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    argv = ["--checkpoints", str(tiny), "--tasks", "rte", "--seeds", "3", "--glue_dir", str(shared_data / "glue"),
            "--max_train_samples", "16", "--max_eval_samples", "21", "--per_device_eval_batch_size", "4",
            "--max_steps", "1", "--disable_tqdm", "true", "--output_dir", str(tmp_path / "suite")]  # fmt: skip
    env = checkout_env(OMP_NUM_THREADS="1")
    subprocess.run([*launch, str(recipe), *argv], check=True, env=env, timeout=600)
    cell_file = next((tmp_path / "suite" / "cells").glob("tiny-*/rte/seed3/cell.json"))
    cell = json.loads(cell_file.read_text())
    columns = read_predictions("rte", cell_file.parent / "predict_results_rte.txt")
    assert columns["index"] == list(range(21))
    recomputed = load_glue_metric("rte").compute(predictions=columns["prediction"], references=columns["label"])
    assert 100 * recomputed["accuracy"] == pytest.approx(cell["score"], abs=1e-9)
    summary = json.loads((tmp_path / "suite" / "glue_suite.json").read_text())
    assert summary["checkpoints"][str(tiny)]["tasks"]["rte"]["scores"] == [cell["score"]]
    written = cell_file.stat().st_mtime_ns
    subprocess.run([*launch, str(recipe), *argv], check=True, env=env, timeout=600)
    assert cell_file.stat().st_mtime_ns == written  # reused by both processes


@pytest.mark.slow
def test_every_process_checks_the_prediction_files_after_the_main_process_wrote_them(tmp_path: Path) -> None:
    """The main process writes a cell's prediction files; the others must not look for them before it has."""
    worker = Path(__file__).with_name("suite_cell_worker.py")
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    env = checkout_env(OMP_NUM_THREADS="1")
    done = subprocess.run([*launch, str(worker), str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(path.read_text().strip() for path in tmp_path.glob("rank*.txt")) == [
        "rank 0: score 100.0",
        "rank 1: score 100.0",
    ]
    assert json.loads(next(tmp_path.glob("cells/*/late/seed0/cell.json")).read_text())["score"] == 100.0


def test_checkpoint_spellings_and_label_collisions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for run in ("a", "b"):
        (tmp_path / run / "final").mkdir(parents=True)
        (tmp_path / run / "final" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    args = SuiteArguments(checkpoints=["a/final", "b/final"], baseline=str(tmp_path / "a" / "final"), tasks=["rte"])
    assert args.checkpoints == ["a/final", "b/final"] and args.baseline == "a/final"
    with pytest.raises(ValueError, match="--checkpoints has duplicates"):
        SuiteArguments(checkpoints=["a/final", "./a/final"], tasks=["rte"])
    cells = [
        {"checkpoint": name, "task": "rte", "seed": 1, "score": score, "metrics": {"accuracy": score}}
        for name, score in (("a/final", 50.0), ("b/final", 60.0))
    ]
    summary = summarize_suite(cells, [glue_tasks.FAMILY.task("rte")], [1], "a/final")
    assert [entry["label"] for entry in summary["checkpoints"].values()] == ["a/final", "b/final"]
    assert "| b/final | +10.0 | +10.0 | +10.0 |" in suite_markdown(summary)
