"""Helpers of ``scripts/vision_evidence.sh`` (evidence for the README's vision table).

    python scripts/vision_evidence.py scenes OUT_DIR --num_train 512 --num_eval 256 [--scene_seed 0 --scene_size 64]
    python scripts/vision_evidence.py random-init --suite TITLE DIR [--suite TITLE DIR ...] --out PREFIX

``scenes`` writes the generated scenes' downstream splits (``downstream_train`` / ``downstream_test``, exactly the
images ``finetune_dense.py`` renders for ``--num_train_scenes`` / ``--num_eval_scenes``) into a local ``datasets``
folder (parquet + a README declaring the splits), so the suite's cells load them instead of rendering them again.

``random-init`` reads each suite's ``dense_suite.json`` and adds to ``PREFIX.md`` / ``PREFIX.json`` (written by
``scripts/evidence_tables.py``) the comparison of the pre-trained checkpoints with the suite's ``random-init:`` row
and the verdict of the protocol's decision rule (``scripts/vision_evidence_protocol.md``, addendum of 2026-11-25).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from robust_pretrain.evaluation.checkpoints import random_init_source
from robust_pretrain.reporting.aggregation import mean_std, standard_errors

SIGNIFICANT = 2.0  # standard errors, the protocol's threshold

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
    description = (
        f"generator v{scenes.GENERATOR_VERSION}, seed {scene_seed}, {scene_size} px: {num_train} "
        f"downstream_train / {num_eval} downstream_test"
    )
    (out_dir / "README.md").write_text(DATASET_README.format(description=description), encoding="utf-8")


def _run_scores(entry: dict[str, Any], tasks: list[str]) -> dict[str, list[float]]:
    """Per task the scores of each fine-tuning run, and ``"average"``: each run's mean over the tasks."""
    scores = {task: entry["tasks"][task]["scores"] for task in tasks}
    return {**scores, "average": [statistics.fmean(run) for run in zip(*scores.values(), strict=True)]}


def _side(entries: list[dict[str, Any]], tasks: list[str]) -> dict[str, list[float]]:
    runs = [_run_scores(entry, tasks) for entry in entries]
    return {key: [score for run in runs for score in run[key]] for key in (*tasks, "average")}


def compare_with_random_init(suite: dict[str, Any]) -> dict[str, Any]:
    """The pre-trained checkpoints (pooled, and per objective: the folder above ``seed-<n>``) against the suite's one
    ``random-init:`` row: per task and for the per-run task average, means ± std, delta and its size in standard
    errors (Welch), and the verdict of the protocol's rule on the pooled side."""
    tasks = suite["tasks"]
    random_init = [name for name in suite["checkpoints"] if random_init_source(name) is not None]
    if len(random_init) != 1:
        raise ValueError(f"expected one random-init row in the suite, found {random_init}")
    reference = _side([suite["checkpoints"][random_init[0]]], tasks)
    groups: dict[str, list[dict[str, Any]]] = {"pooled": []}
    for name, entry in suite["checkpoints"].items():
        if name != random_init[0]:
            groups["pooled"].append(entry)
            groups.setdefault(Path(name).parent.name, []).append(entry)
    sides = {"random init": reference} | {group: _side(entries, tasks) for group, entries in groups.items()}
    rows = {
        group: {
            key: {
                **mean_std(scores),
                "n": len(scores),
                **(
                    {}
                    if group == "random init"
                    else {
                        "delta": statistics.fmean(scores) - statistics.fmean(reference[key]),
                        "in_standard_errors": standard_errors(reference[key], scores),
                    }
                ),
            }
            for key, scores in side.items()
        }
        for group, side in sides.items()
    }
    pooled = rows["pooled"]
    if pooled["average"]["in_standard_errors"] >= SIGNIFICANT and all(
        pooled[task]["in_standard_errors"] > -SIGNIFICANT for task in tasks
    ):
        verdict = "pre-training helps"
    elif pooled["average"]["in_standard_errors"] <= -SIGNIFICANT:
        verdict = "pre-training hurts"
    else:
        verdict = "no detectable difference at this budget"
    return {"random_init": random_init[0], "tasks": tasks, "rows": rows, "verdict": verdict}


def render_comparison(title: str, comparison: dict[str, Any], columns: dict[str, Any]) -> list[str]:
    tasks = comparison["tasks"]
    headers = [columns[task]["header"] for task in tasks]
    lines = [
        f"### {title}",
        "",
        f"Scores x100 per fine-tuning run, mean ± std (n runs); Δ = row - random init (in standard errors). Verdict "
        f"(protocol's rule, pooled row): **{comparison['verdict']}**.",
        "",
        f"| checkpoints | n | {' | '.join(headers)} | average (per run) |",
        "|---|---|" + "---|" * (len(tasks) + 1),
    ]
    for group, row in comparison["rows"].items():
        cells = []
        for key in (*tasks, "average"):
            stat = row[key]
            cell = f"{stat['mean']:.1f} ± {stat['std']:.1f}"
            if "delta" in stat:
                cell += f" (Δ {stat['delta']:+.1f}, {stat['in_standard_errors']:+.2f} SE)"
            cells.append(cell)
        lines.append(f"| {group} | {row['average']['n']} | {' | '.join(cells)} |")
    return [*lines, ""]


def add_random_init_comparison(suites: list[tuple[str, Path]], out: Path) -> None:
    """Append the section to ``out``.md and the key ``random_init`` to ``out``.json."""
    lines = ["## Does pre-training help at all? Pre-trained checkpoints vs the random-init row", ""]
    results = {}
    for title, directory in suites:
        suite = json.loads((directory / "dense_suite.json").read_text(encoding="utf-8"))
        results[title] = compare_with_random_init(suite)
        lines += render_comparison(title, results[title], suite["columns"])
    markdown = out.with_suffix(".md")
    markdown.write_text(markdown.read_text(encoding="utf-8").rstrip("\n") + "\n\n" + "\n".join(lines), "utf-8")
    tables = out.with_suffix(".json")
    payload = json.loads(tables.read_text(encoding="utf-8")) | {"random_init": results}
    tables.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    scenes = commands.add_parser("scenes")
    scenes.add_argument("out_dir", type=Path)
    scenes.add_argument("--num_train", type=int, required=True)
    scenes.add_argument("--num_eval", type=int, required=True)
    scenes.add_argument("--scene_seed", type=int, default=0)
    scenes.add_argument("--scene_size", type=int, default=64)
    random_init = commands.add_parser("random-init")
    random_init.add_argument("--suite", nargs=2, action="append", metavar=("TITLE", "DIR"), required=True)
    random_init.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "scenes":
        write_scenes(args.out_dir, args.num_train, args.num_eval, args.scene_seed, args.scene_size)
    else:
        add_random_init_comparison([(title, Path(directory)) for title, directory in args.suite], args.out)


if __name__ == "__main__":
    main()
