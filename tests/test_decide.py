"""robust-pretrain-decide: the rule fixed before the first run, the cells (paired by seed, natural first), the
verdict's numbers, the winner's weights, refusals, and one end-to-end run of the real recipe."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_recipe_causal_lm import recipe_argv

from robust_pretrain.cli import UsageError
from robust_pretrain.pretraining.decide import arms as decide_arms
from robust_pretrain.pretraining.decide import recipe as decide
from robust_pretrain.pretraining.decide.cells import PROTOCOL_NAME
from robust_pretrain.reporting.decision import (
    HELPS,
    HELPS_BELOW_MARGIN,
    HURTS,
    INCONCLUSIVE,
    NO_EFFECT,
    decision_markdown,
    rule_verdict,
    summarise,
)
from robust_pretrain.reporting.statistics import detectable_difference, mean_interval, pairs_to_detect

T_975_DF2 = 4.302652729749464  # Student t, 97.5 % quantile, 2 degrees of freedom (tables)
DOMAINS = ["answers", "email", "code"]


def interval(*differences: float):
    return mean_interval(list(differences), 0.95)


@pytest.mark.parametrize(
    ("differences", "expected"),
    [
        ((-0.2, -0.3, -0.25), HELPS),  # [-0.374, -0.126]: below 0, gain 0.25 >= 0.1
        ((-0.05, -0.06, -0.055), HELPS_BELOW_MARGIN),  # below 0, gain 0.055 < 0.1
        ((0.2, 0.3, 0.25), HURTS),
        ((-0.01, 0.02, 0.005), NO_EFFECT),  # within +-0.1
        ((-0.3, 0.3, 0.0), INCONCLUSIVE),  # wider than the margin on both sides
        ((-0.3, 0.1, -0.25), INCONCLUSIVE),  # a mean gain of 0.15, but the interval reaches above 0
        ((-0.2, -0.2, -0.2), INCONCLUSIVE),  # no spread: says nothing about run-to-run variation
    ],
)
def test_the_rule_reads_each_interval_as_written(differences, expected):
    assert rule_verdict(interval(*differences), margin=0.1) == expected


def test_the_helps_bar_is_the_margin():
    gain = interval(-0.2, -0.3, -0.25)  # mean gain 0.25
    assert rule_verdict(gain, margin=0.25) == HELPS
    assert rule_verdict(gain, margin=0.2501) == HELPS_BELOW_MARGIN


def losses_for(worst: list[float]) -> dict[int, dict[str, float]]:
    """Per seed: 'code' at the given worst loss, the other domains well below it."""
    return {seed: {"answers": 3.0, "email": 3.1, "code": w} for seed, w in zip((1, 2, 3), worst, strict=True)}


PROTOCOL = {"endpoint": "worst_domain_loss", "baseline": "natural", "confidence": 0.95, "margin": 0.1}


def test_the_summary_pairs_by_seed_with_df_seeds_minus_one():
    losses = {"natural": losses_for([5.0, 5.2, 5.1]), "minimax": losses_for([4.8, 4.9, 4.85])}
    summary = summarise(losses, PROTOCOL)
    minimax = summary["arms"]["minimax"]
    # differences -0.2, -0.3, -0.25: mean -0.25, sample sd 0.05, half-width t * 0.05 / sqrt(3)
    half = T_975_DF2 * 0.05 / math.sqrt(3)
    assert minimax["difference"]["mean"] == pytest.approx(-0.25)
    assert minimax["difference"]["df"] == 2
    assert minimax["difference"]["low"] == pytest.approx(-0.25 - half)
    assert minimax["difference"]["high"] == pytest.approx(-0.25 + half)
    assert minimax["verdict"] == HELPS and minimax["worst_domain"] == "code"
    assert minimax["domain_loss"]["code"] == pytest.approx(4.85)
    assert summary["arms"]["natural"]["mean_domain_loss"] == pytest.approx((3.0 + 3.1 + 5.1) / 3)
    assert "verdict" not in summary["arms"]["natural"]


def test_the_seeds_the_margin_needs():
    # sd 0.05, margin 0.1: 4 pairs detect 0.05 * 2.128 = 0.106 > 0.1, 5 pairs less (the exact values are checked by
    # simulation in test_statistics)
    assert detectable_difference(0.05, 4) > 0.1 >= detectable_difference(0.05, 5)
    assert pairs_to_detect(0.05, 0.1) == 5
    assert pairs_to_detect(10.0, 0.1, most=50) == 51


def test_the_card_states_what_the_seeds_can_detect():
    losses = {
        "natural": losses_for([5.0, 5.2, 5.1]),
        "minimax": losses_for([4.8, 4.9, 4.85]),  # differences -0.2, -0.3, -0.25: sd 0.05
        "stratified": losses_for([5.0, 5.2, 5.1]),  # no spread: nothing to estimate from
    }
    summary = summarise(losses, PROTOCOL)
    minimax = summary["arms"]["minimax"]
    assert minimax["detectable_difference"] == pytest.approx(detectable_difference(0.05, 3))
    assert minimax["seeds_for_margin"] == 5
    assert "detectable_difference" not in summary["arms"]["stratified"]
    card = decision_markdown(summary, {**PROTOCOL, "hash": "0" * 64, "seeds": [1, 2, 3]}, ["code (0.030)"])
    assert "`minimax` 0.163 nats (sd 0.050; the margin needs 5 seeds)." in card  # 3.264 sd at 3 pairs
    assert "80% power, two-sided at 95%" in card and "`stratified`" not in card.split("Smallest mean")[1]


def test_the_mean_endpoint_averages_the_domains():
    losses = {"natural": losses_for([5.0, 5.2, 5.1]), "minimax": losses_for([4.8, 4.9, 4.85])}
    summary = summarise(losses, {**PROTOCOL, "endpoint": "mean_domain_loss"})
    # the mean over 3 domains moves by a third of the worst domain's change
    assert summary["arms"]["minimax"]["difference"]["mean"] == pytest.approx(-0.25 / 3)
    assert summary["arms"]["minimax"]["verdict"] == HELPS_BELOW_MARGIN


SEQUENCES = {"answers": 600, "email": 370, "code": 30}


def fake_report(options: list[str]) -> dict[str, Any]:
    """A task report whose worst ('code') loss depends on the arm and seed: minimax gains 0.2-0.3 nats at the end,
    nothing at the earlier readings (every --eval_steps steps)."""
    seed = int(options[options.index("--seed") + 1])
    weighting = options[options.index("--weighting") + 1] if "--weighting" in options else "mixture"
    gain = 0.2 + 0.05 * (seed % 3) if weighting == "minimax" else 0.0
    worst = 5.0 + 0.1 * seed - gain
    shares = {"answers": 0.6, "email": 0.37, "code": 0.03}
    max_steps = int(options[options.index("--max_steps") + 1])
    every = int(options[options.index("--eval_steps") + 1]) if "--eval_steps" in options else max_steps
    readings = [
        {
            "step": step,
            "eval_task_loss": {"answers": 3.0, "email": 3.1, "code": worst + (gain if step < max_steps else 0)},
        }
        for step in range(every, max_steps + 1, every)
    ]
    return {
        "tasks": DOMAINS,
        "eval_task_loss": {"answers": 3.0, "email": 3.1, "code": worst},
        "mixture_weights": shares,
        "time_averaged_weights": {"answers": 0.2, "email": 0.2, "code": 0.6} if weighting == "minimax" else {},
        "provenance": {"tokenizer_sha256": "t", "data_sha256": {d: d for d in DOMAINS}, "model_size": "tiny"},
        "training_sequences": SEQUENCES,
        "global_batch_sequences": 8,
        "settings": {"max_steps": max_steps},
        "held_out_texts": dict.fromkeys(DOMAINS, 20),
        "held_out_tokens": dict.fromkeys(DOMAINS, 5000),
        "eval_readings": readings,
    }


def fake_domains(options: list[str]) -> dict[str, Any]:
    """The domains of the fake data, without reading any: 20 held-out texts each."""
    return {"domains": DOMAINS, "held_out_texts": dict.fromkeys(DOMAINS, 20)}


class FakeCells:
    """Records each cell's recipe, folder and options; checks the protocol exists before the first one."""

    def __init__(self, root: Path) -> None:
        self.root, self.calls = root, []

    def __call__(self, recipe: str, cell: Path, options: list[str]) -> dict[str, Any]:
        assert (self.root / PROTOCOL_NAME).is_file()  # fixed before the first training step
        self.calls.append((recipe, cell.relative_to(self.root).as_posix(), options))
        return fake_report(options)


