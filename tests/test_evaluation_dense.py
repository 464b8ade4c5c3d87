"""The dense family through the suite command: tasks x seeds x checkpoints fine-tuned for real, average, worst task
named, deltas against a baseline, per-image predictions that recompute the scores, resumable cells, model-index."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_recipe_pretrain import single_thread
from test_vision_finetune import tiny_config

from robust_pretrain.evaluation import suite
from robust_pretrain.evaluation.checkpoints import checkpoint_key
from robust_pretrain.vision import scenes
from robust_pretrain.vision.collator import ModalityMaskCollator
from robust_pretrain.vision.finetune import recompute_metrics
from robust_pretrain.vision.image_processing_multimae import MultiMAEImageProcessor
from robust_pretrain.vision.modeling_multimae import MultiMAEForPreTraining

SIZE = 32
PRIMARY = {"semseg": "mean_iou", "depth": "delta1"}
DISPLAY = {"semseg": "Segmentation", "depth": "Depth"}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


def tiny_model(seed: int) -> MultiMAEForPreTraining:
    torch.manual_seed(seed)
    return MultiMAEForPreTraining(tiny_config())


def pretrain(path: Path, steps: int = 3) -> Path:
    """A few MM-MAE pre-training steps on generated (pre-training split) scenes, saved like a recipe output."""
    model = tiny_model(seed=0)
    data = scenes.generate_scenes(4, "train", 0, scenes.SceneConfig(image_size=SIZE))
    processed = MultiMAEImageProcessor(size=SIZE, num_classes=scenes.NUM_CLASSES)(
        images=data["rgb"], depth=data["depth"], semseg=data["semseg"]
    )
    examples = [
        {name: processed[name][i] for name in ("rgb", "depth", "semseg")} | {"id": data["id"][i]}
        for i in range(len(data))
    ]
    batch = ModalityMaskCollator(num_visible_tokens=8, patch_size=8)(examples)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    model.save_pretrained(path)
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_dense_suite_end_to_end(tmp_path: Path) -> None:
    pretrained = pretrain(tmp_path / "pretrained")
    baseline = tmp_path / "random-init"
    tiny_model(seed=1).save_pretrained(baseline)
    before = {path: snapshot(path) for path in (pretrained, baseline)}
    out = tmp_path / "suite"
    argv = ["--family", "dense", "--checkpoints", str(pretrained), "--baseline", str(baseline), "--tasks", "semseg",
            "depth", "--seeds", "1", "2", "--output_dir", str(out), "--num_train_scenes", "8", "--num_eval_scenes",
            "3", "--scene_size", str(SIZE), "--max_steps", "2", "--per_device_train_batch_size", "4",
            "--learning_rate", "1e-3", "--report_to", "none", "--disable_tqdm", "true",
            "--num_prediction_images", "1", "--fusion_hidden_size", "4"]  # fmt: skip
    summary = suite.run(argv)

    assert summary["family"] == "dense" and summary["tasks"] == ["semseg", "depth"]
    assert summary["limits"] == {"max_steps": 2} and summary["higher_is_better"]
    entries = {}
    for checkpoint in (pretrained, baseline):
        means = {}
        for task in ("semseg", "depth"):
            scores = []
            for seed in (1, 2):
                cell_dir = out / "cells" / checkpoint_key(str(checkpoint)) / task / f"seed{seed}"
                cell = json.loads((cell_dir / "cell.json").read_text())
                assert cell["prediction_files"] == [f"predictions_{task}.npz"]
                assert cell["settings"]["options"]["model"]["fusion_hidden_size"] == 4
                recomputed = recompute_metrics(cell_dir / f"predictions_{task}.npz")
                assert cell["score"] == pytest.approx(100 * recomputed[PRIMARY[task]])
                assert cell["metrics"][PRIMARY[task]] == cell["score"]
                scores.append(cell["score"])
            means[task] = statistics.fmean(scores)
            entry = summary["checkpoints"][str(checkpoint)]
            assert entry["tasks"][task]["mean"] == pytest.approx(means[task])
            assert entry["tasks"][task]["std"] == pytest.approx(statistics.stdev(scores))
        assert entry["average"] == pytest.approx(statistics.fmean(means.values()))
        assert entry["worst_task"] == min(means, key=means.__getitem__)
        entries[checkpoint] = entry
    delta = entries[pretrained]["delta"]
    assert delta["average"] == pytest.approx(entries[pretrained]["average"] - entries[baseline]["average"])
    assert delta["worst_score"] == pytest.approx(entries[pretrained]["worst_score"] - entries[baseline]["worst_score"])

    markdown = (out / "dense_suite.md").read_text()
    assert "| checkpoint | Segmentation (mIoU) | Depth (δ1) | average | worst task |" in markdown
    for checkpoint, entry in entries.items():
        worst = f"{entry['worst_score']:.1f} ({DISPLAY[entry['worst_task']]})"
        assert f"| {checkpoint.name} |" in markdown and f"| {entry['average']:.1f} | {worst} |" in markdown
    assert "Deltas against the baseline random-init" in markdown and "max_steps=2" in markdown
    assert (
        json.loads((out / "dense_suite.json").read_text())["checkpoints"][str(pretrained)]["worst_task"]
        == (entries[pretrained]["worst_task"])
    )
    index = json.loads((out / "model_cards" / checkpoint_key(str(pretrained)) / "model_index.json").read_text())
    metrics = {m["type"]: m["value"] for r in index["model-index"][0]["results"] for m in r["metrics"]}
    assert metrics["mean_iou"] == round(entries[pretrained]["tasks"]["semseg"]["metrics"]["mean_iou"], 2)
    assert metrics["delta1"] == round(entries[pretrained]["tasks"]["depth"]["metrics"]["delta1"], 2)
    assert {"pixel_accuracy", "abs_rel", "rmse"} <= set(metrics)
    assert {path: snapshot(path) for path in (pretrained, baseline)} == before  # checkpoints left untouched

    cell_file = out / "cells" / checkpoint_key(str(pretrained)) / "depth" / "seed2" / "cell.json"
    written = cell_file.stat().st_mtime_ns
    assert suite.run(argv) == summary  # every cell reused
    assert cell_file.stat().st_mtime_ns == written


def test_dense_suite_refuses_bad_checkpoints_before_any_cell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from robust_pretrain.vision.export import export_vit

    checkpoint = tmp_path / "mmmae"
    tiny_model(seed=0).save_pretrained(checkpoint)
    vit = export_vit(checkpoint, tmp_path / "vit")
    status = suite.main(
        [
            "--family",
            "dense",
            "--checkpoints",
            str(checkpoint),
            str(vit),
            "--tasks",
            "classification",
            "depth",
            "--output_dir",
            str(tmp_path / "suite"),
        ]
    )
    assert status == 2
    error = capsys.readouterr().err
    assert "--checkpoints" in error and f"{vit} is a ViT checkpoint; --task depth needs" in error
    status = suite.main(
        [
            "--family",
            "dense",
            "--checkpoints",
            str(checkpoint),
            "--tasks",
            "depth",
            "--input_modalities",
            "rgb",
            "depth",
            "--output_dir",
            str(tmp_path / "suite"),
        ]
    )
    assert status == 2 and "the depth task cannot read its own target" in capsys.readouterr().err
    assert not (tmp_path / "suite").exists()
