"""Tables of an evidence run (``scripts/glue_evidence.sh``, ``scripts/vision_evidence.sh``): upstream and downstream.

    python scripts/evidence_tables.py --title TITLE --family glue|dense --baseline STRATEGY --compare DIR \\
        --suite TITLE DIR [--suite TITLE DIR ...] --timings FILE --commands FILE --protocol FILE --out PREFIX \\
        [--notes FILE] [--cards DIR]

Reads the comparison of pre-training objectives (``comparison.json`` and each run's ``task_report.json``; runs are
``<compare>/<strategy>/seed-<seed>``) and each suite (``<family>_suite.json``) and writes ``PREFIX.md`` /
``PREFIX.json``: the upstream table (per-task held-out loss, mean, worst; deltas against the baseline objective), the
suites' own tables, and per objective the downstream scores pooled over pre-training seeds x fine-tuning seeds, with
the delta of every objective against the baseline (in score points and in standard errors) and, as a noise
yardstick, the spread between the pre-training seeds of one objective. Checkpoints of a suite that are not runs of
the comparison (e.g. the untouched starting model) are shown as reference rows (``--label`` names them), outside
the deltas.

``--cards DIR --card_prefix NAME`` also writes each comparison run's model card, with the suite's results merged in by
``--update_model_cards``, to ``DIR/<NAME>-<strategy>-seed<seed>/README.md``: titled by that name, ``--base_model``
(the Hub id of the local checkpoint the runs continued from) in place of its folder name, and the commands that made
it (``--model_path``, the local folder, spelled as ``--model_path_command``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics
from pathlib import Path

from huggingface_hub import ModelCard

from robust_pretrain.reporting.aggregation import deltas, mean_std, relative_change, standard_errors, task_summary
from robust_pretrain.reporting.cards import CARD_CONTENT_NAME, ModelCardContent, build_model_card


def _counted(values: list[float]) -> dict[str, float]:
    """:func:`mean_std` with the number of values."""
    return {**mean_std(values), "n": len(values)}


def comparison_runs(compare_dir: Path, comparison: dict) -> dict[str, tuple[str, str]]:
    """``{run directory: (strategy, seed)}`` of the comparison's runs."""
    return {
        str(compare_dir / run / f"seed-{seed}"): (run, str(seed))
        for run in comparison["runs"]
        for seed in comparison["seeds"]
    }


def upstream_table(compare_dir: Path, comparison: dict) -> dict:
    per_seed = {}
    for run in comparison["runs"]:
        for seed in comparison["seeds"]:
            report = json.loads((compare_dir / run / f"seed-{seed}" / "task_report.json").read_text())
            per_seed.setdefault(run, {})[str(seed)] = {
                "task_loss": report["eval_task_loss"],
                "mean": report["eval_mean_task_loss"],
                "worst": report["eval_worst_task_loss"],
                "worst_task": report["worst_task"],
            }
    return {"runs": comparison["runs"], "per_seed": per_seed}