def arguments(root: Path, **values: Any) -> decide.DecideArguments:
    return decide.DecideArguments(output_dir=str(root), **{"seeds": [1, 2, 3], **values})


def run_decide(args: decide.DecideArguments, passed: list[str], cells: FakeCells) -> dict[str, Any]:
    return decide.decide(args, passed, cells, read_domains=fake_domains)


def test_cells_run_natural_first_with_its_tokenizer_and_weights(tmp_path):
    root = tmp_path / "d"
    cells = FakeCells(root)
    args = arguments(root, arms=["natural", "sampling_control", "stratified", "minimax", "group_dro", "doremi"])
    summary = run_decide(args, ["--max_steps", "5"], cells)
    order = [cell for _, cell, _ in cells.calls]
    assert order[:6] == [
        "cells/natural/seed-1", "cells/sampling_control/seed-1", "cells/stratified/seed-1", "cells/minimax/seed-1",
        "cells/group_dro/seed-1", "cells/doremi/seed-1",
    ]  # fmt: skip
    assert len(order) == 18
    by_cell = {cell: (recipe, options) for recipe, cell, options in cells.calls}
    natural_options = by_cell["cells/natural/seed-2"][1]
    assert natural_options[-4:] == ["--seed", "2", "--weighting", "proportional"]
    # the options in one order, the user's --max_steps replacing the default's; readings every ceil(5 / 4) steps
    assert natural_options[:-4] == [
        "--config", "decoder_demo", "--eval_steps", "2", "--eval_strategy", "steps", "--max_steps", "5",
    ]  # fmt: skip
    for cell, (recipe, options) in by_cell.items():
        if "natural" not in cell.split("/")[1:2]:
            seed = cell.rsplit("-", 1)[1]
            assert options[options.index("--tokenizer_name") + 1] == str(root / "cells" / "natural" / f"seed-{seed}")
            assert recipe == ("mixture" if "doremi" in cell else "causal_lm")
    control = by_cell["cells/sampling_control/seed-3"][1]
    weights = json.loads(Path(control[control.index("--domain_weights") + 1]).read_text())
    assert weights["weights"] == pytest.approx({"answers": 0.6, "email": 0.37, "code": 0.03})
    assert weights["provenance"]["tokenizer_sha256"] == "t"
    stratified = by_cell["cells/stratified/seed-3"][1]
    uniform = json.loads(Path(stratified[stratified.index("--domain_weights") + 1]).read_text())["weights"]
    assert uniform == pytest.approx(dict.fromkeys(DOMAINS, 1 / 3))
    dro = by_cell["cells/group_dro/seed-1"][1]
    assert dro[dro.index("--reference_losses") + 1 : dro.index("--reference_losses") + 4] == ["3.0", "3.1", "5.1"]
    assert dro[-2:] == ["--task_sampling", "online"]
    # minimax gains 0.2 + 0.05 (seed % 3) nats on the worst domain: 0.25, 0.3, 0.2 -> helps; the others do not move
    assert summary["arms"]["minimax"]["verdict"] == HELPS
    assert summary["arms"]["stratified"]["verdict"] == INCONCLUSIVE  # identical to natural: no spread
    exported = json.loads((root / "winner_weights.json").read_text())
    assert exported["weights"] == pytest.approx({"answers": 0.2, "email": 0.2, "code": 0.6})
    assert exported["provenance"]["arm"] == "minimax" and exported["provenance"]["tokenizer_sha256"] == "t"
    card = (root / "decision.md").read_text()
    assert "Winner: `minimax`." in card and "Smallest domains (natural share): code (0.030), email (0.370)" in card
    # what each arm drew: minimax its time-averaged weights, the others the mixture they drew from
    assert summary["arms"]["minimax"]["drawn_weights"] == pytest.approx({"answers": 0.2, "email": 0.2, "code": 0.6})
    assert summary["arms"]["doremi"]["drawn_weights"] == pytest.approx({"answers": 0.6, "email": 0.37, "code": 0.03})
    assert "| minimax | 0.200 | 0.200 | 0.600 |" in card and "| natural | 0.600 | 0.370 | 0.030 |" in card
    assert (root / "decision.png").stat().st_size > 0


