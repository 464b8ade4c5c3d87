"""One evaluation suite for every task family: checkpoints x tasks x seeds, the average and the worst task.

Each (checkpoint, task, seed) cell is one call of the task row's ``run`` (:mod:`robust_pretrain.evaluation.tasks`),
in-process; every cell builds a fresh model and re-seeds. A cell's result is stored in
``<output_dir>/cells/<checkpoint>/<task>/seed<seed>/cell.json`` (next to the run's own files and per-example
predictions) with a fingerprint of every setting that can change its score, so an interrupted suite resumes where it
stopped and recomputes exactly the cells whose settings changed (and says which settings).

Outputs: ``<family>_suite.json`` / ``.md`` (per task mean ± std over seeds, average, worst task named, deltas
against a baseline) and, per checkpoint, ``model_cards/<checkpoint>/model_index.json`` plus a card fragment. A
checkpoint's own ``README.md`` is edited only with ``--update_model_cards`` (see
:mod:`robust_pretrain.reporting.suite_cards`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from accelerate import PartialState

from robust_pretrain.cli import UsageError, check_checkpoint, run_console
from robust_pretrain.config import OptionParser, load_config_file, parse_with_config
from robust_pretrain.evaluation.checkpoints import (
    checkpoint_identity,
    checkpoint_key,
    checkpoint_label,
    checkpoint_state,
    random_init_source,
)
from robust_pretrain.evaluation.tasks import RunSettings, SuiteTask, TaskFamily, family_names, get_family
from robust_pretrain.options import check_options, option
from robust_pretrain.reporting.aggregation import summarize_suite
from robust_pretrain.reporting.suite_cards import check_card_updates, eval_results, write_card_outputs
from robust_pretrain.reporting.tables import suite_markdown

logger = logging.getLogger(__name__)

CELL_FILE = "cell.json"
DEFAULT_FAMILY = "glue"


@dataclass
class SuiteArguments:
    """Which checkpoints, tasks and seeds to run; the family's ``--output_dir`` option is the suite directory."""

    checkpoints: list[str] = field(
        metadata={
            "help": "Checkpoints to compare (local directories or Hub ids; dense family: random-init:<checkpoint> for "
            "its architecture with random weights, the no-pre-training baseline)."
        }
    )
    family: str = field(
        default=DEFAULT_FAMILY,
        metadata={"help": "Task family; selects the tasks and the options below. Known: " + ", ".join(family_names())},
    )
    tasks: list[str] | None = field(
        default=None, metadata={"help": "Tasks of the family (default: the family's usual set, e.g. GLUE's 8)."}
    )
    seeds: list[int] = option(default_factory=lambda: [42], help="Fine-tuning seeds per task.", minimum=0)
    baseline: str | None = field(
        default=None, metadata={"help": "Checkpoint the others are compared with (added to --checkpoints if absent)."}
    )
    update_model_cards: bool = field(
        default=False,
        metadata={
            "help": "Also merge the results into the README.md of local checkpoints written by this project's recipes "
            "(results always go to <output_dir>/model_cards/)."
        },
    )
    save_models: bool = field(default=False, metadata={"help": "Keep every fine-tuned model in its cell directory."})

    def __post_init__(self) -> None:
        check_options(self)
        family = get_family(self.family)
        self.tasks = [family.task(name).name for name in (self.tasks or family.default_tasks)]
        if not self.tasks or not self.seeds or not self.checkpoints:
            raise UsageError("--checkpoints, --tasks and --seeds each need at least one value")
        directions = {family.task(name).higher_is_better for name in self.tasks}
        if len(directions) > 1:
            raise UsageError(
                f"--tasks {self.tasks} mix metrics where higher is better with metrics where lower is better; they "
                "have no common average or worst task: run them as separate suites"
            )
        identities = [checkpoint_identity(checkpoint) for checkpoint in self.checkpoints]
        if self.baseline is not None:
            if checkpoint_identity(self.baseline) in identities:  # same checkpoint, possibly spelled differently
                self.baseline = self.checkpoints[identities.index(checkpoint_identity(self.baseline))]
            else:
                self.checkpoints = [self.baseline, *self.checkpoints]
                identities.insert(0, checkpoint_identity(self.baseline))
        for name, values in (("checkpoints", identities), ("tasks", self.tasks), ("seeds", self.seeds)):
            if len(set(values)) != len(values):
                raise UsageError(f"--{name} has duplicates: {getattr(self, name)}")


