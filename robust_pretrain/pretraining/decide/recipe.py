"""Does worst-case or learned domain mixing beat a static mixture on *your* domains? One command that answers it, by a
rule fixed before the first training step.

    robust-pretrain-decide --output_dir outputs/decide [--arms sampling_control stratified unimax minimax ...] \\
        [--arm mine=weights.json] [--seeds 42 43 44 45] [--baseline sampling_control] [--margin 0.1] \\
        [--plan | --cell ARM:SEED | --report] \\
        [--domain_files web=web.txt code=code.txt ... | --config decoder_demo --max_steps 300 ...]

Every arm trains the same decoder (``robust-pretrain-causal-lm``; every option decide does not declare goes to every
run, after the defaults ``--config decoder_demo --max_steps 300``) on the same domains, once per seed, into
``<output_dir>/cells/<arm>/seed-<seed>``. Paired by seed: a seed fixes the initialisation and the data order, and
every arm of a seed uses the tokenizer of that seed's ``natural`` run. Arms
(:mod:`~robust_pretrain.pretraining.decide.arms` for the static ones' weights):

* ``natural``: batches in the domains' natural proportions, the plain mean loss (``--weighting proportional``);
* ``sampling_control`` (the default baseline): each sequence's domain drawn at the natural proportions by the same
  mechanism as the other drawing arms, the plain mean loss (separates the effect of the weights from how batches are
  drawn);
* ``stratified``: domains drawn uniformly; ``temperature``: ``q ∝ p^(1/τ)`` (``--temperature``); ``unimax``: uniform
  up to ``--epoch_cap`` epochs per domain (Chung et al. 2023);
* ``minimax``: the paper's objective, its weights also drawing the domains (``--task_sampling online``);
  ``minimax_capped``: the same with ``--max_epochs_per_task`` ``--epoch_cap``;
* ``group_dro``: group DRO on the excess loss over the ``natural`` run's held-out losses, its weights drawing;
* ``doremi``: ``robust-pretrain-mixture`` (reference -> proxy -> learned weights -> main run; 3 trainings);
* ``--arm NAME=weights.json`` (repeatable): domains drawn from a weights file (``{"weights": {domain: weight}}``;
  without ``provenance`` it gets the natural run's).

Every input is checked before anything is written: decide's options, the recipe's options and data (two or more
domains; ``--streaming`` is refused: its natural arm would draw uniformly), the arm files' contents, and the held-out
texts per domain (:mod:`~robust_pretrain.pretraining.decide.guards`). ``protocol.json`` (arms, seeds, baseline,
endpoint, margin, confidence, the arms' settings, the guards' floors, the options every run gets in a canonical
order, the rule in words, and the hash of all of it) is then written before the first training step; a rerun with
another protocol is refused, naming what changed. Finished cells are reused and interrupted ones resume. ``--plan``
writes the protocol and ``cells.json`` and trains nothing; ``--cell ARM:SEED`` runs one cell (also under
``accelerate launch``; a cell other than ``natural`` needs its seed's natural cell finished); ``--report``
aggregates the finished cells (:mod:`~robust_pretrain.pretraining.decide.cells`: concurrent cells in one folder).
The verdict (:mod:`robust_pretrain.reporting.decision`) compares each arm with ``--baseline`` on the endpoint, paired
by seed, with a t-interval at df = seeds - 1, at the end of training and at each of ``--readings`` held-out readings:
``decision.md`` (the card), ``decision.json``, ``decision.png``, and, when an arm helps, its domain weights with
their provenance in ``winner_weights.json`` (usable by ``--domain_weights``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import datasets

from robust_pretrain.cli import UsageError, refuse, run_console
from robust_pretrain.config import OptionParser
from robust_pretrain.options import check_options, option, option_problems
from robust_pretrain.pretraining import mixture
from robust_pretrain.pretraining.causal_lm import recipe as causal_lm
from robust_pretrain.pretraining.causal_lm.data import load_domain_texts, require_every_domain, texts_per_domain
from robust_pretrain.pretraining.decide.arms import BUILT_IN_ARMS, cell_plan, custom_arms, read_arm_file
from robust_pretrain.pretraining.decide.cells import (
    CELLS_NAME,
    cell_dir,
    cell_lock,
    check_folder,
    finished,
    fix_protocol,
    main_process,
    read_record,
    record_cell,
    write_json,
)
from robust_pretrain.pretraining.decide.guards import check_held_out, regime
from robust_pretrain.reporting.decision import ENDPOINTS, RULE, summarise, verdict_lines, winner, write_decision

logger = logging.getLogger(__name__)

DEFAULT_RUN_OPTIONS = ["--config", "decoder_demo", "--max_steps", "300"]
#: options decide sets per cell: given for every run they would change what an arm means
OWNED_OPTIONS = (
    "--seed", "--output_dir", "--weighting", "--loss_normalization", "--task_sampling", "--task_sampling_weights",
    "--importance_weighting", "--objective_weights", "--domain_weights", "--reference_losses", "--reference_run",
    "--reference_model", "--reference_mismatch_ok", "--overwrite_output_dir", "--max_epochs_per_task",
    "--eval_strategy", "--eval_steps",
)  # fmt: skip
#: decide's options that are not part of the protocol (where the folder is, what to run now, the override)
NOT_PROTOCOL = ("output_dir", "arms", "arm", "allow_small_held_out", "plan", "cell", "report")
#: trainings of one cell of an arm (for the cost)
TRAININGS = {"doremi": 3}
CellRunner = Callable[[str, Path, list[str]], dict[str, Any]]
"""Trains one cell (``"causal_lm"`` or ``"mixture"``, its folder, its options); returns its task report."""
DomainReader = Callable[[list[str]], dict[str, Any]]
"""The recipe's options -> ``{"domains": [names], "held_out_texts": {domain: count}}`` (no training)."""


