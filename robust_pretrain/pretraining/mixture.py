"""The domain-mixture workflow in one command (DoReMi's three steps): reference run -> proxy run -> domain weights ->
main run.

    robust-pretrain-mixture --output_dir outputs/mixture --config decoder_demo [--max_steps 300 ...]

The mixture owns its definition: it sets each stage's objective, reference and sampling itself and refuses, before
the first stage, the options that would change them (``--weighting``, ``--loss_normalization``, ``--excess_clipping``,
``--domain_weights``, ``--task_sampling``, ``--reference_*``, and ``--streaming``, whose stream cannot draw the
natural proportions the reference needs). The options of the weighting strategies (``--dro_step_size``,
``--dro_smoothing``, ``--alpha``, ``--loss_ema``, ...) reach the proxy, and only the proxy (one its
``--proxy_objective`` does not take is refused); every other option (the command line's and a ``--config`` file's,
expanded here) reaches each stage's ``robust-pretrain-causal-lm`` run
(:mod:`robust_pretrain.pretraining.causal_lm.recipe`), into ``<output_dir>/<stage>``:

1. ``reference``: natural proportions, the plain mean next-token loss (``--weighting proportional``).
2. ``proxy-<r>``: ``--proxy_objective`` (``doremi``: Algorithm 1 of DoReMi, :mod:`robust_pretrain.weighting.doremi`,
   with DoReMi's step size 1.0 unless ``--dro_step_size`` is given) on the **excess** loss over the reference, with the
   reference's tokenizer, drawing batches uniformly over the domains as DoReMi does (``--proxy_sampling natural``: in
   the reference's proportions). ``--proxy_excess token`` (DoReMi's): the reference's
   checkpoint runs on each proxy batch (``--reference_model``) and the excess is the mean over a domain's tokens of
   ``max(l_proxy - l_ref, 0)``; ``held_out``: ``max(L_t - ref_t, 0)`` with the reference's held-out per-domain mean
   losses (no reference forward pass). Its domain weights are the strategy's weights averaged over all its optimizer
   steps (DoReMi's time average).
3. ``domain_weights.json``: the last round's weights with their provenance (tokenizer, each domain's data hash, model
   size, steps, objective, reference losses, every round's weights). Rounds go on until the weights change by less
   than ``--weights_tolerance`` in L1 or ``--rounds`` is reached. Round ``r > 1`` (DoReMi's iterated version) first
   trains ``reference-<r>`` with round ``r - 1``'s weights and runs its proxy against it; with ``--retrain_reference
   false`` every round keeps the round-1 reference and its proxy instead draws domains with round ``r - 1``'s weights.
4. ``main``: the plain mean loss, each sequence's domain drawn with those weights (``--domain_weights``); the run
   checks that the weights' provenance matches its own tokenizer, data and model size.

A stage that finished (its ``task_report.json`` written) is reused when the command is run again with the same
options, and the command says which stages it reused; an interrupted stage resumes from its last checkpoint; a stage
that finished with other options is refused. The stages record the paths inside the mixture folder relative to it,
so a moved or copied folder is rerun (and reused) as well.
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
from robust_pretrain.config import OptionParser, config_to_argv, load_config_file
from robust_pretrain.options import check_options, option, option_problems
from robust_pretrain.pretraining.causal_lm import recipe as causal_lm
from robust_pretrain.pretraining.causal_lm.arguments import DOMAIN_WEIGHTS_NAME
from robust_pretrain.reporting.task_report import TASK_REPORT_NAME
from robust_pretrain.weighting import WeightingArguments, accepted_options

logger = logging.getLogger(__name__)

STAGE_NAME = "stage.json"
"""The options a finished stage ran with, beside its outputs: a re-run reuses the stage only with the same ones."""
StageRunner = Callable[[Path, list[str]], dict[str, Any]]
"""Runs one stage into a folder with the stage's options; returns its task report."""
Options = list[str | Path]
"""A stage's options; a ``Path`` is a path inside the mixture folder, relative to it."""

#: options the mixture sets itself (refused when given)
OWNED = (
    "weighting",
    "loss_normalization",
    "excess_clipping",
    "domain_weights",
    "task_sampling",
    "task_sampling_weights",
    "importance_weighting",
    "objective_weights",
    "reference_losses",
    "reference_run",
    "reference_model",
    "reference_mismatch_ok",
    "streaming",
)
#: options of the weighting strategies: the proxy's only
PROXY_ONLY = tuple(each.name for each in fields(WeightingArguments) if each.name not in OWNED)
#: the proxy's sampling weights with ``--proxy_sampling uniform``
UNIFORM_NAME = "uniform_weights.json"
#: DoReMi's step size (their code's default and the paper's), the mixture's default for doremi and group_dro
DOREMI_STEP_SIZE = 1.0


