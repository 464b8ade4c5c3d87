"""The one model-card renderer: every recipe's card, rendered from templates in ``model_cards/`` (package data) with
``huggingface_hub``.

Pre-training cards (``model_cards/pretraining.md``) serve every task family; what differs between families (PoS groups
of masked words for text, image modalities for vision, and any later family such as causal-LM pre-training) is data,
a :class:`CardTaskFamily`. Fine-tuning cards (``model_cards/finetuning.md``, GLUE and dense) are a
:class:`FineTuningCardContent`. The suite's results (``model_cards/suite_results.md``) are written by
:mod:`robust_pretrain.reporting.suite_cards`. Everything a card states comes from the run (its task report,
settings, data, model and tokenizer, base model, metrics) or from a verified source (the paper's citation in the
template, the weighting strategy's own module docstring). A pre-training recipe builds a :class:`ModelCardContent`
and renders it::

    content = ModelCardContent(architecture="BertForMaskedLM", tasks=pos_tasks(...), report=report,
                               training_data=EWT_TRAINING_DATA, model_size=model_size(model))
    trainer.card_renderer = card_renderer(trainer, content)  # README.md, naming the Hub repo once the Trainer has one

Local paths appear in a card only as file names. Beside a pre-training ``README.md`` the card's content is saved as
``model_card.json``, so that publishing the folder later re-renders the card for its Hub repo
(:func:`card_text_for_repo`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

if TYPE_CHECKING:
    from transformers import Trainer

TEMPLATES = Path(__file__).resolve().parents[1] / "model_cards"  # package data: installed with the package
TEMPLATE = TEMPLATES / "pretraining.md"
FINETUNING_TEMPLATE = TEMPLATES / "finetuning.md"
SUITE_RESULTS_TEMPLATE = TEMPLATES / "suite_results.md"  # the suite's card fragment per checkpoint
CARD_CONTENT_NAME = "model_card.json"
EWT_DATA = (
    "Raw text of the [Universal Dependencies English Web Treebank](https://universaldependencies.org/treebanks/"
    "en_ewt/) (UD English-EWT, train + dev; CC BY-SA 4.0, annotations (c) Stanford University; underlying LDC2012T13 "
    "web texts). The EWT test split is held out for the per-task evaluation."
)
TEXT_USAGE = """\
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

model = AutoModelForSequenceClassification.from_pretrained("{model_id}", num_labels=2)
tokenizer = AutoTokenizer.from_pretrained("{model_id}")
trainer = Trainer(model=model, args=TrainingArguments("finetuned"), train_dataset=..., processing_class=tokenizer)
trainer.train()"""
VISION_USAGE = """\
import robust_pretrain  # registers the MultiMAE classes with transformers' Auto classes
from transformers import AutoImageProcessor, AutoModel