@dataclass
class DecideArguments:
    output_dir: str = option(help="Folder of the decision: protocol, cells, verdict.", path="output_dir")
    arms: list[str] = option(
        default_factory=lambda: ["sampling_control", "stratified", "unimax", "minimax", "minimax_capped"],
        help="Built-in arms to compare (natural, every seed's tokenizer and reference, and the baseline always run).",
        choices=BUILT_IN_ARMS,
    )
    arm: list[str] | None = option(
        None, "Extra arms drawing domains from a weights file, as NAME=weights.json (repeatable: the arms add up)."
    )
    seeds: list[int] = option(
        default_factory=lambda: [42, 43, 44, 45],
        help="One run per arm and seed, paired by seed.",
        minimum=0,
        maximum=2**32 - 1,  # the runs' --seed
    )
    baseline: str = option("sampling_control", "The arm every other arm is compared with.")
    endpoint: str = option("worst_domain_loss", "What is compared, per run.", choices=list(ENDPOINTS))
    margin: float = option(0.1, "The smallest gain (nats) that counts as helping.", above=0)
    confidence: float = option(0.95, "Confidence of the paired t-intervals.", above=0, below=1)
    epoch_cap: float = option(4.0, "unimax and minimax_capped: the most epochs drawn of any domain.", above=0)
    temperature: float = option(3.0, "temperature: τ of q ∝ p^(1/τ) (1: natural; larger: towards uniform).", above=0)
    readings: int = option(4, "Held-out evaluations over training (evenly spaced, the last at the end).", minimum=1)
    min_held_out_texts: int = option(5, "Refuse fewer held-out texts (documents) in a domain.", minimum=1)
    min_held_out_tokens: int = option(
        2000, "Refuse fewer held-out tokens in a domain (checked after natural).", minimum=1
    )
    allow_small_held_out: bool = option(False, "Go on (with a warning) below the held-out floors.")
    epochs_warning: float = option(4.0, "Warn where an arm draws a domain's sequences more epochs than this.", above=0)
    plan: bool = option(False, "Validate, write the protocol and cells.json, train nothing.")
    cell: str | None = option(None, "Run one cell, ARM:SEED (its seed's natural cell first), then stop.")
    report: bool = option(False, "Aggregate the finished cells into the verdict (refusing while some are missing).")

    def __post_init__(self) -> None:
        check_options(self)


