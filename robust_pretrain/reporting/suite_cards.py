"""Suite results as ``model-index`` metadata: always in the suite's own directory, in a checkpoint's card on request.

By default nothing outside the suite directory is written: each checkpoint gets
``<output_dir>/model_cards/<key>/model_index.json`` and a card fragment ``README.md`` there. With
``--update_model_cards`` the results are also merged into the ``README.md`` of checkpoints this project's recipes
wrote (they carry ``task_report.json`` or ``run_config.json``); read-only directories, Hugging Face cache snapshots
and installed packages are refused before any cell runs.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub import constants as hub_constants
from huggingface_hub.repocard_data import eval_results_to_model_index

from robust_pretrain.cli import UsageError
from robust_pretrain.reporting.cards import SUITE_RESULTS_TEMPLATE
from robust_pretrain.reporting.task_report import TASK_REPORT_NAME

if TYPE_CHECKING:
    from robust_pretrain.evaluation.tasks import RunSettings, SuiteTask

# Files only this project's recipes write into an output directory (the pre-training run configuration).
RECIPE_OUTPUT_MARKERS = (TASK_REPORT_NAME, "run_config.json")
CARDS_DIR = "model_cards"


def card_source(family: str) -> str:
    return f"robust-pretrain {family}_suite"


def _limits_text(limits: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in limits.items())


def eval_results(
    entry: dict[str, Any], tasks: Sequence[SuiteTask], seeds: Sequence[int], family: str, run_settings: RunSettings
) -> list[EvalResult]:
    """One ``EvalResult`` per task and reported metric (mean over seeds); a limited protocol is named in each."""
    limited = f"; limited protocol: {_limits_text(run_settings.limits)}" if run_settings.limits else ""
    method = run_settings.fine_tuning
    results = []
    for task in tasks:
        means = entry["tasks"][task.name]["metrics"]
        for key, (metric_type, target) in task.card_metrics.items():
            metric_args: dict[str, Any] = {"source": card_source(family), "fine_tuning": method, "seeds": list(seeds)}
            if run_settings.limits:
                metric_args["limits"] = dict(run_settings.limits)
            results.append(
                EvalResult(
                    task_type=target.task_type,
                    dataset_type=target.dataset_type,
                    dataset_name=target.dataset_name,
                    dataset_config=target.dataset_config,
                    dataset_split=target.dataset_split,
                    metric_type=metric_type,
                    metric_value=round(means[key], 2),
                    metric_name=f"{metric_type} ({method} fine-tuning, mean over {len(seeds)} seeds{limited})",
                    metric_args=metric_args,
                )
            )
    return results


def _replaced_by(old: EvalResult, new: EvalResult) -> bool:
    """Whether ``old`` is an earlier suite result for the same metric and protocol (anything else is kept)."""
    keys = ("task_type", "dataset_type", "dataset_config", "dataset_split", "metric_type")
    old_args, new_args = old.metric_args or {}, new.metric_args or {}
    same_run = all(old_args.get(key) == new_args.get(key) for key in ("source", "fine_tuning", "limits"))
    return same_run and all(getattr(old, key) == getattr(new, key) for key in keys)


def _in_hub_cache(path: Path) -> bool:
    cache = Path(hub_constants.HF_HUB_CACHE).expanduser().resolve()
    in_snapshot = any(part.startswith(("models--", "datasets--")) for part in path.parts) and "snapshots" in path.parts
    return in_snapshot or path.is_relative_to(cache)


def _read_only(path: Path) -> bool:
    # Permission bits as well as access(): a directory made read-only stays writable for root.
    return not os.access(path, os.W_OK) or not stat.S_IMODE(path.stat().st_mode) & 0o222


def card_update_refusal(checkpoint: str) -> str | None:
    """Why ``--update_model_cards`` must not edit this local checkpoint's README.md, or None if it may."""
    from robust_pretrain.evaluation.checkpoints import local_dir  # the evaluation package imports this module

    path = local_dir(checkpoint)
    if path is None:
        return None
    readme = path / "README.md"
    if _in_hub_cache(path):
        return "it is inside the Hugging Face cache (editing a snapshot breaks the cache's integrity)"
    if {"site-packages", "dist-packages"} & set(path.parts):
        return "it is inside an installed Python package"
    if _read_only(path) or (readme.is_file() and _read_only(readme)):
        return "it is read-only"
    if not any((path / marker).is_file() for marker in RECIPE_OUTPUT_MARKERS):
        return f"it is not an output directory of this project's recipes (no {' or '.join(RECIPE_OUTPUT_MARKERS)})"
    if readme.is_file():
        try:
            ModelCard.load(readme)
        except ValueError as error:
            return f"its README.md cannot be parsed as a model card ({error})"
    return None


def check_card_updates(checkpoints: Sequence[str], output_dir: Path) -> None:
    """Raise before any cell runs if ``--update_model_cards`` would have to edit a checkpoint it must not."""
    refused = [(checkpoint, reason) for checkpoint in checkpoints if (reason := card_update_refusal(checkpoint))]
    if refused:
        details = "; ".join(f"{checkpoint}: {reason}" for checkpoint, reason in refused)
        raise UsageError(
            f"--update_model_cards refuses to edit these checkpoints' README.md: {details}. Nothing was run. Leave "
            f"out --update_model_cards: every checkpoint's results are written to {output_dir / CARDS_DIR} anyway."
        )


def merge_into_card(readme: Path, title: str, results: list[EvalResult]) -> ModelCard:
    """Add or refresh suite results in the card at ``readme`` (created if absent); text, other metadata and every
    other evaluation result (including the user's own) are kept."""
    if readme.is_file():
        card = ModelCard.load(readme)
    else:
        card = ModelCard(
            f"# {title}\n\nEvaluation results (model-index metadata above) from robust-pretrain's suite.\n"
        )
    kept = [old for old in card.data.eval_results or [] if not any(_replaced_by(old, new) for new in results)]
    card.data.eval_results = kept + results
    card.data.model_name = card.data.model_name or title
    card.save(readme)
    return card


def write_card_outputs(
    checkpoint: str, results: list[EvalResult], output_dir: Path, update_model_card: bool
) -> list[Path]:
    """Write the checkpoint's ``model_index.json`` and card fragment into the suite directory and, if asked (and
    :func:`check_card_updates` passed), merge the results into a local checkpoint's own card. Returns the paths."""
    from robust_pretrain.evaluation.checkpoints import checkpoint_key, checkpoint_label, local_dir

    label = checkpoint_label(checkpoint)
    target = output_dir / CARDS_DIR / checkpoint_key(checkpoint)
    target.mkdir(parents=True, exist_ok=True)
    index = {"checkpoint": checkpoint, "model-index": eval_results_to_model_index(label, results)}
    (target / "model_index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    fragment = ModelCard.from_template(
        ModelCardData(model_name=label, eval_results=results),
        template_path=str(SUITE_RESULTS_TEMPLATE),
        label=label,
        checkpoint=checkpoint,
    )
    fragment.save(target / "README.md")
    written = [target / "model_index.json", target / "README.md"]
    local = local_dir(checkpoint)
    if update_model_card and local is not None:
        merge_into_card(local / "README.md", local.name, results)
        written.append(local / "README.md")
    return written
