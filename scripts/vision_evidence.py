"""Helpers of ``scripts/vision_evidence.sh`` (evidence for the README's vision table).

    python scripts/vision_evidence.py scenes OUT_DIR --num_train 512 --num_eval 256 [--scene_seed 0 --scene_size 64]
    python scripts/vision_evidence.py tables --compare DIR --suite TITLE DIR [--suite TITLE DIR ...] \
        --timings FILE --commands FILE --protocol FILE --out PREFIX [--notes FILE]

``scenes`` renders the generated scenes' downstream splits once (``downstream_train`` / ``downstream_test``, exactly
the images ``finetune_dense.py`` renders for ``--num_train_scenes`` / ``--num_eval_scenes``) into a local ``datasets``
folder (parquet + a README declaring the splits), so the suite's cells load them instead of rendering them again.

``tables`` reads the comparison (``comparison.json`` and each run's ``task_report.json``) and each dense suite
(``dense_suite.json``) and writes ``PREFIX.md`` / ``PREFIX.json``: the upstream table (per-modality held-out loss,
mean, worst), the suites' own tables, and per strategy the downstream scores pooled over pre-training seeds x
fine-tuning seeds with the delta of minimax against average and, as a noise yardstick, the spread between the two
pre-training seeds of one strategy.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

SPLITS = ("downstream_train", "downstream_test")
DATASET_README = """---
configs:
- config_name: default
  data_files:
  - split: downstream_train
    path: downstream_train.parquet
  - split: downstream_test
    path: downstream_test.parquet