def downstream_tables(
    suite: dict, runs: dict[str, tuple[str, str]], baseline: str, labels: dict[str, str] | None = None
) -> dict:
    """Per objective: each task's scores pooled over (pre-training seed, fine-tuning seed), the average and worst task
    of the pooled means, and per pre-training seed the task means (for the between-seed spread). Each objective's
    delta against ``baseline`` comes with its size in standard errors (``delta / sqrt(s_b^2/n_b + s_o^2/n_o)`` over
    the pooled runs; for the average, over each run's mean of the tasks)."""
    tasks, pooled, references, labels = suite["tasks"], {}, {}, labels or {}
    for checkpoint, entry in suite["checkpoints"].items():
        if checkpoint not in runs:
            references[labels.get(checkpoint, entry["label"])] = {
                "tasks": {task: entry["tasks"][task]["mean"] for task in tasks},
                "average": entry["average"],
                "worst_task": entry["worst_task"],
                "worst_score": entry["worst_score"],
            }
            continue
        strategy, seed = runs[checkpoint]
        slot = pooled.setdefault(
            strategy, {"scores": {t: [] for t in tasks}, "run_averages": [], "per_pretraining_seed": {}}
        )
        for task in tasks:
            slot["scores"][task] += entry["tasks"][task]["scores"]
        seeds = [entry["tasks"][task]["seeds"] for task in tasks]
        if any(order != seeds[0] for order in seeds):
            raise ValueError(f"{checkpoint}: tasks were run with different fine-tuning seeds {seeds}")
        scores_per_run = zip(*(entry["tasks"][task]["scores"] for task in tasks), strict=True)
        slot["run_averages"] += [statistics.fmean(scores) for scores in scores_per_run]
        slot["per_pretraining_seed"][seed] = {
            **{task: entry["tasks"][task]["mean"] for task in tasks},
            "average": entry["average"],
            "worst_task": entry["worst_task"],
            "worst_score": entry["worst_score"],
        }
    if baseline not in pooled:
        raise ValueError(f"--baseline {baseline!r} has no checkpoint in the suite; objectives: {sorted(pooled)}")
    for slot in pooled.values():
        slot["tasks"] = {task: _counted(scores) for task, scores in slot["scores"].items()}
        slot.update(task_summary({task: stat["mean"] for task, stat in slot["tasks"].items()}, higher_is_better=True))
        seeds = slot["per_pretraining_seed"].values()
        slot["average_over_pretraining_seeds"] = _counted([s["average"] for s in seeds])
        slot["worst_over_pretraining_seeds"] = _counted([s["worst_score"] for s in seeds])
    base = pooled[baseline]
    changes = {
        strategy: {
            **deltas(other, base, tasks),
            "same_worst_task": other["worst_task"] == base["worst_task"],
            "in_standard_errors": {
                **{t: standard_errors(base["scores"][t], other["scores"][t]) for t in tasks},
                "average": standard_errors(base["run_averages"], other["run_averages"]),
            },
        }
        for strategy, other in pooled.items()
        if strategy != baseline
    }
    return {"tasks": tasks, "baseline": baseline, "strategies": pooled, "deltas": changes, "references": references}


def _pm(stat: dict, digits: int) -> str:
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def render_upstream(upstream: dict, baseline: str) -> list[str]:
    tasks = list(next(iter(next(iter(upstream["per_seed"].values())).values()))["task_loss"])
    runs = upstream["runs"]
    lines = [
        "## Upstream: held-out task loss (lower is better; mean ± std over pre-training seeds)",
        "",
        "| run | " + " | ".join(tasks) + " | mean | worst | worst task (per seed) |",
        "|---" * (len(tasks) + 4) + "|",
    ]
    for run, stats in runs.items():
        worst_tasks = ", ".join(f"{seed}: {r['worst_task']}" for seed, r in upstream["per_seed"][run].items())
        lines.append(
            f"| {run} | "
            + " | ".join(_pm(stats["task_loss"][t], 4) for t in tasks)
            + f" | {_pm(stats['mean_task_loss'], 4)} | {_pm(stats['worst_task_loss'], 4)} | {worst_tasks} |"
        )
    base = runs[baseline]
    for run, other in runs.items():
        if run == baseline:
            continue
        pairs = [(base["task_loss"][t], other["task_loss"][t]) for t in tasks]
        pairs += [(base[key], other[key]) for key in ("mean_task_loss", "worst_task_loss")]
        lines.append(
            f"| **Δ {run} − {baseline}** | "
            + " | ".join(
                f"{o['mean'] - b['mean']:+.4f} ({relative_change(o['mean'], b['mean']):+.1%})" for b, o in pairs
            )
            + " | |"
        )
    lines += [
        "",
        "Per pre-training seed:",
        "",
        "| run | seed | " + " | ".join(tasks) + " | mean | worst |",
        "|---" * (len(tasks) + 4) + "|",
    ]
    for run in runs:
        for seed, r in upstream["per_seed"][run].items():
            lines.append(
                f"| {run} | {seed} | "
                + " | ".join(f"{r['task_loss'][t]:.4f}" for t in tasks)
                + f" | {r['mean']:.4f} | {r['worst']:.4f} |"
            )
    return lines


