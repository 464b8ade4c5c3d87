"""The model card: one template for PoS tasks and image modalities; every fact from the run or a verified source."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tomllib
import torch
from huggingface_hub import ModelCard
from test_recipe_multimae import pushed_run  # noqa: F401  (fixture: the shared vision recipe run)
from test_recipe_pretrain import _one_thread, pretrained_run  # noqa: F401  (fixtures; the shared recipe run)

import robust_pretrain
from robust_pretrain.data import DEFAULT_POS_TASKS, UPOS_TAGS
from robust_pretrain.reference import model_size
from robust_pretrain.reporting.cards import (
    EWT_TRAINING_DATA,
    TEMPLATE,
    ModelCardContent,
    card_text_for_repo,
    checkpoint_tokenizer,
    local_files,
    modality_tasks,
    pos_tasks,
    render_model_card,
    trained_tokenizer,
)

AUTHORS = "Wang, Jianghui and Chen, Yang and Xie, Xingyu and Fang, Cong and Lin, Zhouchen"
MODALITIES = {
    "rgb": {"kind": "image", "channels": 3, "loss": "MSE on per-patch normalised pixels"},
    "depth": {"kind": "depth map", "channels": 1, "loss": "L1 on valid pixels"},
    "semseg": {"kind": "class map", "channels": 40, "loss": "cross-entropy"},
}


def report(tasks: list[str], weighting: str = "minimax", **settings: object) -> dict:
    losses = {name: 1.0 + i / 4 for i, name in enumerate(tasks)}
    return {
        "tasks": tasks,
        "weighting": weighting,
        "settings": {"weighting": weighting, **settings},
        "final_weights": {name: 1 / len(tasks) for name in tasks},
        "eval_task_loss": losses,
        "eval_mean_task_loss": sum(losses.values()) / len(losses),
        "eval_worst_task_loss": max(losses.values()),
        "worst_task": tasks[-1],
    }


def pos_content(weighting: str = "minimax", **kwargs: object) -> ModelCardContent:
    groups = {name: list(tags) for name, tags in DEFAULT_POS_TASKS.items()}
    unassigned = [tag for tag in UPOS_TAGS if not any(tag in tags for tags in groups.values())]
    return ModelCardContent(
        architecture="BertForMaskedLM",
        tasks=pos_tasks(groups, unassigned_tags=unassigned, tagger="the `shipped` tagger backend"),
        report=report(list(groups), weighting, alpha=2.0),
        **kwargs,
    )


def table(body: str, header: str) -> dict[str, list[str]]:
    """The Markdown table whose header row starts with ``| header |``: first cell -> the other cells."""
    lines = body.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_citation_names_the_papers_authors(tmp_path: Path) -> None:
    body = render_model_card(tmp_path, pos_content()).text

    bibtex = body.split("```bibtex")[1]
    assert re.search(r"author\s*=\s*\{(.*)\}", bibtex).group(1) == AUTHORS
    assert "title         = {Task-Robust Pre-Training for Worst-Case Downstream Adaptation}" in bibtex
    assert "year          = {2023}" in bibtex and "eprint        = {2306.12070}" in bibtex
    assert "Jianghui Wang, Yang Chen, Xingyu Xie, Cong Fang, Zhouchen Lin." in body
    assert "NeurIPS 2023" in body and "arxiv.org/abs/2306.12070" in body
    for wrong in ("Yang, Yang", "Yuan, Xuanyu", "Zhang, Yingchun", "Zhang, Chao"):
        assert wrong not in body


def test_method_follows_the_runs_strategy(tmp_path: Path) -> None:
    minimax = render_model_card(tmp_path / "minimax", pos_content("minimax")).text
    assert "`minimax` strategy: Softmax-weighted minimax — Algorithm 1 of Wang et al." in minimax

    baseline = render_model_card(tmp_path / "average", pos_content("average")).text
    assert "This checkpoint is the **baseline**" in baseline and "task-robust (worst-case)" not in baseline

    gradnorm = render_model_card(tmp_path / "gradnorm", pos_content("gradnorm")).text
    assert "`gradnorm` strategy: GradNorm — Chen et al., *GradNorm:" in gradnorm
    assert "softmax" not in gradnorm and "baseline" not in gradnorm  # no other strategy's claims
    tags = ModelCard.load(tmp_path / "gradnorm" / "README.md").data.tags
    assert tags == ["robust-pretrain", "weighting-gradnorm"]  # no "minimax" / "task-robust" tag it did not earn


def test_pos_card_table_and_untasked_tags_follow_the_spec(tmp_path: Path) -> None:
    groups = {"verbs": ["VERB"], "nouns": ["NOUN", "PROPN"]}
    content = ModelCardContent(
        architecture="BertForMaskedLM",
        tasks=pos_tasks(groups, unassigned_tags=["ADJ", "X"], tagger="the `nltk` tagger backend"),
        report=report(list(groups)),
    )
    body = render_model_card(tmp_path, content).text

    assert table(body, "task") == {"verbs": ["VERB", "0.5000", "1.0000"], "nouns": ["NOUN, PROPN", "0.5000", "1.2500"]}
    assert "| task | UPOS tags | final weight | held-out MLM loss |\n|---|---|---|---|" in body
    assert "Words tagged ADJ or X belong to no task" in body
    assert "(the `nltk` tagger backend)" in body
    assert "split into 2 upstream tasks, one per part-of-speech group" in body


def test_vision_card_from_the_same_template(tmp_path: Path) -> None:
    content = ModelCardContent(
        architecture="MultiMAEForPreTraining",
        tasks=modality_tasks(MODALITIES, limitations=["Depth and class maps are pseudo-labels."]),
        report=report(list(MODALITIES), alpha=1.0),
        training_data=local_files("/data/scenes/train.parquet"),
        plot="task_weights.png",
    )
    card = render_model_card(tmp_path / "vision-demo", content, repo_id="someone/mm-mae")
    body = card.text

    assert table(body, "modality") == {
        "rgb": ["image", "3", "MSE on per-patch normalised pixels", "0.3333", "1.0000"],
        "depth": ["depth map", "1", "L1 on valid pixels", "0.3333", "1.2500"],
        "semseg": ["class map", "40", "cross-entropy", "0.3333", "1.5000"],
    }
    assert "| modality | kind | channels | loss | final weight | held-out reconstruction loss |" in body
    assert "|---|---|---|---|---|---|" in body
    assert "**masked multi-modal autoencoding** over 3 upstream tasks" in body
    assert "one per input modality" in body and "Depth and class maps are pseudo-labels." in body
    assert 'AutoModel.from_pretrained("someone/mm-mae")' in body and "## Usage" in body
    for text_only in ("part-of-speech", "UPOS", "tagger", "Words tagged", "MLM", "AutoTokenizer"):
        assert text_only not in body
    assert "`train.parquet`" in body and "/data/scenes" not in body
    assert card.data.pipeline_tag == "image-feature-extraction" and card.data.license is None
    assert {r.metric_name for r in card.data.eval_results} == {
        "mean task reconstruction loss",
        "worst task reconstruction loss",
    }
    assert card.data.eval_results[0].dataset_type == "image"


def test_template_is_package_data() -> None:
    """The template ships in the wheel (pyproject's package-data), so installed console scripts can render cards."""
    package = Path(robust_pretrain.__file__).parent
    pyproject = tomllib.loads((package.parent / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["robust_pretrain"]
    assert TEMPLATE.is_file() and any(TEMPLATE in set(package.glob(pattern)) for pattern in patterns)


def test_modality_without_loss_is_refused() -> None:
    with pytest.raises(ValueError, match=r"modality 'depth': the card needs \['loss'\]"):
        modality_tasks({"depth": {"kind": "depth map", "channels": 1}})


def test_card_source_round_trips(tmp_path: Path) -> None:
    content = pos_content(base_model=str(tmp_path / "checkpoints" / "bert-small"), plot="task_weights.png")
    assert content.base_model is None and content.local_base_model == "bert-small"
    render_model_card(tmp_path / "run", content)

    saved = json.loads((tmp_path / "run" / "model_card.json").read_text())
    assert ModelCardContent.from_dict(saved["content"]) == content
    assert str(tmp_path) not in json.dumps(saved)
    assert card_text_for_repo(tmp_path / "run", "me/run") == str(
        render_model_card(tmp_path / "copy", content, repo_id="me/run")
    )


@pytest.mark.slow
def test_recipe_card_states_the_runs_settings(pretrained_run) -> None:  # noqa: F811
    """Every row of the settings table equals what the run recorded: run_config.json, the saved TrainingArguments
    (training_args.bin) or trainer_state.json."""
    output_dir, _ = pretrained_run
    run_config = json.loads((output_dir / "run_config.json").read_text())
    state = json.loads((output_dir / "trainer_state.json").read_text())
    args = torch.load(output_dir / "training_args.bin", weights_only=False)
    card = ModelCard.load(output_dir / "README.md")

    settings = {key: cells[0] for key, cells in table(card.text, "setting").items()}
    assert {"weighting", "alpha", "masking", "mlm_probability", "max_seq_length", "max_steps", "learning_rate",
            "per_device_train_batch_size", "seed", "processes"} <= set(settings)  # fmt: skip
    recorded = {**vars(args), **run_config, "max_steps": state["max_steps"], "processes": args.world_size}
    assert settings == {key: str(recorded[key]) for key in settings}
    assert (settings["max_steps"], settings["per_device_train_batch_size"], settings["processes"]) == ("3", "8", "1")
    assert EWT_TRAINING_DATA.description in card.text  # the embedded corpus the run used
    assert f'from_pretrained("path/to/{output_dir.name}"' in card.text and str(output_dir) not in card.text


def test_model_size_of_a_tiny_bert_counted_by_hand() -> None:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=100,
        hidden_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=32,
    )
    # embeddings: words 100*8 + positions 32*8 + token types 2*8 + LayerNorm 2*8 = 1088
    # per layer: q, k, v 3*(8*8+8) + attention output 8*8+8 + LayerNorm 16 + 8*16+16 + 16*8+8 + LayerNorm 16 = 600
    # MLM head: transform 8*8+8 + LayerNorm 16 + decoder bias 100 (decoder weight tied to the word embeddings) = 188
    assert model_size(BertForMaskedLM(config)) == {
        "layers": 2,
        "hidden size": 8,
        "attention heads": 2,
        "parameters": 1088 + 2 * 600 + 188,
    }


def test_card_states_model_size_and_tokenizer_origin(tmp_path: Path) -> None:
    size = {"layers": 4, "hidden size": 256, "attention heads": 4, "parameters": 11_170_560}
    body = render_model_card(tmp_path / "a", pos_content(model_size=size, tokenizer=trained_tokenizer(8000))).text
    assert table(body, "architecture") == {"BertForMaskedLM": ["4", "256", "4", "11,170,560 (11.2M)"]}
    assert "Tokenizer: a WordPiece tokenizer trained on this run's training text (vocabulary of 8000 tokens)." in body
    saved = json.loads((tmp_path / "a" / "model_card.json").read_text())["content"]
    assert ModelCardContent.from_dict(saved).model_size == size  # publishing re-renders the same facts
    assert "| BertForMaskedLM | 4 | 256 | 4 | 11,170,560 (11.2M) |" in card_text_for_repo(tmp_path / "a", "me/a")

    local = checkpoint_tokenizer(str(tmp_path / "checkpoints" / "bert-small"), 30522)
    assert local == "the tokenizer of `bert-small` (vocabulary of 30522 tokens)"  # a local folder: its name only
    assert checkpoint_tokenizer("google-bert/bert-base-uncased", 30522).startswith("the tokenizer of `google-bert/")
    assert "## Model" not in render_model_card(tmp_path / "b", pos_content()).text  # a card without the facts


@pytest.mark.slow
def test_recipe_card_states_the_models_size_and_tokenizer(pretrained_run) -> None:  # noqa: F811
    """The from-scratch run's card: the saved model's layers, hidden size, heads and parameter count, and the
    WordPiece tokenizer trained on its text with the saved tokenizer's vocabulary size."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    output_dir, _ = pretrained_run
    model = AutoModelForMaskedLM.from_pretrained(output_dir)
    parameters = sum(parameter.numel() for parameter in model.parameters())
    text = ModelCard.load(output_dir / "README.md").text
    row = table(text, "architecture")["BertForMaskedLM"]
    assert row[:3] == [str(model.config.num_hidden_layers), str(model.config.hidden_size), "2"]  # the tiny preset
    assert row[3].startswith(f"{parameters:,} (")
    vocabulary = len(AutoTokenizer.from_pretrained(output_dir))
    assert f"trained on this run's training text (vocabulary of {vocabulary} tokens)" in text and vocabulary == 1000


@pytest.mark.slow
def test_vision_recipe_card_states_the_models_size(pushed_run) -> None:  # noqa: F811
    from transformers import AutoModelForPreTraining

    output_dir = pushed_run[0]
    model = AutoModelForPreTraining.from_pretrained(output_dir)
    text = ModelCard.load(output_dir / "README.md").text
    parameters = sum(parameter.numel() for parameter in model.parameters())
    config = model.config
    row = table(text, "architecture")[type(model).__name__]
    assert row[:3] == [str(config.num_hidden_layers), str(config.hidden_size), str(config.num_attention_heads)]
    assert row[3].startswith(f"{parameters:,} (") and "Tokenizer:" not in text  # images: no tokenizer
