"""The domain-mixture workflow in one command (DoReMi's three steps): reference run -> proxy run -> domain weights ->
main run.

    robust-pretrain-mixture --output_dir outputs/mixture --config decoder_demo [--max_steps 300 ...]

Every option the mixture does not declare itself goes to each stage's ``robust-pretrain-causal-lm`` run
(:mod:`robust_pretrain.pretraining.causal_lm`), into ``<output_dir>/<stage>``:

1. ``reference``: natural proportions, the plain mean next-token loss (``--weighting proportional``); its held-out
   per-domain losses are the reference losses.
2. ``proxy-<r>``: ``--proxy_objective`` (``group_dro``, DoReMi's, or ``minimax``) on the **excess** loss over the
   reference (``max(L_t - reference_t, 0)``), with the reference's tokenizer; round 1 draws batches in natural
   proportions, round ``r > 1`` draws domains with round ``r - 1``'s weights. Its domain weights are the strategy's
   weights averaged over all its optimizer steps (DoReMi's time average).
3. ``domain_weights.json``: the last round's weights with their provenance (tokenizer, each domain's data hash, model
   size, steps, objective, reference losses, every round's weights). Rounds go on until the weights change by less
   than ``--weights_tolerance`` in L1 or ``--rounds`` is reached.
4. ``main``: the plain mean loss, each sequence's domain drawn with those weights (``--domain_weights``); the run
   checks that the weights' provenance matches its own tokenizer, data and model size.

A stage that finished (its ``task_report.json`` written) is reused when the command is run again with the same
options; an interrupted stage resumes from its last checkpoint; a stage that finished with other options is refused.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from robust_pretrain.cli import UsageError, refuse, run_console
from robust_pretrain.config import OptionParser
from robust_pretrain.options import check_options, option, option_problems
from robust_pretrain.pretraining import causal_lm
from robust_pretrain.pretraining.causal_lm import DOMAIN_WEIGHTS_NAME
from robust_pretrain.reporting.task_report import TASK_REPORT_NAME

logger = logging.getLogger(__name__)

STAGE_NAME = "stage.json"
"""The options a finished stage ran with, beside its outputs: a re-run reuses the stage only with the same ones."""
StageRunner = Callable[[Path, list[str]], dict[str, Any]]
"""Runs one stage into a folder with the stage's options; returns its task report."""


@dataclass
class MixtureArguments:
    output_dir: str = option(
        help="Folder of the workflow: a sub-folder per stage, domain_weights.json.", path="output_dir"
    )
    proxy_objective: str = option(
        "group_dro",
        "Strategy of the proxy run on the excess loss over the reference: group_dro (DoReMi) or minimax.",
        choices=["group_dro", "minimax"],
    )
    rounds: int = option(1, "Most proxy rounds (each after the first draws domains with the previous weights).",
                         minimum=1)  # fmt: skip
    weights_tolerance: float = option(
        0.02, "Stop the rounds once the weights change by less than this (L1 distance).", above=0
    )
    main_run: bool = option(True, "Train the main run with the learned weights (else stop after exporting them).")

    def __post_init__(self) -> None:
        check_options(self)


def l1(first: dict[str, float], second: dict[str, float]) -> float:
    return sum(abs(first[name] - second[name]) for name in first)


def option_values(tokens: list[str]) -> dict[str, list[str]]:
    """``--name value ...`` tokens -> ``{"--name": [values]}`` (a repeated option: its last values)."""
    values: dict[str, list[str]] = {}
    name = None
    for token in tokens:
        if token.startswith("--"):
            name, _, inline = token.partition("=")
            values[name] = [inline] if inline else []
        elif name is not None:
            values[name].append(token)
    return values