def render_downstream(title: str, downstream: dict, suite: dict, suite_md: str) -> list[str]:
    tasks, columns, baseline = downstream["tasks"], suite["columns"], downstream["baseline"]
    headers = [columns[t]["header"] for t in tasks]
    slots = downstream["strategies"].values()
    runs = {len(scores) for slot in slots for scores in slot["scores"].values()}
    pretraining_seeds = {len(slot["per_pretraining_seed"]) for slot in slots}
    lines = [
        f"## {title} (x100, higher is better)",
        "",
        f"Per objective, each task's score pooled over pre-training x fine-tuning seeds (mean ± std of "
        f"{'/'.join(map(str, sorted(runs)))} runs); average and worst task of the pooled means; the last two "
        f"columns: average and worst score per pre-training seed (mean ± std over the "
        f"{'/'.join(map(str, sorted(pretraining_seeds)))} pre-training seeds, each the mean over fine-tuning "
        "seeds).",
        "",
        "| objective | " + " | ".join(headers) + " | average | worst task | average (per pt seed) | "
        "worst (per pt seed) |",
        "|---" * (len(tasks) + 5) + "|",
    ]
    for strategy, slot in downstream["strategies"].items():
        lines.append(
            f"| {strategy} | "
            + " | ".join(_pm(slot["tasks"][t], 1) for t in tasks)
            + f" | {slot['average']:.1f} | {slot['worst_score']:.1f} ({columns[slot['worst_task']]['display_name']})"
            + f" | {_pm(slot['average_over_pretraining_seeds'], 1)} | {_pm(slot['worst_over_pretraining_seeds'], 1)} |"
        )
    for label, row in downstream["references"].items():
        lines.append(
            f"| reference: {label} | "
            + " | ".join(f"{row['tasks'][t]:.1f}" for t in tasks)
            + f" | {row['average']:.1f} | {row['worst_score']:.1f} "
            f"({columns[row['worst_task']]['display_name']}) | | |"
        )
    for strategy, delta in downstream["deltas"].items():
        errors = delta["in_standard_errors"]
        worst_task = downstream["strategies"][strategy]["worst_task"]
        lines.append(
            f"| **Δ {strategy} − {baseline}** | "
            + " | ".join(f"{delta['tasks'][t]:+.1f}" for t in tasks)
            + f" | {delta['average']:+.1f} | {delta['worst_score']:+.1f} | | |"
        )
        lines.append(
            "| Δ in standard errors | "
            + " | ".join(f"{errors[t]:+.1f}" for t in tasks)
            + f" | {errors['average']:+.1f} | "
            + (f"{errors[worst_task]:+.1f}" if delta["same_worst_task"] else "")
            + " | | |"
        )
    lines += [
        "",
        "Per pre-training seed (mean over fine-tuning seeds):",
        "",
        "| objective | pt seed | " + " | ".join(headers) + " | average | worst task |",
        "|---" * (len(tasks) + 4) + "|",
    ]
    for strategy, slot in downstream["strategies"].items():
        for seed, row in slot["per_pretraining_seed"].items():
            lines.append(
                f"| {strategy} | {seed} | "
                + " | ".join(f"{row[t]:.1f}" for t in tasks)
                + f" | {row['average']:.1f} | {row['worst_score']:.1f} "
                f"({columns[row['worst_task']]['display_name']}) |"
            )
    lines += [
        "",
        f"The suite's own table (`{suite['family']}_suite.md`, one row per checkpoint):",
        "",
        suite_md.strip(),
        "",
    ]
    return lines