@dataclass
class MixtureArguments:
    output_dir: str = option(
        help="Folder of the workflow: a sub-folder per stage, domain_weights.json.", path="output_dir"
    )
    proxy_objective: str = option(
        "doremi",
        "Strategy of the proxy run on the excess loss over the reference: doremi (DoReMi's Algorithm 1: every domain "
        "updated every step), group_dro (Sagawa et al.'s online group DRO: a domain absent from a step gets weight 0 "
        "and no update, so rare domains are starved; kept to reproduce runs made before doremi) or minimax (with "
        "--weigh_absent_tasks true unless given).",
        choices=["doremi", "group_dro", "minimax"],
    )
    proxy_sampling: str = option(
        "uniform",
        "How the proxy draws its batches: uniform over the domains (DoReMi's: every domain in nearly every batch, so "
        "none keeps a stale excess while the losses fall) or natural (the reference's proportions; rare domains are "
        "often absent and keep their last, higher excess: biased towards them early in training).",
        choices=["uniform", "natural"],
    )
    proxy_excess: str = option(
        "token",
        "The proxy's excess loss: token (DoReMi's: the reference checkpoint runs on each proxy batch, the excess is "
        "the mean over a domain's tokens of max(l_proxy - l_ref, 0)) or held_out (cheap: max(L_t - ref_t, 0) with the "
        "reference's held-out per-domain mean losses).",
        choices=["token", "held_out"],
    )
    rounds: int = option(1, "Most proxy rounds.", minimum=1)
    retrain_reference: bool = option(
        True,
        "Round r > 1 trains a new reference with round r-1's weights and runs its proxy against it (DoReMi's iterated "
        "version); false: every round keeps the first reference and its proxy draws domains with round r-1's weights.",
    )
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


