"""The dense family through the suite command: tasks x seeds x checkpoints fine-tuned for real, average, worst task
named, deltas against a baseline, per-image predictions that recompute the scores, resumable cells, model-index."""

from __future__ import annotations

import importlib.util
import json
import math
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
from robust_pretrain.vision.finetune.metrics import recompute_metrics
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor
from robust_pretrain.vision.multimae.pretraining import MultiMAEForPreTraining

SIZE = 32
EVIDENCE_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "vision_evidence.py"
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
    from robust_pretrain.vision.multimae.export import export_vit

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


def test_random_init_row_ignores_the_weights_and_is_marked(tmp_path: Path) -> None:
    """``random-init:<checkpoint>`` fine-tunes the architecture from weights drawn with the cell's seed: two
    checkpoints that share a config but not their weights give the same random-init score, and a row, cell key, card
    and model index of their own that say so."""
    first, second = tmp_path / "first", tmp_path / "second"
    tiny_model(seed=0).save_pretrained(first)
    tiny_model(seed=1).save_pretrained(second)
    out = tmp_path / "suite"
    entries = [str(first), f"random-init:{first}", f"random-init:{second}"]
    argv = ["--family", "dense", "--checkpoints", *entries, "--tasks", "depth", "--seeds", "3",
            "--output_dir", str(out), "--num_train_scenes", "4", "--num_eval_scenes", "2", "--scene_size", str(SIZE),
            "--max_steps", "1", "--per_device_train_batch_size", "4", "--report_to", "none",
            "--disable_tqdm", "true", "--num_prediction_images", "0", "--fusion_hidden_size", "4"]  # fmt: skip
    summary = suite.run(argv)

    rows = summary["checkpoints"]
    assert rows[f"random-init:{first}"]["label"] == "random-init:first"
    assert rows[f"random-init:{first}"]["average"] == rows[f"random-init:{second}"]["average"]
    assert rows[f"random-init:{first}"]["average"] != rows[str(first)]["average"]
    cells = {entry: out / "cells" / checkpoint_key(entry) / "depth" / "seed3" for entry in entries}
    assert len(set(cells.values())) == 3  # keyed apart from each other and from the checkpoint itself
    settings = json.loads((cells[f"random-init:{first}"] / "cell.json").read_text())["settings"]
    assert settings["checkpoint"] == f"random-init:{first.resolve()}"
    assert list(settings["checkpoint_state"]) == ["config.json"]  # the weights are not part of it
    assert "| random-init:first |" in (out / "dense_suite.md").read_text()
    card = out / "model_cards" / checkpoint_key(f"random-init:{first}")
    assert json.loads((card / "model_index.json").read_text())["model-index"][0]["name"] == "random-init:first"
    fine_tuning_card = (cells[f"random-init:{first}"] / "README.md").read_text()
    assert "from random initialisation" in fine_tuning_card
    assert "from random initialisation" not in (cells[str(first)] / "README.md").read_text()


def _suite_entry(scores: dict[str, list[float]]) -> dict:
    return {"tasks": {task: {"scores": values} for task, values in scores.items()}}


def test_vision_evidence_compares_pretrained_runs_with_the_random_init_row() -> None:
    """The protocol addendum's statistic: per-run task averages, pre-trained runs pooled and per objective, Welch
    standard errors against the random-init row, and the verdict of its rule."""
    spec = importlib.util.spec_from_file_location("vision_evidence", EVIDENCE_SCRIPT)
    evidence = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(evidence)
    suite = {
        "tasks": ["semseg", "depth"],
        "checkpoints": {
            "c/average/seed-42": _suite_entry({"semseg": [30.0, 32.0], "depth": [70.0, 72.0]}),
            "c/minimax/seed-42": _suite_entry({"semseg": [31.0, 29.0], "depth": [74.0, 70.0]}),
            "random-init:c/average/seed-42": _suite_entry({"semseg": [20.0, 22.0], "depth": [71.0, 69.0]}),
        },
    }
    result = evidence.compare_with_random_init(suite)
    assert result["random_init"] == "random-init:c/average/seed-42"
    assert list(result["rows"]) == ["random init", "pooled", "average", "minimax"]
    pooled_averages = [50.0, 52.0, 52.5, 49.5]  # per run: mean of semseg and depth
    random_averages = [45.5, 45.5]
    pooled = result["rows"]["pooled"]["average"]
    assert pooled["n"] == 4 and pooled["mean"] == pytest.approx(51.0)
    assert pooled["delta"] == pytest.approx(51.0 - 45.5)
    error = math.sqrt(statistics.variance(pooled_averages) / 4 + statistics.variance(random_averages) / 2)
    assert pooled["in_standard_errors"] == pytest.approx(5.5 / error)
    assert result["rows"]["minimax"]["semseg"]["delta"] == pytest.approx(30.0 - 21.0)
    assert result["rows"]["random init"]["depth"] == {"mean": 70.0, "std": pytest.approx(math.sqrt(2)), "n": 2}
    depth_se = result["rows"]["pooled"]["depth"]["in_standard_errors"]
    assert abs(depth_se) < 2 and result["verdict"] == "pre-training helps"
    suite["checkpoints"]["random-init:c/average/seed-42"] = _suite_entry(
        {"semseg": [40.0, 42.0], "depth": [71.0, 69.0]}
    )
    assert evidence.compare_with_random_init(suite)["verdict"] == "pre-training hurts"
