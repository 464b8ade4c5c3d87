"""scripts/vision_evidence_v2.py: worst-task gain over random init, paired by pre-training seed at df = seeds - 1,
the protocol's decision, constant-predictor flags, and the committed state a later session resumes from."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "vision_evidence_v2.py"
spec = importlib.util.spec_from_file_location("vision_evidence_v2", SCRIPT)
v2 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(v2)

T_DF2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # t quantile 0.975 with 2 df, closed form (4.3027)
T_DF1 = math.tan(math.pi * (0.975 - 0.5))  # t quantile 0.975 with 1 df (Cauchy), 12.706

# scores[seed][arm] = (semseg, depth, classification), x100. Gains over random init and worst gain (task):
#   42: average 4, 1, 20 -> 1 (depth);  minimax 5, 2, 10 -> 2 (depth);   delta 1
#   43: average 3, 1, 20 -> 1 (depth);  minimax 3, 4, 5 -> 3 (semseg);   delta 2 (the worst task differs by arm)
#   44: average 4, 2, 18 -> 2 (depth);  minimax 5, 6, 15 -> 5 (semseg);  delta 3
SCORES = {
    "42": {"random-init": (50, 70, 40), "average": (54, 71, 60), "minimax": (55, 72, 50)},
    "43": {"random-init": (52, 72, 45), "average": (55, 73, 65), "minimax": (55, 76, 50)},
    "44": {"random-init": (48, 70, 40), "average": (52, 72, 58), "minimax": (53, 76, 55)},
}
SHARES = {"0": 81 / 256, "1": 100 / 256, "2": 75 / 256}


def _scores() -> dict:
    return {
        seed: {arm: dict(zip(v2.TASKS, values, strict=True)) for arm, values in by_arm.items()}
        for seed, by_arm in SCORES.items()
    }


def test_worst_gain_paired_by_pretraining_seed_with_df_seeds_minus_one() -> None:
    analysis = v2.analyse(_scores())
    rows = analysis["rows"]["43"]
    assert rows["minimax"]["gains"] == {"semseg": 3, "depth": 4, "classification": 5}
    assert (rows["minimax"]["worst_gain"], rows["minimax"]["worst_gain_task"]) == (3, "semseg")
    assert (rows["average"]["worst_gain"], rows["average"]["worst_gain_task"]) == (1, "depth")
    assert rows["average"]["mean"] == pytest.approx(193 / 3) and rows["average"]["worst_score"] == 55
    primary = analysis["deltas"]["worst_gain"]
    assert primary["per_seed"] == {"42": 1, "43": 2, "44": 3}
    # differences 1, 2, 3: mean 2, sd 1, half-width t(0.975, 2) / sqrt(3) = 2.484: [-0.484, 4.484]. Pooling the
    # arms' runs as independent draws (Welch: sd sqrt(1/3/3 + 7/3/3)) or a normal quantile (1.96: low +0.87, "minimax
    # better") gives another interval.
    assert primary["mean"] == pytest.approx(2) and primary["std"] == pytest.approx(1)
    assert (primary["n"], primary["df"]) == (3, 2)
    assert primary["low"] == pytest.approx(2 - T_DF2 / math.sqrt(3))
    assert primary["high"] == pytest.approx(2 + T_DF2 / math.sqrt(3))
    assert analysis["decision"] == primary["reading"] == "no difference shown"
    t80_df2 = 0.6 / math.sqrt(2 * 0.8 * 0.2)  # t quantile 0.8 with 2 df, closed form (1.0607)
    assert analysis["detectable_effect"] == pytest.approx((T_DF2 + t80_df2) * 1 / math.sqrt(3))  # 3.10 sd
    # depth: differences 1, 3, 4 (mean 8/3, variance 7/3); segmentation 1, 0, 1
    depth = analysis["deltas"]["depth"]
    assert depth["mean"] == pytest.approx(8 / 3) and depth["std"] == pytest.approx(math.sqrt(7 / 3))
    assert analysis["deltas"]["semseg"]["mean"] == pytest.approx(2 / 3)
    # worst raw score: average 54, 55, 52; minimax 50 (classification), 50, 53
    assert analysis["deltas"]["worst_score"]["per_seed"] == {"42": -4, "43": -5, "44": 1}
    # average vs random init: classification gains 20, 20, 18 (mean 58/3, sd 2/sqrt(3)): helps; worst gains 1, 1, 2:
    # 4/3 -+ 4.3027 * 0.5774 / 1.732 = 1.434, low -0.10: no difference shown
    versus = analysis["against_random_init"]["average"]
    assert versus["classification"]["mean"] == pytest.approx(58 / 3)
    assert versus["classification"]["reading"] == "pre-training helps"
    assert versus["worst_gain"]["low"] == pytest.approx(4 / 3 - T_DF2 * math.sqrt(1 / 3) / math.sqrt(3))
    assert versus["worst_gain"]["reading"] == "no difference shown" and versus["worst_gain"]["df"] == 2


def test_decision_rule_reads_the_interval_bounds() -> None:
    worse = v2.mean_interval([-3, -2, -4])  # -3 -+ 2.484: upper -0.516
    better = v2.mean_interval([3, 2, 4])
    assert v2.reading(worse, "minimax better", "minimax worse") == "minimax worse"
    assert v2.reading(better, "minimax better", "minimax worse") == "minimax better"
    assert v2.reading(v2.mean_interval([5.0]), "minimax better", "minimax worse") == "no difference shown"


def test_constant_predictor_flags_and_the_decision_without_their_seeds() -> None:
    cells = {
        "42": {"random-init": {"accuracy": 81 / 256}, "average": {"accuracy": 0.6}, "minimax": {"accuracy": 0.5}},
        "43": {"random-init": {"accuracy": 81 / 256 + 1e-6}, "average": {"accuracy": 75 / 256}},
    }
    flagged = v2.flags(cells, SHARES)
    assert flagged == [
        {"seed": "42", "arm": "random-init", "accuracy": 81 / 256, "class": "0"},
        {"seed": "43", "arm": "average", "accuracy": 75 / 256, "class": "2"},
    ]
    without = v2.sensitivity(_scores(), flagged[:1])
    assert without == {"dropped_seeds": ["42"], "decision": "no difference shown"}  # 2.5 -+ 12.7 * 0.707 / 1.414
    kept = v2.analyse({seed: value for seed, value in _scores().items() if seed != "42"})["deltas"]["worst_gain"]
    assert kept["df"] == 1 and kept["high"] == pytest.approx(2.5 + T_DF1 * math.sqrt(0.5) / math.sqrt(2))
    assert v2.sensitivity(_scores(), []) == {"dropped_seeds": [], "decision": None}


def _write(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))


def _fake_output(out: Path, seeds: list[str]) -> None:
    """The runner's output layout: pre-training runs and suite cells (keyed folder names as the suite makes them)."""
    for seed in seeds:
        for arm in v2.PRETRAINED:
            run = out / "pretraining" / arm / f"seed-{seed}"
            loss = {"rgb": 0.5, "depth": 0.4, "semseg": 0.6}
            _write(run / "task_report.json", {"eval_task_loss": loss, "eval_mean_task_loss": 0.5,
                                              "eval_worst_task_loss": 0.6, "worst_task": "semseg"})  # fmt: skip
            _write(run / "config.json", {"decoder_use_task_queries": True, "hidden_size": 64})
            recipe = {"decoder_variant": "multimae", "depth_normalization": "standardize_trimmed"}
            _write(run / "run_config.json", recipe)
            _write(run / "compare_settings.json", {"options": ["--weighting", arm]})
            (run / "model.safetensors").write_bytes(b"weights")
        for arm, values in SCORES[seed].items():
            checkpoint = f"{out}/pretraining/{'average' if arm == 'random-init' else arm}/seed-{seed}"
            checkpoint = ("random-init:" if arm == "random-init" else "") + checkpoint
            for task, score in zip(v2.TASKS, values, strict=True):
                cell = {"checkpoint": checkpoint, "task": task, "score": score, "raw_metrics": {}}
                if task == "classification":
                    cell["raw_metrics"]["eval_top1_accuracy"] = 81 / 256 if arm == "random-init" else score / 100
                _write(out / "suite" / f"seed-{seed}" / "cells" / f"seed-{seed}-{arm}" / task / f"seed{seed}"
                       / "cell.json", cell)  # fmt: skip


