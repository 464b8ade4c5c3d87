"""robust-pretrain-decide's inputs: every bad one refused in one line with exit 2, before anything is written (the arm
files' contents and the data's domains included); the accepted forms (repeated --arm, a hand-written arm file, the
same folder by another spelling or moved, the same options in another order) reused or run as one protocol."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_decide import DOMAINS, FakeCells, fake_domains

from robust_pretrain.pretraining.decide import recipe as decide


def domain_files(folder: Path, texts: dict[str, int]) -> list[str]:
    """``--domain_files`` of one small text file per domain (``texts[name]`` lines), 50 % held out."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, count in texts.items():
        path = folder / f"{name}.txt"
        path.write_text("".join(f"{name} text number {i} says something.\n" for i in range(count)))
        entries.append(f"{name}={path}")
    return ["--domain_files", *entries, "--validation_split_percentage", "50"]


def arm_file(folder: Path, content: Any, name: str = "w.json") -> str:
    path = folder / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def refused(tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], message: str) -> None:
    out = tmp_path / "d"
    assert decide.main(["--output_dir", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent" not in err and len(err.strip().splitlines()) <= 3 and message in err, err
    assert not out.exists()  # nothing written


GOOD = {"answers": 1, "email": 1, "code": 2}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"weights": {"answers": float("nan"), "email": 1, "code": 1}}, "the weight of 'answers' is nan"),
        ({"weights": {"answers": -1, "email": 1, "code": 1}}, "'answers' is -1, not a finite JSON number >= 0"),
        ({"weights": {"answers": "1", "email": 1, "code": 1}}, "the weight of 'answers' is '1'"),
        ({"weights": {**GOOD, "web": 1}}, "unknown domain(s) ['web']"),
        ({"weights": {"answers": 1, "email": 1}}, "missing domain(s) ['code']"),
        ("{not json", "not a JSON file"),
        ({}, 'expected {"weights"'),
        ({"weights": {}}, 'expected {"weights"'),
        ({"weights": [1, 2, 3]}, 'expected {"weights"'),
        ({"weights": dict.fromkeys(DOMAINS, 0)}, "the weights are all 0"),
    ],
)
def test_a_bad_arm_file_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch, content, message):
    monkeypatch.setattr(decide, "recipe_domains", fake_domains)
    refused(tmp_path, capsys, ["--arm", f"mine={arm_file(tmp_path, content)}"], message)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--streaming", "true"], "--streaming: refused by decide"),
        (["--streaming"], "--streaming: refused by decide"),
        (["--seeds", "1", "2", "--seeds", "3", "4"], "--seeds is given twice"),
        (["--margin", "0.1", "--margin", "0.2"], "--margin is given twice"),
        (["--seeds", "-1", "2"], "--seeds must be in [0, 4.29497e+09], got -1"),  # the runs' --seed refused it late
        (["--arms", "minimax", "minimax"], "--arms minimax minimax: an arm is listed twice"),
        (["--arm", "../escape=W"], "an arm name is letters, digits"),
        (["--arm", "a/b=W"], "an arm name is letters, digits"),
        (["--arm", ".hidden=W"], "an arm name is letters, digits"),
        (["--arm", "x=W", "--arm", "x=W"], "the arm 'x' is given already"),
        (["--cell", "minimax:7"], "--cell minimax:7: expected ARM:SEED"),
        (["--cell", "magic:42"], "--cell magic:42: expected ARM:SEED"),
        (["--plan", "--report"], "give one of them at most"),
        (["--max_steps", "-1"], "--max_steps -1: decide needs a fixed number of steps"),
        (["--max_steps", "8", "--readings", "20"], "--readings 20: more than the 8 training steps"),  # was: 8, silently
        (["--eval_steps", "5"], "--eval_steps: robust-pretrain-decide sets these per cell"),
        (["--max_epochs_per_task", "2"], "--max_epochs_per_task: robust-pretrain-decide sets these per cell"),
        (["--reference_mismatch_ok", "tokenizer"], "--reference_mismatch_ok: robust-pretrain-decide sets these"),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setattr(decide, "recipe_domains", fake_domains)
    weights = arm_file(tmp_path, {"weights": GOOD})
    refused(tmp_path, capsys, [token.replace("=W", f"={weights}") for token in argv], message)


