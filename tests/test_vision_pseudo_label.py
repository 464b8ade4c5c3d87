import json

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (
    DPTConfig,
    DPTForDepthEstimation,
    DPTImageProcessorPil,
    SegformerConfig,
    SegformerForSemanticSegmentation,
    SegformerImageProcessorPil,
    pipeline,
)

from robust_pretrain.vision.loaders import load_image_folder, load_mapped_dataset
from robust_pretrain.vision.pseudo_label import depth_to_png, main, segments_to_class_map, write_folder_layout

NUM_LABELS = 5
HEIGHT, WIDTH = 24, 32


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    """Randomly initialised DPT (metric depth around 2 m) and SegFormer, saved with their image processors."""
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    dpt = DPTForDepthEstimation(
        DPTConfig(
            hidden_size=16,
            num_hidden_layers=4,
            num_attention_heads=2,
            intermediate_size=32,
            image_size=32,
            patch_size=8,
            neck_hidden_sizes=[8, 8, 16, 16],
            fusion_hidden_size=16,
            backbone_out_indices=[0, 1, 2, 3],
            head_hidden_size=8,
        )
    )
    with torch.no_grad():
        last = dpt.head.head[-2]  # the final convolution, before the ReLU
        last.weight.normal_(0.0, 0.5)
        last.bias.fill_(2.0)
    dpt.save_pretrained(root / "dpt")
    DPTImageProcessorPil(size={"height": 32, "width": 32}, keep_aspect_ratio=False).save_pretrained(root / "dpt")
    segformer = SegformerForSemanticSegmentation(
        SegformerConfig(
            num_encoder_blocks=2,
            depths=[1, 1],
            sr_ratios=[2, 1],
            hidden_sizes=[8, 16],
            patch_sizes=[7, 3],
            strides=[4, 2],
            num_attention_heads=[1, 2],
            mlp_ratios=[2, 2],
            decoder_hidden_size=16,
            num_labels=NUM_LABELS,
            id2label={i: f"class{i}" for i in range(NUM_LABELS)},
            label2id={f"class{i}": i for i in range(NUM_LABELS)},
        )
    )
    segformer.save_pretrained(root / "segformer")
    SegformerImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(root / "segformer")
    return {"depth": str(root / "dpt"), "segmentation": str(root / "segformer")}


def rgb_images(count: int = 3) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)) for _ in range(count)]


def expected_labels(models: dict[str, str], image: Image.Image) -> tuple[np.ndarray, np.ndarray]:
    """Depth (metres, float32) and class map computed from the models directly, without the pipelines."""
    depth_processor = DPTImageProcessorPil.from_pretrained(models["depth"])
    depth_model = DPTForDepthEstimation.from_pretrained(models["depth"]).eval()
    with torch.no_grad():
        outputs = depth_model(**depth_processor(image, return_tensors="pt"))
    metres = depth_processor.post_process_depth_estimation(outputs, [(HEIGHT, WIDTH)])[0]["predicted_depth"]
    depth = metres.numpy()
    seg_processor = SegformerImageProcessorPil.from_pretrained(models["segmentation"])
    seg_model = SegformerForSemanticSegmentation.from_pretrained(models["segmentation"]).eval()
    with torch.no_grad():
        outputs = seg_model(**seg_processor(image, return_tensors="pt"))
    classes = seg_processor.post_process_semantic_segmentation(outputs, [(HEIGHT, WIDTH)])[0]
    return depth, classes.numpy()


def assert_close_labels(depth_png: Image.Image, classes_png: Image.Image | None, expected, depth_scale: float):
    """Equal up to batching noise: depth within one PNG unit, classes on >= 99% of the pixels."""
    depth, classes = expected
    assert depth_png.mode == "I;16"
    assert np.abs(np.asarray(depth_png).astype(np.int64) - np.round(depth * depth_scale)).max() <= 1
    if classes_png is not None:
        assert classes_png.mode == "L" and (np.asarray(classes_png) == classes).mean() >= 0.99


@pytest.mark.slow
def test_folder_layout_in_folder_layout_out(tmp_path, tiny_models):
    source = tmp_path / "source"
    (source / "train" / "rgb").mkdir(parents=True)
    images = rgb_images()
    for index, image in enumerate(images):
        image.save(source / "train" / "rgb" / f"img{index}.jpg", quality=90)
    output = tmp_path / "labelled"
    status = main(
        [
            "--dataset",
            str(source),
            "--output_dir",
            str(output),
            "--depth_model",
            tiny_models["depth"],
            "--segmentation_model",
            tiny_models["segmentation"],
            "--batch_size",
            "2",
        ]
    )
    assert status == 0
    split = output / "train"
    assert sorted(p.name for p in (split / "rgb").iterdir()) == ["img0.jpg", "img1.jpg", "img2.jpg"]
    assert (split / "rgb" / "img1.jpg").read_bytes() == (source / "train" / "rgb" / "img1.jpg").read_bytes()
    for index in range(3):
        expected = expected_labels(tiny_models, Image.open(source / "train" / "rgb" / f"img{index}.jpg"))
        assert 1.0 < expected[0].mean() < 3.0  # metric depth around 2 m
        assert_close_labels(
            Image.open(split / "depth" / f"img{index}.png"),
            Image.open(split / "semseg" / f"img{index}.png"),
            expected,
            1000,
        )
    assert len(np.unique(np.asarray(Image.open(split / "semseg" / "img0.png")))) > 1
    dataset = load_image_folder(output, "train", num_classes=NUM_LABELS)
    assert dataset.column_names == ["id", "rgb", "depth", "semseg"] and len(dataset) == 3
    provenance = json.loads((output / "pseudo_labels.json").read_text())
    assert provenance["train"]["class_names"] == [f"class{i}" for i in range(NUM_LABELS)]
    assert provenance["train"]["rows"] == 3 and provenance["train"]["depth_scale"] == 1000.0


