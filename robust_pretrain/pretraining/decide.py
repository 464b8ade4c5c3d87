"""Does worst-case or learned domain mixing beat a static mixture on *your* domains? One command that answers it, by a
rule fixed before the first training step.

    robust-pretrain-decide --output_dir outputs/decide [--arms natural stratified minimax group_dro] \\
        [--arm mine=weights.json] [--seeds 42 43 44 45] [--endpoint worst_domain_loss] [--margin 0.1] \\
        [--domain_files web=web.txt code=code.txt ... | --config decoder_demo --max_steps 300 ...]

Every arm trains the same decoder (``robust-pretrain-causal-lm``; every option decide does not declare goes to every
run, after the defaults ``--config decoder_demo --max_steps 300``) on the same domains, once per seed, into
``<output_dir>/cells/<arm>/seed-<seed>``. Paired by seed: a seed fixes the initialisation and the data order, and
every arm of a seed uses the tokenizer of that seed's ``natural`` run. Arms:

* ``natural``: batches in the domains' natural proportions, the plain mean loss (``--weighting proportional``);
* ``sampling_control``: each sequence's domain drawn at the natural proportions by the same mechanism as the online
  arms, the plain mean loss (separates the effect of the weights from how batches are drawn);
* ``stratified``: domains drawn uniformly, the plain mean loss;
* ``minimax``: the paper's objective, its weights also drawing the domains (``--task_sampling online``);
* ``group_dro``: DoReMi's objective, group DRO on the excess loss over the ``natural`` run's held-out losses, its
  weights drawing the domains;
* ``doremi``: ``robust-pretrain-mixture`` (reference -> proxy -> learned weights -> main run; 3 trainings);
* ``--arm NAME=weights.json``: domains drawn from a weights file (``{"weights": {domain: weight}}``).

``protocol.json`` (arms, seeds, baseline, endpoint, margin, confidence, the options every run gets, the rule in
words, and the hash of all of it) is written before the first training step; a rerun with another protocol is
refused, naming what changed. Finished cells are reused and interrupted ones resume. The verdict
(:mod:`robust_pretrain.reporting.decision`) compares each arm with ``--baseline`` on the endpoint, paired by seed, with
a t-interval at df = seeds - 1: ``decision.md`` (the card), ``decision.json``, ``decision.png``, and, when an arm
helps, its domain weights with their provenance in ``winner_weights.json`` (usable by ``--domain_weights``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from robust_pretrain.cli import UsageError, refuse, run_console
from robust_pretrain.config import OptionParser
from robust_pretrain.options import check_options, option, option_problems
from robust_pretrain.pretraining import mixture
from robust_pretrain.pretraining.causal_lm import recipe as causal_lm
from robust_pretrain.reporting.decision import ENDPOINTS, RULE, summarise, winner, write_decision

logger = logging.getLogger(__name__)

BUILT_IN_ARMS = ("natural", "sampling_control", "stratified", "minimax", "group_dro", "doremi")
DEFAULT_RUN_OPTIONS = ["--config", "decoder_demo", "--max_steps", "300"]
#: options decide sets per cell: given for every run they would change what an arm means
OWNED_OPTIONS = (
    "--seed", "--output_dir", "--weighting", "--loss_normalization", "--task_sampling", "--task_sampling_weights",
    "--importance_weighting", "--objective_weights", "--domain_weights", "--reference_losses", "--reference_run",
    "--reference_model", "--overwrite_output_dir",
)  # fmt: skip
PROTOCOL_NAME = "protocol.json"
CellRunner = Callable[[str, Path, list[str]], dict[str, Any]]
"""Trains one cell (``"causal_lm"`` or ``"mixture"``, its folder, its options); returns its task report."""


@dataclass
class DecideArguments:
    output_dir: str = option(help="Folder of the decision: protocol, cells, verdict.", path="output_dir")
    arms: list[str] = option(
        default_factory=lambda: ["natural", "stratified", "minimax", "group_dro"],
        help="Built-in arms to compare (natural always runs: it is every seed's tokenizer and reference).",
        choices=BUILT_IN_ARMS,
    )
    arm: list[str] | None = option(None, "Extra arms drawing domains from a weights file, as NAME=weights.json.")
    seeds: list[int] = option(
        default_factory=lambda: [42, 43, 44, 45], help="One run per arm and seed, paired by seed."
    )
    baseline: str = option("natural", "The arm every other arm is compared with.")
    endpoint: str = option("worst_domain_loss", "What is compared, per run.", choices=list(ENDPOINTS))
    margin: float = option(0.1, "The smallest gain (nats) that counts as helping.", above=0)
    confidence: float = option(0.95, "Confidence of the paired t-intervals.", above=0, below=1)

    def __post_init__(self) -> None:
        check_options(self)


def custom_arms(entries: list[str] | None) -> dict[str, Path]:
    arms: dict[str, Path] = {}
    for entry in entries or []:
        name, _, path = entry.partition("=")
        if not name or not path:
            raise UsageError(f"--arm {entry}: expected NAME=weights.json")
        if name in BUILT_IN_ARMS or name in arms:
            raise UsageError(f"--arm {entry}: the arm {name!r} exists already; choose another name")
        if not Path(path).is_file():
            raise UsageError(f"--arm {entry}: {path} is not a file")
        arms[name] = Path(path).resolve()
    return arms


def check_arguments(args: DecideArguments, passed: list[str], extra: dict[str, Path]) -> list[str]:
    """The arms in run order (natural first); refuse what would make the comparison mean something else."""
    owned = sorted({token.partition("=")[0] for token in passed} & set(OWNED_OPTIONS))
    if owned:
        raise UsageError(f"{', '.join(owned)}: robust-pretrain-decide sets these per cell (use --seeds and --arms)")
    if len(set(args.seeds)) != len(args.seeds) or len(args.seeds) < 2:
        raise UsageError(f"--seeds {args.seeds}: give at least 2 distinct seeds (the interval has df = seeds - 1)")
    arms = list(dict.fromkeys(["natural", *args.arms, *extra]))
    if args.baseline not in arms:
        raise UsageError(f"--baseline {args.baseline} is not among the arms {arms}")
    if len(arms) < 2:
        raise UsageError("--arms: give at least one arm besides natural to compare")
    return arms


def fix_protocol(root: Path, protocol: dict[str, Any]) -> dict[str, Any]:
    """Write ``protocol.json`` with its hash, or refuse a rerun whose protocol differs from the written one."""
    body = {key: value for key, value in protocol.items() if key != "hash"}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    path = root / PROTOCOL_NAME
    if path.is_file():
        try:
            written = json.loads(path.read_text())
        except ValueError as err:
            raise UsageError(f"{path} is not JSON ({err}): restore it or use another --output_dir") from err
        if written.get("hash") != digest:
            changed = sorted(k for k in {*body, *written} - {"hash"} if written.get(k) != body.get(k))
            raise UsageError(
                f"{path} fixed another protocol before the first run (changed: {', '.join(changed)}): rerun with the "
                "same options, or use another --output_dir"
            )
        logger.info("protocol %s unchanged: finished cells are reused", digest[:12])
    else:
        root.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**body, "hash": digest}, indent=2) + "\n")
    return {**body, "hash": digest}


def weights_file(path: Path, weights: dict[str, float], natural: dict[str, Any]) -> Path:
    """A domain-weights file with the provenance of the seed's natural run (same tokenizer, data and size)."""
    total = sum(weights.values())
    content = {"weights": {name: value / total for name, value in weights.items()}, "provenance": natural["provenance"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=2) + "\n")
    return path


