"""The verdict of ``robust-pretrain-decide``: each arm against the baseline arm, paired by seed, by a rule fixed before
the first training step.

The unit is a pre-training run: one value of the endpoint per (arm, seed) cell, lower is better (a held-out loss in
nats). For each arm, the differences ``arm - baseline`` over the seeds both have give a mean and a Student-t interval
with ``seeds - 1`` degrees of freedom (:func:`~robust_pretrain.reporting.statistics.paired_interval`), read by
:func:`rule_verdict` against the protocol's ``margin``.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from robust_pretrain.reporting.plots import plot_decision
from robust_pretrain.reporting.statistics import Interval, detectable_difference, paired_interval, pairs_to_detect

ENDPOINTS = {
    "worst_domain_loss": "the worst domain's held-out loss (nats)",
    "mean_domain_loss": "the mean over domains of the held-out loss (nats)",
}
HELPS, HELPS_BELOW_MARGIN, HURTS, NO_EFFECT, INCONCLUSIVE = (
    "helps",
    "helps, by less than the margin",
    "hurts",
    "no effect of that size",
    "inconclusive",
)
#: the rule in words (written into the protocol before the first run)
RULE = (
    "lower is better; per arm, the paired difference arm - baseline over seeds, its {confidence:.0%} t-interval at "
    "df = seeds - 1: 'helps' if the interval lies below 0 and the mean gain is >= {margin} nats; 'helps, by less than "
    "the margin' if it lies below 0 with a smaller gain; 'hurts' if it lies above 0; 'no effect of that size' if it "
    "lies within +-{margin}; else 'inconclusive'"
)
#: the power at which the card states the smallest difference a design detects (reported, not part of the rule)
POWER = 0.8
#: the most seeds the card counts when it says how many the margin needs
MOST_SEEDS = 1000


def endpoint_value(losses: Mapping[str, float], endpoint: str) -> float:
    """The endpoint of one run from its per-domain held-out losses."""
    if endpoint == "worst_domain_loss":
        return max(losses.values())
    return statistics.fmean(losses.values())


def rule_verdict(interval: Interval, margin: float) -> str:
    """The fixed reading of ``arm - baseline`` (lower is better); a single pair or no spread is inconclusive."""
    if interval.low is None or interval.high is None or interval.std == 0:
        return INCONCLUSIVE
    if interval.high < 0:
        return HELPS if -interval.mean >= margin else HELPS_BELOW_MARGIN
    if interval.low > 0:
        return HURTS
    if -margin < interval.low and interval.high < margin:
        return NO_EFFECT
    return INCONCLUSIVE


def summarise(
    losses: Mapping[str, Mapping[int, Mapping[str, float]]],
    protocol: Mapping[str, Any],
    drawn: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, Any]:
    """``losses[arm][seed][domain]`` -> per arm: per-domain means, the endpoint per seed, the domain weights it drew
    (``drawn[arm]``, when given), and (other than the baseline) the paired interval against the baseline, its verdict
    and what the seeds can detect (:func:`design`)."""
    endpoint, baseline, confidence = protocol["endpoint"], protocol["baseline"], protocol["confidence"]
    domains = list(next(iter(losses[baseline].values())))
    per_seed = {arm: {str(s): endpoint_value(d, endpoint) for s, d in seeds.items()} for arm, seeds in losses.items()}
    arms: dict[str, Any] = {}
    for arm, seeds in losses.items():
        means = {domain: statistics.fmean(run[domain] for run in seeds.values()) for domain in domains}
        entry: dict[str, Any] = {
            "domain_loss": means,
            "per_seed_domain_loss": {domain: [run[domain] for run in seeds.values()] for domain in domains},
            "worst_domain": max(means, key=means.__getitem__),
            "mean_domain_loss": statistics.fmean(means.values()),
            "endpoint_per_seed": per_seed[arm],
        }
        if drawn is not None:
            entry["drawn_weights"] = dict(drawn[arm])
        if arm != baseline:
            interval, unpaired = paired_interval(per_seed[baseline], per_seed[arm], confidence)
            entry |= {
                "difference": interval.as_dict(),
                "unpaired_seeds": unpaired,
                "verdict": rule_verdict(interval, protocol["margin"]),
                **design(interval, protocol["margin"]),
            }
        arms[arm] = entry
    return {"endpoint": endpoint, "baseline": baseline, "domains": domains, "arms": arms}


def design(interval: Interval, margin: float) -> dict[str, Any]:
    """What the seeds can tell at this spread of the paired differences: the smallest mean difference they detect with
    :data:`POWER` and the seeds the margin would need; nothing for a single pair or no spread."""
    if not interval.std:
        return {}
    return {
        "detectable_difference": detectable_difference(interval.std, interval.n, interval.confidence, POWER),
        "seeds_for_margin": pairs_to_detect(interval.std, margin, interval.confidence, POWER, MOST_SEEDS),
    }


def seeds_needed(count: int) -> str:
    """A count from :func:`pairs_to_detect`, its 'out of reach' value in words."""
    return f"more than {MOST_SEEDS}" if count > MOST_SEEDS else str(count)


def design_line(summary: Mapping[str, Any], protocol: Mapping[str, Any]) -> str:
    """One sentence per card: per arm, the smallest difference its seeds detect and the seeds the margin needs."""
    parts = [
        f"`{arm}` {e['detectable_difference']:.3f} nats (sd {e['difference']['std']:.3f}; the margin needs "
        f"{seeds_needed(e['seeds_for_margin'])} seeds)"
        for arm, e in summary["arms"].items()
        if "detectable_difference" in e
    ]
    if not parts:
        return "Smallest detectable difference: no arm has a spread over seeds to estimate it from."
    return (
        f"Smallest mean difference these seeds detect ({POWER:.0%} power, two-sided at {protocol['confidence']:.0%}, "
        f"from the spread of each arm's paired differences; the margin is {protocol['margin']} nats): "
        + ", ".join(parts)
        + "."
    )


def winner(summary: Mapping[str, Any]) -> str | None:
    """The arm that 'helps' with the largest mean gain, or None when none does."""
    helping = {a: e["difference"]["mean"] for a, e in summary["arms"].items() if e.get("verdict") == HELPS}
    return min(helping, key=helping.__getitem__) if helping else None


def drawn_table(summary: Mapping[str, Any]) -> list[str]:
    """The card's lines for the domain weights each arm drew (none when the summary has no drawn weights)."""
    domains, arms = summary["domains"], summary["arms"]
    if not all("drawn_weights" in entry for entry in arms.values()):
        return []
    rows = [f"| {a} | " + " | ".join(f"{e['drawn_weights'][d]:.3f}" for d in domains) + " |" for a, e in arms.items()]
    header = ["| arm | " + " | ".join(domains) + " |", "|---|" + "---|" * len(domains)]
    return ["", "Domain weights each arm drew (mean over seeds):", "", *header, *rows]


