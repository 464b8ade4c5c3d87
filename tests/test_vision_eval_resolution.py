"""finetune_dense scores at each label's own resolution (issue 20 item 4): a PNG folder with 48x64 labels, a
non-square model input from the command line, the metric recomputed by hand from the saved model at the original
size (and differing from the squashed-label score), the Eigen crop and depth cap as options."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from ports import free_port
from processes import checkout_env
from test_recipe_pretrain import single_thread
from test_vision_finetune import checkpoint, tiny_config  # noqa: F401 (the module-scoped checkpoint fixture)

from robust_pretrain.vision.finetune.metrics import recompute_metrics
from robust_pretrain.vision.finetune.recipe import main
from robust_pretrain.vision.multimae.heads import MultiMAEForDepthEstimation, MultiMAEForSemanticSegmentation
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor

HEIGHT, WIDTH, CLASSES = 48, 64, 4
MODEL_CLASSES = {"semseg": MultiMAEForSemanticSegmentation, "depth": MultiMAEForDepthEstimation}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


def write_frames(
    root: Path, split: str, count: int, seed: int, height: int = HEIGHT, width: int = WIDTH, first: int = 0
) -> None:
    """rgb 8-bit, depth 16-bit mm (0 = missing), semseg 8-bit class ids with 255 = unlabelled; odd rows differ from
    even ones (depth x1.5, class + 1), so labels resized to the model input (every other row) change."""
    rng = np.random.default_rng(seed)
    for modality in ("rgb", "depth", "semseg"):
        (root / split / modality).mkdir(parents=True, exist_ok=True)
    odd_rows = (np.arange(height) % 2)[:, None]
    for index in range(first, first + count):
        stem = f"{split}_{index}"
        rgb = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(rgb).save(root / split / "rgb" / f"{stem}.png")
        depth = rng.integers(500, 6000, (height, width)) * (1 + 0.5 * odd_rows)
        depth = np.where(rng.random((height, width)) < 0.1, 0, depth).astype(np.uint16)
        Image.fromarray(depth).save(root / split / "depth" / f"{stem}.png")
        classes = 2 * rng.integers(0, CLASSES // 2, (height, width)) + odd_rows
        classes = np.where(rng.random((height, width)) < 0.05, 255, classes).astype(np.uint8)
        Image.fromarray(classes).save(root / split / "semseg" / f"{stem}.png")


def finetune(checkpoint_dir: Path, folder: Path, task: str, output_dir: Path, *extra: str) -> int:
    return main([
        "--model_name_or_path", str(checkpoint_dir), "--task", task, "--image_folder", str(folder),
        "--output_dir", str(output_dir), "--num_labels", str(CLASSES), "--image_size", "24", "32",
        "--max_steps", "2", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2",
        "--learning_rate", "1e-3", "--warmup_steps", "0", "--report_to", "none", "--disable_tqdm", "true",
        "--num_prediction_images", "1", *extra,
    ])  # fmt: skip


def mean_iou(predictions: list[np.ndarray], labels: list[np.ndarray]) -> float:
    confusion = np.zeros((CLASSES, CLASSES))
    for prediction, label in zip(predictions, labels, strict=True):
        kept = label != 255
        np.add.at(confusion, (label[kept], prediction[kept]), 1)
    union = confusion.sum(0) + confusion.sum(1) - np.diag(confusion)
    return float(np.mean(np.diag(confusion)[union > 0] / union[union > 0]))


def abs_rel(
    predictions: list[np.ndarray], labels: list[np.ndarray], crop: tuple[int, ...] | None = None, cap: float = 10.0
) -> float:
    errors = []
    for prediction, label in zip(predictions, labels, strict=True):
        window = np.zeros(label.shape, dtype=bool)
        top, bottom, left, right = crop or (0, label.shape[0], 0, label.shape[1])
        window[top:bottom, left:right] = True
        valid = (label > 1e-3) & (label < cap) & window
        clipped = np.clip(prediction[valid], 1e-3, cap)
        errors.append(np.mean(np.abs(clipped - label[valid]) / label[valid]))
    return float(np.mean(errors))


def by_hand(task: str, output_dir: Path, folder: Path, crop: tuple[int, ...] | None = None) -> tuple[float, float]:
    """The metric from the saved model and processor, at the labels' stored size (model output upsampled
    bilinearly, then argmax) and squashed (labels resized to the model input, nearest)."""
    processor = MultiMAEImageProcessor.from_pretrained(output_dir)
    model = MODEL_CLASSES[task].from_pretrained(output_dir).eval()
    at_size, squashed_predictions, labels, squashed_labels = [], [], [], []
    for rgb_path in sorted((folder / "validation" / "rgb").iterdir()):
        image = Image.open(rgb_path)
        target = Image.open(folder / "validation" / task / rgb_path.name)
        processed = processor.process_example({"rgb": image, task: target})
        with torch.no_grad():
            output = model(pixel_values=torch.from_numpy(processed["rgb"])[None])
        values = output.logits if task == "semseg" else output.predicted_depth[:, None]
        size = target.size[::-1]  # the label's own (height, width)
        upsampled = torch.nn.functional.interpolate(values, size=size, mode="bilinear", align_corners=False)
        if task == "semseg":
            at_size.append(upsampled[0].argmax(0).numpy())
            squashed_predictions.append(values[0].argmax(0).numpy())
            labels.append(np.asarray(target).astype(np.int64))
            squashed_labels.append(processed["semseg"])
        else:
            at_size.append(upsampled[0, 0].numpy())
            squashed_predictions.append(values[0, 0].numpy())
            labels.append(np.asarray(target).astype(np.float64) / 1000)
            squashed_labels.append(processed["depth"][0])
    if task == "semseg":
        return mean_iou(at_size, labels), mean_iou(squashed_predictions, squashed_labels)
    return abs_rel(at_size, labels, crop), abs_rel(squashed_predictions, squashed_labels)


@pytest.mark.slow
@pytest.mark.parametrize(("task", "metric"), [("semseg", "mean_iou"), ("depth", "abs_rel")])
def test_scores_at_the_labels_own_resolution(checkpoint: Path, tmp_path: Path, task: str, metric: str) -> None:  # noqa: F811
    folder = tmp_path / "frames"
    write_frames(folder, "train", 4, seed=1)
    write_frames(folder, "validation", 3, seed=2)
    output_dir = tmp_path / "out"
    assert finetune(checkpoint, folder, task, output_dir) == 0
    reported = json.loads((output_dir / "eval_results.json").read_text())[f"eval_{metric}"]
    assert json.loads((output_dir / "preprocessor_config.json").read_text())["size"] == {"height": 24, "width": 32}
    assert json.loads((output_dir / "config.json").read_text())["image_size"] == [24, 32]
    at_size, squashed = by_hand(task, output_dir, folder)
    assert reported == pytest.approx(at_size, rel=1e-5)
    assert abs(reported - squashed) > 1e-3
    saved = np.load(output_dir / f"predictions_{task}.npz")
    assert saved["labels"].shape == (3, HEIGHT, WIDTH) and saved["predictions"].shape == (3, HEIGHT, WIDTH)
    assert recompute_metrics(output_dir / f"predictions_{task}.npz")[metric] == pytest.approx(reported, rel=1e-6)


@pytest.mark.slow
def test_eigen_crop_and_depth_cap(checkpoint: Path, tmp_path: Path) -> None:  # noqa: F811
    folder = tmp_path / "nyu"
    write_frames(folder, "train", 2, seed=3, height=480, width=640)
    write_frames(folder, "validation", 2, seed=4, height=480, width=640)
    output_dir = tmp_path / "out"
    assert finetune(checkpoint, folder, "depth", output_dir, "--eigen_crop", "true", "--max_depth", "8") == 0
    reported = json.loads((output_dir / "eval_results.json").read_text())["eval_abs_rel"]
    processor = MultiMAEImageProcessor.from_pretrained(output_dir)
    model = MultiMAEForDepthEstimation.from_pretrained(output_dir).eval()
    predictions, labels = [], []
    for rgb_path in sorted((folder / "validation" / "rgb").iterdir()):
        processed = processor.process_example({"rgb": Image.open(rgb_path)})
        with torch.no_grad():
            depth = model(pixel_values=torch.from_numpy(processed["rgb"])[None]).predicted_depth[:, None]
        predictions.append(torch.nn.functional.interpolate(depth, size=(480, 640), mode="bilinear")[0, 0].numpy())
        label = np.asarray(Image.open(folder / "validation" / "depth" / rgb_path.name)).astype(np.float64) / 1000
        labels.append(label)
    assert reported == pytest.approx(abs_rel(predictions, labels, crop=(45, 471, 41, 601), cap=8.0), rel=1e-5)
    assert reported != pytest.approx(abs_rel(predictions, labels, cap=8.0), rel=1e-3)  # without the crop
    assert reported != pytest.approx(abs_rel(predictions, labels, crop=(45, 471, 41, 601)), rel=1e-3)  # no cap
    assert recompute_metrics(output_dir / "predictions_depth.npz")["abs_rel"] == pytest.approx(reported, rel=1e-6)


@pytest.mark.slow
def test_labels_of_several_sizes(checkpoint: Path, tmp_path: Path) -> None:  # noqa: F811
    """48x64 and 24x32 frames in one evaluation split: each scored at its own size (padded in the saved file)."""
    folder = tmp_path / "frames"
    write_frames(folder, "train", 4, seed=1)
    write_frames(folder, "validation", 2, seed=2)
    write_frames(folder, "validation", 2, seed=3, height=HEIGHT // 2, width=WIDTH // 2, first=2)
    output_dir = tmp_path / "out"
    assert finetune(checkpoint, folder, "semseg", output_dir) == 0
    reported = json.loads((output_dir / "eval_results.json").read_text())["eval_mean_iou"]
    assert reported == pytest.approx(by_hand("semseg", output_dir, folder)[0], rel=1e-5)
    saved = np.load(output_dir / "predictions_semseg.npz")
    assert saved["labels"].shape == (4, HEIGHT, WIDTH) and (saved["labels"][2:, HEIGHT // 2 :] == 255).all()


@pytest.mark.parametrize(
    ("task", "extra", "message"),
    [
        ("depth", ["--eigen_crop", "true"], "--eigen_crop: the Eigen crop is defined on 480x640 frames"),
        ("semseg", ["--eigen_crop", "true"], "--eigen_crop applies to --task depth"),
        ("semseg", ["--image_size", "20", "32"], "--image_size 20 32: not a multiple of the checkpoint's patch size 8"),
        ("semseg", ["--image_size", "8", "16", "24"], "--image_size [8, 16, 24]: one side or height width"),
    ],
)
def test_bad_evaluation_options_are_one_line(
    checkpoint: Path,  # noqa: F811
    tmp_path: Path,
    capsys,
    task: str,
    extra: list[str],
    message: str,
) -> None:
    folder = tmp_path / "frames"
    write_frames(folder, "train", 2, seed=1)
    write_frames(folder, "validation", 2, seed=2)
    assert finetune(checkpoint, folder, task, tmp_path / "out", *extra) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_two_processes_score_at_the_labels_own_resolution_like_one(checkpoint: Path, tmp_path: Path) -> None:  # noqa: F811
    """torchrun, 2 processes, 5 eval images (uneven shards): the padded label-size predictions and labels gather
    to the single-process ones and scores."""
    folder = tmp_path / "frames"
    write_frames(folder, "train", 4, seed=1)
    write_frames(folder, "validation", 5, seed=2)
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "finetune_dense.py"
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    common = ["--task", "semseg", "--image_folder", str(folder), "--num_labels", str(CLASSES), "--image_size", "24",
              "32", "--per_device_eval_batch_size", "2", "--report_to", "none", "--disable_tqdm", "true"]  # fmt: skip
    argv = ["--model_name_or_path", str(checkpoint), "--output_dir", str(tmp_path / "ddp"), "--max_steps", "2",
            "--per_device_train_batch_size", "2", *common]  # fmt: skip
    subprocess.run([*launch, str(recipe), *argv], check=True, env=checkout_env(OMP_NUM_THREADS="1"), timeout=600)
    distributed = json.loads((tmp_path / "ddp" / "all_results.json").read_text())
    assert distributed["eval_samples"] == 5
    assert distributed["eval_mean_iou"] == pytest.approx(by_hand("semseg", tmp_path / "ddp", folder)[0], rel=1e-5)
    one = main(["--model_name_or_path", str(tmp_path / "ddp"), "--output_dir", str(tmp_path / "one"),
                "--do_train", "false", *common])  # fmt: skip
    assert one == 0
    single = json.loads((tmp_path / "one" / "eval_results.json").read_text())
    assert single["eval_mean_iou"] == pytest.approx(distributed["eval_mean_iou"], rel=1e-6)
    saved = [dict(np.load(tmp_path / run / "predictions_semseg.npz")) for run in ("one", "ddp")]
    assert saved[0]["ids"].tolist() == saved[1]["ids"].tolist() and saved[0]["labels"].shape == (5, HEIGHT, WIDTH)
    np.testing.assert_array_equal(saved[0]["predictions"], saved[1]["predictions"])
    np.testing.assert_array_equal(saved[0]["labels"], saved[1]["labels"])