def test_a_rerun_with_another_protocol_is_refused_naming_what_changed(tmp_path):
    root = tmp_path / "d"
    run_decide(arguments(root, arms=["minimax"]), [], FakeCells(root))
    written = (root / PROTOCOL_NAME).read_text()
    run_decide(arguments(root, arms=["minimax"]), [], FakeCells(root))  # the same protocol: accepted
    with pytest.raises(UsageError, match=r"fixed another protocol before the first run \(changed: margin, rule\)"):
        run_decide(arguments(root, arms=["minimax"], margin=0.2), [], FakeCells(root))
    with pytest.raises(UsageError, match=r"changed: run_options"):
        run_decide(arguments(root, arms=["minimax"]), ["--max_steps", "9"], FakeCells(root))
    assert (root / PROTOCOL_NAME).read_text() == written


def test_no_helping_arm_leaves_no_winner_file(tmp_path):
    root = tmp_path / "d"
    run_decide(arguments(root, arms=["stratified"]), [], FakeCells(root))
    assert not (root / "winner_weights.json").exists()
    assert "No arm helps by the rule: keep the baseline." in (root / "decision.md").read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seed", "3"], "--seed: robust-pretrain-decide sets these per cell"),
        (["--weighting", "minimax"], "--weighting: robust-pretrain-decide sets these per cell"),
        (["--seeds", "3"], "--seeds [3]: give at least 2 distinct seeds"),
        (["--seeds", "3", "3"], "give at least 2 distinct seeds"),
        (["--baseline", "mine", "--arms", "stratified"], "--baseline mine is not among the arms"),
        (["--arms", "natural", "--baseline", "natural"], "--arms: give at least one arm besides natural"),
        (["--arm", "mine"], "--arm mine: expected NAME=weights.json"),
        (["--arm", "minimax=w.json"], "the arm 'minimax' is given already"),
        (["--arm", "mine=missing.json"], "--arm mine=missing.json: missing.json is not a file"),
        (["--margin", "0"], "--margin must be > 0"),
        (["--arms", "natural", "magic"], "--arms"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_anything_is_written(tmp_path, capsys, argv, message):
    out = tmp_path / "d"
    assert decide.main(["--output_dir", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and message in err
    assert not out.exists()


@pytest.mark.slow
def test_the_real_recipe_end_to_end_and_a_rerun_reuses_every_cell(tmp_path):
    passed = [a for a in recipe_argv(tmp_path, "unused", "--max_steps", "3") if a not in ("--seed", "5")]
    passed = passed[: passed.index("--output_dir")] + passed[passed.index("--output_dir") + 2 :]
    root = tmp_path / "decide"
    arms = ["sampling_control", "unimax", "minimax", "minimax_capped", "doremi"]
    floors = ["--min_held_out_texts", "1", "--min_held_out_tokens", "1", "--readings", "3", "--epoch_cap", "0.5"]
    argv = ["--output_dir", str(root), "--seeds", "1", "2", "--arms", *arms, *floors, *passed]
    summary = decide.run(argv)
    assert list(summary["arms"]) == ["natural", *arms]
    natural = json.loads((root / "cells" / "natural" / "seed-1" / "task_report.json").read_text())
    texts = natural["held_out_texts"]
    assert min(texts.values()) >= 1 and min(natural["held_out_tokens"].values()) > 0
    assert natural["global_batch_sequences"] == 4
    assert [r["step"] for r in natural["eval_readings"]] == [1, 2, 3]  # every ceil(3 / 3) steps, the last the end
    assert natural["eval_readings"][-1]["eval_task_loss"] == pytest.approx(natural["eval_task_loss"])
    assert [r["step"] for r in summary["regime"]["readings"]] == [1, 2, 3]
    capped = json.loads((root / "cells" / "minimax_capped" / "seed-1" / "task_report.json").read_text())
    assert capped["settings"]["max_epochs_per_task"] == 0.5
    # 3 steps x 4 sequences = 12 draws: no domain drawn more than its cap plus one global batch
    sequences = capped["training_sequences"]
    assert all(capped["epochs_drawn"][d] * sequences[d] <= 0.5 * sequences[d] + 4 for d in sequences)
    assert sum(capped["epochs_drawn"][d] * sequences[d] for d in sequences) == pytest.approx(12)
    unimax = json.loads((root / "cells" / "unimax" / "seed-1" / "arm_weights.json").read_text())["weights"]
    assert unimax == pytest.approx(decide_arms.unimax_weights(natural["training_sequences"], 12, 0.5))
    doremi = json.loads((root / "cells" / "doremi" / "seed-1" / "main" / "task_report.json").read_text())
    assert doremi["mixture_kind"] == "file"  # the mixture's main run, drawing the learned weights
    natural = json.loads((root / "cells" / "natural" / "seed-1" / "task_report.json").read_text())
    control = json.loads((root / "cells" / "sampling_control" / "seed-1" / "task_report.json").read_text())
    assert control["mixture_kind"] == "file" and control["mixture_weights"] == pytest.approx(natural["mixture_weights"])
    minimax = json.loads((root / "cells" / "minimax" / "seed-2" / "task_report.json").read_text())
    assert minimax["weighting"] == "minimax" and minimax["settings"]["domain_sampling"] == "online"
    assert summary["arms"]["minimax"]["endpoint_per_seed"]["2"] == max(minimax["eval_task_loss"].values())
    stamps = {p: p.stat().st_mtime_ns for p in root.glob("cells/**/task_report.json")}
    assert decide.run(argv) == json.loads(json.dumps(summary))  # the same verdict from the reused cells
    assert {p: p.stat().st_mtime_ns for p in root.glob("cells/**/task_report.json")} == stamps
    # across sessions (scripts/decide_evidence_state.py): only the JSON state is kept; restored into an empty
    # folder at the same path, every cell is reused from its report alone: nothing trains, the verdict is the same
    state, script = tmp_path / "state", Path(__file__).parents[1] / "scripts" / "decide_evidence_state.py"
    subprocess.run([sys.executable, script, "save", root, state], check=True)
    root.rename(tmp_path / "first-session")
    subprocess.run([sys.executable, script, "restore", root, state], check=True)
    assert not list(root.rglob("*.safetensors"))
    assert decide.run(argv) == json.loads(json.dumps(summary))
    assert not list(root.rglob("*.safetensors"))


@pytest.mark.parametrize("regime", ["python", "rare_email"])
def test_the_evidence_page_and_the_readme_quote_the_committed_decision(regime):
    """The figures read out in docs/evidence/decide_evidence.md (3 decimals) and the README's row (2; DoReMi's 3) are
    the committed decision's (benchmarks/results/decide_evidence_<regime>.json), not an earlier or hand-typed copy."""
    root = Path(__file__).resolve().parents[1]
    decision = json.loads((root / "benchmarks" / "results" / f"decide_evidence_{regime}.json").read_text())
    page, readme = (root / "docs" / "evidence" / "decide_evidence.md").read_text(), (root / "README.md").read_text()
    section = " ".join(page.split(f"## Regime `{regime}`")[1].split("## ")[0].split())  # lines joined

    def quoted(value: float, digits: int) -> str:
        return f"{value:+.{digits}f}".replace("-", "−")

    for arm in ("minimax", "group_dro", "doremi"):
        diff = decision["arms"][arm]["difference"]
        # the README gives DoReMi's at 3 decimals: its intervals' low ends round to -0.00 at 2
        for digits, text in ((3, section), (3 if arm == "doremi" else 2, readme)):
            figure = f"{quoted(diff['mean'], digits)} [{quoted(diff['low'], digits)}, {quoted(diff['high'], digits)}]"
            assert figure in text, f"{regime} {arm}: {figure} not quoted"
