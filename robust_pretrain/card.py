"""Model card of a pre-training run, rendered from ``model_cards/template.md`` with ``huggingface_hub.ModelCard``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

TEMPLATE = Path(__file__).resolve().parents[1] / "model_cards" / "template.md"
EWT_DATA = (
    "Raw text of the [Universal Dependencies English Web Treebank](https://universaldependencies.org/treebanks/"
    "en_ewt/) (UD English-EWT, train + dev; CC BY-SA 4.0, annotations (c) Stanford University; underlying LDC2012T13 "
    "web texts). The EWT test split is held out for the per-task evaluation."
)


def render_model_card(
    output_dir: str | Path,
    report: dict[str, Any],
    task_groups: dict[str, list[str]],
    *,
    model_name: str,
    architecture: str,
    repo_or_path: str,
    base_model: str | None = None,
    training_data: str = EWT_DATA,
    datasets: list[str] | None = None,
    tagger: str = "the shipped UPOS tagger",
    plot: str | None = None,
) -> ModelCard:
    """Write ``README.md`` into ``output_dir`` and return the card.

    ``report`` is the run's task report (:func:`robust_pretrain.reporting.task_report`); its held-out losses also go
    into the ``model-index`` metadata.
    """
    losses = report.get("eval_task_loss", {})
    weights = report.get("final_weights", {})
    eval_results = [
        EvalResult(
            task_type="fill-mask",
            dataset_type="text",
            dataset_name="held-out split",
            metric_type="loss",
            metric_name=name,
            metric_value=round(report[key], 4),
        )
        for key, name in (
            ("eval_mean_task_loss", "mean task MLM loss"),
            ("eval_worst_task_loss", "worst task MLM loss"),
        )
        if report.get(key) is not None
    ]
    hub_base_model = base_model if base_model and not Path(base_model).exists() else None  # a local path is no Hub id
    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag="fill-mask",
        license="cc-by-sa-4.0" if training_data == EWT_DATA else None,
        tags=["robust-pretrain", "task-robust", "minimax", f"weighting-{report.get('weighting', 'unknown')}"],
        datasets=datasets or (["universal_dependencies"] if training_data == EWT_DATA else None),
        base_model=hub_base_model,
        model_name=model_name if eval_results else None,
        eval_results=eval_results or None,
    )
    rows = [
        {
            "name": name,
            "tags": ", ".join(task_groups.get(name, [])),
            "weight": _fmt(weights.get(name)),
            "loss": _fmt(losses.get(name)),
        }
        for name in report["tasks"]
    ]
    card = ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE),
        model_name=model_name,
        architecture=architecture,
        base_model=base_model,
        hub_base_model=hub_base_model,
        task_names=report["tasks"],
        weighting=report.get("weighting"),
        settings=report.get("settings", {}),
        task_rows=rows,
        mean_loss=_fmt(report.get("eval_mean_task_loss")),
        worst_loss=_fmt(report.get("eval_worst_task_loss")),
        worst_task=report.get("worst_task"),
        plot=plot,
        training_data=training_data,
        tagger=tagger,
        repo_or_path=repo_or_path,
    )
    card.save(Path(output_dir) / "README.md")
    return card


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
