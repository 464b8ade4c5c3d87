"""Tables of an evidence run (``scripts/*_evidence.sh``): upstream and downstream, analysed as a nested design.

    python scripts/evidence_tables.py --title TITLE --family glue|probe|dense --baseline STRATEGY --compare DIR \\
        [--compare DIR ...] --suite TITLE DIR [--suite TITLE DIR ...] --timings FILE --commands FILE \\
        --protocol FILE --out PREFIX [--smallest_effect X] [--notes FILE] [--cards DIR]

Reads the comparisons of pre-training objectives (each ``--compare`` directory's ``comparison.json`` and each run's
``task_report.json``; runs are ``<compare>/<run>/seed-<seed>``, run names unique over all directories) and each suite
(``<family>_suite.json``) and writes ``PREFIX.md`` / ``PREFIX.json``: the upstream table (per-task held-out loss,
mean, worst; deltas against the baseline objective), then per suite the analysis that matches the design
(:mod:`robust_pretrain.reporting.statistics`): each pre-training run's scores averaged over its fine-tuning seeds
first; per objective, mean ± std over pre-training runs; every other objective against the baseline paired by
pre-training seed, with a t-interval on ``pairs - 1`` degrees of freedom and the number of runs it rests on; with
``--smallest_effect``, the pre-registered verdict on the worst-task difference. Checkpoints of a suite that are not
runs of a comparison (e.g. the untouched starting model) are shown as reference rows (``--label`` names them),
outside the differences.

``--cards DIR --card_prefix NAME`` also writes each comparison run's model card, with the suite's results merged in by
``--update_model_cards``, to ``DIR/<NAME>-<strategy>-seed<seed>/README.md``: titled by that name, ``--base_model``
(the Hub id of the local checkpoint the runs continued from) in place of its folder name, and the commands that made
it (``--model_path``, the local folder, spelled as ``--model_path_command``; ``--evidence_out``, the script's
output folder, as ``$OUT``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from pathlib import Path

from huggingface_hub import ModelCard

from robust_pretrain.reporting.aggregation import relative_change, task_summary
from robust_pretrain.reporting.cards import CARD_CONTENT_NAME, ModelCardContent, build_model_card
from robust_pretrain.reporting.statistics import mean_interval, paired_interval, run_means, verdict


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
    suite: dict,
    runs: dict[str, tuple[str, str]],
    baseline: str,
    labels: dict[str, str] | None = None,
    smallest_effect: float | None = None,
) -> dict:
    """The nested design's analysis. Per pre-training run (checkpoint): each task's score averaged over its
    fine-tuning seeds, their average and the run's worst task. Per objective: each of these over its pre-training runs
    (mean, std, t-interval with n - 1 df). Per non-baseline objective: the differences against ``baseline`` paired by
    pre-training seed (mean and t-interval with pairs - 1 df, the seeds used and those left unpaired) and, with
    ``smallest_effect``, the pre-registered verdict on each difference (:func:`statistics.verdict`)."""
    tasks, strategies, references, labels = suite["tasks"], {}, {}, labels or {}
    higher_is_better = suite.get("higher_is_better", True)
    if smallest_effect is not None and not higher_is_better:
        raise ValueError("verdicts are defined for scores where higher is better")
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
        fine_tuning_seeds = {len(entry["tasks"][task]["scores"]) for task in tasks}
        strategies.setdefault(strategy, {"per_pretraining_seed": {}})["per_pretraining_seed"][seed] = {
            **run_means({task: entry["tasks"][task]["scores"] for task in tasks}),
            **task_summary(
                run_means({task: entry["tasks"][task]["scores"] for task in tasks}), higher_is_better=higher_is_better
            ),
            "fine_tuning_seeds": min(fine_tuning_seeds),
        }
    if baseline not in strategies:
        raise ValueError(f"--baseline {baseline!r} has no checkpoint in the suite; objectives: {sorted(strategies)}")
    majority = majority_scores(suite)
    if majority:
        references["majority class"] = {
            "tasks": majority,
            **task_summary(majority, higher_is_better=higher_is_better),
        }
    measures = [*tasks, "average", "worst_score"]
    for slot in strategies.values():
        seeds = list(slot["per_pretraining_seed"])
        rows = slot["per_pretraining_seed"].values()
        slot["over_pretraining_runs"] = {
            measure: mean_interval([row[measure] for row in rows], seeds=seeds).as_dict() for measure in measures
        }
        slot.update(
            task_summary(
                {task: slot["over_pretraining_runs"][task]["mean"] for task in tasks}, higher_is_better=higher_is_better
            )
        )
    base = strategies[baseline]["per_pretraining_seed"]
    changes = {}
    for strategy, slot in strategies.items():
        if strategy == baseline:
            continue
        own, change = slot["per_pretraining_seed"], {}
        for measure in measures:
            interval, unpaired = paired_interval(
                {seed: row[measure] for seed, row in base.items()}, {seed: row[measure] for seed, row in own.items()}
            )
            change[measure] = {**interval.as_dict(), "unpaired_seeds": unpaired}
            if smallest_effect is not None:
                change[measure]["verdict"] = verdict(interval, smallest_effect)
        changes[strategy] = change
    return {
        "tasks": tasks,
        "baseline": baseline,
        "higher_is_better": higher_is_better,
        "smallest_effect": smallest_effect,
        "strategies": strategies,
        "deltas": changes,
        "references": references,
    }


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


def majority_scores(suite: dict) -> dict[str, float]:
    """Each task's majority-class score where the suite's cells record one (``majority_<metric>``, the probe family),
    else empty: the floor every checkpoint has to clear."""
    scores = {}
    for task in suite["tasks"]:
        for entry in suite["checkpoints"].values():
            found = [
                value for key, value in entry["tasks"][task].get("metrics", {}).items() if key.startswith("majority_")
            ]
            if found:
                scores[task] = found[0]
                break
    return scores if len(scores) == len(suite["tasks"]) else {}


def _spread(stat: dict, digits: int = 1) -> str:
    """``mean ± std`` over pre-training runs (the mean alone for one run)."""
    return f"{stat['mean']:.{digits}f}" + ("" if stat["std"] is None else f" ± {stat['std']:.{digits}f}")


def _difference(stat: dict) -> str:
    """``+mean [low, high]`` (the mean alone for one pair)."""
    if stat["low"] is None:
        return f"{stat['mean']:+.1f}"
    return f"{stat['mean']:+.1f} [{stat['low']:+.1f}, {stat['high']:+.1f}]"


def render_downstream(title: str, downstream: dict, suite: dict, suite_md: str) -> list[str]:
    tasks, columns, baseline = downstream["tasks"], suite["columns"], downstream["baseline"]
    headers = [columns[t]["header"] for t in tasks]
    direction = "higher" if downstream["higher_is_better"] else "lower"
    lines = [
        f"## {title} (x100, {direction} is better)",
        "",
        "Unit of analysis: the pre-training run. Each run's task scores are first averaged over its fine-tuning seeds; "
        "per objective, mean ± std over its pre-training runs (n = number of runs); worst = each run's worst task, "
        "averaged over runs; worst task named = the worst of the objective's task means.",
        "",
        "| objective | n | " + " | ".join(headers) + " | average | worst (per run) | worst task of the means |",
        "|---" * (len(tasks) + 5) + "|",
    ]
    for strategy, slot in downstream["strategies"].items():
        stats = slot["over_pretraining_runs"]
        lines.append(
            f"| {strategy} | {stats['average']['n']} | "
            + " | ".join(_spread(stats[t]) for t in tasks)
            + f" | {_spread(stats['average'])} | {_spread(stats['worst_score'])}"
            + f" | {slot['worst_score']:.1f} ({columns[slot['worst_task']]['display_name']}) |"
        )
    for label, row in downstream["references"].items():
        lines.append(
            f"| reference: {label} | | "
            + " | ".join(f"{row['tasks'][t]:.1f}" for t in tasks)
            + f" | {row['average']:.1f} | {row['worst_score']:.1f} | "
            f"{row['worst_score']:.1f} ({columns[row['worst_task']]['display_name']}) |"
        )
    if downstream["deltas"]:
        confidence = next(iter(next(iter(downstream["deltas"].values())).values()))["confidence"]
        lines += [
            "",
            f"Differences against `{baseline}`, paired by pre-training seed: mean [{confidence:.0%} t-interval, "
            "df = pairs − 1]; `pairs` is the number of pre-training runs per objective the intervals rest on.",
            "",
            "| objective | pairs (df) | "
            + " | ".join(f"Δ {columns[t]['display_name']}" for t in tasks)
            + " | Δ average | Δ worst (per run) |",
            "|---" * (len(tasks) + 4) + "|",
        ]
        for strategy, change in downstream["deltas"].items():
            worst = change["worst_score"]
            unpaired = (
                f"; unpaired seeds left out: {', '.join(worst['unpaired_seeds'])}" if worst["unpaired_seeds"] else ""
            )
            lines.append(
                f"| **{strategy} − {baseline}** | {worst['n']} ({worst['df']}){unpaired} | "
                + " | ".join(_difference(change[t]) for t in tasks)
                + f" | {_difference(change['average'])} | {_difference(worst)} |"
            )
        if downstream["smallest_effect"] is not None:
            lines += [
                "",
                f"Pre-registered verdict on Δ worst (helps: interval above 0; hurts: below 0; no effect of that size: "
                f"upper end below +{downstream['smallest_effect']:g}; else inconclusive):",
                "",
            ]
            lines += [
                f"- `{strategy}`: **{change['worst_score']['verdict']}** "
                f"(paired pre-training runs: {change['worst_score']['n']})"
                for strategy, change in downstream["deltas"].items()
            ]
    lines += [
        "",
        "Per pre-training run (mean over its fine-tuning seeds):",
        "",
        "| objective | pt seed | ft seeds | " + " | ".join(headers) + " | average | worst task |",
        "|---" * (len(tasks) + 5) + "|",
    ]
    for strategy, slot in downstream["strategies"].items():
        for seed, row in slot["per_pretraining_seed"].items():
            lines.append(
                f"| {strategy} | {seed} | {row['fine_tuning_seeds']} | "
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


def suite_family(suite_dir: Path) -> str:
    """The family of the one ``<family>_suite.json`` in ``suite_dir``."""
    found = sorted(path.name.removesuffix("_suite.json") for path in suite_dir.glob("*_suite.json"))
    if len(found) != 1:
        raise ValueError(f"{suite_dir}: expected one <family>_suite.json, found {found or 'none'}; pass --family")
    return found[0]


def write_tables(args: argparse.Namespace) -> None:
    upstream, runs = {"runs": {}, "per_seed": {}}, {}
    for compare_dir in args.compare:
        comparison = json.loads((compare_dir / "comparison.json").read_text())
        repeated = sorted(set(comparison["runs"]) & set(upstream["runs"]))
        if repeated:
            raise ValueError(f"{compare_dir}: run names {repeated} are also in an earlier --compare directory")
        table = upstream_table(compare_dir, comparison)
        upstream["runs"].update(table["runs"])
        upstream["per_seed"].update(table["per_seed"])
        runs.update(comparison_runs(compare_dir, comparison))
    timings, invocations = read_timings(args.timings)
    commands = list(dict.fromkeys(line for line in args.commands.read_text().splitlines() if not line.startswith("#")))
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
    if invocations > 1:
        lines += [f"Summed over the script's {invocations} invocations (a resumed or reused step adds each time):", ""]
    lines += [f"- {name}: {seconds / 60:.1f} min ({seconds:.0f} s)" for name, seconds in timings.items()]
    if notes.strip():
        lines += ["", notes.strip()]
    lines += ["", *render_upstream(upstream, args.baseline), ""]
    downstream = {}
    for title, directory in args.suite:
        suite_dir = Path(directory)
        family = args.family or suite_family(suite_dir)
        suite = json.loads((suite_dir / f"{family}_suite.json").read_text())
        suite["family"] = family
        tables = downstream_tables(suite, runs, args.baseline, dict(args.label or []), args.smallest_effect)
        downstream[title] = {"suite_dir": str(suite_dir), **tables, "suite": suite}
        suite_md = (suite_dir / f"{family}_suite.md").read_text()
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
            write_reference_card(Path(checkpoint), name, args, card_commands(commands, checkpoint))


def read_timings(path: Path) -> tuple[dict[str, float], int]:
    """Wall seconds per step name, summed over the script's invocations (each starts with a ``#`` line), and the
    number of invocations."""
    timings: dict[str, float] = {}
    lines = path.read_text().splitlines()
    invocations = 0 if not lines or lines[0].startswith("#") else 1  # a list begun before invocations were marked
    for line in lines:
        if line.startswith("#"):
            invocations += 1
            continue
        name, _, seconds = line.rpartition(" ")
        timings[name] = timings.get(name, 0.0) + float(seconds)
    return timings, invocations


def card_commands(commands: list[str], checkpoint: str) -> list[str]:
    """The suite commands that merged results into this checkpoint's card (``--update_model_cards``, naming it)."""
    return [c for c in commands if "--update_model_cards" in c and checkpoint in shlex.split(c)]


