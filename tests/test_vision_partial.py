"""Partial modalities from the command line (issue 20 item 3): ``--unmatched error|drop|partial`` in the MM-MAE
pre-training and finetune-dense recipes, on PNG folders where some frames lack depth. ``partial`` trains on them;
a missing depth map gets no input and no loss (checked against a hand computation on a tiny batch)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from test_recipe_multimae import FOLDER, IMAGE, VISIBLE, argv, write_folder
from test_recipe_pretrain import single_thread
from test_vision_finetune import checkpoint, tiny_config  # noqa: F401 (the module-scoped checkpoint fixture)
from transformers import AutoModelForPreTraining

from robust_pretrain.pretraining.multimae import recipe
from robust_pretrain.vision import loaders
from robust_pretrain.vision.collator import ModalityMaskCollator
from robust_pretrain.vision.finetune import recipe as finetune
from robust_pretrain.vision.finetune.metrics import recompute_metrics
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor, MultiMAETransform

WITHOUT_DEPTH = {"train": ["a1", "a4", "a6"], "test": ["b1"]}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


def partial_folder(root: Path, size: int = IMAGE, train: int = 8, test: int = 2) -> Path:
    """rgb, depth (16-bit mm) and semseg PNGs; the frames of WITHOUT_DEPTH have no depth map."""
    write_folder(root, "train", [f"a{i}" for i in range(train)], size=size)
    write_folder(root, "test", [f"b{i}" for i in range(test)], size=size)
    for split, stems in WITHOUT_DEPTH.items():
        for stem in stems:
            (root / split / "depth" / f"{stem}.png").unlink()
    return root


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.slow
def test_pretraining_on_frames_without_depth(tmp_path: Path, capsys) -> None:
    root = partial_folder(tmp_path / "data")
    assert recipe.main(argv(tmp_path / "refused", "--image_folder", str(root), *FOLDER)) == 2
    assert "(only in rgb, semseg: a1, a4, a6); add the missing files, or pass --unmatched drop" in one_line_error(
        capsys
    )

    output_dir = tmp_path / "out"
    metres = ["--depth_normalization", "none"]  # the hand computation below is the L1 in metres
    assert recipe.main(argv(output_dir, "--image_folder", str(root), *FOLDER, "--unmatched", "partial", *metres)) == 0
    assert "(8 training and 2 held-out images" in (output_dir / "README.md").read_text()  # none dropped
    log = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    assert all(np.isfinite(entry["task_loss/depth"]) for entry in log if "task_loss/depth" in entry)
    assert any("task_loss/depth" in entry for entry in log)

    # The held-out batch as the recipe builds it: b0 has depth, b1 not.
    processor = MultiMAEImageProcessor.from_pretrained(output_dir)
    model = AutoModelForPreTraining.from_pretrained(output_dir).eval()
    rows = loaders.load_image_folder(root, "test", unmatched="partial").with_transform(
        MultiMAETransform(processor, train=False)
    )
    examples = [rows[0], rows[1]]
    assert [e["id"] for e in examples] == ["b0", "b1"] and examples[1]["depth"] is None
    collate = ModalityMaskCollator(
        VISIBLE, model.config.patch_size, fill_values={"depth": 0.0, "semseg": 255}, seed=1234
    )
    batch = collate(examples)
    assert (batch["depth"][1] == 0).all() and batch["mask_depth"][1].all()  # filled, and hidden from the encoder
    visible_b1 = (~batch["mask_rgb"][1]).sum() + (~batch["mask_semseg"][1]).sum()
    assert visible_b1 == VISIBLE  # its budget goes to the modalities it has
    with torch.no_grad():
        both = model(**batch)
        alone = model(**collate([examples[0]]))
    # depth loss by hand: L1 in metres over b0's hidden patches' valid pixels only
    patch = model.config.patch_size
    hidden = batch["mask_depth"].reshape(2, IMAGE // patch, IMAGE // patch)
    hidden = hidden.repeat_interleave(patch, 1).repeat_interleave(patch, 2)[:, None]
    target = batch["depth"]
    counted = hidden & (target > 0)
    assert not counted[1].any()
    error = (both.predictions["depth"] - target).abs()
    assert both.task_losses["depth"] == pytest.approx(float(error[counted].mean()), rel=1e-5)
    assert both.task_counts["depth"] == float(counted[0].sum()) == alone.task_counts["depth"]
    assert both.task_losses["depth"] == pytest.approx(float(alone.task_losses["depth"]), rel=1e-5)
    assert both.task_counts["rgb"] > alone.task_counts["rgb"]  # b1 still counts where it has data


def test_pretraining_refuses_frames_without_rgb_or_room_for_the_budget(tmp_path: Path, capsys) -> None:
    root = partial_folder(tmp_path / "data")
    (root / "train" / "rgb" / "a2.png").unlink()
    assert recipe.main(argv(tmp_path / "out", "--image_folder", str(root), *FOLDER, "--unmatched", "partial")) == 2
    assert "the training examples ['a2'] have no rgb, which cannot be left out" in one_line_error(capsys)
    too_many = ["--unmatched", "partial", "--num_visible_tokens", "40"]  # < 3 x 16 patches, > the 2 x 16 of a1
    write_folder(root, "train", ["a2"], modalities=("rgb",))
    assert recipe.main(argv(tmp_path / "out", "--image_folder", str(root), *FOLDER, *too_many)) == 2
    assert "--num_visible_tokens 40 exceeds the 32 patches of a training example with only 2 of the modalities" in (
        one_line_error(capsys)
    )
    bad = ["--unmatched", "some"]
    assert recipe.main(argv(tmp_path / "out", "--image_folder", str(root), *FOLDER, *bad)) == 2
    assert "--unmatched" in (err := one_line_error(capsys)) and "partial" in err


def dense(checkpoint_dir: Path, root: Path, task: str, output_dir: Path, *extra: str) -> int:
    return finetune.main([
        "--model_name_or_path", str(checkpoint_dir), "--task", task, "--image_folder", str(root),
        "--eval_split", "test", "--num_labels", "3", "--output_dir", str(output_dir), "--max_steps", "2",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "2", "--warmup_steps", "0",
        "--report_to", "none", "--disable_tqdm", "true", "--num_prediction_images", "1", *extra,
    ])  # fmt: skip


@pytest.mark.slow
def test_finetune_dense_on_frames_without_depth(checkpoint: Path, tmp_path: Path, capsys) -> None:  # noqa: F811
    root = partial_folder(tmp_path / "data", size=32)
    assert dense(checkpoint, root, "depth", tmp_path / "refused") == 2
    assert "--unmatched partial" in one_line_error(capsys)

    output_dir = tmp_path / "depth"
    assert dense(checkpoint, root, "depth", output_dir, "--unmatched", "partial") == 0
    results = json.loads((output_dir / "all_results.json").read_text())
    assert results["train_samples"] == 8 and results["eval_samples"] == 1  # b1 has no depth to score
    assert np.load(output_dir / "predictions_depth.npz")["ids"].tolist() == ["b0"]
    assert recompute_metrics(output_dir / "predictions_depth.npz")["delta1"] == pytest.approx(results["eval_delta1"])
    # depth as an input cannot be left out: the fine-tuning model encodes every input patch
    inputs = ["--unmatched", "partial", "--input_modalities", "rgb", "depth"]
    capsys.readouterr()
    assert dense(checkpoint, root, "semseg", tmp_path / "semseg", *inputs) == 2
    assert "the training examples ['a1', 'a4', 'a6']" in one_line_error(capsys)
    # drop keeps the complete frames only
    assert dense(checkpoint, root, "depth", tmp_path / "drop", "--unmatched", "drop") == 0
    assert json.loads((tmp_path / "drop" / "all_results.json").read_text())["train_samples"] == 5


@pytest.mark.parametrize(("task", "fill"), [("depth", 0.0), ("semseg", 255)])
def test_dense_collator_fills_missing_targets_even_for_a_whole_batch(task: str, fill: float) -> None:
    rgb = np.zeros((3, 8, 12), dtype=np.float32)
    target = np.ones((1, 8, 12), dtype=np.float32) if task == "depth" else np.ones((8, 12), dtype=np.int64)
    collate = finetune.DenseCollator(task, ignore_index=255)
    mixed = collate([{"rgb": rgb, task: target}, {"rgb": rgb, task: None}])["labels"]
    assert mixed.shape == (2, 8, 12) and (mixed[0] == 1).all() and (mixed[1] == fill).all()
    empty = collate([{"rgb": rgb, task: None}] * 2)["labels"]
    assert empty.shape == (2, 8, 12) and (empty == fill).all()
