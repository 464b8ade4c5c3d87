"""A pip user without the clone: the wheel built from this checkout, installed into a fresh virtual environment, runs
the vision demo by name (``robust-pretrain-multimae --config vision_demo``) in an empty directory, and the text demo
without the UD-EWT data names a folder relative to that directory, not one inside the environment.

The environment is made from the base interpreter (not this one's venv, which holds an editable install of the
checkout). Its dependencies come from this venv's site-packages through a ``.pth`` line: a folder added that way is
only appended to ``sys.path``, its own ``.pth`` files (the editable install's finder) are not run. The test checks
that ``robust_pretrain`` is the wheel's copy and that nothing of the checkout is on the path."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
PROBE = """
import json, os, sys
import robust_pretrain
from robust_pretrain.configs import resolve_config
print(json.dumps({
    "file": robust_pretrain.__file__,
    "path": [os.path.abspath(entry) for entry in sys.path],
    "demo": str(resolve_config("vision_demo")),
    "finders": [type(finder).__name__ for finder in sys.meta_path],
}))
"""


def run(command: list, cwd: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def environment(tmp_path_factory) -> tuple[Path, dict]:
    """A fresh virtual environment with the wheel of this checkout installed (the folder, and its environment vars)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # a copy: the build writes build/ and *.egg-info next to the sources
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(CHECKOUT / "robust_pretrain", source / "robust_pretrain", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(CHECKOUT / name, source / name)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    env.update(OMP_NUM_THREADS="1", HF_HOME=str(root / "hf-home"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    built = run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", root / "dist", source], root, env)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (root / "dist").glob("robust_pretrain-*.whl")
    venv = root / "venv"
    made = run([sys._base_executable, "-m", "venv", "--without-pip", venv], root, env)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = run([*pip, "--python", python, "install", "--no-deps", "--no-index", wheel], root, env)
    assert installed.returncode == 0, installed.stderr[-3000:]
    (purelib,) = (venv / "lib").glob("python3*/site-packages")
    (purelib / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv, env


@pytest.mark.slow
def test_the_wheel_is_what_runs_and_the_checkout_is_not_on_the_path(environment, tmp_path):
    venv, env = environment
    probe = run([venv / "bin" / "python", "-c", PROBE], tmp_path, env)
    assert probe.returncode == 0, probe.stderr[-3000:]
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    site_packages = next((venv / "lib").glob("python3*/site-packages")).resolve()
    assert Path(report["file"]).resolve() == site_packages / "robust_pretrain" / "__init__.py"
    assert Path(report["demo"]).resolve() == site_packages / "robust_pretrain" / "configs" / "vision_demo.yaml"
    entries = [Path(entry).resolve() for entry in report["path"]]
    assert CHECKOUT not in entries  # and no other folder on the path offers a robust_pretrain
    assert [entry for entry in entries if (entry / "robust_pretrain").exists()] == [site_packages]
    assert not any("editable" in name.lower() for name in report["finders"])


@pytest.mark.slow
def test_the_vision_demo_runs_by_name_in_an_empty_directory(environment, tmp_path):
    venv, env = environment
    command = [venv / "bin" / "robust-pretrain-multimae", "--config", "vision_demo", "--max_steps", "2"]
    command += ["--num_train_scenes", "16", "--num_eval_scenes", "8", "--logging_steps", "1", "--save_steps", "2"]
    proc = run(command, tmp_path, env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    output_dir = tmp_path / "outputs" / "vision_demo"  # the packaged config's output_dir, from the current directory
    for name in ("model.safetensors", "config.json", "preprocessor_config.json", "task_report.json", "README.md"):
        assert (output_dir / name).is_file(), name
    config = json.loads((output_dir / "config.json").read_text())
    assert config["model_type"] == "multimae" and config["image_size"] == 32 and config["patch_size"] == 4
    report = json.loads((output_dir / "task_report.json").read_text())
    assert report["tasks"] == ["rgb", "depth", "semseg"] and report["settings"]["max_steps"] == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == ["outputs"]


@pytest.mark.slow
def test_a_missing_ud_ewt_folder_is_named_from_the_current_directory(environment, tmp_path):
    venv, env = environment
    env = {key: value for key, value in env.items() if key != "ROBUST_PRETRAIN_UD_DIR"}
    proc = run([venv / "bin" / "robust-pretrain-pos-mlm", "--config", "demo", "--max_steps", "1"], tmp_path, env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert f"UD English-EWT folder not found: {tmp_path.parent / 'shared' / 'data' / 'ud_ewt'} (the default" in line
    assert "--ud_dir" in line and "$ROBUST_PRETRAIN_UD_DIR" in line
    assert str(venv) not in line and str(CHECKOUT) not in line
