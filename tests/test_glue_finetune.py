"""End-to-end finetune_glue runs with a tiny random BERT on every shared task, synthetic MNLI, LoRA, bad inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from glue_support import SHARED_TASKS, make_synthetic_glue, make_tiny_bert
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForSequenceClassification

from robust_pretrain.cli import UsageError
from robust_pretrain.glue import finetune, get_task, load_glue, load_glue_metric, read_predictions

FAST = ["--max_train_samples", "24", "--max_eval_samples", "20", "--max_steps", "2", "--disable_tqdm", "true"]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def _run(model: Path, task: str, glue_dir: Path, output_dir: Path, *extra: str) -> dict[str, float]:
    argv = ["--model_name_or_path", str(model), "--task_name", task, "--glue_dir", str(glue_dir)]
    return finetune.run([*argv, "--output_dir", str(output_dir), *FAST, *extra])


@pytest.mark.slow
@pytest.mark.parametrize("task", SHARED_TASKS)
def test_finetune_every_shared_task(task: str, tiny_bert: Path, shared_data: Path, tmp_path: Path) -> None:
    spec = get_task(task)
    metrics = _run(tiny_bert, task, shared_data / "glue", tmp_path)
    saved = json.loads((tmp_path / "all_results.json").read_text())
    assert saved == {**saved, **metrics}
    assert saved["eval_samples"] == 20 and saved["train_samples"] == 24
    assert json.loads((tmp_path / "trainer_state.json").read_text())["global_step"] == 2
    for name in spec.metrics:
        assert isinstance(saved[f"eval_{name}"], float)
    config = AutoConfig.from_pretrained(tmp_path)
    assert config.num_labels == spec.num_labels
    if spec.is_regression:
        assert config.problem_type == "regression"
    else:
        assert config.id2label == dict(enumerate(spec.label_names))
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "tokenizer.json").is_file()


def _recomputed(task: str, path: Path) -> dict[str, float]:
    columns = read_predictions(task, path)
    return load_glue_metric(task).compute(predictions=columns["prediction"], references=columns["label"])


def test_finetune_mnli_reports_matched_and_mismatched(tiny_bert: Path, tmp_path: Path) -> None:
    glue_dir = make_synthetic_glue(tmp_path / "glue", count=30)
    metrics = _run(tiny_bert, "mnli", glue_dir, tmp_path / "out", "--max_eval_samples", "30")
    assert metrics["eval_samples"] == 30 and metrics["eval_samples_mm"] == 30
    assert {"eval_accuracy", "eval_accuracy_mm"} <= set(metrics)
    assert _recomputed("mnli", tmp_path / "out" / "predict_results_mnli.txt")["accuracy"] == metrics["eval_accuracy"]
    mismatched = tmp_path / "out" / "predict_results_mnli-mm.txt"
    assert _recomputed("mnli", mismatched)["accuracy"] == metrics["eval_accuracy_mm"]
    rows = mismatched.read_text().splitlines()
    assert rows[0] == "index\tprediction\tlabel" and len(rows) == 31
    assert [row.split("\t")[2] for row in rows[1:4]] == ["entailment", "neutral", "contradiction"]
    assert AutoConfig.from_pretrained(tmp_path / "out").id2label == {0: "entailment", 1: "neutral", 2: "contradiction"}


@pytest.mark.slow
def test_predictions_reproduce_regression_and_f1_scores(tiny_bert: Path, shared_data: Path, tmp_path: Path) -> None:
    for task in ("stsb", "mrpc"):
        metrics = _run(tiny_bert, task, shared_data / "glue", tmp_path / task)
        recomputed = _recomputed(task, tmp_path / task / f"predict_results_{task}.txt")
        for name in get_task(task).metrics:
            assert recomputed[name] == pytest.approx(metrics[f"eval_{name}"], abs=1e-12)
    dev = load_glue("stsb", shared_data / "glue")["validation"]
    columns = read_predictions("stsb", tmp_path / "stsb" / "predict_results_stsb.txt")
    assert columns["index"] == list(range(20)) and columns["label"] == pytest.approx(dev["label"][:20])


def test_lora_saves_peft_adapter_and_head(tiny_bert: Path, shared_data: Path, tmp_path: Path) -> None:
    lora = ["--use_lora", "true", "--lora_r", "4", "--lora_alpha", "8", "--learning_rate", "1e-2"]
    metrics = _run(tiny_bert, "rte", shared_data / "glue", tmp_path, *lora)
    assert not (tmp_path / "model.safetensors").exists()
    adapter_config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert adapter_config["peft_type"] == "LORA" and adapter_config["r"] == 4 and adapter_config["lora_alpha"] == 8
    assert set(adapter_config["target_modules"]) == {"query", "value"}
    assert "classifier" in adapter_config["modules_to_save"]
    weights = load_file(tmp_path / "adapter_model.safetensors")
    assert any("classifier" in key for key in weights)
    assert sum("lora_B" in key for key in weights) == 4  # 2 layers x (query, value)

    base = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    model = PeftModel.from_pretrained(base, tmp_path).eval()
    for key, tensor in weights.items():
        if "lora_B" in key:
            assert tensor.abs().sum() > 0  # trained (lora_B starts at zero)
    classifier = model.base_model.model.classifier.modules_to_save["default"]
    head = {k: v for k, v in weights.items() if "classifier" in k and k.endswith("weight")}
    assert len(head) == 1 and torch.equal(classifier.weight, next(iter(head.values())))

    # The reloaded adapter reproduces the saved evaluation.
    dev = load_glue("rte", shared_data / "glue")["validation"][:20]
    tokenizer = finetune.AutoTokenizer.from_pretrained(tmp_path)
    batch = tokenizer(
        dev["sentence1"], dev["sentence2"], truncation=True, max_length=128, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        predictions = model(**batch).logits.argmax(-1).numpy()
    accuracy = load_glue_metric("rte").compute(predictions=predictions, references=dev["label"])["accuracy"]
    assert accuracy == pytest.approx(metrics["eval_accuracy"])


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to build a Trainer fails the test: errors must come before training."""

    def forbidden(*args, **kwargs):
        raise AssertionError("Trainer was built despite bad input")

    monkeypatch.setattr(finetune, "Trainer", forbidden)


