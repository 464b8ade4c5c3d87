"""NYUv2-style class maps (0 = unlabelled, 1..K = classes) with ``do_reduce_labels``: 0 becomes the ignore index and
id becomes id - 1 in the image processor, the loaders' checks and both recipes (fine-tuning and pre-training); ids
above K are refused with the figures, before any training (issue 20 item 2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_recipe_multimae import argv as pretraining_argv
from test_recipe_pretrain import single_thread
from tiny_vision import tiny_config
from transformers import AutoImageProcessor

from robust_pretrain.pretraining.multimae import recipe as pretraining
from robust_pretrain.vision.finetune import recipe as finetune
from robust_pretrain.vision.loaders import load_image_folder
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor
from robust_pretrain.vision.multimae.pretraining import MultiMAEForPreTraining

CLASSES = 3  # raw ids 1..3 are the classes, 0 is unlabelled
HEIGHT, WIDTH = 24, 32  # NYUv2's 480 x 640 aspect


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


def raw_labels(seed: int) -> np.ndarray:
    """A raw NYUv2-style map: blocks of 0 (unlabelled) and of each class id 1..CLASSES."""
    blocks = np.random.default_rng(seed).integers(0, CLASSES + 1, (HEIGHT // 4, WIDTH // 4))
    blocks[0, :4] = np.arange(CLASSES + 1)  # every raw id present
    return np.kron(blocks, np.ones((4, 4), dtype=np.int64)).astype(np.uint8)


def reduced(raw: np.ndarray, ignore_index: int = 255) -> np.ndarray:
    """The reduction by hand (mmseg's reduce_zero_label)."""
    out = raw.astype(np.int64) - 1
    out[raw == 0] = ignore_index
    return out


def write_nyu_folder(root: Path, splits: dict[str, int], bad: tuple[str, int] | None = None) -> Path:
    """rgb 8-bit PNG, depth 16-bit PNG (mm), semseg 8-bit PNG with 0 = unlabelled; ``bad`` = (stem, id) writes
    that id into one pixel of that stem's label map."""
    rng = np.random.default_rng(0)
    for split, count in splits.items():
        for modality in ("rgb", "depth", "semseg"):
            (root / split / modality).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            stem = f"{split}_{index}"
            Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)).save(
                root / split / "rgb" / f"{stem}.png"
            )
            depth = rng.integers(500, 5000, (HEIGHT, WIDTH)).astype(np.uint16)
            Image.fromarray(depth).save(root / split / "depth" / f"{stem}.png")
            labels = raw_labels(sum(map(ord, stem)))
            if bad is not None and bad[0] == stem:
                labels[5, 7] = bad[1]
            Image.fromarray(labels).save(root / split / "semseg" / f"{stem}.png")
    return root


def test_processor_reduces_zero_label_and_refuses_ids_above_the_classes() -> None:
    raw = raw_labels(1)
    raw[0, 0] = 255  # already ignored: stays
    processor = MultiMAEImageProcessor(size=(HEIGHT, WIDTH), num_classes=CLASSES, do_reduce_labels=True)
    out = processor(segmentation_maps=Image.fromarray(raw), return_tensors="np")["semseg"][0]
    expected = reduced(raw)
    expected[0, 0] = 255
    np.testing.assert_array_equal(out, expected)
    assert set(np.unique(out)) == {0, 1, 2, 255}
    # Without the reduction the same map has an id (3) outside the 3 classes: refused, not trained as a shift; the
    # hint names the reduction first (raising num_classes would train "unlabelled" as a class).
    with pytest.raises(ValueError, match=r"class id 3 outside 0\.\.2: if 0 marks unlabelled .* --do_reduce_labels"):
        MultiMAEImageProcessor(num_classes=CLASSES)(segmentation_maps=raw)
    raw[3, 3] = 4
    with pytest.raises(ValueError, match=r"class ids \[4\], outside 1\.\.3 .*after the reduction \[3\]"):
        processor(segmentation_maps=raw)
    with pytest.raises(ValueError, match="ignore_index 0 would merge them"):
        MultiMAEImageProcessor(ignore_index=0, do_reduce_labels=True)
    saved = MultiMAEImageProcessor(do_reduce_labels=True).to_dict()
    assert saved["do_reduce_labels"] is True  # in preprocessor_config.json


