"""Helpers of ``scripts/vision_evidence_v2.sh`` (protocol: ``scripts/vision_evidence_v2_protocol.md``).

    python scripts/vision_evidence_v2.py shares DATASET_DIR STATE     # test-label shares of the scenes' test split
    python scripts/vision_evidence_v2.py save OUT STATE               # finished runs' and cells' small files -> STATE
    python scripts/vision_evidence_v2.py restore OUT STATE            # wall times and commands back into OUT
    python scripts/vision_evidence_v2.py complete STATE SEED          # exit 0 if the seed's results are all saved
    python scripts/vision_evidence_v2.py tables STATE --out PREFIX [--seeds 42 43 44]

``OUT`` is the runner's output folder (``pretraining/<arm>/seed-<s>`` runs, ``suite/seed-<s>`` suites); ``STATE`` the
committed folder (``seed-<s>/pretraining/<arm>/*.json``, ``seed-<s>/cells/<arm>/<task>.json``, no weights). The
tables are computed from ``STATE`` alone: per seed the three arms' scores, each pre-trained arm's gain over the same
seed's random init and its worst task's gain (the primary endpoint), minimax − average paired by pre-training seed
with a t-interval at df = seeds − 1, the protocol's decision, and the constant-predictor flags.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from robust_pretrain.reporting.statistics import Interval, mean_interval, paired_interval, t_quantile

ARMS = ("average", "minimax", "random-init")
PRETRAINED = ("average", "minimax")
TASKS = ("semseg", "depth", "classification")
HEADERS = {"semseg": "Segmentation (mIoU)", "depth": "Depth (δ1)", "classification": "Classification (top-1)"}
RUN_FILES = ("task_report.json", "compare_settings.json", "run_config.json", "config.json")
LOGS = ("timings.txt", "commands.txt")
CONSTANT_TOLERANCE = 1e-9
MEASURES = (*TASKS, "mean", "worst_score", "worst_gain")
MEASURE_NAMES = {
    **HEADERS,
    "mean": "mean of the 3 scores",
    "worst_score": "worst raw score",
    "worst_gain": "**worst task's gain over random init (primary)**",
}


# --- state: save, restore, completeness -------------------------------------------------------------------------


def cell_arm(checkpoint: str) -> str:
    """A suite cell's arm from its checkpoint as spelled in the suite: ``random-init:...`` or ``.../<arm>/seed-s``."""
    if checkpoint.startswith("random-init:"):
        return "random-init"
    arm = Path(checkpoint).parent.name
    if arm not in PRETRAINED:
        raise ValueError(f"cell of an unknown checkpoint {checkpoint!r}")
    return arm


def save(out: Path, state: Path) -> int:
    """Copy every finished pre-training run's and suite cell's small files, and the logs, from ``out`` to ``state``."""
    copied = 0
    for arm in PRETRAINED:
        for run in sorted((out / "pretraining" / arm).glob("seed-*")):
            if not (run / "task_report.json").is_file():
                continue
            for name in RUN_FILES:
                if (run / name).is_file():
                    target = state / run.name / "pretraining" / arm / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(run / name, target)
                    copied += 1
    for cell_file in sorted((out / "suite").glob("seed-*/cells/*/*/seed*/cell.json")):
        cell = json.loads(cell_file.read_text(encoding="utf-8"))
        seed_dir = cell_file.relative_to(out / "suite").parts[0]
        target = state / seed_dir / "cells" / cell_arm(cell["checkpoint"]) / f"{cell['task']}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cell_file, target)
        copied += 1
    for name in LOGS:
        if (out / name).is_file():
            state.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out / name, state / name)
    return copied


def restore(out: Path, state: Path) -> None:
    """Put the saved wall times and commands back into ``out`` (a new session starts with an empty ``outputs/``); the
    finished seeds themselves are read from ``state`` (``complete``), not copied back."""
    out.mkdir(parents=True, exist_ok=True)
    for name in LOGS:
        if (state / name).is_file() and not (out / name).is_file():
            shutil.copyfile(state / name, out / name)


def missing_files(state: Path, seed: int | str) -> list[str]:
    """The result files of ``seed`` not yet in ``state`` (empty: the seed is finished)."""
    root = state / f"seed-{seed}"
    wanted = [root / "pretraining" / arm / "task_report.json" for arm in PRETRAINED]
    wanted += [root / "cells" / arm / f"{task}.json" for arm in ARMS for task in TASKS]
    return [str(path.relative_to(state)) for path in wanted if not path.is_file()]