def test_state_saved_without_weights_and_tables_from_the_state_alone(tmp_path: Path) -> None:
    out, state = tmp_path / "out", tmp_path / "state"
    _fake_output(out, ["42", "43", "44"])
    (out / "timings.txt").write_text("# start\npretraining-42 300\nsuite-42 600\n# again\nsuite-42 60\n")
    (out / "commands.txt").write_text("# start\npython a\npython b\n# again\npython a\n")
    v2.save(out, state)
    assert not list(state.rglob("*.safetensors"))
    assert json.loads((state / "seed-43" / "cells" / "random-init" / "depth.json").read_text())["score"] == 72
    assert v2.missing_files(state, "42") == []
    (state / "seed-44" / "cells" / "minimax" / "depth.json").unlink()
    assert v2.missing_files(state, "44") == ["seed-44/cells/minimax/depth.json"]
    _write(state / "label_shares.json", SHARES)
    payload = v2.write_tables(state, ["42", "43", "44"], tmp_path / "tables", Path("protocol.md"))
    assert payload["finished_seeds"] == ["42", "43"] and list(payload["unfinished"]) == ["44"]
    assert payload["pretraining_config"]["depth_normalization"] == "standardize_trimmed"
    assert payload["pretraining_config"]["decoder_variant"] == "multimae"
    assert payload["pretraining_config"]["decoder"] == {"decoder_use_task_queries": True}
    assert payload["analysis"]["deltas"]["worst_gain"]["df"] == 1  # two finished seeds: df 1
    assert [flag["arm"] for flag in payload["constant_predictors"]] == ["random-init", "random-init"]
    assert payload["wall_seconds"] == {"pretraining-42": 300, "suite-42": 660}
    assert payload["commands"] == ["python a", "python b"]
    text = (tmp_path / "tables.md").read_text()
    assert "Pre-training seeds finished: 42, 43 of 42, 43, 44." in text
    assert "| 42 | random-init | 50.0 | 70.0 | 40.0 **(constant predictor: class 0's share)** |" in text
    assert "| 43 | minimax | 55.0 | 76.0 | 50.0 | 60.3 | 50.0 | +3.0 (semseg) |" in text
    fresh = tmp_path / "fresh"
    v2.restore(fresh, state)
    assert (fresh / "timings.txt").read_text() == (out / "timings.txt").read_text()
