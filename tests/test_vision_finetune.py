"""finetune_dense: each head trains and evaluates on the generated scenes and on a folder layout; LoRA; metrics
recomputed by hand from the per-image prediction files; bad input refused before training."""

from __future__ import annotations

import csv
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
from transformers import BertConfig, BertModel

from robust_pretrain.cli import UsageError
from robust_pretrain.vision import scenes
from robust_pretrain.vision.finetune.arguments import DenseRunArguments
from robust_pretrain.vision.finetune.metrics import recompute_metrics
from robust_pretrain.vision.finetune.model import parameter_groups
from robust_pretrain.vision.finetune.recipe import main, run
from robust_pretrain.vision.multimae.configuration_multimae import MultiMAEConfig, default_modalities
from robust_pretrain.vision.multimae.export import export_vit
from robust_pretrain.vision.multimae.heads import MultiMAEForSemanticSegmentation
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor
from robust_pretrain.vision.multimae.pretraining import MultiMAEForPreTraining

SIZE = 32
PRIMARY = {"semseg": "eval_mean_iou", "depth": "eval_delta1", "classification": "eval_top1_accuracy"}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread (the CI machine's cores are shared)."""
    with single_thread():
        yield


def tiny_config(**overrides) -> MultiMAEConfig:
    settings = dict(
        modalities=[vars(spec) for spec in default_modalities(scenes.NUM_CLASSES)],
        image_size=SIZE,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        decoder_hidden_size=32,
        decoder_num_hidden_layers=1,
        decoder_num_attention_heads=2,
        decoder_intermediate_size=64,
        neck_hidden_sizes=[8, 8, 8, 8],
        fusion_hidden_size=8,
    )
    return MultiMAEConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mmmae") / "pretrained"
    torch.manual_seed(0)
    MultiMAEForPreTraining(tiny_config()).save_pretrained(path)
    return path


def write_folder(root: Path, split: str, rows: list[dict], labels: bool = True) -> None:
    """Scenes as the folder layout: rgb PNG, depth 16-bit PNG (mm), semseg 8-bit PNG, labels.csv (class names)."""
    for modality in ("rgb", "depth", "semseg"):
        (root / split / modality).mkdir(parents=True, exist_ok=True)
    for row in rows:
        for modality in ("rgb", "depth", "semseg"):
            row[modality].save(root / split / modality / f"{row['id']}.png")
    if labels:
        with (root / split / "labels.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["id", "label"])
            writer.writerows([row["id"], scenes.LABEL_NAMES[row["label"]]] for row in rows)


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("folder")
    config = scenes.SceneConfig(image_size=SIZE)
    for split, count, seed in (("train", 6, 5), ("validation", 3, 6)):
        rows = list(scenes.generate_scenes(count, "downstream_train", seed, config))
        for index, row in enumerate(rows):
            row["id"] = f"{split}_{index}"
        write_folder(root, split, rows)
    return root


def finetune(checkpoint: Path, task: str, output_dir: Path, *extra: str) -> dict[str, float]:
    return run([
        "--model_name_or_path", str(checkpoint), "--task", task, "--output_dir", str(output_dir),
        "--num_train_scenes", "8", "--num_eval_scenes", "4", "--scene_size", str(SIZE), "--max_steps", "3",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "2", "--warmup_steps", "1",
        "--learning_rate", "1e-3", "--report_to", "none", "--disable_tqdm", "true", "--num_prediction_images", "2",
        *extra,
    ])  # fmt: skip


def metrics_by_hand(task: str, saved: dict[str, np.ndarray]) -> dict[str, float]:
    """The reported metrics from the prediction file, with numpy only (independent of the metric modules)."""
    predictions, labels = saved["predictions"], saved["labels"]
    if task == "classification":
        return {"eval_top1_accuracy": float(np.mean(predictions.argmax(axis=1) == labels))}
    if task == "semseg":
        classes = len(saved["label_names"])
        kept = labels != 255
        confusion = np.zeros((classes, classes))
        np.add.at(confusion, (labels[kept], predictions[kept]), 1)
        union = confusion.sum(0) + confusion.sum(1) - np.diag(confusion)
        present = union > 0
        ious = np.diag(confusion)[present] / union[present]
        result = {"eval_mean_iou": ious.mean(), "eval_pixel_accuracy": np.trace(confusion) / kept.sum()}
        names = saved["label_names"][present]
        result.update({f"eval_iou_{name}": iou for name, iou in zip(names, ious, strict=True)})
        return result
    deltas = []
    for prediction, label in zip(predictions, labels, strict=True):
        valid = (label > 1e-3) & (label < 10.0)
        clipped = np.clip(prediction[valid], 1e-3, 10.0)
        deltas.append(np.mean(np.maximum(clipped / label[valid], label[valid] / clipped) < 1.25))
    return {"eval_delta1": float(np.mean(deltas))}


def check_outputs(
    task: str, output_dir: Path, metrics: dict[str, float], expected_ids: list[str], plotted_rows: int = 2
) -> None:
    reported = json.loads((output_dir / "all_results.json").read_text())
    assert reported[PRIMARY[task]] == pytest.approx(metrics[PRIMARY[task]])
    assert np.isfinite(reported["train_loss"]) and reported["train_samples"] > 0
    with np.load(output_dir / f"predictions_{task}.npz") as saved:
        saved = dict(saved)
    assert saved["ids"].tolist() == expected_ids
    by_hand = metrics_by_hand(task, saved)
    for key, value in by_hand.items():
        assert reported[key] == pytest.approx(value, abs=1e-6), key
    recomputed = recompute_metrics(output_dir / f"predictions_{task}.npz")
    assert {f"eval_{key}": value for key, value in recomputed.items()} == pytest.approx(
        {key: value for key, value in reported.items() if key[len("eval_") :] in recomputed}
    )
    with Image.open(output_dir / "predictions.png") as plot:  # 2.6-inch panels at 100 dpi
        columns = 1 if task == "classification" else 3  # input (titled with both classes) / input, prediction, target
        assert plot.size == (260 * columns, 260 * plotted_rows)
    card = (output_dir / "README.md").read_text()
    assert f"## Fine-tuning: {task}" in card and f"value: {round(reported[PRIMARY[task]], 4)}" in card


@pytest.mark.slow
@pytest.mark.parametrize("task", ["semseg", "depth", "classification"])
def test_each_head_on_generated_scenes(checkpoint: Path, task: str, tmp_path: Path) -> None:
    metrics = finetune(checkpoint, task, tmp_path / task)
    downstream = scenes.generate_scenes(4, "downstream_test", 0, scenes.SceneConfig(image_size=SIZE))
    check_outputs(task, tmp_path / task, metrics, downstream["id"])
    assert (tmp_path / task / "model.safetensors").is_file()
    if task == "semseg":  # per-class IoU flattened into keys, one per class present
        assert {key for key in metrics if key.startswith("eval_iou_")} <= {
            f"eval_iou_{name}" for name in scenes.CLASS_NAMES
        }


@pytest.mark.slow
@pytest.mark.parametrize("task", ["semseg", "depth", "classification"])
def test_each_head_on_a_folder_layout(checkpoint: Path, image_folder: Path, task: str, tmp_path: Path) -> None:
    extra = ["--num_labels", str(scenes.NUM_CLASSES)] if task == "semseg" else []
    metrics = finetune(checkpoint, task, tmp_path / task, "--image_folder", str(image_folder), *extra)
    check_outputs(task, tmp_path / task, metrics, [f"validation_{i}" for i in range(3)])
    if task == "classification":
        rows = (tmp_path / task / "predict_results_classification.txt").read_text().splitlines()
        assert rows[0] == "index\tid\tprediction\tlabel" and len(rows) == 4
        with (image_folder / "validation" / "labels.csv").open() as handle:
            assert [row.split("\t")[3] for row in rows[1:]] == [row["label"] for row in csv.DictReader(handle)]


@pytest.mark.slow
def test_datasets_dataset_with_column_mapping_and_depth_input(checkpoint: Path, tmp_path: Path) -> None:
    """A local ``datasets`` dataset whose columns have other names; depth fed as a second input."""
    config = scenes.SceneConfig(image_size=SIZE)
    for split, count in (("train", 4), ("test", 3)):
        data = scenes.generate_scenes(count, "downstream_train", 7 if split == "train" else 8, config)
        data = data.rename_columns({"rgb": "image", "semseg": "annotation", "depth": "depth_mm"})
        data.to_parquet(tmp_path / "data" / f"{split}.parquet")
    out = tmp_path / "out"
    metrics = finetune(checkpoint, "semseg", out, "--dataset_name", str(tmp_path / "data"), "--num_labels", "7",
                       "--column_mapping", "rgb=image", "semseg=annotation", "depth=depth_mm", "id=id",
                       "--input_modalities", "rgb", "depth", "--neck_hidden_sizes", "4", "4", "8", "8",
                       "--fusion_hidden_size", "4")  # fmt: skip
    check_outputs("semseg", out, metrics, scenes.generate_scenes(3, "downstream_train", 8, config)["id"])
    saved = json.loads((out / "config.json").read_text())
    assert saved["finetune_modalities"] == ["rgb", "depth"]
    assert saved["neck_hidden_sizes"] == [4, 4, 8, 8] and saved["fusion_hidden_size"] == 4  # the head's own sizes
    with pytest.raises(UsageError, match=r"--column_mapping maps no column to \['semseg'\]"):
        finetune(
            checkpoint,
            "semseg",
            tmp_path / "unmapped",
            "--dataset_name",
            str(tmp_path / "data"),
            "--num_labels",
            "7",
            "--column_mapping",
            "rgb=image",
        )


@pytest.mark.slow
def test_lora_trains_adapters_and_saves_the_head(checkpoint: Path, tmp_path: Path) -> None:
    from peft import PeftModel

    out = tmp_path / "lora"
    finetune(checkpoint, "semseg", out, "--use_lora", "true", "--lora_r", "4")
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["modules_to_save"] == ["neck", "head.head"]
    assert not (out / "model.safetensors").exists()
    # The saved adapter + head reproduce the saved predictions of the first eval image.
    config = MultiMAEConfig.from_pretrained(checkpoint, num_labels=scenes.NUM_CLASSES)
    base = MultiMAEForSemanticSegmentation.from_pretrained(checkpoint, config=config)
    model = PeftModel.from_pretrained(base, out).eval()
    image = scenes.generate_scenes(1, "downstream_test", 0, scenes.SceneConfig(image_size=SIZE))[0]["rgb"]
    pixels = MultiMAEImageProcessor.from_pretrained(out)(images=image)["rgb"]
    with torch.no_grad():
        predicted = model(pixel_values=pixels).logits.argmax(1)[0].numpy()
    with np.load(out / "predictions_semseg.npz") as saved:
        np.testing.assert_array_equal(predicted, saved["predictions"][0])
    # The encoder stayed frozen: its weights equal the checkpoint's.
    merged = model.merge_and_unload()
    reference = MultiMAEForSemanticSegmentation.from_pretrained(checkpoint, config=config)
    assert not torch.equal(
        merged.multimae.layers[0].attention.q_proj.weight, reference.multimae.layers[0].attention.q_proj.weight
    )  # LoRA delta merged in
    torch.testing.assert_close(merged.multimae.layers[0].mlp.fc1.weight, reference.multimae.layers[0].mlp.fc1.weight)


@pytest.mark.slow
def test_vit_checkpoint_fine_tunes_for_classification(checkpoint: Path, tmp_path: Path) -> None:
    vit = export_vit(checkpoint, tmp_path / "vit")
    metrics = finetune(vit, "classification", tmp_path / "out")
    downstream = scenes.generate_scenes(4, "downstream_test", 0, scenes.SceneConfig(image_size=SIZE))
    check_outputs("classification", tmp_path / "out", metrics, downstream["id"])
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["ViTForImageClassification"]
    with pytest.raises(UsageError, match="is a ViT checkpoint; --task semseg needs"):
        finetune(vit, "semseg", tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


@pytest.mark.slow
def test_two_processes_train_and_evaluate_like_one(checkpoint: Path, tmp_path: Path) -> None:
    """torchrun, 2 processes: every eval image is scored once (5 images, uneven shards), the main process writes;
    the saved model evaluated by one process gives the same predictions and scores."""
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "finetune_dense.py"
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    common = ["--task", "depth", "--num_train_scenes", "8", "--num_eval_scenes", "5", "--scene_size", str(SIZE),
              "--per_device_eval_batch_size", "2", "--report_to", "none", "--disable_tqdm", "true"]  # fmt: skip
    argv = ["--model_name_or_path", str(checkpoint), "--output_dir", str(tmp_path / "ddp"), "--max_steps", "2",
            "--per_device_train_batch_size", "2", *common]  # fmt: skip
    subprocess.run([*launch, str(recipe), *argv], check=True, env=checkout_env(OMP_NUM_THREADS="1"), timeout=600)
    downstream = scenes.generate_scenes(5, "downstream_test", 0, scenes.SceneConfig(image_size=SIZE))
    distributed = json.loads((tmp_path / "ddp" / "all_results.json").read_text())
    check_outputs("depth", tmp_path / "ddp", distributed, downstream["id"], plotted_rows=4)
    assert distributed["eval_samples"] == 5 and distributed["train_samples"] == 8
    assert distributed["epoch"] == 1.0  # 2 steps x 2 processes x 2 images: torchrun on CPU joined one DDP group

    single = run(["--model_name_or_path", str(tmp_path / "ddp"), "--output_dir", str(tmp_path / "one"),
                  "--do_train", "false", *common])  # fmt: skip
    for key in ("eval_delta1", "eval_abs_rel", "eval_rmse"):
        assert single[key] == pytest.approx(distributed[key], rel=1e-5)
    one, two = (dict(np.load(tmp_path / run / "predictions_depth.npz")) for run in ("one", "ddp"))
    assert one["ids"].tolist() == two["ids"].tolist()
    np.testing.assert_allclose(one["predictions"], two["predictions"], rtol=1e-5, atol=1e-6)


def test_layer_wise_learning_rate_decay() -> None:
    model = MultiMAEForSemanticSegmentation(tiny_config(num_labels=3))
    groups = parameter_groups(model, num_layers=2, learning_rate=1.0, weight_decay=0.05, layer_decay=0.5)
    lr_of = {id(p): (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert lr_of[id(named["multimae.embeddings.global_tokens"])] == (0.125, 0.0)
    assert lr_of[id(named["multimae.embeddings.patch_embeddings.rgb.projection.weight"])] == (0.125, 0.05)
    assert lr_of[id(named["multimae.layers.0.attention.q_proj.weight"])] == (0.25, 0.05)
    assert lr_of[id(named["multimae.layers.1.attention.q_proj.bias"])] == (0.5, 0.0)
    assert lr_of[id(named["multimae.layernorm.weight"])] == (1.0, 0.0)
    assert lr_of[id(named["head.head.0.weight"])] == (1.0, 0.05)
    assert groups[0]["lr"] == 1.0  # the head's lr is the one the Trainer logs
    assert sum(len(g["params"]) for g in groups) == len(named)


# ------------------------------------------------------------------------------------------------- bad input


def broken_folder(root: Path, problem: str) -> Path:
    rows = list(scenes.generate_scenes(3, "downstream_train", 1, scenes.SceneConfig(image_size=SIZE)))
    for split in ("train", "validation"):
        write_folder(root, split, [dict(row, id=f"{split}{i}") for i, row in enumerate(rows)])
    bad = root / "train" / problem / "train1.png"
    if problem == "semseg":
        Image.fromarray(np.full((SIZE, SIZE // 2), 1, np.uint8)).save(bad)  # wrong aspect ratio
    elif problem == "classes":
        bad = root / "train" / "semseg" / "train1.png"
        Image.fromarray(np.full((SIZE, SIZE), 9, np.uint8)).save(bad)  # class 9 of 7
    elif problem == "depth":
        Image.fromarray(np.zeros((SIZE, SIZE), np.uint16)).save(bad)  # no valid pixel
    elif problem == "empty":
        for path in (root / "validation").rglob("*.png"):
            path.unlink()
        bad = root / "validation"
    return bad


@pytest.mark.parametrize(
    ("task", "problem", "message"),
    [
        ("semseg", "semseg", "different aspect ratios"),
        ("semseg", "classes", r"class ids \[9\] outside 0..6"),
        ("depth", "depth", "depth map has no valid pixel"),
        ("semseg", "empty", "no example has all of"),
    ],
)
def test_bad_data_is_refused_before_training(
    checkpoint: Path, tmp_path: Path, task: str, problem: str, message: str
) -> None:
    bad = broken_folder(tmp_path / "data", problem)
    out = tmp_path / "out"
    with pytest.raises(UsageError, match=message) as error:
        finetune(checkpoint, task, out, "--image_folder", str(tmp_path / "data"), "--num_labels", "7")
    assert str(bad) in str(error.value)
    assert "--image_folder" in str(error.value)
    assert not out.exists()


def test_classification_labels_outside_the_classes(checkpoint: Path, tmp_path: Path) -> None:
    broken_folder(tmp_path / "data", "none")
    with pytest.raises(UsageError, match=r"labels \['sphere'\] are not among --class_names \['box', 'cylinder'\]"):
        finetune(
            checkpoint,
            "classification",
            tmp_path / "out",
            "--image_folder",
            str(tmp_path / "data"),
            "--class_names",
            "box",
            "cylinder",
        )
    assert not (tmp_path / "out").exists()


def test_bad_checkpoint_task_and_output_dir(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bert = tmp_path / "bert"
    config = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    BertModel(config).save_pretrained(bert)
    with pytest.raises(UsageError, match=r"--model_name_or_path .*bert: config.json has model_type 'bert'"):
        finetune(bert, "semseg", tmp_path / "out")
    with pytest.raises(UsageError, match="--task 'segmentation' is not a known task"):
        DenseRunArguments(model_name_or_path=str(checkpoint), task="segmentation")
    status = main(["--model_name_or_path", str(checkpoint), "--task", "segmentation", "--output_dir", str(tmp_path)])
    assert status == 2 and "--task: invalid choice: 'segmentation'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("keep me")
    status = main(
        [
            "--model_name_or_path",
            str(checkpoint),
            "--task",
            "depth",
            "--output_dir",
            str(taken),
            "--num_train_scenes",
            "2",
            "--num_eval_scenes",
            "1",
            "--scene_size",
            str(SIZE),
        ]
    )
    assert status == 2 and "--output_dir" in capsys.readouterr().err
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]
