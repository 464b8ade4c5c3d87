"""Fine-tuning model cards: GLUE (finetune_glue) and dense (finetune_dense) through the one renderer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from glue_support import make_synthetic_glue, make_tiny_bert
from huggingface_hub import ModelCard

from robust_pretrain.glue import finetune
from robust_pretrain.reporting.cards import FineTunedMetric, FineTuningCardContent, render_finetuning_card

pytestmark = pytest.mark.slow  # fine-tuning runs


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def settings_table(text: str) -> dict[str, str]:
    lines = text.splitlines()
    start = lines.index("| setting | value |")
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        key, value = (cell.strip() for cell in line.strip("|").split("|"))
        rows[key] = value
    return rows


def test_glue_run_writes_its_card(tiny_bert: Path, shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "rte-run"
    argv = ["--model_name_or_path", str(tiny_bert), "--task_name", "rte", "--glue_dir", str(shared_data / "glue")]
    argv += ["--output_dir", str(out), "--max_train_samples", "24", "--max_eval_samples", "20", "--max_steps", "2"]
    argv += ["--learning_rate", "3e-5", "--seed", "7", "--per_device_train_batch_size", "4", "--disable_tqdm", "true"]
    metrics = finetune.run(argv)
    card = ModelCard.load(out / "README.md")

    results = {(r.metric_type, r.dataset_split): r for r in card.data.eval_results}
    assert set(results) == {("accuracy", "validation[:20]")}  # RTE's metric, on the first 20 dev rows it scored
    accuracy = results["accuracy", "validation[:20]"]
    assert accuracy.metric_value == round(metrics["eval_accuracy"], 4)
    assert accuracy.metric_value == round(json.loads((out / "eval_results.json").read_text())["eval_accuracy"], 4)
    assert (accuracy.task_type, accuracy.dataset_type, accuracy.dataset_config) == (
        "text-classification",
        "nyu-mll/glue",
        "rte",
    )
    assert accuracy.dataset_name == "GLUE RTE"
    assert card.data.model_name == f"{tiny_bert.name}-rte" and card.data.base_model is None  # a local checkpoint
    assert card.data.tags == ["robust-pretrain", "text-classification"]

    text = card.text
    assert "## Fine-tuning: rte" in text
    assert f"The local checkpoint `{tiny_bert.name}`" in text and str(tiny_bert.parent) not in text
    assert "`finetune_glue` recipe" in text and "(full fine-tuning)" in text
    assert f"| accuracy | validation[:20] | {metrics['eval_accuracy']:.4f} |" in text
    assert "fine-tuned on its training split (first 24 rows), scored on `validation[:20]`" in text
    settings = settings_table(text)
    assert settings["learning_rate"] == "3e-05" and settings["seed"] == "7"
    assert settings["per_device_train_batch_size"] == "4" and settings["max_steps"] == "2"
    assert settings["max_seq_length"] == "128" and settings["max_train_samples"] == "24"
    assert settings["optimizer_steps"] == "2" and settings["processes"] == "1"
    assert "Per-example predictions (index, prediction, label): `predict_results_rte.txt`." in text
    assert "lora_r" not in settings and "glue_dir" not in settings  # LoRA off; no local path


def test_glue_mnli_card_names_both_dev_splits_and_lora(tiny_bert: Path, tmp_path: Path) -> None:
    glue_dir = make_synthetic_glue(tmp_path / "glue", count=30)
    out = tmp_path / "mnli-run"
    argv = ["--model_name_or_path", str(tiny_bert), "--task_name", "mnli", "--glue_dir", str(glue_dir)]
    argv += ["--output_dir", str(out), "--max_train_samples", "24", "--max_steps", "2", "--disable_tqdm", "true"]
    argv += ["--use_lora", "true", "--lora_r", "4"]
    metrics = finetune.run(argv)
    card = ModelCard.load(out / "README.md")

    results = {(r.metric_type, r.dataset_split): r.metric_value for r in card.data.eval_results}
    assert results == {
        ("accuracy", "validation_matched"): round(metrics["eval_accuracy"], 4),
        ("accuracy", "validation_mismatched"): round(metrics["eval_accuracy_mm"], 4),
    }
    assert "LoRA r=4 on query, value + full classification head" in card.text
    settings = settings_table(card.text)
    assert settings["lora_r"] == "4" and settings["lora_target_modules"] == "query, value"


def test_hub_base_model_is_linked_and_in_the_metadata(tmp_path: Path) -> None:
    content = FineTuningCardContent(
        recipe="finetune_glue",
        task="sst2",
        task_type="text-classification",
        base_model="someone/robust-bert",
        method="full fine-tuning",
        settings={"learning_rate": 2e-5},
        data="GLUE SST-2",
        dataset_type="nyu-mll/glue",
        dataset_name="GLUE SST-2",
        dataset_config="sst2",
        metrics=(FineTunedMetric("accuracy", 0.912345, "validation"),),
    )
    card = ModelCard.load(render_finetuning_card(tmp_path, content))
    assert card.data.base_model == "someone/robust-bert" and card.data.datasets == ["nyu-mll/glue"]
    assert card.data.model_name == "robust-bert-sst2" and card.data.eval_results[0].metric_value == 0.9123
    assert "[`someone/robust-bert`](https://huggingface.co/someone/robust-bert)" in card.text


def test_dense_card_states_task_metrics_protocol_and_data(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from transformers.trainer_utils import SchedulerType

    from robust_pretrain.options import LoraArguments
    from robust_pretrain.reporting.recipe_cards import dense_card_content

    training_args = SimpleNamespace(
        learning_rate=1e-4,
        weight_decay=0.05,
        lr_scheduler_type=SchedulerType("cosine"),
        warmup_steps=0.05,
        num_train_epochs=2.0,
        max_steps=-1,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        seed=3,
        world_size=2,
        layer_decay=0.75,
    )
    content = dense_card_content(
        SimpleNamespace(task="depth", model_name_or_path=str(tmp_path / "runs" / "mm-mae"), random_init=False),
        SimpleNamespace(input_modalities=["rgb", "depth"]),
        LoraArguments(),
        training_args,
        SimpleNamespace(description="the image folder `nyu` (splits train / test)", eval_split="test"),
        {"eval_delta1": 0.812345, "eval_abs_rel": 0.2, "eval_loss": 1.0},
        12,
        "predictions_depth.npz",
    )
    card = ModelCard.load(render_finetuning_card(tmp_path / "out", content))
    assert {(r.metric_type, r.metric_value) for r in card.data.eval_results} == {("delta1", 0.8123), ("abs_rel", 0.2)}
    assert card.data.eval_results[0].dataset_name == "the image folder `nyu`"
    assert {r.dataset_split for r in card.data.eval_results} == {"test"}  # the split scored
    assert card.data.model_name == "mm-mae-depth" and card.data.tags == ["robust-pretrain", "depth-estimation"]
    assert "(full fine-tuning; AdamW, layer-wise lr decay 0.75, warm-up then a cosine schedule)" in card.text
    assert "Input: rgb + depth." in card.text and str(tmp_path) not in card.text
    settings = settings_table(card.text)
    assert settings["global_batch_size"] == "16" and settings["optimizer_steps"] == "12"  # 8 per process x 2
    assert settings["lr_scheduler_type"] == "cosine" and settings["seed"] == "3"
