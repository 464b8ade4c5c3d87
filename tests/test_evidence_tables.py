"""scripts/evidence_tables.py: run means first, objectives paired by pre-training seed, t-intervals, verdicts."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "evidence_tables.py"
spec = importlib.util.spec_from_file_location("evidence_tables", SCRIPT)
evidence_tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(evidence_tables)


def _entry(label: str, scores: dict[str, list[float]]) -> dict:
    means = {task: statistics.fmean(values) for task, values in scores.items()}
    worst = min(means, key=means.__getitem__)
    return {
        "label": label,
        "tasks": {task: {"scores": values, "seeds": [1, 2], "mean": means[task]} for task, values in scores.items()},
        "average": statistics.fmean(means.values()),
        "worst_task": worst,
        "worst_score": means[worst],
    }


T_DF2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # t quantile 0.975 with 2 df, closed form


def _suite() -> tuple[dict, dict]:
    runs = {f"/c/{name}/seed-{seed}": (name, str(seed)) for name in ("base", "new") for seed in (1, 2, 3)}
    runs["/c/new/seed-4"] = ("new", "4")
    suite = {
        "tasks": ["a", "b"],
        "higher_is_better": True,
        "checkpoints": {
            "/c/base/seed-1": _entry("base/seed-1", {"a": [50, 52], "b": [30, 32]}),
            "/c/base/seed-2": _entry("base/seed-2", {"a": [54, 56], "b": [34, 36]}),
            "/c/base/seed-3": _entry("base/seed-3", {"a": [40, 40], "b": [50, 50]}),
            "/c/new/seed-1": _entry("new/seed-1", {"a": [51, 51], "b": [40, 42]}),
            "/c/new/seed-2": _entry("new/seed-2", {"a": [55, 55], "b": [44, 46]}),
            "/c/new/seed-3": _entry("new/seed-3", {"a": [40, 40], "b": [56, 60]}),
            "/c/new/seed-4": _entry("new/seed-4", {"a": [0, 0], "b": [0, 0]}),
            "/m/model": _entry("model", {"a": [60, 60], "b": [20, 20]}),
        },
    }
    return suite, runs


def test_runs_averaged_first_then_paired_by_pretraining_seed() -> None:
    suite, runs = _suite()
    tables = evidence_tables.downstream_tables(suite, runs, "base", smallest_effect=4.6)
    base = tables["strategies"]["base"]
    # run means over the 2 fine-tuning seeds: a 51, 55, 40; b 31, 35, 50; averages 41, 45, 45; worst 31, 35, 40
    assert base["per_pretraining_seed"]["3"] == {
        "a": 40, "b": 50, "average": 45, "worst_task": "a", "worst_score": 40, "fine_tuning_seeds": 2
    }  # fmt: skip
    over = base["over_pretraining_runs"]
    assert over["a"]["mean"] == pytest.approx(146 / 3) and over["a"]["n"] == 3 and over["a"]["df"] == 2
    assert over["average"]["mean"] == pytest.approx(131 / 3) and over["worst_score"]["mean"] == pytest.approx(106 / 3)
    assert base["worst_task"] == "b" and base["worst_score"] == pytest.approx(116 / 3)  # the worst of the task means
    assert tables["strategies"]["new"]["over_pretraining_runs"]["a"]["n"] == 4  # its unpaired run counts here
    delta = tables["deltas"]["new"]
    # paired seeds 1, 2, 3 (seed 4 has no baseline run): differences a 0, 0, 0; b 10, 10, 8; average 5, 5, 4;
    # worst 10, 10, 0 (seed 3: both runs' worst task is a at 40)
    assert delta["a"]["mean"] == 0 and delta["a"]["low"] == delta["a"]["high"] == 0
    assert delta["b"]["mean"] == pytest.approx(28 / 3) and delta["b"]["std"] == pytest.approx(math.sqrt(4 / 3))
    assert delta["b"]["high"] - delta["b"]["mean"] == pytest.approx(T_DF2 * math.sqrt(4 / 3) / math.sqrt(3))
    assert delta["average"]["mean"] == pytest.approx(14 / 3)
    worst = delta["worst_score"]
    assert worst["mean"] == pytest.approx(20 / 3) and worst["std"] == pytest.approx(math.sqrt(100 / 3))
    assert worst["low"] == pytest.approx(20 / 3 - T_DF2 * math.sqrt(100 / 3) / math.sqrt(3))
    assert (worst["n"], worst["df"], worst["seeds"], worst["unpaired_seeds"]) == (3, 2, ["1", "2", "3"], ["4"])
    # b: 9.3 [6.5, 12.2] and average: 4.7 [3.2, 6.1] lie above 0; a: identical in every pair (no spread), no verdict
    assert worst["verdict"] == "inconclusive" and delta["b"]["verdict"] == delta["average"]["verdict"] == "helps"
    assert delta["a"]["verdict"] == "inconclusive"
    wide = evidence_tables.downstream_tables(suite, runs, "base", smallest_effect=25)["deltas"]["new"]
    assert wide["worst_score"]["verdict"] == "no effect of that size"  # upper end 6.67 + 14.34 = 21.0 < 25
    assert tables["references"]["model"]["average"] == 40 and tables["references"]["model"]["worst_task"] == "b"
    with pytest.raises(ValueError, match="--baseline 'other' has no checkpoint"):
        evidence_tables.downstream_tables(suite, runs, "other")
    with pytest.raises(ValueError, match="higher is better"):
        evidence_tables.downstream_tables({**suite, "higher_is_better": False}, runs, "base", smallest_effect=1)


def test_rendered_tables_name_pairs_df_and_verdict() -> None:
    suite, runs = _suite()
    tables = evidence_tables.downstream_tables(suite, runs, "base", smallest_effect=4.6)
    suite["columns"] = {t: {"header": f"{t.upper()} (x)", "display_name": t.upper()} for t in ("a", "b")}
    text = "\n".join(evidence_tables.render_downstream("Probe", tables, {**suite, "family": "probe"}, "raw"))
    assert "| **new − base** | 3 (2); unpaired seeds left out: 4 | +0.0 [+0.0, +0.0] | +9.3 [+6.5, +12.2] |" in text
    assert "- `new`: **inconclusive** (paired pre-training runs: 3)" in text
    assert "| base | 3 | 48.7 ± 7.8 | 38.7 ± 10.0 | 43.7 ± 2.3 | 35.3 ± 4.5 | 38.7 (B) |" in text


def test_majority_class_reference_row_from_probe_cells() -> None:
    suite, runs = _suite()
    for entry in suite["checkpoints"].values():
        entry["tasks"]["a"]["metrics"] = {"accuracy": 1.0, "majority_accuracy": 52.7}
        entry["tasks"]["b"]["metrics"] = {"f1": 1.0, "majority_f1": 81.2}
    row = evidence_tables.downstream_tables(suite, runs, "base")["references"]["majority class"]
    assert row["tasks"] == {"a": 52.7, "b": 81.2} and row["worst_task"] == "a"
    assert row["average"] == pytest.approx(66.95)
    suite, runs = _suite()
    assert "majority class" not in evidence_tables.downstream_tables(suite, runs, "base")["references"]


def test_suite_family_is_read_from_the_directory(tmp_path: Path) -> None:
    (tmp_path / "probe_suite.json").write_text("{}")
    assert evidence_tables.suite_family(tmp_path) == "probe"
    (tmp_path / "glue_suite.json").write_text("{}")
    with pytest.raises(ValueError, match="expected one <family>_suite.json"):
        evidence_tables.suite_family(tmp_path)


def test_reference_card_names_the_suite_commands_of_its_own_checkpoint(tmp_path: Path) -> None:
    from test_card import pos_content

    from robust_pretrain.reporting.cards import render_model_card

    out = tmp_path / "evidence"
    arm = out / "pretraining" / "scale-free" / "minimax-loss_normalization=excess"
    run, other = arm / "seed-44", arm / "seed-42"
    run.mkdir(parents=True)
    render_model_card(run, pos_content())
    (run / "compare_settings.json").write_text(json.dumps({"options": ["--weighting", "minimax", "--seed", "44"]}))
    suite = "python recipes/glue_suite.py"
    commands = [
        f"{suite} --family probe --checkpoints {other} {run} --update_model_cards true --output_dir {out}/probe",
        f"{suite} --checkpoints {other} --tasks cola --update_model_cards true --output_dir {out}/cola",
        f"{suite} --family probe --checkpoints {other} {run} --output_dir {out}/probe",
    ]
    chosen = evidence_tables.card_commands(commands, str(run))
    assert chosen == commands[:1]  # the CoLA cards did not include seed 44; the third command wrote no card
    args = argparse.Namespace(
        base_model="sentence-transformers/all-MiniLM-L6-v2",
        model_path="\0",
        model_path_command="",
        script="scripts/downstream_evidence.sh",
        out=Path("benchmarks/results/downstream_evidence"),
        cards=tmp_path / "cards",
        evidence_out=out,
    )
    evidence_tables.write_reference_card(run, "minilm-scale-free-seed44", args, chosen)
    text = (tmp_path / "cards" / "minilm-scale-free-seed44" / "README.md").read_text()
    assert "Pre-training, then the suite that merged the results above into this card" in text
    assert "one run of `scripts/downstream_evidence.sh`" in text
    assert "evidence tables: `benchmarks/results/downstream_evidence.md`" in text
    arm_out = "$OUT/pretraining/scale-free/minimax-loss_normalization=excess"
    assert f"--weighting minimax --seed 44 --output_dir {arm_out}/seed-44" in text
    assert f"--checkpoints {arm_out}/seed-42 {arm_out}/seed-44 --update_model_cards true" in text
    assert str(tmp_path) not in text
    assert "base_model: sentence-transformers/all-MiniLM-L6-v2" in text


def test_wall_times_are_summed_over_invocations(tmp_path: Path) -> None:
    timings = tmp_path / "timings.txt"
    timings.write_text("# 03:47 UTC x.sh\nreference 376\n# 04:09 UTC x.sh\nreference 300\nprobe lane 1 60\n")
    assert evidence_tables.read_timings(timings) == ({"reference": 676.0, "probe lane 1": 60.0}, 2)
    timings.write_text("a 5\nb 7\n")  # a list written before invocations were marked
    assert evidence_tables.read_timings(timings) == ({"a": 5.0, "b": 7.0}, 1)
    timings.write_text("a 5\n# 04:09 UTC x.sh\na 1\n")  # such a list, then a marked invocation
    assert evidence_tables.read_timings(timings) == ({"a": 6.0}, 2)