---
Generated scenes (robust_pretrain.vision.scenes), {description}. Written by scripts/vision_evidence.py.
"""


def write_scenes(out_dir: Path, num_train: int, num_eval: int, scene_seed: int, scene_size: int) -> None:
    from robust_pretrain.vision import scenes

    out_dir.mkdir(parents=True, exist_ok=True)
    config = scenes.SceneConfig(image_size=scene_size)
    for split, count in zip(SPLITS, (num_train, num_eval), strict=True):
        scenes.generate_scenes(count, split, scene_seed, config).to_parquet(str(out_dir / f"{split}.parquet"))
    description = (f"generator v{scenes.GENERATOR_VERSION}, seed {scene_seed}, {scene_size} px: {num_train} "
                   f"downstream_train / {num_eval} downstream_test")
    (out_dir / "README.md").write_text(DATASET_README.format(description=description), encoding="utf-8")


def _mean_std(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values)}


def _standard_errors(baseline: list[float], other: list[float]) -> float:
    """Difference of means over its standard error (Welch); inf for a non-zero difference without spread."""
    error = (statistics.variance(baseline) / len(baseline) + statistics.variance(other) / len(other)) ** 0.5
    difference = statistics.fmean(other) - statistics.fmean(baseline)
    return difference / error if error else (0.0 if difference == 0 else float("inf") * difference)


def _strategy_of(checkpoint: str) -> tuple[str, str]:
    """``(strategy, seed)`` of a comparison run directory ``.../<strategy>/seed-<seed>``."""
    path = Path(checkpoint)
    return path.parent.name, path.name.removeprefix("seed-")


def upstream_table(compare_dir: Path) -> dict:
    comparison = json.loads((compare_dir / "comparison.json").read_text())
    per_seed = {}
    for run in comparison["runs"]:
        for seed in comparison["seeds"]:
            report = json.loads((compare_dir / run / f"seed-{seed}" / "task_report.json").read_text())
            per_seed.setdefault(run, {})[str(seed)] = {
                "task_loss": report["eval_task_loss"], "mean": report["eval_mean_task_loss"],
                "worst": report["eval_worst_task_loss"], "worst_task": report["worst_task"],
            }
    return {"runs": comparison["runs"], "per_seed": per_seed}


def downstream_tables(suite: dict) -> dict:
    """Per strategy: each task's scores pooled over (pre-training seed, fine-tuning seed), the average and worst task
    of the pooled means, and per pre-training seed the task means (for the between-seed spread). The delta of minimax
    against average comes with its size in standard errors (``delta / sqrt(s_a^2/n_a + s_m^2/n_m)`` over the pooled
    runs; for the average, over each run's mean of the three tasks)."""
    tasks, pooled = suite["tasks"], {}
    for checkpoint, entry in suite["checkpoints"].items():
        strategy, seed = _strategy_of(checkpoint)
        slot = pooled.setdefault(strategy, {"scores": {t: [] for t in tasks}, "run_averages": [],
                                            "per_pretraining_seed": {}})
        for task in tasks:
            slot["scores"][task] += entry["tasks"][task]["scores"]
        seeds = [entry["tasks"][task]["seeds"] for task in tasks]
        if any(order != seeds[0] for order in seeds):
            raise ValueError(f"{checkpoint}: tasks were run with different fine-tuning seeds {seeds}")
        runs = zip(*(entry["tasks"][task]["scores"] for task in tasks), strict=True)
        slot["run_averages"] += [statistics.fmean(run) for run in runs]
        slot["per_pretraining_seed"][seed] = {
            **{task: entry["tasks"][task]["mean"] for task in tasks},
            "average": entry["average"], "worst_task": entry["worst_task"], "worst_score": entry["worst_score"],
        }
    for slot in pooled.values():
        slot["tasks"] = {task: _mean_std(scores) for task, scores in slot["scores"].items()}
        means = {task: stat["mean"] for task, stat in slot["tasks"].items()}
        slot["average"] = statistics.fmean(means.values())
        slot["worst_task"] = min(means, key=means.__getitem__)
        slot["worst_score"] = means[slot["worst_task"]]
        seeds = slot["per_pretraining_seed"].values()
        slot["average_over_pretraining_seeds"] = _mean_std([s["average"] for s in seeds])
        slot["worst_over_pretraining_seeds"] = _mean_std([s["worst_score"] for s in seeds])
    delta = None
    if {"average", "minimax"} <= set(pooled):
        base, other = pooled["average"], pooled["minimax"]
        delta = {
            "tasks": {t: other["tasks"][t]["mean"] - base["tasks"][t]["mean"] for t in tasks},
            "average": other["average"] - base["average"],
            "worst_score": other["worst_score"] - base["worst_score"],
            "in_standard_errors": {
                **{t: _standard_errors(base["scores"][t], other["scores"][t]) for t in tasks},
                "average": _standard_errors(base["run_averages"], other["run_averages"]),
            },
        }
    return {"tasks": tasks, "strategies": pooled, "delta_minimax_vs_average": delta}


def _pm(stat: dict, digits: int) -> str:
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def render_upstream(upstream: dict) -> list[str]:
    modalities = list(next(iter(next(iter(upstream["per_seed"].values())).values()))["task_loss"])
    runs = list(upstream["runs"])
    lines = ["## Upstream: held-out reconstruction loss (lower is better; mean ± std over pre-training seeds)",
             "", "| run | " + " | ".join(modalities) + " | mean | worst | worst task (per seed) |",
             "|---" * (len(modalities) + 4) + "|"]
    for run in runs:
        stats = upstream["runs"][run]
        worst_tasks = ", ".join(f"{seed}: {r['worst_task']}" for seed, r in upstream["per_seed"][run].items())
        lines.append(f"| {run} | " + " | ".join(_pm(stats["task_loss"][m], 4) for m in modalities)
                     + f" | {_pm(stats['mean_task_loss'], 4)} | {_pm(stats['worst_task_loss'], 4)} | {worst_tasks} |")
    if {"average", "minimax"} <= set(runs):
        base, other = upstream["runs"]["average"], upstream["runs"]["minimax"]
        pairs = [(base["task_loss"][m], other["task_loss"][m]) for m in modalities]
        pairs += [(base[key], other[key]) for key in ("mean_task_loss", "worst_task_loss")]
        lines.append("| **Δ minimax − average** | " + " | ".join(
            f"{o['mean'] - b['mean']:+.4f} ({o['mean'] / b['mean'] - 1:+.1%})" for b, o in pairs) + " | |")
    lines += ["", "Per pre-training seed:", "", "| run | seed | " + " | ".join(modalities) + " | mean | worst |",
              "|---" * (len(modalities) + 4) + "|"]
    for run in runs:
        for seed, r in upstream["per_seed"][run].items():
            lines.append(f"| {run} | {seed} | " + " | ".join(f"{r['task_loss'][m]:.4f}" for m in modalities)
                         + f" | {r['mean']:.4f} | {r['worst']:.4f} |")
    return lines


def render_downstream(title: str, downstream: dict, suite: dict, suite_md: str) -> list[str]:
    tasks, columns = downstream["tasks"], suite["columns"]
    headers = [columns[t]["header"] for t in tasks]
    lines = [f"## {title} (x100, higher is better)", "",
             "Per strategy, each task's score pooled over 2 pre-training seeds x 2 fine-tuning seeds (mean ± std of "
             "4 runs); average and worst task of the pooled means; the last two columns: average and worst score "
             "per pre-training seed (mean ± std over the 2 pre-training seeds, each the mean of 2 fine-tuning "
             "seeds).", "",
             "| strategy | " + " | ".join(headers) + " | average | worst task | average (per pt seed) | "
             "worst (per pt seed) |", "|---" * (len(tasks) + 5) + "|"]
    for strategy, slot in downstream["strategies"].items():
        lines.append(
            f"| {strategy} | " + " | ".join(_pm(slot["tasks"][t], 1) for t in tasks)
            + f" | {slot['average']:.1f} | {slot['worst_score']:.1f} ({columns[slot['worst_task']]['display_name']})"
            + f" | {_pm(slot['average_over_pretraining_seeds'], 1)} | {_pm(slot['worst_over_pretraining_seeds'], 1)} |"
        )
    delta = downstream["delta_minimax_vs_average"]
    if delta is not None:
        lines.append("| **Δ minimax − average** | " + " | ".join(f"{delta['tasks'][t]:+.1f}" for t in tasks)
                     + f" | {delta['average']:+.1f} | {delta['worst_score']:+.1f} | | |")
        errors = delta["in_standard_errors"]
        worst_task = downstream["strategies"]["minimax"]["worst_task"]
        same_worst = worst_task == downstream["strategies"]["average"]["worst_task"]
        lines.append("| Δ in standard errors | " + " | ".join(f"{errors[t]:+.1f}" for t in tasks)
                     + f" | {errors['average']:+.1f} | " + (f"{errors[worst_task]:+.1f}" if same_worst else "")
                     + " | | |")
    lines += ["", "Per pre-training seed (mean of 2 fine-tuning seeds):", "",
              "| strategy | pt seed | " + " | ".join(headers) + " | average | worst task |",
              "|---" * (len(tasks) + 4) + "|"]
    for strategy, slot in downstream["strategies"].items():
        for seed, row in slot["per_pretraining_seed"].items():
            lines.append(f"| {strategy} | {seed} | " + " | ".join(f"{row[t]:.1f}" for t in tasks)
                         + f" | {row['average']:.1f} | {row['worst_score']:.1f} "
                         f"({columns[row['worst_task']]['display_name']}) |")
    lines += ["", "The suite's own table (`dense_suite.md`, one row per checkpoint):", "", suite_md.strip(), ""]
    return lines


def write_tables(compare_dir: Path, suites: list[tuple[str, Path]], timings_file: Path, commands_file: Path,
                 protocol_file: Path, out: Path, notes_file: Path | None = None) -> None:
    """``suites``: (section title, suite directory), the primary result first."""
    upstream = upstream_table(compare_dir)
    timings = {}
    for line in timings_file.read_text().splitlines():
        name, _, seconds = line.rpartition(" ")
        timings[name] = float(seconds)
    commands = commands_file.read_text().splitlines()
    protocol = protocol_file.read_text()
    notes = notes_file.read_text() if notes_file is not None and notes_file.is_file() else ""
    lines = ["# Vision evidence: average vs minimax MM-MAE pre-training on the generated scenes", "",
             "## Commands", "", "```bash", *commands, "```", "", "## Fine-tuning protocol (fixed before any result)",
             "", protocol.strip(), "", "## Wall times", ""]
    lines += [f"- {name}: {seconds / 60:.1f} min ({seconds:.0f} s)" for name, seconds in timings.items()]
    if notes.strip():
        lines += ["", notes.strip()]
    lines += ["", *render_upstream(upstream), ""]
    downstream = {}
    for title, suite_dir in suites:
        suite = json.loads((suite_dir / "dense_suite.json").read_text())
        downstream[title] = {"suite_dir": str(suite_dir), **downstream_tables(suite), "suite": suite}
        lines += render_downstream(title, downstream[title], suite, (suite_dir / "dense_suite.md").read_text())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(
        {"commands": commands, "protocol": protocol, "wall_seconds": timings, "notes": notes, "upstream": upstream,
         "downstream": downstream}, indent=2) + "\n")
    out.with_suffix(".md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    scenes = sub.add_parser("scenes")
    scenes.add_argument("out_dir", type=Path)
    scenes.add_argument("--num_train", type=int, required=True)
    scenes.add_argument("--num_eval", type=int, required=True)
    scenes.add_argument("--scene_seed", type=int, default=0)
    scenes.add_argument("--scene_size", type=int, default=64)
    tables = sub.add_parser("tables")
    for name in ("compare", "timings", "commands", "protocol", "out"):
        tables.add_argument(f"--{name}", type=Path, required=True)
    tables.add_argument("--suite", nargs=2, action="append", metavar=("TITLE", "DIR"), required=True,
                        help="a dense suite directory and its section title; the primary result first")
    tables.add_argument("--notes", type=Path, help="markdown appended to the wall times (e.g. where runs were reused)")
    args = parser.parse_args()
    if args.command == "scenes":
        write_scenes(args.out_dir, args.num_train, args.num_eval, args.scene_seed, args.scene_size)
    else:
        suites = [(title, Path(directory)) for title, directory in args.suite]
        write_tables(args.compare, suites, args.timings, args.commands, args.protocol, args.out, args.notes)


if __name__ == "__main__":
    main()
