"""``robust-pretrain-mixture`` owns its definition (issue 29 items 3 and 4): the options it sets itself, a proxy
option its proxy objective does not take and a corrupt stage file are refused before any stage runs, as
``tests/test_bad_inputs.py`` refuses bad input: exit status 2, at most 3 lines naming the option or file, no
traceback, nothing written. ``{tmp}`` is the test's folder, ``{out}`` an existing output directory holding a user's
file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robust_pretrain.pretraining import mixture
from robust_pretrain.pretraining.causal_lm import recipe as causal_lm

PROG = "robust-pretrain-mixture"
BASE = ["--config", "decoder_demo", "--output_dir", "{out}"]

# (options, fragments the error must contain)
CASES: list[tuple[list[str], list[str]]] = [
    (["--weighting", "minimax"], ["--weighting is set by robust-pretrain-mixture itself", "--proxy_objective"]),
    (["--loss_normalization", "raw"], ["--loss_normalization is set by robust-pretrain-mixture itself"]),
    (["--excess_clipping", "token"], ["--excess_clipping is set by", "--proxy_excess"]),
    (["--domain_weights", "{tmp}/weights.json"], ["--domain_weights is set by", "natural proportions"]),
    (["--task_sampling", "online"], ["--task_sampling is set by robust-pretrain-mixture itself"]),
    (["--reference_losses", "1", "2"], ["--reference_losses is set by", "reference stage"]),
    (["--reference_run", "{tmp}/reference"], ["--reference_run is set by robust-pretrain-mixture itself"]),
    (["--reference_model", "{tmp}/reference"], ["--reference_model is set by robust-pretrain-mixture itself"]),
    (["--reference_mismatch_ok", "tasks"], ["--reference_mismatch_ok is set by robust-pretrain-mixture itself"]),
    (["--streaming", "true"], ["--streaming: the mixture's reference must draw the natural", "map-style data"]),
    (["--streaming"], ["--streaming: the mixture's reference must draw the natural proportions"]),
    (["--task_sampling=online"], ["--task_sampling is set by robust-pretrain-mixture itself"]),
    (["--config", "{tmp}/owned.yaml"], ["--config {tmp}/owned.yaml: 'domain_weights' is set by", "remove it"]),
    (["--alpha", "2"], ["--alpha does not apply to --proxy_objective doremi", "--dro_step_size"]),
    (["--proxy_objective", "minimax", "--dro_step_size", "0.5"], ["--dro_step_size does not apply", "minimax"]),
    (["--dro_step_size", "-1"], ["--dro_step_size must be > 0, got -1.0"]),
    (["--dro_smoothing", "1"], ["--dro_smoothing must be in [0, 1)"]),
    (["--proxy_excess", "mean"], ["--proxy_excess", "invalid choice: 'mean'"]),
    (["--retrain_reference", "maybe"], ["--retrain_reference"]),
    (["--output_dir", "{tmp}/corrupt"], ["{tmp}/corrupt/reference/stage.json is corrupt", "delete the stage folder"]),
    (["--output_dir", "{tmp}/bad-report"], ["bad-report/reference/task_report.json is corrupt", "{tmp}/bad-report/"]),
]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    (tmp_path / "weights.json").write_text('{"weights": {"news": 1.0}}')
    (tmp_path / "reference").mkdir()
    (tmp_path / "owned.yaml").write_text("max_steps: 3\ndomain_weights: weights.json\n")
    (tmp_path / "corrupt" / "reference").mkdir(parents=True)
    (tmp_path / "corrupt" / "reference" / "stage.json").write_text('{"options": ["--max_steps", ')  # cut short
    # a reference stage recorded with exactly the options of this command line, whose report is cut short
    stage = tmp_path / "bad-report" / "reference"
    stage.mkdir(parents=True)
    args = mixture.MixtureArguments(output_dir=str(tmp_path / "bad-report"))
    every_stage, _ = mixture.split_options(args, ["--config", "decoder_demo"])
    (stage / "stage.json").write_text(json.dumps({"options": [*every_stage, "--weighting", "proportional"]}))
    (stage / "task_report.json").write_bytes(b"\x00\xff")
    return tmp_path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize(("options", "fragments"), CASES, ids=[" ".join(options)[:60] for options, _ in CASES])
def test_the_mixture_refuses_before_any_stage(
    options: list[str], fragments: list[str], workspace: Path, capsys, monkeypatch
) -> None:
    def no_stage(argv: list[str]) -> dict:
        raise AssertionError(f"a stage was started: {argv}")

    monkeypatch.setattr(causal_lm, "run", no_stage)
    argv = [token.format(tmp=workspace, out=workspace / "out") for token in [*BASE, *options]]
    before = snapshot(workspace)
    capsys.readouterr()
    status = mixture.main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err, err
    lines = err.rstrip("\n").split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith(f"{PROG}: error: "))
    message = lines[first:]
    assert 1 <= len(message) <= 3 and all(line.startswith(f"{PROG}: error: ") for line in message), err
    text = " ".join(message)
    for fragment in fragments:
        assert fragment.format(tmp=workspace) in text, (fragment, text)
    assert snapshot(workspace) == before