def suite_output_dir(family: TaskFamily, options: Sequence[Any]) -> Path:
    """The ``output_dir`` of the one option dataclass that has it."""
    found = [option.output_dir for option in options if "output_dir" in {f.name for f in fields(option)}]
    if len(found) != 1:
        raise TypeError(f"family {family.name!r}: exactly one option dataclass must define output_dir")
    if not found[0]:
        raise UsageError("--output_dir is required (the suite directory)")
    return Path(found[0])


def _write_json(path: Path, payload: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        return {key: item for name, child in value.items() for key, item in _flatten(child, f"{prefix}{name}.").items()}
    return {prefix.rstrip("."): value}


def _changes(old: dict[str, Any], new: dict[str, Any]) -> str:
    """``setting: old -> new`` for every differing (nested) setting."""
    before = _flatten(json.loads(json.dumps(old, default=str)))
    after = _flatten(json.loads(json.dumps(new, default=str)))
    changed = [key for key in sorted({*before, *after}) if before.get(key) != after.get(key)]
    return ", ".join(f"{key}: {before.get(key)!r} -> {after.get(key)!r}" for key in changed)


def cell_settings(checkpoint: str, task: SuiteTask, seed: int, run_settings: RunSettings) -> dict[str, Any]:
    """Everything that can change a cell's score."""
    return {
        "checkpoint": checkpoint_identity(checkpoint),
        "checkpoint_state": checkpoint_state(checkpoint),
        "family": task.family,
        "task": task.name,
        "seed": seed,
        "options": run_settings.settings,
    }


def _fingerprint(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def run_cell(
    checkpoint: str,
    task: SuiteTask,
    seed: int,
    options: Sequence[Any],
    run_settings: RunSettings,
    output_dir: Path,
    save_model: bool = False,
) -> dict[str, Any]:
    """Run one (checkpoint, task, seed) cell unless a finished cell with the same settings is on disk."""
    cell_dir = output_dir / "cells" / checkpoint_key(checkpoint) / task.name / f"seed{seed}"
    settings = cell_settings(checkpoint, task, seed, run_settings)
    fingerprint = _fingerprint(settings)
    cell_file = cell_dir / CELL_FILE
    if cell_file.is_file():
        cell = json.loads(cell_file.read_text(encoding="utf-8"))
        if cell.get("fingerprint") == fingerprint:
            logger.info("Reusing finished cell %s", cell_dir)
            return {**cell, "checkpoint": checkpoint}  # as spelled in this run (the identity is the same)
        logger.warning("Running %s again; settings changed: %s", cell_dir, _changes(cell.get("settings", {}), settings))
    state = PartialState()  # under accelerate launch / torchrun every process runs the cell; the main one writes
    if state.is_main_process:
        if cell_dir.exists():  # an interrupted or outdated run of this cell: the suite's own directory
            shutil.rmtree(cell_dir)
        cell_dir.mkdir(parents=True)
    state.wait_for_everyone()
    logger.info("Running cell %s: %s seed %d", checkpoint_label(checkpoint), task.name, seed)
    result = task.run(checkpoint=checkpoint, seed=seed, output_dir=cell_dir, options=options, save_model=save_model)
    state.wait_for_everyone()  # the main process writes the prediction files; the others check them after it
    missing = [key for key in (task.primary_metric, *task.card_metrics) if key not in result.metrics]
    missing += [name for name in result.prediction_files if not (cell_dir / name).is_file()]
    if missing:
        raise RuntimeError(f"task {task.name!r} ({task.family}): its run did not produce {missing} in {cell_dir}")
    cell = {
        "checkpoint": checkpoint,
        "family": task.family,
        "task": task.name,
        "seed": seed,
        "fingerprint": fingerprint,
        "settings": settings,
        "limits": run_settings.limits,
        "score": result.metrics[task.primary_metric],
        "metrics": result.metrics,
        "prediction_files": list(result.prediction_files),
        "raw_metrics": result.raw_metrics,
    }
    if state.is_main_process:
        _write_json(cell_file, cell)
    return cell


def run_suite(suite_args: SuiteArguments, options: Sequence[Any]) -> dict[str, Any]:
    """Validate every input, run (or reuse) all cells, then write ``<family>_suite.json``/``.md`` and card outputs.

    ``options``: the family's parsed option dataclasses, in the order of its ``option_types``.
    """
    family = get_family(suite_args.family)
    tasks = [family.task(name) for name in suite_args.tasks]
    output_dir = suite_output_dir(family, options)
    run_settings = family.run_settings(options)
    for checkpoint in suite_args.checkpoints:  # existence here; the family checks that each is a model it can load
        option_name = "--baseline" if checkpoint == suite_args.baseline else "--checkpoints"
        source = random_init_source(checkpoint)
        if source is not None and not family.random_init:
            raise UsageError(f"{option_name} {checkpoint}: the {family.name} family has no random-init entries")
        check_checkpoint(source or checkpoint, option_name, model=False)
    family.check_inputs(suite_args.checkpoints, tasks, options)
    if suite_args.update_model_cards:
        check_card_updates(suite_args.checkpoints, output_dir)
    if run_settings.limits:
        logger.warning("Limited protocol (recorded with every result): %s", run_settings.limits)
    output_dir.mkdir(parents=True, exist_ok=True)

    cells = [
        run_cell(checkpoint, task, seed, options, run_settings, output_dir, suite_args.save_models)
        for checkpoint in suite_args.checkpoints
        for task in tasks
        for seed in suite_args.seeds
    ]
    summary = summarize_suite(
        cells, tasks, suite_args.seeds, suite_args.baseline, family.description, run_settings.limits
    )
    if not PartialState().is_main_process:
        return summary
    _write_json(output_dir / f"{family.name}_suite.json", summary)
    (output_dir / f"{family.name}_suite.md").write_text(suite_markdown(summary), encoding="utf-8")
    for checkpoint, entry in summary["checkpoints"].items():
        results = eval_results(entry, tasks, suite_args.seeds, family.name, run_settings)
        for path in write_card_outputs(checkpoint, results, output_dir, suite_args.update_model_cards):
            logger.info("Wrote %s", path)
    return summary


def _family_from_argv(argv: Sequence[str] | None) -> str:
    """``--family`` from the command line or the ``--config`` file (it decides which options exist)."""
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--config")
    peek.add_argument("--family")
    known, _ = peek.parse_known_args(argv)
    if known.family is None and known.config is not None:
        return load_config_file(known.config).get("family", DEFAULT_FAMILY)
    return known.family or DEFAULT_FAMILY


def parse_suite_args(argv: Sequence[str] | None = None) -> tuple[SuiteArguments, tuple[Any, ...]]:
    """Parse ``[--config FILE] [--family NAME] --checkpoints ... <family options>``."""
    family = get_family(_family_from_argv(argv))
    parser = OptionParser(
        (SuiteArguments, *family.option_types),
        description=f"{family.name} tasks x seeds per checkpoint; reports the average and the worst task. "
        "--config FILE (YAML/JSON) sets defaults for any option.",
    )
    suite_args, *options = parse_with_config(parser, None if argv is None else list(argv))
    return suite_args, tuple(options)


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the command line, run the suite, print and return its summary."""
    suite_args, options = parse_suite_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    summary = run_suite(suite_args, options)
    print(suite_markdown(summary))
    return summary


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``robust-pretrain-suite [--family glue] --checkpoints A B --output_dir DIR ...``): exit
    status 2 and one paragraph for a bad option, checkpoint or data file."""
    return run_console(run, argv, prog="robust-pretrain-suite")