def write_reference_card(run_dir: Path, name: str, args: argparse.Namespace, suite_commands: list[str]) -> None:
    """The run's card (metadata incl. merged suite results kept), titled ``name``, with the commands that made it."""
    content = ModelCardContent.from_dict(json.loads((run_dir / CARD_CONTENT_NAME).read_text())["content"])
    content = dataclasses.replace(content, base_model=args.base_model, local_base_model=None)
    card = ModelCard.load(run_dir / "README.md")
    card.data.model_name, card.data.base_model = name, args.base_model
    options = json.loads((run_dir / "compare_settings.json").read_text())["options"]
    pretraining = shlex.join(
        ["python", "-m", "robust_pretrain.pretraining.pos_mlm.recipe", *options, "--output_dir", str(run_dir)]
    )
    commands = []
    for command in (pretraining, *suite_commands):
        command = command.replace(str(args.evidence_out or run_dir.parents[2]), "$OUT")
        commands.append(command.replace(args.model_path, args.model_path_command))
    card.text = build_model_card(content, model_name=name, model_id=f"path/to/{name}").text + "\n".join(
        [
            "",
            "",
            "## How this checkpoint was made",
            "",
            f"Pre-training, then the suite{'s' if len(suite_commands) > 1 else ''} that merged the results above "
            "into this card: "
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
    parser.add_argument(
        "--family",
        choices=("glue", "probe", "dense"),
        help="every suite's task family (default: each suite directory's one <family>_suite.json)",
    )
    parser.add_argument("--baseline", required=True, help="objective (comparison run name) the deltas are against")
    parser.add_argument(
        "--compare", type=Path, action="append", required=True, help="a comparison directory (repeatable)"
    )
    for name in ("timings", "commands", "protocol", "out"):
        parser.add_argument(f"--{name}", type=Path, required=True)
    parser.add_argument(
        "--smallest_effect",
        type=float,
        help="pre-registered smallest effect of interest (> 0, score points): adds the verdict on each Δ worst",
    )
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
    parser.add_argument(
        "--evidence_out",
        type=Path,
        help="the evidence script's output folder, written $OUT in the cards (default: two levels above each run)",
    )
    parser.add_argument("--cards", type=Path, help="write each comparison run's model card into this folder")
    parser.add_argument("--card_prefix", default="checkpoint", help="cards are named <prefix>-<strategy>-seed<seed>")
    parser.add_argument("--base_model", help="Hub id of the checkpoint the runs continued from (for the cards)")
    parser.add_argument("--model_path", default="\0", help="local folder of that checkpoint, as in the commands")
    parser.add_argument("--model_path_command", default="", help="how the cards spell --model_path")
    write_tables(parser.parse_args())


if __name__ == "__main__":
    main()