processor = AutoImageProcessor.from_pretrained("{model_id}")
model = AutoModel.from_pretrained("{model_id}")"""


@dataclass(frozen=True)
class CardTaskFamily:
    """The words and the task table a card uses for one kind of upstream task.

    Attributes:
        objective: the pre-training objective, e.g. ``"masked-language modelling"``.
        task_split: completes "The <objective> objective is split into N upstream tasks, ...".
        table_title: heading of the task table.
        task_column: header of its first column (the task name).
        columns: headers of the descriptive columns.
        rows: task name -> one cell per descriptive column.
        loss_name: what the held-out loss is, e.g. ``"MLM loss"``.
        notes: sentences printed under the task table.
        limitations: family-specific sentences of "Intended use and limitations".
        pipeline_tag: the model's Hub task (card metadata and the model-index task type).
        data_kind: the model-index dataset type (``"text"``, ``"image"``).
        usage_title: heading of the code example.
        usage: the code example; ``{model_id}`` is replaced by the Hub repo id or the local folder.
    """

    objective: str
    task_split: str
    table_title: str
    task_column: str
    columns: tuple[str, ...]
    rows: Mapping[str, tuple[str, ...]]
    loss_name: str
    pipeline_tag: str
    data_kind: str
    usage_title: str
    usage: str
    notes: tuple[str, ...] = ()
    limitations: tuple[str, ...] = ()


def pos_tasks(
    task_groups: Mapping[str, Sequence[str]], *, unassigned_tags: Sequence[str], tagger: str
) -> CardTaskFamily:
    """Part-of-speech tasks of masked-LM pre-training: task name -> its UPOS tags.

    Args:
        task_groups: the task spec, task name -> UPOS tags.
        unassigned_tags: UPOS tags in no group (never masked).
        tagger: the tagger that assigned the tags, as the card names it.
    """
    notes = ()
    if unassigned_tags:
        tags = ", ".join(unassigned_tags[:-1]) + (" or " if len(unassigned_tags) > 1 else "") + unassigned_tags[-1]
        notes = (f"Words tagged {tags} belong to no task: they are never masked and stay visible as context.",)
    return CardTaskFamily(
        objective="masked-language modelling",
        task_split="one per part-of-speech group: only the words of a group are masked for its task.",
        table_title="Task groups (Universal POS tags)",
        task_column="task",
        columns=("UPOS tags",),
        rows={name: (", ".join(tags),) for name, tags in task_groups.items()},
        loss_name="MLM loss",
        pipeline_tag="fill-mask",
        data_kind="text",
        usage_title="Fine-tuning",
        usage=TEXT_USAGE,
        notes=notes,
        limitations=(f"Part-of-speech groups come from an automatic tagger ({tagger}), so task membership is noisy.",),
    )


def modality_tasks(
    modalities: Mapping[str, Mapping[str, Any]], *, limitations: Sequence[str] = (), usage: str = VISION_USAGE
) -> CardTaskFamily:
    """Image modalities of masked multi-modal autoencoding: modality name -> ``{"kind", "channels", "loss"}``.

    ``channels`` is the number of input channels (or of classes, for a class map); ``loss`` names the reconstruction
    loss (e.g. ``"MSE on per-patch normalised pixels"``).
    """
    rows = {}
    for name, spec in modalities.items():
        missing = {"kind", "channels", "loss"} - set(spec)
        if missing:
            raise ValueError(f"modality {name!r}: the card needs {sorted(missing)} (kind, channels, loss)")
        rows[name] = (str(spec["kind"]), str(spec["channels"]), str(spec["loss"]))
    return CardTaskFamily(
        objective="masked multi-modal autoencoding",
        task_split="one per input modality: each task reconstructs the masked patches of its modality from the "
        "visible patches of all modalities.",
        table_title="Modalities",
        task_column="modality",
        columns=("kind", "channels", "loss"),
        rows=rows,
        loss_name="reconstruction loss",
        pipeline_tag="image-feature-extraction",
        data_kind="image",
        usage_title="Usage",
        usage=usage,
        limitations=tuple(limitations),
    )


@dataclass(frozen=True)
class TrainingData:
    """The card's "Training data" section and the metadata that follows from it.

    Attributes:
        description: Markdown text.
        license: the card's ``license`` metadata, for data whose license carries over to the model (share-alike).
        datasets: Hub dataset ids (``datasets`` metadata).
    """

    description: str
    license: str | None = None
    datasets: tuple[str, ...] = ()


EWT_TRAINING_DATA = TrainingData(EWT_DATA, license="cc-by-sa-4.0", datasets=("universal_dependencies",))


def hub_dataset(name: str, config: str | None = None) -> TrainingData:
    """Training data loaded from the Hub dataset ``name``."""
    label = f"`{name}`" + (f" (configuration `{config}`)" if config else "")
    return TrainingData(f"The Hub dataset {label} (see its own license).", datasets=(name,))


def local_files(*paths: str | Path) -> TrainingData:
    """Training data read from local files, named by their file names only."""
    names = ", ".join(f"`{Path(path).name}`" for path in paths)
    plural = len(paths) > 1
    return TrainingData(f"Local file{'s' if plural else ''} {names} (see {'their' if plural else 'its'} own license).")


@dataclass(frozen=True)
class ModelCardContent:
    """What a run's card states.

    Attributes:
        architecture: the model class, e.g. ``"BertForMaskedLM"``.
        tasks: the task family.
        report: the run's task report (:func:`robust_pretrain.reporting.task_report`).
        training_data: the data section and its metadata.
        base_model: the checkpoint training continued from: a Hub id, or a local path (kept as its folder name in
            ``local_base_model``).
        plot: file name of the task-weight plot in the output folder.
        model_size: the trained model's size (:func:`model_size`): layers, hidden size, attention heads, parameters.
        tokenizer: where the tokenizer comes from (:func:`trained_tokenizer`, :func:`checkpoint_tokenizer`); None for
            a model without one.
    """

    architecture: str
    tasks: CardTaskFamily
    report: Mapping[str, Any]
    training_data: TrainingData = field(default=EWT_TRAINING_DATA)
    base_model: str | None = None
    local_base_model: str | None = None
    plot: str | None = None
    model_size: Mapping[str, int] | None = None
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if self.base_model is not None and _is_local_path(self.base_model):
            object.__setattr__(self, "local_base_model", Path(self.base_model).expanduser().resolve().name)
            object.__setattr__(self, "base_model", None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelCardContent:
        tasks = dict(data["tasks"])
        for key in ("columns", "notes", "limitations"):
            tasks[key] = tuple(tasks[key])
        tasks["rows"] = {name: tuple(cells) for name, cells in tasks["rows"].items()}
        training_data = dict(data["training_data"], datasets=tuple(data["training_data"]["datasets"]))
        return cls(**{**data, "tasks": CardTaskFamily(**tasks), "training_data": TrainingData(**training_data)})


def trained_tokenizer(vocab_size: int) -> str:
    """Tokenizer origin: a WordPiece tokenizer trained on the run's training text."""
    return f"a WordPiece tokenizer trained on this run's training text (vocabulary of {vocab_size} tokens)"