@pytest.mark.parametrize("saved", ["cells.json", "decision.md", "winner_weights.json", "cells"])
@pytest.mark.parametrize("mode", [["--plan"], []])
def test_a_folder_holding_decision_files_without_a_protocol_is_refused_and_kept(
    tmp_path, capsys, monkeypatch, saved, mode
):
    """A user's own ``decision.md`` (or a decision whose protocol.json is gone) is never overwritten."""
    monkeypatch.setattr(decide, "recipe_domains", fake_domains)
    out = tmp_path / "d"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    if saved == "cells":
        (out / saved).mkdir()
    else:
        (out / saved).write_text("my own")
    before = sorted((path.relative_to(out), path.read_bytes() if path.is_file() else b"") for path in out.rglob("*"))
    assert decide.main(["--output_dir", str(out), *mode]) == 2
    err = capsys.readouterr().err
    assert f"holds {saved} but no protocol.json" in err and len(err.strip().splitlines()) == 1, err
    after = sorted((path.relative_to(out), path.read_bytes() if path.is_file() else b"") for path in out.rglob("*"))
    assert after == before


def test_one_domain_and_a_small_held_out_set_are_refused_from_the_data(tmp_path, capsys):
    refused(tmp_path, capsys, domain_files(tmp_path / "one", {"only": 40}), "the data has one domain (only)")
    # 4 texts of 'rare' held out (50 % of 8): below the floor of 5 documents, named with its count
    small = domain_files(tmp_path / "small", {"big": 40, "rare": 8})
    refused(tmp_path, capsys, small, "held-out texts below the floor of 5: rare (4 texts)")
    out = tmp_path / "d"
    assert decide.main(["--output_dir", str(out), "--plan", "--allow_small_held_out", *small]) == 0
    assert json.loads((out / "protocol.json").read_text())["domains"] == ["big", "rare"]


def test_repeated_arms_add_up_and_a_hand_written_file_gets_the_natural_provenance(tmp_path):
    first = arm_file(tmp_path, {"weights": GOOD}, "first.json")  # as the docs show it: no provenance
    second = arm_file(tmp_path, {"weights": {"answers": 3, "email": 1, "code": 0}}, "second.json")
    root = tmp_path / "d"
    argv = ["--output_dir", str(root), "--seeds", "1", "2", "--arms", "stratified", "--arm", f"a={first}"]
    parser = decide.OptionParser(decide.DecideArguments, allow_abbrev=False)
    namespace, passed = parser.parse_known_args(
        decide.merge_repeats([*argv, "--arm", f"b={second}", "--max_steps", "4"])
    )
    args = decide.DecideArguments(**vars(namespace))
    assert args.arm == [f"a={first}", f"b={second}"] and passed == ["--max_steps", "4"]
    cells = FakeCells(root)
    summary = decide.decide(args, passed, cells, read_domains=fake_domains)
    assert list(summary["arms"]) == ["natural", "sampling_control", "stratified", "a", "b"]
    written = json.loads((root / "cells" / "a" / "seed-2" / "arm_weights.json").read_text())
    assert written["weights"] == pytest.approx({"answers": 0.25, "email": 0.25, "code": 0.5})
    assert written["provenance"]["tokenizer_sha256"] == "t"  # the seed's natural run's


def run_plan(root: Path, passed: list[str], cells: FakeCells | None = None) -> dict[str, Any]:
    args = decide.DecideArguments(output_dir=str(root), seeds=[1, 2], arms=["minimax"])
    return decide.decide(args, passed, cells or FakeCells(root), read_domains=fake_domains)


def test_the_folder_is_recognised_by_its_contents_and_options_in_any_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = Path("d")
    first = FakeCells(relative)
    summary = run_plan(relative, ["--max_steps", "4", "--learning_rate", "0.001"], first)
    assert len(first.calls) == 6
    # the same options in another order, the folder by its absolute path: the same protocol, every cell reused
    again = FakeCells(tmp_path / "d")
    assert run_plan(tmp_path / "d", ["--learning_rate", "0.001", "--max_steps", "4"], again) == summary
    assert again.calls == []
    # moved: still every cell reused
    (tmp_path / "d").rename(tmp_path / "moved")
    moved = FakeCells(tmp_path / "moved")
    assert run_plan(tmp_path / "moved", ["--max_steps", "4", "--learning_rate", "0.001"], moved) == summary
    assert moved.calls == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--learning_rate", "-1"], "--learning_rate must be > 0"),
        (["--bogus_option", "3"], "unknown option --bogus_option"),
        (["--tokenizer_name", "/nonexistent/tokenizer"], "--tokenizer_name /nonexistent/tokenizer: no such checkpoint"),
        (["--domain_files", "a=/nonexistent/a.txt", "b=/nonexistent/b.txt"], "data file not found"),
    ],
)
def test_the_recipe_options_and_data_are_checked_before_anything_is_written(tmp_path, capsys, extra, message):
    refused(tmp_path, capsys, [*domain_files(tmp_path / "two", {"big": 40, "rare": 20}), *extra], message)