def option_groups(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """``--name value ...`` tokens -> ``[(name, tokens of that option)]`` in order (``name`` without dashes)."""
    groups: list[tuple[str, list[str]]] = []
    for token in tokens:
        if token.startswith("--") or not groups:
            flag, equals, inline = token.partition("=")
            groups.append((flag[2:].replace("-", "_"), [flag, inline] if equals else [token]))
        else:
            groups[-1][1].append(token)
    return groups


def _read_json(path: Path, stage_dir: Path, key: str | None = None) -> dict[str, Any]:
    """The JSON object in ``path`` (with ``key``, if given); a :class:`UsageError` naming the stage folder to delete
    when it is not one."""
    try:
        content = json.loads(path.read_text())
        if not isinstance(content, dict) or (key is not None and not isinstance(content.get(key), list)):
            raise ValueError(f"not a JSON object{f' with a list {key!r}' if key else ''}")
    except (ValueError, UnicodeDecodeError) as err:
        raise UsageError(
            f"{path} is corrupt ({type(err).__name__}: {err}): delete the stage folder {stage_dir} to train that stage "
            "again"
        ) from err
    return content


def run_stage(root: Path, stage: str, options: Options, runner: StageRunner, reused: list[str]) -> dict[str, Any]:
    """The report of stage ``stage`` (in ``root / stage``): reused if it finished with the same options (the passed
    ones and the stage's own, paths inside ``root`` relative to it), else run (resuming an interrupted run); a reused
    stage's name is appended to ``reused``."""
    stage_dir = root / stage
    recorded = [option.as_posix() if isinstance(option, Path) else option for option in options]
    record = stage_dir / STAGE_NAME
    report_path = stage_dir / TASK_REPORT_NAME
    if record.is_file():
        previous = _read_json(record, stage_dir, "options")["options"]
        if previous != recorded:
            before, now = option_values(previous), option_values(recorded)
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
            print(f"= reusing the finished stage {stage_dir} (same options)", flush=True)
            reused.append(stage)
            return _read_json(report_path, stage_dir)
    resolved = [str(root / option) if isinstance(option, Path) else option for option in options]
    report = runner(stage_dir, resolved)  # an interrupted run resumes, or refuses other options, by itself
    record.write_text(json.dumps({"options": recorded}, indent=2) + "\n")
    return report


def mixture_workflow(args: MixtureArguments, runner: StageRunner, passed: list[str]) -> dict[str, Any]:
    """Reference -> proxy rounds -> ``domain_weights.json`` -> main run, each stage run with its options: the
    ``passed`` ones (the proxy options among them to the proxy only) and its own; the exported weights file's content,
    the main run's report under ``"main"`` and the stages reused from an earlier run under ``"reused"``."""
    shared, proxy_options = split_options(args, passed)
    root = Path(args.output_dir)
    reused: list[str] = []
    reference_name = "reference"
    reference = run_stage(root, reference_name, [*shared, "--weighting", "proportional"], runner, reused)
    domains, natural_weights = reference["tasks"], reference["mixture_weights"]
    shared = [*shared, "--tokenizer_name", Path(reference_name)]
    if args.proxy_sampling == "uniform":
        uniform = {"weights": dict.fromkeys(domains, 1.0), "provenance": reference["provenance"]}  # the same data
        (root / UNIFORM_NAME).write_text(json.dumps(uniform, indent=2) + "\n")
    against = {
        "token": "per-token excess over the reference model",
        "held_out": "excess over the reference's held-out means",
    }
    rounds: list[dict[str, float]] = []
    previous_file: Path | None = None
    content: dict[str, Any] = {}
    for round_index in range(1, args.rounds + 1):
        sampling: Options = ["--domain_weights", Path(UNIFORM_NAME)] if args.proxy_sampling == "uniform" else []
        if previous_file is not None and args.retrain_reference:
            reference_name = f"reference-{round_index}"
            reference_options = [*shared, "--weighting", "proportional", "--domain_weights", previous_file]
            reference = run_stage(root, reference_name, reference_options, runner, reused)
        elif previous_file is not None:
            sampling = ["--domain_weights", previous_file]
        reference_losses = [reference["eval_task_loss"][name] for name in domains]
        if args.proxy_excess == "token":
            excess: Options = ["--reference_model", Path(reference_name), "--excess_clipping", "token"]
        else:
            excess = ["--reference_losses", *(repr(loss) for loss in reference_losses)]
        options = [*shared, *proxy_options, "--weighting", args.proxy_objective, "--loss_normalization", "excess"]
        proxy = run_stage(root, f"proxy-{round_index}", [*options, *excess, *sampling], runner, reused)
        weights = proxy["time_averaged_weights"]
        rounds.append(weights)
        content = {
            "weights": weights,
            "provenance": {
                **proxy["provenance"],
                "steps": proxy["train_steps"],
                "objective": f"{args.proxy_objective} on the {against[args.proxy_excess]}",
                "reference": reference_name,
                "reference_losses": dict(zip(domains, reference_losses, strict=True)),
                "natural_weights": natural_weights,
                "rounds": rounds,
            },
        }
        previous_file = Path(f"domain_weights-{round_index}.json")
        (root / previous_file).write_text(json.dumps(content, indent=2) + "\n")
        change = l1(weights, rounds[-2]) if len(rounds) > 1 else None
        logger.info("round %d: weights %s (L1 change %s)", round_index, weights, change)
        if change is not None and change < args.weights_tolerance:
            break
    shutil.copyfile(root / previous_file, root / DOMAIN_WEIGHTS_NAME)
    if args.main_run:
        options = [*shared, "--weighting", "proportional", "--domain_weights", Path(DOMAIN_WEIGHTS_NAME)]
        content["main"] = run_stage(root, "main", options, runner, reused)
    if reused:
        print(f"= reused the finished stages {', '.join(reused)} of {root}", flush=True)
    return {**content, "reused": reused}


def split_options(args: MixtureArguments, passed: list[str]) -> tuple[list[str], list[str]]:
    """``passed`` (a ``--config`` file expanded in place, the command line's options winning) -> the options of every
    stage and the proxy's own options (unless given: ``--dro_step_size 1.0`` for doremi and group_dro,
    ``--weigh_absent_tasks true`` for minimax). Refused
    (:class:`UsageError`): the options the mixture sets itself, a proxy option the proxy objective does not take or a
    value it does not accept. A recipe config's ``weighting`` (and ``loss_normalization``) and the proxy options of
    that weighting are the standalone recipe's: the mixture leaves them out."""
    config_path, command_line = None, []
    groups = option_groups(passed)
    for name, tokens in groups:
        if name == "config" and len(tokens) == 2:
            config_path = tokens[1]
        else:
            command_line.append((name, tokens))
    config = [] if config_path is None else option_groups(config_to_argv(load_config_file(config_path), config_path))
    given = {name for name, _ in command_line}
    problems = [
        STREAMING_REFUSED
        if name == "streaming"
        else f"--{name} is set by robust-pretrain-mixture itself ({OWNED_WHY[name]}): leave it out"
        for name, tokens in command_line
        if name in OWNED and not _is_false(tokens)
    ]
    problems += [
        f"--config {config_path}: {name!r} is set by robust-pretrain-mixture itself ({OWNED_WHY[name]}): remove it "
        "from the config"
        for name, tokens in config
        if name in OWNED and name not in ("weighting", "loss_normalization") and not _is_false(tokens)
    ]
    takes = accepted_options(args.proxy_objective)
    problems += [
        f"--{name} does not apply to --proxy_objective {args.proxy_objective} (its options: "
        f"{', '.join('--' + each for each in sorted(takes & set(PROXY_ONLY)))})"
        for name in dict.fromkeys(name for name, _ in command_line)
        if name in PROXY_ONLY and name not in takes
    ]
    refuse(problems)
    every_stage: list[str] = []
    proxy: list[str] = []
    for name, tokens in [*((n, t) for n, t in config if n not in given), *command_line]:
        if name in OWNED or name == "output_dir":
            continue  # a recipe config's weighting and output_dir are the standalone recipe's
        if name in PROXY_ONLY:
            proxy += tokens if name in takes else []
        else:
            every_stage += tokens
    defaults = {"dro_step_size": repr(DOREMI_STEP_SIZE)}
    if args.proxy_objective == "minimax":  # as doremi does: absent domains keep their weight (no starved rare domain)
        defaults["weigh_absent_tasks"] = "true"
    given_to_proxy = {name for name, _ in option_groups(proxy)}
    for name, value in defaults.items():
        if name in takes and name not in given_to_proxy:
            proxy += [f"--{name}", value]
    namespace, _ = OptionParser(WeightingArguments).parse_known_args(proxy)
    values = {each.name: getattr(namespace, each.name) for each in fields(WeightingArguments)}
    refuse(option_problems(WeightingArguments, values))
    return every_stage, proxy


#: why the mixture sets each option of ``OWNED`` itself
OWNED_WHY = {
    "weighting": "proportional for the reference and the main run, --proxy_objective for the proxy",
    "loss_normalization": "the proxy's excess over the reference",
    "excess_clipping": "--proxy_excess chooses the proxy's excess",
    "domain_weights": "the reference draws the natural proportions, the main run the learned weights",
    "task_sampling": "the reference draws the natural proportions, the main run the learned weights",
    "task_sampling_weights": "the reference draws the natural proportions, the main run the learned weights",
    "importance_weighting": "the stages' objectives are the mixture's",
    "objective_weights": "the stages' objectives are the mixture's",
    "reference_losses": "the proxy's reference is the mixture's reference stage",
    "reference_run": "the proxy's reference is the mixture's reference stage",
    "reference_model": "the proxy's reference is the mixture's reference stage",
    "reference_mismatch_ok": "the proxy's reference is the mixture's reference stage",
    "streaming": "the reference must draw the natural proportions, which a stream cannot",
}
STREAMING_REFUSED = (
    "--streaming: the mixture's reference must draw the natural proportions, and a stream draws uniform or a file's "
    "weights; run the mixture on map-style data (no --streaming)"
)


def _is_false(tokens: list[str]) -> bool:
    """Whether an option's tokens set a boolean to false (``--streaming false`` changes nothing)."""
    return len(tokens) == 2 and tokens[1].lower() in ("false", "0", "no")


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``robust-pretrain-mixture``): exit status 2 and one line for a bad option."""
    return run_console(run, argv, prog="robust-pretrain-mixture")


def run(argv: list[str]) -> dict[str, Any]:
    """The workflow as ``argv`` says: the mixture's own options, the others passed to the stages they are for."""
    parser = OptionParser(MixtureArguments, description=__doc__)
    namespace, passed = parser.parse_known_args(argv)
    values = {each.name: getattr(namespace, each.name) for each in fields(MixtureArguments)}
    refuse(option_problems(MixtureArguments, values))
    mixture_args = MixtureArguments(**values)

    def causal_lm_stage(stage_dir: Path, options: list[str]) -> dict[str, Any]:
        return causal_lm.run([*options, "--output_dir", str(stage_dir)])["report"]

    return mixture_workflow(mixture_args, causal_lm_stage, passed)


__all__ = ["MixtureArguments", "main", "mixture_workflow", "run", "run_stage"]
