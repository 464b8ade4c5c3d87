"""The regime guards of ``robust-pretrain-decide``: is there room for an answer?

* held-out size per domain (texts before training, tokens after the first ``natural`` cell): below
  ``--min_held_out_texts`` / ``--min_held_out_tokens`` the decision is refused unless ``--allow_small_held_out``;
* epochs drawn per arm and domain (how often a training sequence of the domain was seen on average: the counted draws
  of an epoch-capped run, else the drawn weight times the run's draws over the domain's sequences), warned above
  ``--epochs_warning``;
* the verdict at each held-out reading over training (``--readings``), flagged when it changes;
* a power caveat below :data:`FEW_SEEDS` seeds.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from robust_pretrain.cli import UsageError
from robust_pretrain.pretraining.decide.arms import budget
from robust_pretrain.reporting.decision import summarise

logger = logging.getLogger(__name__)

#: below this many seeds the card says that the spread, and so the power, is barely estimated
FEW_SEEDS = 4


def small_held_out(counts: Mapping[str, int], floor: int, unit: str) -> list[str]:
    """The domains whose held-out ``counts`` are below ``floor``, in words."""
    return [f"{domain} ({count} {unit})" for domain, count in counts.items() if count < floor]


def check_held_out(counts: Mapping[str, int], floor: int, unit: str, allow: bool) -> None:
    """Refuse a held-out set of fewer than ``floor`` ``unit`` in some domain (``allow``: a warning instead)."""
    small = small_held_out(counts, floor, unit)
    if not small:
        return
    line = (
        f"held-out {unit} below the floor of {floor}: {', '.join(small)}; a loss on so little held-out data describes "
        "those texts, not the domain"
    )
    if allow:
        logger.warning("%s (--allow_small_held_out: going on)", line)
        return
    raise UsageError(
        f"{line}: hold out more (--validation_split_percentage or --validation_file), or pass --allow_small_held_out"
    )


def epochs_drawn(report: Mapping[str, Any], weights: Mapping[str, float]) -> dict[str, float]:
    """Per domain, how often one of its training sequences was drawn on average: the epoch cap's counts when the run
    recorded them, else ``weights[t] * draws / N_t`` (``draws``: steps times the global batch)."""
    if report.get("epochs_drawn"):
        return dict(report["epochs_drawn"])
    draws, sequences = budget(report), report["training_sequences"]
    return {domain: weights[domain] * draws / sequences[domain] for domain in report["tasks"]}


def mean_epochs(runs: list[Mapping[str, Any]], weights: Mapping[str, float]) -> dict[str, float]:
    """:func:`epochs_drawn` averaged over an arm's seeds."""
    per_run = [epochs_drawn(run, weights) for run in runs]
    return {domain: sum(run[domain] for run in per_run) / len(per_run) for domain in per_run[0]}


def verdicts_over_training(
    reports: Mapping[str, Mapping[int, Mapping[str, Any]]], protocol: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The verdict of each arm at each held-out reading all cells share (by step): ``[{step, arms: {arm: {difference,
    verdict}}}]``."""
    cells = [report for runs in reports.values() for report in runs.values()]
    steps = set.intersection(*({r["step"] for r in cell.get("eval_readings", [])} for cell in cells))
    readings = []
    for step in sorted(steps):
        losses = {
            arm: {
                seed: next(r["eval_task_loss"] for r in report["eval_readings"] if r["step"] == step)
                for seed, report in runs.items()
            }
            for arm, runs in reports.items()
        }
        summary = summarise(losses, protocol)
        arms = {
            arm: {"difference": entry["difference"]["mean"], "verdict": entry["verdict"]}
            for arm, entry in summary["arms"].items()
            if "verdict" in entry
        }
        readings.append({"step": step, "arms": arms})
    return readings


def regime(
    reports: Mapping[str, Mapping[int, Mapping[str, Any]]],
    drawn: Mapping[str, Mapping[str, float]],
    protocol: Mapping[str, Any],
) -> dict[str, Any]:
    """What the card and ``decision.json`` say about the regime: held-out size (the first seed's natural run), epochs
    drawn per arm and domain, the verdicts over training and where they flip, the power caveat."""
    natural = reports["natural"][protocol["seeds"][0]]
    epochs = {arm: mean_epochs(list(runs.values()), drawn[arm]) for arm, runs in reports.items()}
    readings = verdicts_over_training(reports, protocol)
    flips = {
        arm: len({reading["arms"][arm]["verdict"] for reading in readings}) > 1
        for arm in (readings[0]["arms"] if readings else {})
    }
    few = len(protocol["seeds"]) < FEW_SEEDS
    return {
        "held_out_texts": natural.get("held_out_texts", {}),
        "held_out_tokens": natural.get("held_out_tokens", {}),
        "held_out_floor": {"texts": protocol["min_held_out_texts"], "tokens": protocol["min_held_out_tokens"]},
        "small_held_out": small_held_out(natural.get("held_out_texts", {}), protocol["min_held_out_texts"], "texts")
        + small_held_out(natural.get("held_out_tokens", {}), protocol["min_held_out_tokens"], "tokens"),
        "epochs_drawn": epochs,
        "epochs_warning": protocol["epochs_warning"],
        "over_epochs": sorted(
            f"{arm}: {domain} ({value:.1f})"
            for arm, values in epochs.items()
            for domain, value in values.items()
            if value > protocol["epochs_warning"]
        ),
        "readings": readings,
        "verdict_flips": flips,
        "power_caveat": (
            f"{len(protocol['seeds'])} seeds: the spread of the paired differences, and so the interval and what the "
            f"seeds can detect, is barely estimated (use at least {FEW_SEEDS})"
            if few
            else None
        ),
    }


__all__ = ["FEW_SEEDS", "check_held_out", "epochs_drawn", "regime", "verdicts_over_training"]
