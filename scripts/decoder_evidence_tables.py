"""Tables of the decoder evidence (scripts/decoder_evidence.sh): per-domain held-out perplexity of the natural mixture
(the workflow's reference stage) and the robust mixture (its main stage), per seed and their mean, the learned weights,
and the reading the protocol's decision rule gives (scripts/decoder_evidence_protocol.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean

ARMS = {"natural": "reference", "robust mixture": "main"}


def load(runs: Path, seeds: list[int]) -> dict:
    results: dict = {"seeds": seeds, "arms": {}, "weights": {}}
    for arm, stage in ARMS.items():
        results["arms"][arm] = {
            str(seed): json.loads((runs / f"seed-{seed}" / stage / "task_report.json").read_text()) for seed in seeds
        }
    for seed in seeds:
        exported = json.loads((runs / f"seed-{seed}" / "domain_weights.json").read_text())
        results["weights"][str(seed)] = {
            "learned": exported["weights"],
            "natural": exported["provenance"]["natural_weights"],
        }
    return results


def decision(natural: list[float], robust: list[float]) -> tuple[str, float, float]:
    """The protocol's reading of the worst-domain perplexities, the mean delta and the noise yardstick."""
    deltas = [r - n for n, r in zip(natural, robust, strict=True)]
    yardstick = max(natural) - min(natural)
    delta = mean(deltas)
    if all(d < 0 for d in deltas) and -delta > yardstick:
        return "robust mixture helps the worst domain", delta, yardstick
    if all(d > 0 for d in deltas) and delta > yardstick:
        return "robust mixture hurts the worst domain", delta, yardstick
    return "no detectable effect on the worst domain", delta, yardstick


def render(results: dict, timings: str, commands: str) -> tuple[str, dict]:
    seeds = [str(seed) for seed in results["seeds"]]
    arms = results["arms"]
    domains = arms["natural"][seeds[0]]["tasks"]
    lines = [
        "# Decoder evidence: natural vs robust domain mixture (UD-EWT genres, decoder_demo)",
        "",
        "Protocol: `scripts/decoder_evidence_protocol.md` (fixed before the runs). Held-out perplexity per domain "
        "(EWT test), lower is better; per seed and the mean over seeds.",
        "",
        "| arm | seed | " + " | ".join(domains) + " | mean | worst |",
        "|---|---|" + "---|" * (len(domains) + 2),
    ]
    summary: dict = {}
    for arm, by_seed in arms.items():
        worst, means = [], []
        for seed in seeds:
            report = by_seed[seed]
            perplexity = report["eval_task_perplexity"]
            worst.append(report["eval_worst_task_perplexity"])
            means.append(report["eval_mean_task_perplexity"])
            cells = " | ".join(f"{perplexity[d]:.2f}" for d in domains)
            lines.append(f"| {arm} | {seed} | {cells} | {means[-1]:.2f} | {worst[-1]:.2f} |")
        summary[arm] = {"worst": worst, "mean": means}
    reading, delta, yardstick = decision(summary["natural"]["worst"], summary["robust mixture"]["worst"])
    mean_delta = mean(summary["robust mixture"]["mean"]) - mean(summary["natural"]["mean"])
    lines += [
        "",
        f"**Reading (decision rule): {reading}.** Worst-domain perplexity delta (robust - natural), mean over seeds: "
        f"{delta:+.2f} (noise yardstick, the natural arm's seed spread: {yardstick:.2f}); mean-perplexity delta: "
        f"{mean_delta:+.2f}.",
        "",
        "Learned domain weights (time-averaged group DRO proxy weights) against the natural proportions:",
        "",
        "| seed | " + " | ".join(domains) + " |",
        "|---|" + "---|" * len(domains),
    ]
    for seed in seeds:
        weights = results["weights"][seed]
        lines.append(f"| {seed} natural | " + " | ".join(f"{weights['natural'][d]:.3f}" for d in domains) + " |")
        lines.append(f"| {seed} learned | " + " | ".join(f"{weights['learned'][d]:.3f}" for d in domains) + " |")
    lines += ["", "Commands:", "", "```bash", commands.strip(), "```", ""]
    lines += ["Wall times (s):", "", "```", timings.strip(), "```", ""]
    data = {**results, "summary": summary, "reading": reading, "worst_delta": delta, "yardstick": yardstick,
            "mean_delta": mean_delta}  # fmt: skip
    return "\n".join(lines), data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--timings", type=Path, required=True)
    parser.add_argument("--commands", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    text, data = render(load(args.runs, args.seeds), args.timings.read_text(), args.commands.read_text())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