def test_loader_checks_the_reduced_ids(tmp_path: Path) -> None:
    root = write_nyu_folder(tmp_path / "nyu", {"train": 2}, bad=("train_1", 4))
    with pytest.raises(ValueError, match=r"'train_1'.*semseg has class ids \[4\], outside 1\.\.3"):
        load_image_folder(root, "train", num_classes=CLASSES, do_reduce_labels=True)
    write_nyu_folder(tmp_path / "nyu", {"train": 2})
    dataset = load_image_folder(root, "train", num_classes=CLASSES, do_reduce_labels=True)
    assert len(dataset) == 2 and "do_reduce_labels" in dataset.info.description
    with pytest.raises(ValueError, match=r"class id 3 outside 0\.\.2: .*pass --do_reduce_labels true"):
        load_image_folder(root, "train", num_classes=CLASSES)  # the raw ids as classes: one too many


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mmmae") / "pretrained"
    torch.manual_seed(0)
    MultiMAEForPreTraining(tiny_config()).save_pretrained(path)
    return path


def finetune_argv(checkpoint: Path, folder: Path, output_dir: Path, *extra: str) -> list[str]:
    return [
        "--model_name_or_path", str(checkpoint), "--task", "semseg", "--output_dir", str(output_dir),
        "--image_folder", str(folder), "--num_labels", str(CLASSES), "--max_steps", "1",
        "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2", "--warmup_steps", "0",
        "--report_to", "none", "--disable_tqdm", "true", "--num_prediction_images", "0", *extra,
    ]  # fmt: skip


def test_finetune_dense_trains_and_scores_the_reduced_labels(checkpoint: Path, tmp_path: Path) -> None:
    folder = write_nyu_folder(tmp_path / "nyu", {"train": 2, "test": 2})
    out = tmp_path / "out"
    assert finetune.main(finetune_argv(checkpoint, folder, out, "--do_reduce_labels", "true")) == 0
    with np.load(out / "predictions_semseg.npz") as saved:
        labels, ids = saved["labels"], saved["ids"].tolist()
    assert ids == ["test_0", "test_1"]
    for label, stem in zip(labels, ids, strict=True):
        raw = np.asarray(Image.open(folder / "test" / "semseg" / f"{stem}.png"))
        height, width = label.shape
        expected = Image.fromarray(reduced(raw).astype(np.int32)).resize((width, height), Image.Resampling.NEAREST)
        np.testing.assert_array_equal(label, np.asarray(expected))  # 0 -> ignored, 1..3 -> classes 0..2
    assert json.loads((out / "preprocessor_config.json").read_text())["do_reduce_labels"] is True
    assert len(json.loads((out / "config.json").read_text())["id2label"]) == CLASSES


def test_finetune_dense_refuses_ids_above_the_classes_before_training(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = write_nyu_folder(tmp_path / "nyu", {"train": 2, "test": 1}, bad=("test_0", 4))
    out = tmp_path / "out"
    capsys.readouterr()  # the checkpoint fixture's progress bars
    assert finetune.main(finetune_argv(checkpoint, folder, out, "--do_reduce_labels", "true")) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "test_0" in error and "class ids [4], outside 1..3" in error
    assert not (out / "train_results.json").exists()
    # Scene data (ids from 0) and other tasks: the option does not apply.
    assert finetune.main(finetune_argv(checkpoint, folder, out, "--do_reduce_labels", "true", "--task", "depth")) == 2
    assert "--do_reduce_labels applies to --task semseg" in capsys.readouterr().err
    scenes_argv = finetune_argv(checkpoint, folder, out, "--do_reduce_labels", "true")
    scenes_argv[scenes_argv.index("--image_folder") : scenes_argv.index("--image_folder") + 2] = []
    assert finetune.main(scenes_argv) == 2
    assert "the generated scenes' class ids start at 0" in capsys.readouterr().err


def test_pretraining_recipe_reduces_the_labels(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = write_nyu_folder(tmp_path / "nyu", {"train": 4, "test": 2})
    out = tmp_path / "out"
    options = ["--image_folder", str(folder), "--num_semseg_classes", str(CLASSES), "--max_steps", "1"]
    result = pretraining.run(
        pretraining_argv(out, *options, "--num_reconstructions", "0", "--do_reduce_labels", "true")
    )
    assert np.isfinite(result["report"]["eval_task_loss"]["semseg"])
    processor = AutoImageProcessor.from_pretrained(out)  # the processor the run trained with
    raw = raw_labels(3)
    processed = processor(segmentation_maps=raw, return_tensors="np")["semseg"][0]
    resized = Image.fromarray(reduced(raw).astype(np.int32)).resize(processed.shape[::-1], Image.Resampling.NEAREST)
    np.testing.assert_array_equal(processed, np.asarray(resized))
    # Without the option the raw ids are refused (3 is no class of 0..2), before training.
    capsys.readouterr()
    assert pretraining.main(pretraining_argv(tmp_path / "raw", *options)) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "class id 3 outside 0..2: if 0 marks unlabelled pixels" in error
