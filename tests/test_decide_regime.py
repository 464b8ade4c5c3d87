"""robust-pretrain-decide's arms (unimax, temperature, the capped minimax) and its regime guards: held-out size, epochs
drawn, the verdict over training, the power caveat, the cost and the verdict printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_decide import DOMAINS, SEQUENCES, FakeCells, arguments, fake_report, run_decide

from robust_pretrain.cli import UsageError
from robust_pretrain.pretraining.decide.arms import cell_plan, temperature_weights, unimax_weights


def test_unimax_spreads_the_budget_uniformly_up_to_the_cap():
    # budget 600 draws, cap 4 epochs; smallest first: a gets min(600 / 3, 4 * 10) = 40, b min(560 / 2, 400) = 280,
    # c the remaining 280 (below its cap of 4000)
    weights = unimax_weights({"c": 1000, "a": 10, "b": 100}, 600, 4.0)
    assert weights == pytest.approx({"c": 280 / 600, "a": 40 / 600, "b": 280 / 600})
    # nobody capped: uniform
    assert unimax_weights({"a": 100, "b": 200}, 100, 4.0) == pytest.approx({"a": 0.5, "b": 0.5})
    # every domain capped: in proportion to the sequences (each at the cap)
    assert unimax_weights({"a": 10, "b": 30}, 1000, 2.0) == pytest.approx({"a": 0.25, "b": 0.75})


def test_temperature_flattens_the_natural_shares():
    # tau 2: sqrt(0.8) : sqrt(0.2) = 2 : 1
    assert temperature_weights({"a": 0.8, "b": 0.2}, 2.0) == pytest.approx({"a": 2 / 3, "b": 1 / 3})
    assert temperature_weights({"a": 0.8, "b": 0.2}, 1.0) == pytest.approx({"a": 0.8, "b": 0.2})


def test_the_unimax_and_capped_minimax_cells():
    natural = fake_report(["--seed", "1", "--weighting", "proportional", "--max_steps", "300"])
    settings = {"epoch_cap": 4.0, "temperature": 3.0}
    recipe, options, files = cell_plan("unimax", Path("c"), natural, settings, {})
    # 300 steps x 8 = 2400 draws; code (30 sequences) capped at 120, email min(2280 / 2, 1480) = 1140, answers 1140
    ((path, content),) = files.items()
    assert options == ["--weighting", "proportional", "--domain_weights", str(path)]
    assert content["weights"] == pytest.approx({"answers": 1140 / 2400, "email": 1140 / 2400, "code": 120 / 2400})
    assert content["provenance"] == natural["provenance"]
    _, options, files = cell_plan("minimax_capped", Path("c"), natural, settings, {})
    assert options == ["--weighting", "minimax", "--task_sampling", "online", "--max_epochs_per_task", "4.0"]
    assert files == {}


class SmallHeldOut(FakeCells):
    """Natural runs that scored 1,200 held-out tokens of 'code'."""

    def __call__(self, recipe: str, cell: Path, options: list[str]) -> dict[str, Any]:
        report = super().__call__(recipe, cell, options)
        return {**report, "held_out_tokens": {**report["held_out_tokens"], "code": 1200}}


def test_a_small_held_out_domain_is_refused_after_the_first_natural_cell(tmp_path):
    root = tmp_path / "d"
    cells = SmallHeldOut(root)
    with pytest.raises(UsageError, match=r"held-out tokens below the floor of 2000: code \(1200 tokens\)"):
        run_decide(arguments(root, arms=["minimax"]), ["--max_steps", "8"], cells)
    assert [cell for _, cell, _ in cells.calls] == ["cells/natural/seed-1"]  # no other arm trained
    summary = run_decide(arguments(root, arms=["minimax"], allow_small_held_out=True), ["--max_steps", "8"], cells)
    assert summary["regime"]["small_held_out"] == ["code (1200 tokens)"]
    assert "**Warning: held-out set below the floor**: code (1200 tokens)." in (root / "decision.md").read_text()


def test_the_card_states_epochs_readings_power_and_the_run_prints_cost_and_verdict(tmp_path, capsys):
    root = tmp_path / "d"
    summary = run_decide(arguments(root, arms=["minimax"], epochs_warning=0.5), ["--max_steps", "8"], FakeCells(root))
    regime = summary["regime"]
    # 8 steps x 8 sequences = 64 draws; natural shares 0.6 / 0.37 / 0.03 of 600 / 370 / 30 sequences: 64 / 1000 each
    assert regime["epochs_drawn"]["natural"] == pytest.approx(dict.fromkeys(DOMAINS, 64 / 1000))
    # minimax drew 0.2 / 0.2 / 0.6: code 0.6 * 64 / 30
    expected = {d: w * 64 / SEQUENCES[d] for d, w in {"answers": 0.2, "email": 0.2, "code": 0.6}.items()}
    assert regime["epochs_drawn"]["minimax"] == pytest.approx(expected)
    assert regime["over_epochs"] == ["minimax: code (1.3)"]
    # readings every ceil(8 / 4) = 2 steps; minimax gains only at the end (fake_report): inconclusive, then helps
    assert [r["step"] for r in regime["readings"]] == [2, 4, 6, 8]
    assert [r["arms"]["minimax"]["verdict"] for r in regime["readings"]] == ["inconclusive"] * 3 + ["helps"]
    assert regime["verdict_flips"] == {"natural": False, "minimax": True}
    assert regime["power_caveat"].startswith("3 seeds")
    card = (root / "decision.md").read_text()
    assert "**The verdict changes over training** for minimax." in card and "**Power caveat**: 3 seeds" in card
    assert "| minimax | 0.02 | 0.03 | 1.28 |" in card and "| 8 | +0.000 inconclusive | -0.250 helps |" in card
    written = json.loads((root / "decision.json").read_text())
    assert written["regime"]["verdict_flips"]["minimax"] is True and written["baseline"] == "sampling_control"
    out = capsys.readouterr().out
    assert (
        "decide: 9 cells, 9 trainings of 8 steps" in out
        and "decide: natural:1 took 0 s: about 0.0 min for the other 8 trainings" in out
    )
    assert (
        "decide: minimax vs sampling_control: -0.250 [" in out and f"decide: the card is {root / 'decision.md'}" in out
    )


def test_the_temperature_cell_and_a_custom_file_with_its_own_provenance():
    natural = fake_report(["--seed", "1", "--weighting", "proportional", "--max_steps", "300"])
    settings = {"epoch_cap": 4.0, "temperature": 2.0}
    _, _, files = cell_plan("temperature", Path("c"), natural, settings, {})
    (content,) = files.values()
    # sqrt of 0.6 / 0.37 / 0.03, normalised
    roots = {d: s**0.5 for d, s in {"answers": 0.6, "email": 0.37, "code": 0.03}.items()}
    assert content["weights"] == pytest.approx({d: r / sum(roots.values()) for d, r in roots.items()})
    own = {"weights": dict.fromkeys(DOMAINS, 1.0), "provenance": {"tokenizer_sha256": "elsewhere"}}
    _, options, files = cell_plan("mine", Path("c"), natural, settings, {"mine": own})
    assert files == {Path("c") / "arm_weights.json": own}  # checked against the run's provenance by the recipe
    assert options[-2:] == ["--domain_weights", str(Path("c") / "arm_weights.json")]