def cell_plan(arm: str, cell: Path, natural: dict[str, Any], extra: dict[str, Path]) -> tuple[str, list[str]]:
    """The recipe and the arm's own options of one (non-natural) cell."""
    domains = natural["tasks"]
    if arm == "doremi":
        return "mixture", []
    if arm == "minimax":
        return "causal_lm", ["--weighting", "minimax", "--task_sampling", "online"]
    if arm == "group_dro":
        losses = [repr(natural["eval_task_loss"][name]) for name in domains]
        return "causal_lm", [
            "--weighting", "group_dro", "--loss_normalization", "excess", "--reference_losses", *losses,
            "--task_sampling", "online",
        ]  # fmt: skip
    if arm == "sampling_control":
        weights = weights_file(cell / "natural_weights.json", natural["mixture_weights"], natural)
    elif arm == "stratified":
        weights = weights_file(cell / "uniform_weights.json", dict.fromkeys(domains, 1.0), natural)
    else:
        weights = extra[arm]
    return "causal_lm", ["--weighting", "proportional", "--domain_weights", str(weights)]


def run_cells(
    root: Path, arms: list[str], args: DecideArguments, options: list[str], extra: dict[str, Path], run: CellRunner
) -> dict[str, dict[int, dict[str, Any]]]:
    """Every (arm, seed) cell's task report, natural first within each seed; one progress bar over cells."""
    reports: dict[str, dict[int, dict[str, Any]]] = {arm: {} for arm in arms}
    with tqdm(total=len(arms) * len(args.seeds), desc="decide: cells", unit="cell") as bar:
        for seed in args.seeds:
            natural_dir = root / "cells" / "natural" / f"seed-{seed}"
            seeded = [*options, "--seed", str(seed)]
            natural = run("causal_lm", natural_dir, [*seeded, "--weighting", "proportional"])
            reports["natural"][seed] = natural
            bar.update()
            shared = [*seeded, "--tokenizer_name", str(natural_dir)]
            for arm in arms[1:]:
                cell = root / "cells" / arm / f"seed-{seed}"
                recipe, own = cell_plan(arm, cell, natural, extra)
                reports[arm][seed] = run(recipe, cell, [*shared, *own])
                bar.set_postfix_str(f"{arm} seed {seed}")
                bar.update()
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
    content = {"weights": weights, "provenance": {**runs[0]["provenance"], "arm": best, "weights_from": key}}
    target.write_text(json.dumps(content, indent=2) + "\n")