def write_tables(args: argparse.Namespace) -> None:
    comparison = json.loads((args.compare / "comparison.json").read_text())
    upstream = upstream_table(args.compare, comparison)
    runs = comparison_runs(args.compare, comparison)
    timings = {}
    for line in args.timings.read_text().splitlines():
        name, _, seconds = line.rpartition(" ")
        timings[name] = float(seconds)
    commands = args.commands.read_text().splitlines()
    protocol = args.protocol.read_text()
    notes = args.notes.read_text() if args.notes is not None and args.notes.is_file() else ""
    lines = [
        f"# {args.title}",
        "",
        "## Commands",
        "",
        "```bash",
        *commands,
        "```",
        "",
        "## Fine-tuning protocol (fixed before any result)",
        "",
        protocol.strip(),
        "",
        "## Wall times",
        "",
    ]
    lines += [f"- {name}: {seconds / 60:.1f} min ({seconds:.0f} s)" for name, seconds in timings.items()]
    if notes.strip():
        lines += ["", notes.strip()]
    lines += ["", *render_upstream(upstream, args.baseline), ""]
    downstream = {}
    for title, directory in args.suite:
        suite_dir = Path(directory)
        suite = json.loads((suite_dir / f"{args.family}_suite.json").read_text())
        suite["family"] = args.family
        tables = downstream_tables(suite, runs, args.baseline, dict(args.label or []))
        downstream[title] = {"suite_dir": str(suite_dir), **tables, "suite": suite}
        suite_md = (suite_dir / f"{args.family}_suite.md").read_text()
        lines += render_downstream(title, downstream[title], suite, suite_md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(
        json.dumps(
            {
                "commands": commands,
                "protocol": protocol,
                "wall_seconds": timings,
                "notes": notes,
                "upstream": upstream,
                "downstream": downstream,
            },
            indent=2,
        )
        + "\n"
    )
    args.out.with_suffix(".md").write_text("\n".join(lines))
    if args.cards is not None:
        for checkpoint, (strategy, seed) in runs.items():
            name = f"{args.card_prefix}-{strategy}-seed{seed}"
            write_reference_card(Path(checkpoint), name, args, [c for c in commands if "--update_model_cards" in c])


def write_reference_card(run_dir: Path, name: str, args: argparse.Namespace, suite_commands: list[str]) -> None:
    """The run's card (metadata incl. merged suite results kept), titled ``name``, with the commands that made it."""
    content = ModelCardContent.from_dict(json.loads((run_dir / CARD_CONTENT_NAME).read_text())["content"])
    content = dataclasses.replace(content, base_model=args.base_model, local_base_model=None)
    card = ModelCard.load(run_dir / "README.md")
    card.data.model_name, card.data.base_model = name, args.base_model
    options = json.loads((run_dir / "compare_settings.json").read_text())["options"]
    pretraining = shlex.join(
        ["python", "-m", "robust_pretrain.pretraining.pos_mlm", *options, "--output_dir", str(run_dir)]
    )
    commands = []
    for command in (pretraining, *suite_commands):
        command = command.replace(str(run_dir.parents[1]), "$OUT/pretraining").replace(str(run_dir.parents[2]), "$OUT")
        commands.append(command.replace(args.model_path, args.model_path_command))
    card.text = build_model_card(content, model_name=name, model_id=f"path/to/{name}").text + "\n".join(
        [
            "",
            "",
            "## How this checkpoint was made",
            "",
            "Pre-training, then the GLUE suite that merged the results above into this card: "
            f"one run of `{args.script}` "
            f"(`$OUT` is its output folder; evidence tables: `{args.out.with_suffix('.md')}`):",
            "",
            "```bash",
            *commands,
            "```",
            "",
        ]
    )
    target = args.cards / name / "README.md"
    target.parent.mkdir(parents=True, exist_ok=True)
    card.save(target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--title", required=True, help="the heading of the markdown file")
    parser.add_argument("--family", required=True, choices=("glue", "dense"), help="the suites' task family")
    parser.add_argument("--baseline", required=True, help="objective (comparison run name) the deltas are against")
    for name in ("compare", "timings", "commands", "protocol", "out"):
        parser.add_argument(f"--{name}", type=Path, required=True)
    parser.add_argument(
        "--suite",
        nargs=2,
        action="append",
        metavar=("TITLE", "DIR"),
        required=True,
        help="a suite directory and its section title; the primary result first",
    )
    parser.add_argument("--notes", type=Path, help="markdown appended to the wall times (e.g. where runs were reused)")
    parser.add_argument(
        "--label",
        nargs=2,
        action="append",
        metavar=("CHECKPOINT", "LABEL"),
        help="the row label of a reference checkpoint (one that is not a run of the comparison)",
    )
    parser.add_argument("--script", default="scripts/glue_evidence.sh", help="the evidence script, named in cards")
    parser.add_argument("--cards", type=Path, help="write each comparison run's model card into this folder")
    parser.add_argument("--card_prefix", default="checkpoint", help="cards are named <prefix>-<strategy>-seed<seed>")
    parser.add_argument("--base_model", help="Hub id of the checkpoint the runs continued from (for the cards)")
    parser.add_argument("--model_path", default="\0", help="local folder of that checkpoint, as in the commands")
    parser.add_argument("--model_path_command", default="", help="how the cards spell --model_path")
    write_tables(parser.parse_args())


if __name__ == "__main__":
    main()