def test_dataset_in_parquet_dataset_out(tmp_path, tiny_models, capsys):
    source = tmp_path / "hub-like"
    (source / "data").mkdir(parents=True)
    images = rgb_images(2)
    datasets.Dataset.from_dict({"picture": images, "name": ["a", "b"]}).to_parquet(
        str(source / "data" / "test-00000-of-00001.parquet")
    )
    output = tmp_path / "out"
    arguments = [
        "--dataset",
        str(source),
        "--split",
        "test",
        "--rgb_column",
        "picture",
        "--id_column",
        "name",
        "--output_dir",
        str(output),
        "--depth_model",
        tiny_models["depth"],
        "--output_format",
        "dataset",
        "--depth_scale",
        "5000",
    ]
    assert main(arguments) == 0
    written = output / "data" / "test-00000-of-00001.parquet"
    assert written.is_file() and [p.name for p in (output / "data").iterdir()] == [written.name]
    loaded = load_mapped_dataset(str(output), {"rgb": "rgb", "depth": "depth", "id": "id"}, split="test")
    assert loaded["id"] == ["a", "b"] and "semseg" not in loaded.column_names
    assert_close_labels(loaded[1]["depth"], None, expected_labels(tiny_models, images[1]), 5000)
    assert np.array_equal(np.asarray(loaded[0]["rgb"]), np.asarray(images[0]))
    # Nothing is overwritten: the second run stops before labelling, the first result stays.
    before = written.read_bytes()
    assert main(arguments) == 2
    assert "exists already; nothing is overwritten" in capsys.readouterr().err
    assert written.read_bytes() == before


def test_a_failed_write_leaves_nothing(tmp_path):
    images = rgb_images(3)
    labelled = datasets.Dataset.from_dict(
        {"id": ["a", "b", "c"], "rgb": images, "depth": [Image.fromarray(np.ones((4, 4), np.uint16))] * 2 + [None]}
    )
    with pytest.raises(AttributeError):
        write_folder_layout(labelled, tmp_path, "train")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="ids must be unique file names"):
        write_folder_layout(labelled.select([0, 0]), tmp_path, "train")


def test_depth_and_class_conversions():
    png, clipped = depth_to_png(torch.tensor([[1.2346, -1.0, float("nan")], [70.0, 0.0004, 3.0]]), 1000.0)
    assert png.mode == "I;16" and clipped == 1
    assert np.asarray(png).tolist() == [[1235, 0, 0], [65535, 0, 3000]]
    masks = [np.zeros((2, 3), np.uint8) for _ in range(2)]
    masks[0][:, :1], masks[1][:, 1:] = 255, 255
    label2id = {"wall": 0, "chair": 300}
    image = segments_to_class_map(
        [{"label": "wall", "mask": Image.fromarray(masks[0])}, {"label": "chair", "mask": Image.fromarray(masks[1])}],
        label2id,
        (3, 2),
    )
    assert image.mode == "I;16" and np.asarray(image).tolist() == [[0, 300, 300], [0, 300, 300]]


def test_the_pipelines_accept_ready_objects(tiny_models):
    from robust_pretrain.vision.pseudo_label import pseudo_label

    dataset = datasets.Dataset.from_dict({"id": ["x"], "rgb": rgb_images(1)})
    segmenter = pipeline("image-segmentation", model=tiny_models["segmentation"])
    labelled = pseudo_label(dataset, segmentation_model=segmenter)
    assert labelled.column_names == ["id", "rgb", "semseg"]
    expected = expected_labels(tiny_models, rgb_images(1)[0])[1]
    assert np.array_equal(np.asarray(labelled[0]["semseg"]), expected)  # one image: no batching noise
    with pytest.raises(ValueError, match=r"already has the column\(s\) \['semseg'\]"):
        pseudo_label(labelled, segmentation_model=segmenter)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "give --depth_model and/or --segmentation_model"),
        (["--depth_model", "DEPTH", "--output_format", "zip"], "--output-format: invalid choice: 'zip'"),
        (["--depth_model", "./no/such/model"], "--depth_model ./no/such/model: no such checkpoint directory"),
        (["--depth_model", "DEPTH", "--rgb_column", "photo"], "no column 'photo' (mapped to rgb)"),
    ],
)
def test_bad_options_are_reported(tmp_path, tiny_models, capsys, arguments, message):
    source = tmp_path / "src"
    (source / "data").mkdir(parents=True)
    datasets.Dataset.from_dict({"image": rgb_images(1)}).to_parquet(str(source / "data" / "train-0.parquet"))
    arguments = [tiny_models["depth"] if a == "DEPTH" else a for a in arguments]
    assert main(["--dataset", str(source), "--output_dir", str(tmp_path / "out"), *arguments]) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "out").exists()
