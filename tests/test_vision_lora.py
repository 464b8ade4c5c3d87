"""A LoRA output of finetune_dense loads in one line from any directory (issue 32 item 5): the head's config sits
beside the adapter, the base checkpoint is recorded by its absolute path, and the documented snippet, run verbatim in
a fresh interpreter elsewhere after the folder was moved, predicts what the model predicted at the end of training."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from processes import checkout_env
from test_recipe_pretrain import single_thread
from test_vision_finetune import SIZE, checkpoint, finetune  # noqa: F401  (checkpoint: a module-scoped fixture)
from transformers import AutoModelForDepthEstimation

from robust_pretrain.vision import scenes
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor

DOC = Path(__file__).resolve().parents[1] / "docs" / "recipes" / "finetune-dense.md"


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


def documented_snippet() -> str:
    """The Python block of the finetune-dense page that loads a LoRA output."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)
    loading = [textwrap.dedent(block) for block in blocks if "--use_lora output_dir" in block]
    assert len(loading) == 1, blocks
    return loading[0]


@pytest.mark.slow  # a fresh interpreter importing torch and transformers
def test_the_documented_line_loads_a_moved_lora_output_from_another_directory(
    checkpoint: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    training_dir, other_dir = tmp_path / "training", tmp_path / "elsewhere"
    training_dir.mkdir()
    monkeypatch.chdir(training_dir)
    base = Path(os.path.relpath(checkpoint, training_dir))  # the base given by a relative path
    finetune(base, "semseg", Path("runs/semseg"), "--use_lora", "true", "--lora_r", "4")
    adapter = json.loads(Path("runs/semseg/adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(checkpoint.resolve())
    assert len(json.loads(Path("runs/semseg/config.json").read_text())["id2label"]) == scenes.NUM_CLASSES
    assert not Path("runs/semseg/model.safetensors").exists()  # the adapter folder holds no base weights
    (other_dir / "runs").mkdir(parents=True)
    shutil.move("runs/semseg", other_dir / "runs" / "semseg")

    driver = textwrap.dedent(f"""
        import sys
        import numpy as np
        import torch
        from robust_pretrain.vision import scenes
        from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor

        namespace = {{}}
        exec(compile(sys.argv[1], "finetune-dense.md", "exec"), namespace)  # the documented snippet, verbatim
        model = namespace["model"].eval()
        images = [row["rgb"] for row in scenes.generate_scenes(4, "downstream_test", 0, scenes.SceneConfig({SIZE}))]
        pixels = MultiMAEImageProcessor.from_pretrained("runs/semseg")(images=images)["rgb"]
        with torch.no_grad():
            np.save("predicted.npy", model(pixel_values=pixels).logits.argmax(1).numpy())
        print(type(model).__name__)
    """)
    done = subprocess.run(
        [sys.executable, "-c", driver, documented_snippet()],
        cwd=other_dir,
        env=checkout_env(HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "MultiMAEForSemanticSegmentation"
    with np.load(other_dir / "runs" / "semseg" / "predictions_semseg.npz") as saved:
        np.testing.assert_array_equal(np.load(other_dir / "predicted.npy"), saved["predictions"])


def test_depth_lora_output_loads_and_a_random_init_one_names_no_base(checkpoint: Path, tmp_path: Path) -> None:  # noqa: F811
    """The depth head loads the same way (its saved predictions reproduced to float precision); a run from a
    randomly initialised encoder records no base (not the checkpoint whose weights it did not use) and says what to
    load instead."""
    out = tmp_path / "depth"
    finetune(checkpoint, "depth", out, "--use_lora", "true", "--lora_r", "4")
    model = AutoModelForDepthEstimation.from_pretrained(out).eval()
    images = [row["rgb"] for row in scenes.generate_scenes(4, "downstream_test", 0, scenes.SceneConfig(SIZE))]
    pixels = MultiMAEImageProcessor.from_pretrained(out)(images=images)["rgb"]
    with torch.no_grad():
        predicted = model(pixel_values=pixels).predicted_depth.numpy()
    with np.load(out / "predictions_depth.npz") as saved:
        np.testing.assert_allclose(predicted, saved["predictions"], rtol=1e-4, atol=1e-5)
    random = tmp_path / "random"
    finetune(checkpoint, "depth", random, "--use_lora", "true", "--lora_r", "4", "--random_init", "true")
    assert not json.loads((random / "adapter_config.json").read_text())["base_model_name_or_path"]
    with pytest.raises(ValueError, match=r"randomly initialised encoder .* merged/ folder"):
        AutoModelForDepthEstimation.from_pretrained(random)