@dataclass
class Setup:
    """A checked decision: its folder, arms in run order, the options every run gets, the custom arms' files, the
    protocol's body."""

    root: Path
    arms: list[str]
    options: list[str]
    files: dict[str, dict[str, Any]]
    protocol: dict[str, Any]


def merge_repeats(argv: list[str]) -> list[str]:
    """``argv`` with every ``--arm``'s values under the first one; another of decide's options given twice is
    refused."""
    own = {name.replace("_", "-") for name in DecideArguments.__dataclass_fields__}
    groups, arms, seen = [], [], set()
    for name, tokens in mixture.option_groups(argv):
        key = name.replace("_", "-")
        if key == "arm":
            arms += tokens[1:]
            if key in seen:
                continue
        elif key in own and key in seen:
            raise UsageError(f"--{name} is given twice: give all its values once")
        seen.add(key)
        groups.append(["--arm"] if key == "arm" else tokens)
    return [token for tokens in groups for token in (tokens if tokens != ["--arm"] else ["--arm", *arms])]


def canonical_options(tokens: list[str]) -> list[str]:
    """The options of every run in one order (by name; an option given twice: its last values), so that the same
    options in another order are the same protocol."""
    groups = dict(mixture.option_groups(tokens))
    return [token for name in sorted(groups) for token in groups[name]]


def run_options(passed: list[str], readings: int) -> list[str]:
    """The options every run gets: the defaults, the passed ones, and the evaluations for ``readings``."""
    options = canonical_options([*DEFAULT_RUN_OPTIONS, *passed])
    steps = mixture.option_values(options)["--max_steps"][-1]
    try:
        max_steps = int(steps)
    except ValueError:
        raise UsageError(f"--max_steps {steps}: expected a whole number of steps") from None
    if max_steps < 1:
        raise UsageError(f"--max_steps {steps}: decide needs a fixed number of steps >= 1")
    if readings > max_steps:
        raise UsageError(f"--readings {readings}: more than the {max_steps} training steps (--max_steps) to read at")
    if readings > 1:
        options = canonical_options(
            [*options, "--eval_strategy", "steps", "--eval_steps", str(math.ceil(max_steps / readings))]
        )
    return options


def check_arguments(args: DecideArguments, passed: list[str], extra: dict[str, Path]) -> list[str]:
    """The arms in run order (natural first); refuse what would make the comparison mean something else."""
    owned = sorted({token.partition("=")[0] for token in passed} & set(OWNED_OPTIONS))
    if owned:
        raise UsageError(f"{', '.join(owned)}: robust-pretrain-decide sets these per cell (use --seeds and --arms)")
    streaming = mixture.option_values(passed).get("--streaming")
    if streaming is not None and streaming[-1:] != ["false"]:
        raise UsageError("--streaming: refused by decide (a stream draws uniformly, so the natural arm would not be)")
    if len(set(args.seeds)) != len(args.seeds) or len(args.seeds) < 2:
        raise UsageError(f"--seeds {args.seeds}: give at least 2 distinct seeds (the interval has df = seeds - 1)")
    if len(set(args.arms)) != len(args.arms):
        raise UsageError(f"--arms {' '.join(args.arms)}: an arm is listed twice")
    if args.baseline not in (*BUILT_IN_ARMS, *extra):
        raise UsageError(f"--baseline {args.baseline} is not among the arms {[*BUILT_IN_ARMS, *extra]}")
    listed = {"natural", args.baseline, *args.arms}
    arms = [arm for arm in BUILT_IN_ARMS if arm in listed] + list(extra)
    if len(arms) < 2:
        raise UsageError("--arms: give at least one arm besides natural to compare")
    if sum((args.plan, args.report, args.cell is not None)) > 1:
        raise UsageError("--plan, --cell and --report: give one of them at most")
    if args.cell is not None:
        parse_cell(args.cell, arms, args.seeds)
    return arms


