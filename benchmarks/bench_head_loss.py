"""The output layer's loss alone: our per-target paths against PyTorch's ``F.linear_cross_entropy``, time and error.

For hidden states ``[N, h]``, a head ``[V, h]`` and per-target weights ``s`` (three domains of weights 0.5 / 0.3 /
0.2, each divided by its target count: the trainer's objective), the forward and backward pass of
``sum_i s_i l_i`` by

* ``full``: ``F.linear`` then ``F.cross_entropy(reduction='none')`` (the full ``[N, V]`` logits, fp32);
* ``ours-recompute``: :func:`~robust_pretrain.trainer.next_token_loss.chunked_head_losses` (logits recomputed in the
  backward pass: ``8VH`` FLOPs per target);
* ``ours-single-pass``: :func:`~robust_pretrain.trainer.single_pass_loss.single_pass_head_losses` (gradients in the
  forward pass, ``6VH``);
* ``torch-lce-none``: ``F.linear_cross_entropy(reduction='none', options=LinearCrossEntropyOptions())``, weighted
  afterwards (per-target losses with any upstream gradient: PyTorch recomputes);
* ``torch-lce-sum-per-domain``: one ``reduction='sum'`` call per domain on its rows (gradients in the forward pass),
  weighted by ``w_d / n_d``: per-domain sums and weights without per-target losses;
* ``torch-lce-mean``: one ``reduction='mean'`` call (the plain mean: one domain, or proportional weights only).

Interleaved rounds (the machine is shared): each round runs every path once in alternating order; the time ratio to
``full`` is taken within each round, its median reported. Error: the largest relative difference of the hidden
states' and head's gradients from ``full`` in fp32.

    python benchmarks/bench_head_loss.py --results benchmarks/results/head_loss
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from robust_pretrain.trainer.next_token_loss import chunked_head_losses, default_chunk_size
from robust_pretrain.trainer.single_pass_loss import single_pass_head_losses

WEIGHTS = (0.5, 0.3, 0.2)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--targets", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--results", help="output path without extension (default: print only)")
    return parser.parse_args(argv)


def problem(targets: int, hidden: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    domains = torch.arange(targets) % len(WEIGHTS)
    counts = torch.bincount(domains, minlength=len(WEIGHTS)).float()
    return {
        "hidden": torch.randn(targets, hidden, generator=g),
        "weight": torch.randn(vocab, hidden, generator=g) / hidden**0.5,
        "targets": torch.randint(0, vocab, (targets,), generator=g),
        "domains": domains,
        "scales": (torch.tensor(WEIGHTS) / counts)[domains],
    }


def paths(p: dict[str, torch.Tensor]) -> dict[str, Callable]:
    """Each path's objective ``sum_i s_i l_i`` of (hidden, weight) (``torch-lce-mean``: the plain mean)."""
    chunk = default_chunk_size(*p["hidden"].shape[:1], *p["weight"].shape)
    y, s, d = p["targets"], p["scales"], p["domains"]
    options = torch.nn.LinearCrossEntropyOptions()

    def head(w: torch.Tensor) -> torch.nn.Linear:
        linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        del linear.weight
        linear.weight = w
        return linear

    def per_domain(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        rows = [torch.nonzero(d == t).flatten() for t in range(len(WEIGHTS))]
        sums = [F.linear_cross_entropy(h[r], w, y[r], reduction="sum", options=options) for r in rows]
        return sum(sums[t] * s[r[0]] for t, r in enumerate(rows))

    return {
        "full": lambda h, w: (F.cross_entropy(F.linear(h, w), y, reduction="none") * s).sum(),
        "ours-recompute": lambda h, w: (chunked_head_losses(h, head(w), y, chunk) * s).sum(),
        "ours-single-pass": lambda h, w: (single_pass_head_losses(h, head(w), y, s, chunk) * s).sum(),
        "torch-lce-none": lambda h, w: (F.linear_cross_entropy(h, w, y, reduction="none", options=options) * s).sum(),
        "torch-lce-sum-per-domain": per_domain,
        "torch-lce-mean": lambda h, w: F.linear_cross_entropy(h, w, y, reduction="mean", options=options),
    }


def gradients(objective: Callable, p: dict[str, torch.Tensor]) -> tuple[float, list[torch.Tensor]]:
    h, w = p["hidden"].clone().requires_grad_(), p["weight"].clone().requires_grad_()
    start = time.perf_counter()
    objective(h, w).backward()
    return time.perf_counter() - start, [h.grad, w.grad]


def relative_error(grads: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    return max(float((g - r).abs().max() / r.abs().max()) for g, r in zip(grads, reference, strict=True))


def measure(targets: int, hidden: int, cli: argparse.Namespace) -> list[dict]:
    p = problem(targets, hidden, cli.vocab)
    objectives = paths(p)
    mean_problem = dict(p, scales=torch.full_like(p["scales"], 1 / targets))
    _, reference = gradients(objectives["full"], p)
    _, mean_reference = gradients(paths(mean_problem)["full"], mean_problem)
    times: dict[str, list[float]] = {name: [] for name in objectives}
    errors: dict[str, float] = {}
    names = list(objectives)
    for i in range(cli.rounds):
        for name in names if i % 2 == 0 else names[::-1]:
            seconds, grads = gradients(objectives[name], p)
            times[name].append(seconds)
            errors[name] = relative_error(grads, mean_reference if name == "torch-lce-mean" else reference)
    return [
        {
            "targets": targets,
            "hidden": hidden,
            "vocab": cli.vocab,
            "path": name,
            "median_s": round(statistics.median(times[name]), 4),
            "time_ratio_to_full": round(statistics.median(map(float.__truediv__, times[name], times["full"])), 3),
            "max_relative_grad_error": float(f"{errors[name]:.2g}"),
        }
        for name in names
    ]


def table(rows: list[dict]) -> list[str]:
    lines = ["| targets | hidden | path | median (s) | time / full | gradient error vs fp32 full |", "|---" * 6 + "|"]
    for r in rows:
        lines.append(
            f"| {r['targets']} | {r['hidden']} | {r['path']} | {r['median_s']} | {r['time_ratio_to_full']} | "
            f"{r['max_relative_grad_error']} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    cli = parse(argv)
    torch.manual_seed(0)
    rows = [row for h in cli.hidden for n in cli.targets for row in measure(n, h, cli)]
    print("\n".join(table(rows)))
    if cli.results:
        stem = Path(cli.results)
        command = " ".join(["python", *sys.argv])
        setup = {"torch": torch.__version__, "threads": torch.get_num_threads(), "rounds": cli.rounds}
        record = {"command": command, "setup": setup, "results": rows}
        stem.with_suffix(".json").write_text(json.dumps(record, indent=1))
        text = ["# The head's loss alone: our paths and PyTorch's F.linear_cross_entropy (CPU, fp32)", "",
                f"Command: `{command}`", "", *table(rows), ""]  # fmt: skip
        stem.with_suffix(".md").write_text("\n".join(text))


if __name__ == "__main__":
    main()