def run_stage(stage_dir: Path, options: list[str], runner: StageRunner) -> dict[str, Any]:
    """The stage's report: reused if it finished with the same options (the passed ones and the stage's own), else
    run (resuming an interrupted run)."""
    record = stage_dir / STAGE_NAME
    report_path = stage_dir / TASK_REPORT_NAME
    if record.is_file():
        previous = json.loads(record.read_text())["options"]
        if previous != options:
            before, now = option_values(previous), option_values(options)
            changed = [
                f"{name} {' '.join(before.get(name, ['(unset)']))} -> {' '.join(now.get(name, ['(unset)']))}"
                for name in dict.fromkeys([*before, *now])
                if before.get(name) != now.get(name)
            ]
            raise UsageError(
                f"{stage_dir} ran with other options ({', '.join(changed) or 'in another order'}): use another "
                "--output_dir, or delete the stage folder to train it again"
            )
        if report_path.is_file():
            logger.info("reusing the finished stage %s", stage_dir)
            return json.loads(report_path.read_text())
    report = runner(stage_dir, options)  # an interrupted run resumes, or refuses other options, by itself
    record.write_text(json.dumps({"options": options}, indent=2) + "\n")
    return report


def mixture_workflow(args: MixtureArguments, runner: StageRunner, passed: list[str]) -> dict[str, Any]:
    """Reference -> proxy rounds -> ``domain_weights.json`` -> main run, each stage run with the ``passed`` options
    and its own; the exported weights file's content (and the main run's report under ``"main"``)."""
    root = Path(args.output_dir)
    reference_dir = root / "reference"
    reference = run_stage(reference_dir, [*passed, "--weighting", "proportional"], runner)
    domains = reference["tasks"]
    reference_losses = [reference["eval_task_loss"][name] for name in domains]
    shared = [*passed, "--tokenizer_name", str(reference_dir)]
    rounds: list[dict[str, float]] = []
    previous_file: Path | None = None
    proxy: dict[str, Any] = {}
    for round_index in range(1, args.rounds + 1):
        options = [
            *shared,
            "--weighting", args.proxy_objective,
            "--loss_normalization", "excess",
            "--reference_losses", *(repr(loss) for loss in reference_losses),
        ]  # fmt: skip
        if previous_file is not None:
            options += ["--domain_weights", str(previous_file)]
        proxy = run_stage(root / f"proxy-{round_index}", options, runner)
        weights = proxy["time_averaged_weights"]
        rounds.append(weights)
        content = {
            "weights": weights,
            "provenance": {
                **proxy["provenance"],
                "steps": proxy["train_steps"],
                "objective": f"{args.proxy_objective} on the excess loss over the reference",
                "reference_losses": dict(zip(domains, reference_losses, strict=True)),
                "natural_weights": reference["mixture_weights"],
                "rounds": rounds,
            },
        }
        previous_file = root / f"domain_weights-{round_index}.json"
        previous_file.write_text(json.dumps(content, indent=2) + "\n")
        change = l1(weights, rounds[-2]) if len(rounds) > 1 else None
        logger.info("round %d: weights %s (L1 change %s)", round_index, weights, change)
        if change is not None and change < args.weights_tolerance:
            break
    shutil.copyfile(previous_file, root / DOMAIN_WEIGHTS_NAME)
    if args.main_run:
        options = [*shared, "--weighting", "proportional", "--domain_weights", str(root / DOMAIN_WEIGHTS_NAME)]
        content["main"] = run_stage(root / "main", options, runner)
    return content


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``robust-pretrain-mixture``): exit status 2 and one line for a bad option."""
    return run_console(run, argv, prog="robust-pretrain-mixture")


def run(argv: list[str]) -> dict[str, Any]:
    """The workflow as ``argv`` says: the mixture's own options, every other one passed to each stage."""
    parser = OptionParser(MixtureArguments, description=__doc__)
    namespace, passed = parser.parse_known_args(argv)
    values = {each.name: getattr(namespace, each.name) for each in fields(MixtureArguments)}
    refuse(option_problems(MixtureArguments, values))
    mixture_args = MixtureArguments(**values)

    def causal_lm_stage(stage_dir: Path, options: list[str]) -> dict[str, Any]:
        return causal_lm.run([*options, "--output_dir", str(stage_dir)])["report"]

    return mixture_workflow(mixture_args, causal_lm_stage, passed)


__all__ = ["MixtureArguments", "main", "mixture_workflow", "run", "run_stage"]