def parse_cell(entry: str, arms: list[str], seeds: list[int]) -> tuple[str, int]:
    arm, _, seed = entry.rpartition(":")
    if arm not in arms or not seed.lstrip("-").isdigit() or int(seed) not in seeds:
        raise UsageError(f"--cell {entry}: expected ARM:SEED with an arm of {arms} and a seed of {seeds}")
    return arm, int(seed)


def recipe_domains(options: list[str]) -> dict[str, Any]:
    """The domains of the recipe's data and their held-out texts, its options checked (no training, nothing written)."""
    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a refusal is one line
    try:
        with tempfile.TemporaryDirectory() as scratch:
            argv = [*options, "--output_dir", scratch]
            model_args, data_args, training_args = causal_lm.parse_arguments(argv)
            causal_lm.refuse_before_reading(argv, model_args, data_args, training_args)
            texts = load_domain_texts(data_args)
            require_every_domain(texts)
    finally:
        if shown:
            datasets.enable_progress_bars()
    counts = texts_per_domain(texts.validation, len(texts.names))
    return {"domains": texts.names, "held_out_texts": dict(zip(texts.names, counts, strict=True))}


def prepare(args: DecideArguments, passed: list[str], read_domains: DomainReader) -> Setup:
    """Check every input (options, data, arm files, held-out texts) before anything is written; the setup."""
    extra = custom_arms(args.arm)
    arms = check_arguments(args, passed, extra)
    check_folder(Path(args.output_dir))
    options = run_options(passed, args.readings)
    data = read_domains(options)
    domains = data["domains"]
    if len(domains) < 2:
        raise UsageError(f"the data has one domain ({domains[0]}): there is no mixture to decide; give two or more")
    files = {name: read_arm_file(name, path, domains) for name, path in extra.items()}
    check_held_out(data["held_out_texts"], args.min_held_out_texts, "texts", args.allow_small_held_out)
    settings = {k: v for k, v in asdict(args).items() if k not in NOT_PROTOCOL}
    protocol = {
        **settings,
        "seeds": sorted(args.seeds),
        "arms": arms,
        "domains": domains,
        "custom_arm_files": {
            name: hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
            for name, content in files.items()
        },
        "run_options": options,
        "rule": RULE.format(confidence=args.confidence, margin=args.margin),
    }
    return Setup(Path(args.output_dir), arms, options, files, protocol)


def cell_job(setup: Setup, arm: str, seed: int, allow_small: bool) -> tuple[str, list[str], dict[Path, Any]]:
    """The recipe, options and files of cell ``arm:seed``; refused while its seed's natural cell has not finished."""
    seeded = [*setup.options, "--seed", str(seed)]
    natural_options = [*seeded, "--weighting", "proportional"]
    if arm == "natural":
        return "causal_lm", natural_options, {}
    natural = finished(setup.root, "natural", seed, natural_options)
    if natural is None:
        raise UsageError(
            f"cell {arm}:{seed} needs the finished cell natural:{seed} (tokenizer, reference): run it first"
        )
    check_held_out(natural["held_out_tokens"], setup.protocol["min_held_out_tokens"], "tokens", allow_small)
    cell = cell_dir(setup.root, arm, seed)
    recipe, own, files = cell_plan(arm, cell, natural, setup.protocol, setup.files)
    return recipe, [*seeded, "--tokenizer_name", str(cell_dir(setup.root, "natural", seed)), *own], files


