"""The update order's effect on the decoder demo's held-out per-domain losses (``--weight_update``, issue 38).

Reads ``<runs>/<order>_<seed>/eval_results.json`` of runs made, paired by seed, by

    robust-pretrain-causal-lm --config decoder_demo --seed S --weight_update {alternating,simultaneous} \\
        --output_dir <runs>/<order>_S --save_strategy no

and writes, per domain and for the worst domain and the mean, the paired difference simultaneous - alternating of the
held-out loss (nats) with its 95 % Student-t interval (df = pairs - 1), to ``--out``.{json,md}:

    python scripts/order_evidence.py --runs /tmp/order_runs --out benchmarks/results/order_evidence
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from robust_pretrain.reporting.statistics import paired_interval

ORDERS = ("alternating", "simultaneous")
PREFIX = "eval_task_loss/"


def held_out(runs: Path) -> dict[str, dict[str, dict[str, float]]]:
    """order -> seed -> measure -> loss (each domain's, ``worst`` and ``mean`` over domains)."""
    found: dict[str, dict[str, dict[str, float]]] = {order: {} for order in ORDERS}
    for path in sorted(runs.glob("*_*/eval_results.json")):
        order, seed = path.parent.name.rsplit("_", 1)
        if order not in ORDERS:
            continue
        results = json.loads(path.read_text())
        losses = {key.removeprefix(PREFIX): value for key, value in results.items() if key.startswith(PREFIX)}
        found[order][seed] = {**losses, "worst": max(losses.values()), "mean": sum(losses.values()) / len(losses)}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    cli = parser.parse_args()
    losses = held_out(cli.runs)
    measures = list(next(iter(losses["alternating"].values())))
    rows = []
    for measure in measures:
        baseline = {seed: values[measure] for seed, values in losses["alternating"].items()}
        other = {seed: values[measure] for seed, values in losses["simultaneous"].items()}
        interval, unpaired = paired_interval(baseline, other)
        rows.append({"measure": measure, **interval.as_dict(), "unpaired": unpaired})
    command = "python scripts/order_evidence.py " + " ".join(f"--{k} {v}" for k, v in vars(cli).items())
    record = {"command": command, "losses": losses, "differences": rows}
    cli.out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    lines = [
        "# Update order on the decoder demo: simultaneous - alternating held-out loss (nats)",
        "",
        f"Command: `{command}`; runs: `robust-pretrain-causal-lm --config decoder_demo --seed S --weight_update "
        "ORDER` (600 steps, minimax alpha 1, CPU). Paired by seed; 95 % t-interval, df = pairs - 1.",
        "",
        "| held-out loss | mean difference | 95 % interval | pairs (df) |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['measure']} | {r['mean']:+.4f} | [{r['low']:+.4f}, {r['high']:+.4f}] | {r['n']} ({r['df']}) |"
        )
    cli.out.with_suffix(".md").write_text("\n".join([*lines, ""]))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