def decide(args: DecideArguments, passed: list[str], run: CellRunner) -> dict[str, Any]:
    """Fix the protocol, train the cells, write the verdict; the summary."""
    extra = custom_arms(args.arm)
    arms = check_arguments(args, passed, extra)
    root = Path(args.output_dir)
    options = [*DEFAULT_RUN_OPTIONS, *passed]
    protocol = {
        **{k: v for k, v in asdict(args).items() if k not in ("output_dir", "arms", "arm")},
        "arms": arms,
        "custom_arm_files": {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in extra.items()},
        "run_options": options,
        "rule": RULE.format(confidence=args.confidence, margin=args.margin),
    }
    protocol = fix_protocol(root, protocol)
    reports = run_cells(root, arms, args, options, extra, run)
    losses = {arm: {seed: report["eval_task_loss"] for seed, report in runs.items()} for arm, runs in reports.items()}
    drawn = {arm: drawn_weights(list(runs.values()))[0] for arm, runs in reports.items()}
    summary = summarise(losses, protocol, drawn)
    natural_shares = reports["natural"][args.seeds[0]]["mixture_weights"]
    smallest = [f"{name} ({natural_shares[name]:.3f})" for name in sorted(natural_shares, key=natural_shares.get)[:2]]
    write_decision(root, summary, protocol, smallest)
    export_winner(root, winner(summary), reports)
    return summary


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
    namespace, passed = parser.parse_known_args(argv)
    values = {name: getattr(namespace, name) for name in DecideArguments.__dataclass_fields__}
    refuse(option_problems(DecideArguments, values))
    return decide(DecideArguments(**values), passed, run_cell)


__all__ = ["DecideArguments", "decide", "main", "run"]