def run_one(setup: Setup, arm: str, seed: int, run: CellRunner, allow_small: bool) -> tuple[dict[str, Any], bool]:
    """Cell ``arm:seed``'s report (reused when finished with the same options, else run under its lock) and whether
    it trained now."""
    recipe, options, files = cell_job(setup, arm, seed, allow_small)
    report = finished(setup.root, arm, seed, options)
    if report is not None:
        return report, False
    for path, content in files.items():
        write_json(path, content)
    with cell_lock(setup.root, arm, seed):
        report = finished(setup.root, arm, seed, options)  # another job may have finished it meanwhile
        if report is not None:
            return report, False
        report = run(recipe, cell_dir(setup.root, arm, seed), options)
        record_cell(setup.root, arm, seed, options, report)
    return report, True


def cells_list(setup: Setup) -> list[dict[str, Any]]:
    return [
        {
            "cell": f"{arm}:{seed}",
            "folder": f"cells/{arm}/seed-{seed}",
            "needs": None if arm == "natural" else f"natural:{seed}",
        }
        for seed in setup.protocol["seeds"]
        for arm in setup.arms
    ]


def run_all(setup: Setup, args: DecideArguments, run: CellRunner) -> None:
    """Every cell, natural first within each seed; the cost printed before, and after the first natural cell trained
    (:func:`cost_line`)."""
    trainings = sum(TRAININGS.get(arm, 1) for arm in setup.arms) * len(args.seeds)
    steps = int(mixture.option_values(setup.options)["--max_steps"][-1])
    print(f"decide: {len(setup.arms) * len(args.seeds)} cells, {trainings} trainings of {steps} steps", flush=True)
    for seed in args.seeds:
        for arm in setup.arms:
            started = time.monotonic()
            _, trained = run_one(setup, arm, seed, run, args.allow_small_held_out)
            if trained and arm == "natural" and seed == args.seeds[0]:
                print(
                    cost_line(cell_dir(setup.root, arm, seed), time.monotonic() - started, steps, trainings), flush=True
                )


def cost_line(cell: Path, seconds: float, steps: int, trainings: int) -> str:
    """The cost of the other trainings, measured on the first natural cell: its wall time (data, model, training,
    evaluations) and, from the trainer's ``train_results.json`` when written, its seconds per training step."""
    results = cell / "train_results.json"
    runtime = json.loads(results.read_text()).get("train_runtime") if results.is_file() else None
    per_step = f" ({runtime / steps:.3f} s per training step)" if runtime else ""
    return (
        f"decide: {cell.parent.name}:{cell.name.removeprefix('seed-')} took {seconds:.0f} s{per_step}: about "
        f"{(trainings - 1) * seconds / 60:.1f} min for the other {trainings - 1} trainings"
    )


def aggregate(setup: Setup, seeds: list[int]) -> dict[str, dict[int, dict[str, Any]]]:
    """The finished cells' reports; refused naming the missing ones."""
    reports: dict[str, dict[int, dict[str, Any]]] = {arm: {} for arm in setup.arms}
    missing = []
    for seed in seeds:
        for arm in setup.arms:
            if read_record(setup.root, arm, seed) is None:
                missing.append(f"{arm}:{seed}")
                continue
            report = finished(setup.root, arm, seed, cell_job(setup, arm, seed, True)[1])
            reports[arm][seed] = report
    if missing:
        raise UsageError(f"cells not finished: {', '.join(missing)} (run each with --cell ARM:SEED, then --report)")
    return reports


def drawn_weights(runs: list[dict[str, Any]]) -> tuple[dict[str, float], str]:
    """An arm's domain weights: the mean over its seeds of what its runs drew (their time-averaged weights, else the
    mixture they drew from), and the report key they came from."""
    key = "time_averaged_weights" if runs[0].get("time_averaged_weights") else "mixture_weights"
    return {name: sum(run[key][name] for run in runs) / len(runs) for name in runs[0]["tasks"]}, key


def export_winner(root: Path, best: str | None, reports: dict[str, dict[int, dict[str, Any]]]) -> None:
    """The winning arm's :func:`drawn_weights` with the first seed's provenance."""
    target = root / "winner_weights.json"
    if best is None:
        target.unlink(missing_ok=True)
        return
    runs = list(reports[best].values())
    weights, key = drawn_weights(runs)
    write_json(target, {"weights": weights, "provenance": {**runs[0]["provenance"], "arm": best, "weights_from": key}})


