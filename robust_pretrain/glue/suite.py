"""GLUE suite: fine-tune checkpoints x tasks x seeds and report the average and the worst task side by side.

Each (checkpoint, task, seed) cell is one :func:`run_finetune` call, run in-process (one interpreter and one
torch/transformers import for the whole suite; every cell builds a fresh model and Trainer and re-seeds). A cell's
result is stored in ``<output_dir>/cells/<checkpoint>/<task>/seed<seed>/cell.json`` together with a fingerprint of
the settings that change its score, so an interrupted suite resumes where it stopped and only recomputes cells
whose settings changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard
from transformers import HfArgumentParser

from robust_pretrain.config import parse_with_config
from robust_pretrain.glue.data import check_glue_files
from robust_pretrain.glue.finetune import (
    GlueDataArguments,
    GlueRunArguments,
    GlueTrainingArguments,
    LoraArguments,
    check_checkpoint,
    run_finetune,
)
from robust_pretrain.glue.tasks import GLUE_TASKS, get_task, primary_score

logger = logging.getLogger(__name__)

# The eight GLUE tasks of the usual average (WNLI is excluded, as in BERT).
DEFAULT_TASKS = ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte"]
CELL_FILE = "cell.json"
# Training settings that change a cell's score; a finished cell is reused only if these (and data/LoRA settings) match.
_SCORE_SETTINGS = (
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_steps",
    "weight_decay",
    "warmup_steps",
    "lr_scheduler_type",
    "optim",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "label_smoothing_factor",
)
_MODEL_INDEX_TASK = "text-classification"
_HUB_DATASET = "nyu-mll/glue"
_CARD_SOURCE = "robust-pretrain glue_suite"


@dataclass
class GlueSuiteArguments:
    """Which checkpoints, tasks and seeds to run; ``--output_dir`` (training option) is the suite directory."""

    checkpoints: list[str] = field(metadata={"help": "Checkpoints to compare (local directories or Hub ids)."})
    tasks: list[str] = field(
        default_factory=lambda: list(DEFAULT_TASKS),
        metadata={"help": f"GLUE tasks (default: the 8-task GLUE average, no WNLI). Known: {', '.join(GLUE_TASKS)}."},
    )
    seeds: list[int] = field(default_factory=lambda: [42], metadata={"help": "Fine-tuning seeds per task."})
    baseline: str | None = field(
        default=None, metadata={"help": "Checkpoint the others are compared with (added to --checkpoints if absent)."}
    )
    update_model_cards: bool = field(
        default=True, metadata={"help": "Add the results as model-index entries to local checkpoints' README.md."}
    )
    save_models: bool = field(default=False, metadata={"help": "Keep every fine-tuned model in its cell directory."})

    def __post_init__(self) -> None:
        self.tasks = [get_task(task).name for task in self.tasks]
        if not self.tasks or not self.seeds or not self.checkpoints:
            raise ValueError("--checkpoints, --tasks and --seeds each need at least one value")
        identities = [checkpoint_identity(checkpoint) for checkpoint in self.checkpoints]
        if self.baseline is not None:
            if checkpoint_identity(self.baseline) in identities:  # same checkpoint, possibly spelled differently
                self.baseline = self.checkpoints[identities.index(checkpoint_identity(self.baseline))]
            else:
                self.checkpoints = [self.baseline, *self.checkpoints]
                identities.insert(0, checkpoint_identity(self.baseline))
        for name, values in (("checkpoints", identities), ("tasks", self.tasks), ("seeds", self.seeds)):
            if len(set(values)) != len(values):
                raise ValueError(f"--{name} has duplicates: {getattr(self, name)}")


def _local_dir(checkpoint: str) -> Path | None:
    path = Path(checkpoint).expanduser()
    return path.resolve() if path.is_dir() else None


def checkpoint_identity(checkpoint: str) -> str:
    """A local directory's resolved path, or the Hub id."""
    local = _local_dir(checkpoint)
    return checkpoint if local is None else str(local)