def verdict_lines(summary: Mapping[str, Any]) -> list[str]:
    """One line per compared arm: its verdict and the paired difference with its interval; then the winner."""
    lines = []
    for arm, entry in summary["arms"].items():
        if "verdict" in entry:
            diff = entry["difference"]
            span = "" if diff["low"] is None else f" [{diff['low']:+.3f}, {diff['high']:+.3f}]"
            lines.append(f"{arm} vs {summary['baseline']}: {diff['mean']:+.3f}{span} nats: {entry['verdict']}")
    best = winner(summary)
    return [*lines, f"winner: {best}" if best else "no arm helps by the rule: keep the baseline"]


def regime_table(title: str, rows: Mapping[str, Mapping[str, float]], domains: list[str], digits: int) -> list[str]:
    header = ["| | " + " | ".join(domains) + " |", "|---|" + "---|" * len(domains)]
    body = [f"| {name} | " + " | ".join(f"{row[d]:.{digits}f}" for d in domains) + " |" for name, row in rows.items()]
    return ["", title, "", *header, *body]


def regime_markdown(regime: Mapping[str, Any], domains: list[str]) -> list[str]:
    """The card's lines on the regime: held-out size per domain, epochs drawn per arm and domain, the verdicts over
    training and their flips, the power caveat."""
    lines: list[str] = ["", "## Is there room for an answer?"]
    floor = regime["held_out_floor"]
    if regime["held_out_texts"]:
        sizes = {"held-out texts": regime["held_out_texts"], "held-out tokens": regime["held_out_tokens"]}
        lines += regime_table(
            f"Held-out size (floors: {floor['texts']} texts, {floor['tokens']} tokens):", sizes, domains, 0
        )
    if regime["small_held_out"]:
        lines += ["", f"**Warning: held-out set below the floor**: {', '.join(regime['small_held_out'])}."]
    warning = regime["epochs_warning"]
    lines += regime_table(
        "Epochs drawn (times a training sequence was seen, mean over seeds):", regime["epochs_drawn"], domains, 2
    )
    if regime["over_epochs"]:
        lines += [
            "",
            f"**Warning: more than {warning} epochs** (repeats: a gain may be memorisation): "
            f"{', '.join(regime['over_epochs'])}.",
        ]
    if regime["readings"]:
        arms = list(regime["readings"][0]["arms"])
        lines += ["", "Verdict at each held-out reading (difference vs baseline, verdict):", ""]
        lines += ["| step | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
        for reading in regime["readings"]:
            cells = [f"{reading['arms'][a]['difference']:+.3f} {reading['arms'][a]['verdict']}" for a in arms]
            lines.append(f"| {reading['step']} | " + " | ".join(cells) + " |")
        flipped = [arm for arm, flips in regime["verdict_flips"].items() if flips]
        lines += [
            "",
            f"**The verdict changes over training** for {', '.join(flipped)}."
            if flipped
            else "The verdict holds at every reading.",
        ]
    if regime["power_caveat"]:
        lines += ["", f"**Power caveat**: {regime['power_caveat']}."]
    return [*lines, ""]


def decision_markdown(summary: Mapping[str, Any], protocol: Mapping[str, Any], smallest: list[str]) -> str:
    """The card of a decision: the rule, one row per arm (per-domain mean loss, mean, worst, the paired difference
    and its verdict), the smallest domains named, the domain weights each arm drew, and what the seeds can detect
    (:func:`design_line`)."""
    domains, baseline = summary["domains"], summary["baseline"]
    lines = [
        "# Does it beat a static mixture on these domains?",
        "",
        f"Protocol `{protocol['hash'][:12]}` (fixed before the first training step): endpoint "
        f"{ENDPOINTS[summary['endpoint']]}, baseline `{baseline}`, seeds {protocol['seeds']}; "
        + RULE.format(confidence=protocol["confidence"], margin=protocol["margin"])
        + ".",
        "",
        f"Smallest domains (natural share): {', '.join(smallest)}.",
        "",
        "| arm | " + " | ".join(domains) + " | mean | worst | difference vs baseline [interval] | verdict |",
        "|---|" + "---|" * (len(domains) + 4),
    ]
    for arm, entry in summary["arms"].items():
        cells = [f"{entry['domain_loss'][d]:.3f}" for d in domains]
        worst = f"{entry['domain_loss'][entry['worst_domain']]:.3f} ({entry['worst_domain']})"
        if "difference" in entry:
            diff = entry["difference"]
            span = "n/a" if diff["low"] is None else f"[{diff['low']:+.3f}, {diff['high']:+.3f}]"
            compared, verdict = f"{diff['mean']:+.3f} {span}, df {diff['df']}", entry["verdict"]
        else:
            compared, verdict = "(baseline)", ""
        lines.append(
            f"| {arm} | {' | '.join(cells)} | {entry['mean_domain_loss']:.3f} | {worst} | {compared} | {verdict} |"
        )
    lines += drawn_table(summary)
    best = winner(summary)
    lines += ["", f"Winner: `{best}`." if best else "No arm helps by the rule: keep the baseline.", ""]
    lines += [design_line(summary, protocol), ""]
    if "regime" in summary:
        lines += regime_markdown(summary["regime"], domains)
    return "\n".join(lines)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` through a temporary file renamed over ``path``."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(text)
    os.replace(temporary, path)


def write_decision(root: Path, summary: Mapping[str, Any], protocol: Mapping[str, Any], smallest: list[str]) -> None:
    """``decision.json``, ``decision.md`` (the card) and ``decision.png`` in ``root``."""
    write_atomically(root / "decision.json", json.dumps({"protocol": protocol, **summary}, indent=2) + "\n")
    write_atomically(root / "decision.md", decision_markdown(summary, protocol, smallest))
    plot_decision(summary, root / "decision.png")