def conclude(setup: Setup, protocol: dict[str, Any]) -> dict[str, Any]:
    """The verdict of the finished cells: the card, ``decision.json``, the figure, the winner's weights; the summary
    (its regime under ``"regime"``), the verdict and the card's path printed."""
    reports = aggregate(setup, protocol["seeds"])
    root = setup.root
    losses = {arm: {seed: report["eval_task_loss"] for seed, report in runs.items()} for arm, runs in reports.items()}
    drawn = {arm: drawn_weights(list(runs.values()))[0] for arm, runs in reports.items()}
    summary = summarise(losses, protocol, drawn)
    summary["regime"] = regime(reports, drawn, protocol)
    natural_shares = reports["natural"][protocol["seeds"][0]]["mixture_weights"]
    smallest = [f"{name} ({natural_shares[name]:.3f})" for name in sorted(natural_shares, key=natural_shares.get)[:2]]
    if main_process():
        write_decision(root, summary, protocol, smallest)
        export_winner(root, winner(summary), reports)
        for line in verdict_lines(summary):
            print(f"decide: {line}", flush=True)
        print(f"decide: the card is {root / 'decision.md'}", flush=True)
    return summary


def decide(
    args: DecideArguments, passed: list[str], run: CellRunner, read_domains: DomainReader | None = None
) -> dict[str, Any]:
    """Check every input, fix the protocol, then as asked: plan, one cell, the report, or all cells and the report
    (``read_domains``: :func:`recipe_domains` unless given)."""
    setup = prepare(args, passed, read_domains or recipe_domains)
    protocol = fix_protocol(setup.root, setup.protocol, write=not args.report)
    if args.report:
        return conclude(setup, protocol)
    cells = cells_list(setup)
    if main_process():
        write_json(setup.root / CELLS_NAME, {"protocol": protocol["hash"], "cells": cells})
    if args.plan:
        print(f"decide: protocol {protocol['hash'][:12]}, {len(cells)} cells in {setup.root / CELLS_NAME}", flush=True)
        return {"protocol": protocol, "cells": cells}
    if args.cell is not None:
        arm, seed = parse_cell(args.cell, setup.arms, args.seeds)
        report, _ = run_one(setup, arm, seed, run, args.allow_small_held_out)
        print(f"decide: cell {arm}:{seed} finished ({cell_dir(setup.root, arm, seed)})", flush=True)
        return {"cell": args.cell, "report": report}
    run_all(setup, args, run)
    return conclude(setup, protocol)


def run_cell(recipe: str, cell: Path, options: list[str]) -> dict[str, Any]:
    """A cell by the mixture's stage rule: reused when finished with the same options, else trained (resuming)."""
    if recipe == "mixture":
        return mixture.run([*options, "--output_dir", str(cell)])["main"]
    run = lambda folder, given: causal_lm.run([*given, "--output_dir", str(folder)])["report"]  # noqa: E731
    return mixture.run_stage(cell.parent, cell.name, list(options), run, [])


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``robust-pretrain-decide``): exit status 2 and one line for a bad option."""
    return run_console(run, argv, prog="robust-pretrain-decide")


def run(argv: list[str]) -> dict[str, Any]:
    """The decision as ``argv`` says: decide's own options, every other one passed to every run."""
    parser = OptionParser(DecideArguments, description=__doc__, allow_abbrev=False)  # --seed is not --seeds
    namespace, passed = parser.parse_known_args(merge_repeats(argv))
    values = {name: getattr(namespace, name) for name in DecideArguments.__dataclass_fields__}
    refuse(option_problems(DecideArguments, values))
    return decide(DecideArguments(**values), passed, run_cell)


__all__ = ["DecideArguments", "decide", "main", "run"]