def test_missing_checkpoint(
    no_training: None, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(UsageError, match="no-such-ckpt: no such checkpoint directory"):
        _run(tmp_path / "no-such-ckpt", "rte", shared_data / "glue", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="is not a saved model: it has no config.json"):
        _run(tmp_path / "empty", "rte", shared_data / "glue", tmp_path / "out")
    # The console entry point: one paragraph on stderr, exit status 2, no traceback.
    argv = ["--model_name_or_path", "./outputs/nope", "--task_name", "rte", "--output_dir", str(tmp_path / "out")]
    assert finetune.main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith(
        "robust-pretrain-finetune-glue: error: --model_name_or_path ./outputs/nope: no such checkpoint"
    )
    assert "Traceback" not in error


@pytest.mark.slow
def test_refuses_an_earlier_runs_output_dir(tiny_bert: Path, shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run(tiny_bert, "rte", shared_data / "glue", out, "--save_strategy", "steps", "--save_steps", "1")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    with pytest.raises(UsageError, match=f"--output_dir {out} already holds files.*--overwrite_output_dir true"):
        _run(tiny_bert, "rte", shared_data / "glue", out)
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before
    (out / "notes.txt").write_text("mine")
    _run(tiny_bert, "rte", shared_data / "glue", out, "--overwrite_output_dir", "true", "--use_lora", "true")
    assert not list(out.glob("checkpoint-*")) and not (out / "model.safetensors").exists()  # nothing stale remains
    assert (out / "adapter_model.safetensors").is_file() and (out / "notes.txt").read_text() == "mine"


def test_bad_task_and_data(no_training: None, tiny_bert: Path, shared_data: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Unknown GLUE task 'mnli-mm'"):
        _run(tiny_bert, "mnli-mm", shared_data / "glue", tmp_path / "out")
    with pytest.raises(UsageError, match="QNLI/train.tsv not found"):
        _run(tiny_bert, "qnli", shared_data / "glue", tmp_path / "out")
    glue_dir = tmp_path / "glue"
    shutil.copytree(shared_data / "glue" / "WNLI", glue_dir / "WNLI")
    rows = (glue_dir / "WNLI" / "dev.tsv").read_text().splitlines()
    (glue_dir / "WNLI" / "dev.tsv").write_text("\n".join([*rows, "999\ta\tb\tentailment"]) + "\n")
    with pytest.raises(ValueError, match="label 'entailment' is not one of \\['0', '1'\\]"):
        _run(tiny_bert, "wnli", glue_dir, tmp_path / "out")
    with pytest.raises(ValueError, match="max_train_samples must be a positive integer"):
        _run(tiny_bert, "wnli", shared_data / "glue", tmp_path / "out", "--max_train_samples", "0")
