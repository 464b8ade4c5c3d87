"""Folders saved before the modules moved (issue 40) still load: the files that name a module of the package are the
pickled ``training_args.bin`` of every run and checkpoint; a saved MM-MAE model and processor name none."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from processes import checkout_env
from tiny_vision import tiny_config

from robust_pretrain import MinimaxTrainingArguments
from robust_pretrain.vision import MultiMAEForPreTraining, MultiMAEImageProcessor
from robust_pretrain.vision.finetune.arguments import DenseTrainingArguments

#: the class a run pickled into training_args.bin -> the module it named before the move
OLD_MODULES = {
    MinimaxTrainingArguments: "robust_pretrain.training_args",
    DenseTrainingArguments: "robust_pretrain.vision.finetune_arguments",
}


@pytest.mark.parametrize("cls", list(OLD_MODULES), ids=lambda cls: cls.__name__)
def test_a_training_args_bin_saved_under_the_old_module_loads(cls, tmp_path: Path, monkeypatch) -> None:
    """Saved as a run saved it before the move (the class named by its old module), loaded in a fresh process."""
    saved = tmp_path / "training_args.bin"
    monkeypatch.setattr(cls, "__module__", OLD_MODULES[cls])
    torch.save(cls(output_dir=str(tmp_path / "run"), use_cpu=True, report_to=[], seed=7), saved)
    monkeypatch.undo()
    assert OLD_MODULES[cls].encode() in saved.read_bytes()
    code = textwrap.dedent(f"""
        import torch
        args = torch.load({str(saved)!r}, weights_only=False)
        print(type(args).__module__, type(args).__name__, args.seed)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=checkout_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [cls.__module__, cls.__name__, "7"]


def test_a_saved_mm_mae_folder_names_no_module_of_the_package(tmp_path: Path) -> None:
    config = tiny_config()
    MultiMAEForPreTraining(config).save_pretrained(tmp_path)
    MultiMAEImageProcessor(image_size=config.image_size).save_pretrained(tmp_path)
    for name in ("config.json", "preprocessor_config.json"):
        assert "robust_pretrain" not in (tmp_path / name).read_text(), name