def checkpoint_label(checkpoint: str) -> str:
    """Short display name: a local directory's name, or the Hub id."""
    local = _local_dir(checkpoint)
    return checkpoint if local is None else local.name


def _checkpoint_key(checkpoint: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", checkpoint_label(checkpoint)).strip("-")
    return f"{slug}-{hashlib.sha1(checkpoint_identity(checkpoint).encode()).hexdigest()[:8]}"


def cell_fingerprint(
    checkpoint: str,
    task: str,
    seed: int,
    data_args: GlueDataArguments,
    lora_args: LoraArguments,
    training_args: GlueTrainingArguments,
) -> str:
    """Hash of everything that changes a cell's score (the data source is not part of it: Hub and TSV agree)."""
    settings = {
        "checkpoint": checkpoint_identity(checkpoint),
        "task": task,
        "seed": seed,
        "data": {k: v for k, v in dataclasses.asdict(data_args).items() if k not in ("glue_dir", "cache_dir")},
        "lora": dataclasses.asdict(lora_args) if lora_args.use_lora else None,
        "training": {name: str(getattr(training_args, name)) for name in _SCORE_SETTINGS},
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _write_json(path: Path, payload: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def run_cell(
    checkpoint: str,
    task: str,
    seed: int,
    suite_args: GlueSuiteArguments,
    data_args: GlueDataArguments,
    lora_args: LoraArguments,
    training_args: GlueTrainingArguments,
) -> dict[str, Any]:
    """Run one (checkpoint, task, seed) cell unless a finished cell with the same fingerprint is on disk."""
    cell_dir = Path(training_args.output_dir) / "cells" / _checkpoint_key(checkpoint) / task / f"seed{seed}"
    fingerprint = cell_fingerprint(checkpoint, task, seed, data_args, lora_args, training_args)
    cell_file = cell_dir / CELL_FILE
    if cell_file.is_file():
        cell = json.loads(cell_file.read_text(encoding="utf-8"))
        if cell.get("fingerprint") == fingerprint:
            logger.info("Reusing finished cell %s", cell_dir)
            return cell
        logger.warning("Settings changed since %s was computed; running it again", cell_dir)
    cell_args = dataclasses.replace(training_args, output_dir=str(cell_dir), seed=seed)
    eval_metrics = run_finetune(
        GlueRunArguments(model_name_or_path=checkpoint, task_name=task),
        data_args,
        lora_args,
        cell_args,
        save_model=suite_args.save_models,
    )
    cell = {
        "checkpoint": checkpoint,
        "task": task,
        "seed": seed,
        "fingerprint": fingerprint,
        "primary_score": primary_score(task, eval_metrics),
        "eval_metrics": eval_metrics,
    }
    cell_dir.mkdir(parents=True, exist_ok=True)
    _write_json(cell_file, cell)
    return cell


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(cells: list[dict[str, Any]], tasks: list[str], seeds: list[int], baseline: str | None) -> dict[str, Any]:
    """Aggregate cells into per-checkpoint task means/stds (0-100), average, worst task and deltas vs baseline."""
    checkpoints: dict[str, Any] = {}
    for cell in cells:
        entry = checkpoints.setdefault(cell["checkpoint"], {"label": checkpoint_label(cell["checkpoint"]), "tasks": {}})
        task = entry["tasks"].setdefault(cell["task"], {"seeds": [], "scores": [], "metrics": {}})
        task["seeds"].append(cell["seed"])
        task["scores"].append(cell["primary_score"])
        for name in get_task(cell["task"]).metrics:
            for suffix in ("", "_mm"):
                if f"eval_{name}{suffix}" in cell["eval_metrics"]:
                    task["metrics"].setdefault(f"{name}{suffix}", []).append(
                        100.0 * cell["eval_metrics"][f"eval_{name}{suffix}"]
                    )
    for entry in checkpoints.values():
        for name, task in entry["tasks"].items():
            task["mean"], task["std"] = _mean_std(task["scores"])
            task["metrics"] = {metric: statistics.fmean(values) for metric, values in task["metrics"].items()}
            task["primary_metric"] = get_task(name).primary_metric
        means = {name: entry["tasks"][name]["mean"] for name in tasks}
        entry["average"] = statistics.fmean(means.values())
        entry["worst_task"] = min(means, key=means.__getitem__)
        entry["worst_score"] = means[entry["worst_task"]]
    labels = [entry["label"] for entry in checkpoints.values()]
    for checkpoint, entry in checkpoints.items():
        if labels.count(entry["label"]) > 1:
            entry["label"] = checkpoint
    if baseline is not None:
        base = checkpoints[baseline]
        for entry in checkpoints.values():
            entry["delta"] = {
                "tasks": {name: entry["tasks"][name]["mean"] - base["tasks"][name]["mean"] for name in tasks},
                "average": entry["average"] - base["average"],
                "worst_score": entry["worst_score"] - base["worst_score"],
            }
    return {"tasks": tasks, "seeds": seeds, "baseline": baseline, "checkpoints": checkpoints}


def _task_header(task: str) -> str:
    spec = get_task(task)
    return f"{spec.glue_dir_name} ({spec.primary_metric.replace('matthews_correlation', 'mcc')})"


def _signed(value: float) -> str:
    return f"{value:+.1f}"


def render_markdown(summary: dict[str, Any]) -> str:
    """Markdown tables: scores (mean ± std over seeds) with average and worst task, then deltas vs the baseline."""
    tasks = summary["tasks"]
    lines = [
        f"GLUE dev scores x100, mean ± std over seeds {summary['seeds']}; worst task = lowest mean primary score.",
        "",
        "| checkpoint | " + " | ".join(_task_header(task) for task in tasks) + " | average | worst task |",
        "|---" * (len(tasks) + 3) + "|",
    ]
    for entry in summary["checkpoints"].values():
        scores = [f"{entry['tasks'][t]['mean']:.1f} ± {entry['tasks'][t]['std']:.1f}" for t in tasks]
        worst = f"{entry['worst_score']:.1f} ({get_task(entry['worst_task']).glue_dir_name})"
        lines.append(f"| {entry['label']} | " + " | ".join(scores) + f" | {entry['average']:.1f} | {worst} |")
    if summary["baseline"] is not None:
        base_label = summary["checkpoints"][summary["baseline"]]["label"]
        lines += [
            "",
            f"Deltas against the baseline {base_label} (worst-case delta = own worst score - baseline's worst score):",
            "",
            "| checkpoint | "
            + " | ".join(f"Δ {get_task(t).glue_dir_name}" for t in tasks)
            + " | Δ average | Δ worst |",
            "|---" * (len(tasks) + 3) + "|",
        ]
        for checkpoint, entry in summary["checkpoints"].items():
            if checkpoint == summary["baseline"]:
                continue
            delta = entry["delta"]
            cells = [_signed(delta["tasks"][t]) for t in tasks]
            lines.append(
                f"| {entry['label']} | "
                + " | ".join(cells)
                + f" | {_signed(delta['average'])} | {_signed(delta['worst_score'])} |"
            )
    return "\n".join(lines) + "\n"


def _eval_results(entry: dict[str, Any], seeds: list[int], method: str) -> list[EvalResult]:
    results = []
    for task, scores in entry["tasks"].items():
        spec = get_task(task)
        split = spec.eval_splits[0]
        for metric, value in scores["metrics"].items():
            if metric.endswith("_mm"):
                metric, split = metric[: -len("_mm")], "validation_mismatched"
            results.append(
                EvalResult(
                    task_type=_MODEL_INDEX_TASK,
                    dataset_type=_HUB_DATASET,
                    dataset_name=f"GLUE {spec.glue_dir_name}",
                    dataset_config=spec.name,
                    dataset_split=split,
                    metric_type=metric,
                    metric_value=round(value, 2),
                    metric_name=f"{metric} x100 ({method} fine-tuning, mean over {len(seeds)} seeds)",
                    metric_args={"source": _CARD_SOURCE, "fine_tuning": method, "seeds": list(seeds)},
                )
            )
    return results


def _replaced_by(old: EvalResult, new: EvalResult) -> bool:
    """Whether ``old`` is an earlier suite result for the same metric (results from anything else are kept)."""
    keys = ("task_type", "dataset_type", "dataset_config", "dataset_split", "metric_type")
    old_args, new_args = old.metric_args or {}, new.metric_args or {}
    same_run = all(old_args.get(key) == new_args.get(key) for key in ("source", "fine_tuning"))
    return same_run and all(getattr(old, key) == getattr(new, key) for key in keys)


def update_model_card(checkpoint_dir: Path, entry: dict[str, Any], seeds: list[int], method: str = "full") -> Path:
    """Add or refresh suite results (per task and ``method``: full/lora) as ``model-index`` entries in README.md.

    Card text, other metadata and every other evaluation result (including the user's own) are kept.
    """
    readme = checkpoint_dir / "README.md"
    if readme.is_file():
        card = ModelCard.load(readme)
    else:
        text = "GLUE dev results (model-index metadata above) were added by robust-pretrain's glue_suite."
        card = ModelCard(f"# {checkpoint_dir.name}\n\n{text}\n")
    new_results = _eval_results(entry, seeds, method)
    kept = [old for old in card.data.eval_results or [] if not any(_replaced_by(old, new) for new in new_results)]
    card.data.eval_results = kept + new_results
    card.data.model_name = card.data.model_name or checkpoint_dir.name
    card.save(readme)
    return readme


def run_suite(
    suite_args: GlueSuiteArguments,
    data_args: GlueDataArguments,
    lora_args: LoraArguments,
    training_args: GlueTrainingArguments,
) -> dict[str, Any]:
    """Validate every input, run (or reuse) all cells, then write ``glue_suite.json``/``.md`` and model cards."""
    if not training_args.do_eval:
        raise ValueError("The suite needs evaluation; do not pass --do_eval false")
    for checkpoint in suite_args.checkpoints:
        check_checkpoint(checkpoint)
    if data_args.glue_dir is not None:
        for task in suite_args.tasks:
            check_glue_files(task, data_args.glue_dir)
    output_dir = Path(training_args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    cells = [
        run_cell(checkpoint, task, seed, suite_args, data_args, lora_args, training_args)
        for checkpoint in suite_args.checkpoints
        for task in suite_args.tasks
        for seed in suite_args.seeds
    ]
    summary = summarize(cells, suite_args.tasks, suite_args.seeds, suite_args.baseline)
    _write_json(output_dir / "glue_suite.json", summary)
    (output_dir / "glue_suite.md").write_text(render_markdown(summary), encoding="utf-8")
    if suite_args.update_model_cards:
        method = "lora" if lora_args.use_lora else "full"
        for checkpoint, entry in summary["checkpoints"].items():
            local = _local_dir(checkpoint)
            if local is not None:
                logger.info("Updated model card %s", update_model_card(local, entry, suite_args.seeds, method))
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI entry point: ``python recipes/glue_suite.py [--config FILE] --checkpoints A B --output_dir DIR ...``."""
    parser = HfArgumentParser(
        (GlueSuiteArguments, GlueDataArguments, LoraArguments, GlueTrainingArguments),
        description="GLUE tasks x seeds per checkpoint; reports average and worst task. --config FILE sets defaults.",
    )
    suite_args, data_args, lora_args, training_args = parse_with_config(parser, argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    summary = run_suite(suite_args, data_args, lora_args, training_args)
    print(render_markdown(summary))
    return summary