def label_shares(dataset_dir: Path) -> dict[str, float]:
    """Each class's share of the ``downstream_test`` labels of a scenes folder (``vision_evidence.py scenes``)."""
    import pandas as pd

    labels = pd.read_parquet(dataset_dir / "downstream_test.parquet", columns=["label"])["label"].tolist()
    return {str(label): count / len(labels) for label, count in sorted(Counter(labels).items())}


# --- analysis ---------------------------------------------------------------------------------------------------


def constant_predictor(accuracy: float, shares: dict[str, float]) -> str | None:
    """The class whose share of the test labels equals ``accuracy`` (a fraction) within 1e-9, else None."""
    for label, share in shares.items():
        if abs(accuracy - share) <= CONSTANT_TOLERANCE:
            return label
    return None


def seed_rows(scores: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """One seed's rows: per arm the task scores, their mean and the worst raw score; per pre-trained arm also each
    task's gain over the seed's random init and the worst gain (the primary endpoint) with its task."""
    rows = {}
    for arm in ARMS:
        row: dict[str, Any] = {task: scores[arm][task] for task in TASKS}
        row["mean"] = statistics.fmean(row[task] for task in TASKS)
        row["worst_score"] = min(row[task] for task in TASKS)
        if arm != "random-init":
            gains = {task: scores[arm][task] - scores["random-init"][task] for task in TASKS}
            worst = min(TASKS, key=gains.__getitem__)
            row |= {"gains": gains, "worst_gain": gains[worst], "worst_gain_task": worst}
        rows[arm] = row
    return rows


def reading(interval: Interval, better: str, worse: str) -> str:
    """The protocol's rule: ``better`` if the interval's lower bound > 0, ``worse`` if its upper bound < 0, else
    no difference shown (also for a single seed, which has no interval)."""
    if interval.low is not None and interval.low > 0:
        return better
    if interval.high is not None and interval.high < 0:
        return worse
    return "no difference shown"


def analyse(scores: dict[str, dict[str, dict[str, float]]], confidence: float = 0.95) -> dict[str, Any]:
    """``scores[seed][arm][task]`` (x100) of the finished seeds -> per-seed rows, minimax − average paired by
    pre-training seed for every measure (mean, sd, t-interval at df = seeds − 1, per-seed differences, reading) and
    each pre-trained arm against random init (its gains and worst gain over the seeds, same rule)."""
    rows = {seed: seed_rows(by_arm) for seed, by_arm in scores.items()}
    seeds = list(rows)
    deltas = {}
    for measure in MEASURES:
        base = {seed: rows[seed]["average"][measure] for seed in seeds}
        other = {seed: rows[seed]["minimax"][measure] for seed in seeds}
        interval, _ = paired_interval(base, other, confidence)
        deltas[measure] = {
            **interval.as_dict(),
            "per_seed": {seed: other[seed] - base[seed] for seed in seeds},
            "reading": reading(interval, "minimax better", "minimax worse"),
        }
    against_random = {}
    for arm in PRETRAINED:
        values = {task: [rows[seed][arm]["gains"][task] for seed in seeds] for task in TASKS}
        values["worst_gain"] = [rows[seed][arm]["worst_gain"] for seed in seeds]
        against_random[arm] = {}
        for measure, series in values.items():
            interval = mean_interval(series, confidence, seeds)
            against_random[arm][measure] = {
                **interval.as_dict(),
                "reading": reading(interval, "pre-training helps", "pre-training hurts"),
            }
    primary = deltas["worst_gain"]
    detectable = None
    if primary["df"] >= 1 and primary["std"] is not None:  # 80 % power, two-sided 5 % test (the protocol's formula)
        quantiles = t_quantile(0.5 + confidence / 2, primary["df"]) + t_quantile(0.8, primary["df"])
        detectable = quantiles * primary["std"] / len(seeds) ** 0.5
    return {
        "seeds": seeds,
        "detectable_effect": detectable,
        "rows": rows,
        "deltas": deltas,
        "against_random_init": against_random,
        "decision": deltas["worst_gain"]["reading"],
    }


def flags(cells: dict[str, dict[str, dict[str, Any]]], shares: dict[str, float]) -> list[dict[str, Any]]:
    """Classification cells (``cells[seed][arm]``, each with ``accuracy`` as a fraction) flagged as constant
    predictors."""
    found = []
    for seed, by_arm in cells.items():
        for arm, cell in by_arm.items():
            label = constant_predictor(cell["accuracy"], shares)
            if label is not None:
                found.append({"seed": seed, "arm": arm, "accuracy": cell["accuracy"], "class": label})
    return found


def sensitivity(scores: dict[str, dict[str, dict[str, float]]], flagged: list[dict[str, Any]]) -> dict[str, Any]:
    """The decision without the seeds that have a flagged run (the protocol: reported, not decided on)."""
    dropped = sorted({flag["seed"] for flag in flagged if flag["arm"] in ARMS})
    kept = {seed: by_arm for seed, by_arm in scores.items() if seed not in dropped}
    if not dropped:
        return {"dropped_seeds": [], "decision": None}
    if not kept:
        return {"dropped_seeds": dropped, "decision": "no seed left"}
    return {"dropped_seeds": dropped, "decision": analyse(kept)["decision"]}


# --- reading the state, writing the tables ----------------------------------------------------------------------


def load_state(state: Path, seeds: list[str]) -> dict[str, Any]:
    """The finished seeds' scores, classification accuracies, upstream reports and pre-training settings; the
    unfinished seeds with their missing files."""
    loaded: dict[str, Any] = {"scores": {}, "classification": {}, "upstream": {}, "settings": {}, "unfinished": {}}
    for seed in seeds:
        missing = missing_files(state, seed)
        if missing:
            loaded["unfinished"][seed] = missing
            continue
        root = state / f"seed-{seed}"
        cells = {
            arm: {task: json.loads((root / "cells" / arm / f"{task}.json").read_text()) for task in TASKS}
            for arm in ARMS
        }
        loaded["scores"][seed] = {arm: {task: cells[arm][task]["score"] for task in TASKS} for arm in ARMS}
        loaded["classification"][seed] = {
            arm: {"accuracy": cells[arm]["classification"]["raw_metrics"]["eval_top1_accuracy"]} for arm in ARMS
        }
        for arm in PRETRAINED:
            run = root / "pretraining" / arm
            loaded["upstream"].setdefault(seed, {})[arm] = json.loads((run / "task_report.json").read_text())
            loaded["settings"].setdefault(seed, {})[arm] = {
                name: json.loads((run / name).read_text()) for name in RUN_FILES[1:] if (run / name).is_file()
            }
    return loaded


def _interval_text(stat: dict[str, Any]) -> str:
    if stat["low"] is None:
        return f"{stat['mean']:+.2f} (one seed: no interval)"
    return f"{stat['mean']:+.2f} [{stat['low']:+.2f}, {stat['high']:+.2f}]"


def render_seed_table(analysis: dict[str, Any], flagged: list[dict[str, Any]]) -> list[str]:
    marks = {(flag["seed"], flag["arm"]): flag for flag in flagged}
    lines = [
        "| pt seed | arm | " + " | ".join(HEADERS[task] for task in TASKS) + " | mean | worst raw score "
        "| worst gain over random init (task) |",
        "|---" * (len(TASKS) + 5) + "|",
    ]
    for seed, rows in analysis["rows"].items():
        for arm, row in rows.items():
            cells = [f"{row[task]:.1f}" for task in TASKS]
            flag = marks.get((seed, arm))
            if flag is not None:
                cells[-1] += f" **(constant predictor: class {flag['class']}'s share)**"
            gain = "" if arm == "random-init" else f"{row['worst_gain']:+.1f} ({row['worst_gain_task']})"
            lines.append(
                f"| {seed} | {arm} | {' | '.join(cells)} | {row['mean']:.1f} | {row['worst_score']:.1f} | {gain} |"
            )
    return lines


def render_deltas(analysis: dict[str, Any]) -> list[str]:
    seeds = analysis["seeds"]
    lines = [
        "| measure | " + " | ".join(f"Δ seed {seed}" for seed in seeds) + " | mean Δ [95 % t-interval] | sd Δ | df "
        "| reading |",
        "|---" * (len(seeds) + 5) + "|",
    ]
    for measure, stat in analysis["deltas"].items():
        per_seed = " | ".join(f"{stat['per_seed'][seed]:+.2f}" for seed in seeds)
        sd = "" if stat["std"] is None else f"{stat['std']:.2f}"
        lines.append(
            f"| {MEASURE_NAMES[measure]} | {per_seed} | {_interval_text(stat)} | {sd} | {stat['df']} "
            f"| {stat['reading']} |"
        )
    return lines


def render_against_random(analysis: dict[str, Any]) -> list[str]:
    lines = [
        "| arm | " + " | ".join(f"gain {HEADERS[task]}" for task in TASKS) + " | worst gain | reading (worst gain) |",
        "|---" * (len(TASKS) + 3) + "|",
    ]
    for arm, stats in analysis["against_random_init"].items():
        cells = " | ".join(_interval_text(stats[key]) for key in (*TASKS, "worst_gain"))
        lines.append(f"| {arm} | {cells} | {stats['worst_gain']['reading']} |")
    return lines


def render_upstream(upstream: dict[str, dict[str, Any]]) -> list[str]:
    tasks = list(next(iter(next(iter(upstream.values())).values()))["eval_task_loss"])
    lines = ["| pt seed | arm | " + " | ".join(tasks) + " | mean | worst |", "|---" * (len(tasks) + 4) + "|"]
    for seed, by_arm in upstream.items():
        for arm, report in by_arm.items():
            losses = " | ".join(f"{report['eval_task_loss'][task]:.4f}" for task in tasks)
            lines.append(
                f"| {seed} | {arm} | {losses} | {report['eval_mean_task_loss']:.4f} "
                f"| {report['eval_worst_task_loss']:.4f} ({report['worst_task']}) |"
            )
    return lines


def shipped_config(settings: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The pre-training configuration the evidence rests on: one run's resolved recipe options (``run_config.json``),
    model config and compare settings (the other runs' model configs must be identical), and the shipped defaults the
    issue names, read from them: the decoder variant and its switches, the depth normalisation."""
    runs = [by_name for by_arm in settings.values() for by_name in by_arm.values()]
    first = runs[0]
    model, recipe = first.get("config.json", {}), first.get("run_config.json", {})
    return {
        "model_config_identical_across_runs": all(run.get("config.json") == model for run in runs),
        "decoder_variant": recipe.get("decoder_variant"),
        "depth_normalization": recipe.get("depth_normalization"),
        "decoder": {key: value for key, value in model.items() if key.startswith("decoder_")},
        "compare_settings": first.get("compare_settings.json"),
        "run_config": recipe,
        "model_config": model,
    }


def read_logs(state: Path) -> tuple[dict[str, float], list[str]]:
    timings: dict[str, float] = {}
    if (state / "timings.txt").is_file():
        for line in (state / "timings.txt").read_text().splitlines():
            if line and not line.startswith("#"):
                name, _, seconds = line.rpartition(" ")
                timings[name] = timings.get(name, 0.0) + float(seconds)
    commands = []
    if (state / "commands.txt").is_file():
        lines = (state / "commands.txt").read_text().splitlines()
        commands = list(dict.fromkeys(line for line in lines if line and not line.startswith("#")))
    return timings, commands


def write_tables(state: Path, seeds: list[str], out: Path, protocol: Path) -> dict[str, Any]:
    loaded = load_state(state, seeds)
    shares = json.loads((state / "label_shares.json").read_text())
    timings, commands = read_logs(state)
    finished = list(loaded["scores"])
    lines = [
        "# Vision evidence (v2): minimax vs average MM-MAE pre-training for the shipped defaults, paired by seed",
        "",
        f"Protocol (fixed before any run): `{protocol}`. Runner: `bash scripts/vision_evidence_v2.sh`. Tables "
        f"computed from `{state}` by `scripts/vision_evidence_v2.py tables`. Pre-training seeds finished: "
        f"{', '.join(finished) or 'none'} of {', '.join(seeds)}.",
        "",
    ]
    payload: dict[str, Any] = {"protocol": str(protocol), "seeds": seeds, "finished_seeds": finished}
    payload["unfinished"] = loaded["unfinished"]
    if loaded["unfinished"]:
        lines += [f"**Unfinished seeds** (no result used): {', '.join(loaded['unfinished'])}.", ""]
    if finished:
        config = shipped_config(loaded["settings"])
        analysis = analyse(loaded["scores"])
        flagged = flags(loaded["classification"], shares)
        payload |= {"pretraining_config": config, "label_shares": shares, "analysis": analysis}
        payload |= {"constant_predictors": flagged, "without_flagged_seeds": sensitivity(loaded["scores"], flagged)}
        payload["upstream"] = loaded["upstream"]
        lines += render_sections(payload)
    payload |= {"wall_seconds": timings, "commands": commands}
    lines += ["## Wall times", ""]
    lines += [f"- {name}: {seconds / 60:.1f} min ({seconds:.0f} s)" for name, seconds in timings.items()]
    lines += ["", "## Commands", "", "```bash", *commands, "```", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text("\n".join(lines), encoding="utf-8")
    return payload


def render_sections(payload: dict[str, Any]) -> list[str]:
    analysis, config, flagged = payload["analysis"], payload["pretraining_config"], payload["constant_predictors"]
    primary, n = analysis["deltas"]["worst_gain"], len(analysis["seeds"])
    shares = ", ".join(f"class {label}: {share:.4f}" for label, share in payload["label_shares"].items())
    lines = [
        "## Decision (primary endpoint: the worst task's gain over random init, minimax − average)",
        "",
        f"Mean Δ {_interval_text(primary)} "
        + (f"(95 % t-interval, df = {primary['df']}, {n} pre-training seeds)" if n > 1 else "(1 pre-training seed)")
        + f": **{analysis['decision']}** (protocol: minimax better if the interval's lower bound > 0, worse if its "
        "upper bound < 0, else no difference shown)."
        + (
            ""
            if analysis["detectable_effect"] is None
            else f" Observed sd Δ {primary['std']:.2f}: with {n} seeds the design detects (80 % power, two-sided 5 %) "
            f"a mean Δ of about {analysis['detectable_effect']:.1f} points."
        ),
        "",
        "## Pre-training configuration",
        "",
        f"`recipes/configs/vision_demo.yaml` as shipped (each run's resolved options): `decoder_variant: "
        f"{config['decoder_variant']}` (model config: "
        + ", ".join(f"`{key}: {value}`" for key, value in config["decoder"].items() if not key.endswith("size"))
        + f"), `depth_normalization: {config['depth_normalization']}`; model config identical across runs: "
        f"{config['model_config_identical_across_runs']} (the full configs are in the JSON).",
        "",
        "## Per pre-training seed (scores x100; one fine-tuning run per cell, fine-tuning seed = pt seed)",
        "",
        *render_seed_table(analysis, flagged),
        "",
        f"Test-label shares (classification): {shares}. Constant predictors flagged: "
        + (", ".join(f"seed {f['seed']} {f['arm']}" for f in flagged) or "none")
        + ".",
    ]
    if flagged:
        without = payload["without_flagged_seeds"]
        lines.append(f"Decision without seeds {', '.join(without['dropped_seeds'])}: {without['decision']}.")
    lines += [
        "",
        "## Minimax − average, paired by pre-training seed",
        "",
        *render_deltas(analysis),
        "",
        "## Each pre-trained arm against random init (same seed), mean gain [95 % t-interval, df = seeds − 1]",
        "",
        *render_against_random(analysis),
        "",
        "## Upstream: held-out task loss per pre-training run (lower is better)",
        "",
        *render_upstream(payload["upstream"]),
        "",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("save", "restore"):
        sub = commands.add_parser(name)
        sub.add_argument("out", type=Path)
        sub.add_argument("state", type=Path)
    shares = commands.add_parser("shares")
    shares.add_argument("dataset_dir", type=Path)
    shares.add_argument("state", type=Path)
    complete = commands.add_parser("complete")
    complete.add_argument("state", type=Path)
    complete.add_argument("seed")
    tables = commands.add_parser("tables")
    tables.add_argument("state", type=Path)
    tables.add_argument("--out", type=Path, required=True)
    tables.add_argument("--seeds", nargs="+", default=["42", "43", "44"])
    tables.add_argument("--protocol", type=Path, default=Path("scripts/vision_evidence_v2_protocol.md"))
    args = parser.parse_args()
    if args.command == "save":
        print(f"saved {save(args.out, args.state)} files of {args.out} to {args.state}")
    elif args.command == "restore":
        restore(args.out, args.state)
    elif args.command == "shares":
        args.state.mkdir(parents=True, exist_ok=True)
        text = json.dumps(label_shares(args.dataset_dir), indent=2) + "\n"
        (args.state / "label_shares.json").write_text(text, encoding="utf-8")
    elif args.command == "complete":
        missing = missing_files(args.state, args.seed)
        print(f"seed {args.seed}: " + ("finished" if not missing else f"missing {', '.join(missing)}"))
        sys.exit(1 if missing else 0)
    else:
        payload = write_tables(args.state, args.seeds, args.out, args.protocol)
        print(f"wrote {args.out}.md/.json; decision: {payload.get('analysis', {}).get('decision')}")


if __name__ == "__main__":
    main()