def checkpoint_tokenizer(name: str, vocab_size: int) -> str:
    """Tokenizer origin: the tokenizer of a checkpoint (a Hub id, or a local folder named by its name only)."""
    shown = Path(name).expanduser().resolve().name if _is_local_path(name) else name
    return f"the tokenizer of `{shown}` (vocabulary of {vocab_size} tokens)"


def _parameter_count(count: int) -> str:
    """``4,385,920 (4.4M)``."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count:,} ({count / scale:.1f}{unit})"
    return f"{count:,}"


def build_model_card(content: ModelCardContent, *, model_name: str, model_id: str) -> ModelCard:
    """The card of ``content``, titled ``model_name``, whose code example loads ``model_id``."""
    report, tasks = content.report, content.tasks
    weighting = report.get("weighting")
    losses = report.get("eval_task_loss", {})
    weights = report.get("final_weights", {})
    eval_results = [
        EvalResult(
            task_type=tasks.pipeline_tag,
            dataset_type=tasks.data_kind,
            dataset_name="held-out split",
            metric_type="loss",
            metric_name=f"{kind} task {tasks.loss_name}",
            metric_value=round(report[key], 4),
        )
        for key, kind in (("eval_mean_task_loss", "mean"), ("eval_worst_task_loss", "worst"))
        if report.get(key) is not None
    ]
    excess = report.get("scores", {}).get("excess")
    eval_results += [
        EvalResult(
            task_type=tasks.pipeline_tag,
            dataset_type=tasks.data_kind,
            dataset_name="held-out split",
            metric_type="excess_loss",
            metric_name=f"{kind} task excess {tasks.loss_name} over the reference",
            metric_value=round(excess[kind], 4),
        )
        for kind in ("mean", "worst")
        if excess
    ]
    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag=tasks.pipeline_tag,
        license=content.training_data.license,
        tags=["robust-pretrain", f"weighting-{weighting or 'unknown'}"],
        datasets=list(content.training_data.datasets) or None,
        base_model=content.base_model,
        model_name=model_name if eval_results else None,
        eval_results=eval_results or None,
    )
    rows = [
        {"name": name, "cells": tasks.rows.get(name, ("",) * len(tasks.columns)), "weight": _fmt(weights.get(name)),
         "loss": _fmt(losses.get(name)), "excess": _fmt(excess["tasks"].get(name)) if excess else None}
        for name in report["tasks"]
    ]  # fmt: skip
    return ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE),
        model_name=model_name,
        architecture=content.architecture,
        model_size=content.model_size,
        parameters=_parameter_count(content.model_size["parameters"]) if content.model_size else None,
        tokenizer=content.tokenizer,
        hub_base_model=content.base_model,
        local_base_model=content.local_base_model,
        tasks=tasks,
        task_names=report["tasks"],
        weighting=weighting,
        weighting_summary=weighting_summary(weighting),
        settings=report.get("settings", {}),
        task_rows=rows,
        mean_loss=_fmt(report.get("eval_mean_task_loss")),
        worst_loss=_fmt(report.get("eval_worst_task_loss")),
        worst_task=report.get("worst_task"),
        excess={"mean": _fmt(excess["mean"]), "worst": _fmt(excess["worst"]), "worst_task": excess["worst_task"]}
        if excess
        else None,
        plot=content.plot,
        training_data=content.training_data.description,
        usage=tasks.usage.replace("{model_id}", model_id),
    )


def render_model_card(output_dir: str | Path, content: ModelCardContent, *, repo_id: str | None = None) -> ModelCard:
    """Write ``README.md`` and ``model_card.json`` into ``output_dir`` and return the card.

    With ``repo_id`` (the Hub repository the folder is pushed to) the card is titled with it and its code example
    loads it; without, both name the folder (by its name only).
    """
    output_dir = Path(output_dir)
    name = Path(output_dir.resolve()).name
    card = build_model_card(content, model_name=repo_id or name, model_id=repo_id or f"path/to/{name}")
    card.save(output_dir / "README.md")
    source = {"text_sha256": _text_sha256(output_dir / "README.md"), "content": asdict(content)}
    (output_dir / CARD_CONTENT_NAME).write_text(json.dumps(source, indent=2) + "\n")
    return card


def card_text_for_repo(output_dir: str | Path, repo_id: str) -> str | None:
    """``output_dir``'s ``README.md`` with the card's text re-rendered for the Hub repo ``repo_id``.

    The metadata stays as it is in the folder (results merged in by the evaluation suite are kept; the model-index
    name becomes ``repo_id``). None when the folder holds no card written by :func:`render_model_card`, or when the
    card's text was edited since (an edited card is published as it is).
    """
    output_dir = Path(output_dir)
    source_path, readme = output_dir / CARD_CONTENT_NAME, output_dir / "README.md"
    if not source_path.is_file() or not readme.is_file():
        return None
    source = json.loads(source_path.read_text())
    if source.get("text_sha256") != _text_sha256(readme):
        return None
    content = ModelCardContent.from_dict(source["content"])
    card = ModelCard.load(readme)
    card.text = build_model_card(content, model_name=repo_id, model_id=repo_id).text
    if card.data.eval_results:
        card.data.model_name = repo_id
    return str(card)


def card_renderer(trainer: Trainer, content: ModelCardContent) -> Callable[[], ModelCard]:
    """A ``MinimaxTrainer.card_renderer``: the card in ``output_dir``, for the Trainer's Hub repo once it has one
    (``push_to_hub`` creates the repo before it renders the card)."""
    return lambda: render_model_card(trainer.args.output_dir, content, repo_id=trainer.hub_model_id)


@dataclass(frozen=True)
class FineTunedMetric:
    """One evaluation result of a fine-tuning run: metric name, value and the split it was measured on."""

    name: str
    value: float
    split: str


@dataclass(frozen=True)
class FineTuningCardContent:
    """What a fine-tuning run's card states (GLUE and dense fine-tuning).

    Attributes:
        recipe: the recipe that made the model, e.g. ``"finetune_glue"``.
        task: the downstream task, e.g. ``"rte"``.
        task_type: its Hub task (``"text-classification"``, ``"image-segmentation"``, ...).
        base_model: the fine-tuned checkpoint as given (a local path is shown by its folder name only).
        method: e.g. ``"full fine-tuning"`` or ``"LoRA r=8 on query, value + classification head"``.
        settings: the run's settings (options of the command line or config file, the steps it trained).
        data: Markdown sentence naming the data.
        dataset_type: the model-index dataset type (a Hub dataset id, or ``"local"``).
        dataset_name: the model-index dataset name.
        metrics: the evaluation results.
        dataset_config: the model-index dataset configuration.
        inputs: the input modalities, for a vision model.
        notes: sentences under the results (files the run wrote).
    """

    recipe: str
    task: str
    task_type: str
    base_model: str
    method: str
    settings: Mapping[str, Any]
    data: str
    dataset_type: str
    dataset_name: str
    metrics: tuple[FineTunedMetric, ...]
    dataset_config: str | None = None
    inputs: str | None = None
    notes: tuple[str, ...] = ()


def render_finetuning_card(output_dir: str | Path, content: FineTuningCardContent) -> Path:
    """Write the fine-tuning card ``README.md`` (results also as ``model-index`` metadata) into ``output_dir``."""
    local = _is_local_path(content.base_model)
    base = Path(content.base_model).expanduser().resolve().name if local else content.base_model
    model_name = f"{base.split('/')[-1]}-{content.task}"
    results = [
        EvalResult(
            task_type=content.task_type,
            dataset_type=content.dataset_type,
            dataset_name=content.dataset_name,
            dataset_config=content.dataset_config,
            dataset_split=metric.split,
            metric_type=metric.name,
            metric_value=round(metric.value, 4),
        )
        for metric in content.metrics
    ]
    card = ModelCard.from_template(
        ModelCardData(
            model_name=model_name,
            eval_results=results or None,
            library_name="transformers",
            base_model=None if local else content.base_model,
            datasets=[content.dataset_type] if "/" in content.dataset_type else None,
            pipeline_tag=content.task_type,
            tags=["robust-pretrain", content.task_type],
        ),
        template_path=str(FINETUNING_TEMPLATE),
        model_name=model_name,
        content=content,
        base=base,
        hub_base=not local,
        metrics=[(metric.name, metric.split, _fmt(metric.value)) for metric in content.metrics],
    )
    path = Path(output_dir) / "README.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    card.save(path)
    return path


def weighting_summary(weighting: str | None) -> str:
    """One paragraph on the strategy: the first paragraph of its module's docstring, in Markdown."""
    from robust_pretrain.weighting import WEIGHTINGS  # torch: imported when a card is built, not by the publish command

    if weighting not in WEIGHTINGS:
        return f"`{weighting}`."
    doc = inspect.getmodule(WEIGHTINGS[weighting]).__doc__ or f"`{weighting}`."
    return re.sub(r"``", "`", " ".join(doc.strip().split("\n\n")[0].split()))


def _is_local_path(name: str) -> bool:
    return Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or name.count("/") > 1


def _text_sha256(readme: Path) -> str:
    """Digest of a card's text (without its metadata, which the evaluation suite may extend)."""
    return hashlib.sha256(ModelCard.load(readme).text.encode()).hexdigest()


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
