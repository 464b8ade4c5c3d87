import logging
from pathlib import Path

import datasets
import numpy as np
import pytest
from PIL import Image

from robust_pretrain.vision.loaders import UnmatchedStemsError, load_image_folder, load_mapped_dataset
from robust_pretrain.vision.scenes import SceneConfig, generate_scenes

SIZE = 16


@pytest.fixture(scope="module")
def scenes() -> datasets.Dataset:
    return generate_scenes(4, split="test", config=SceneConfig(image_size=SIZE))


def write_layout(
    root: Path,
    scenes: datasets.Dataset,
    split: str = "train",
    modalities=("rgb", "depth", "semseg"),
    rgb_format: str = "jpg",
) -> list[str]:
    stems = [f"{i:04d}" for i in range(len(scenes))]
    for modality in modalities:
        (root / split / modality).mkdir(parents=True, exist_ok=True)
    for stem, row in zip(stems, scenes, strict=True):
        for modality in modalities:
            extension = rgb_format if modality == "rgb" else "png"
            row[modality].save(root / split / modality / f"{stem}.{extension}")
    return stems


def test_folder_layout_matched_by_stem(tmp_path, scenes):
    stems = write_layout(tmp_path, scenes)
    dataset = load_image_folder(tmp_path, "train", num_classes=7, patch_size=4)
    assert dataset.column_names == ["id", "rgb", "depth", "semseg"] and dataset["id"] == stems
    row, source = dataset[2], scenes[2]
    assert row["depth"].mode == "I;16" and np.array_equal(np.asarray(row["depth"]), np.asarray(source["depth"]))
    assert np.array_equal(np.asarray(row["semseg"]), np.asarray(source["semseg"]))
    assert row["rgb"].size == (SIZE, SIZE) and row["rgb"].mode == "RGB"
    # Files are referenced, not copied.
    lazy = dataset.cast_column("rgb", datasets.Image(decode=False))[2]["rgb"]
    assert lazy["bytes"] is None and lazy["path"] == str(tmp_path / "train" / "rgb" / "0002.jpg")


def test_missing_modality_folder_is_an_absent_task(tmp_path, scenes):
    write_layout(tmp_path, scenes, modalities=("rgb", "depth"))
    assert load_image_folder(tmp_path).column_names == ["id", "rgb", "depth"]
    assert load_image_folder(tmp_path, modalities=("rgb",)).column_names == ["id", "rgb"]


def test_unmatched_stems_are_reported_or_dropped(tmp_path, scenes, caplog):
    write_layout(tmp_path, scenes)
    (tmp_path / "train" / "depth" / "0001.png").unlink()
    (tmp_path / "train" / "semseg" / "0003.png").unlink()
    scenes[0]["semseg"].save(tmp_path / "train" / "semseg" / "extra.png")
    with pytest.raises(UnmatchedStemsError) as error:
        load_image_folder(tmp_path)
    message = str(error.value)
    assert "only in rgb, semseg: 0001" in message and "only in depth, rgb: 0003" in message
    assert "only in semseg: extra" in message and set(error.value.unmatched) == {"0001", "0003", "extra"}
    with caplog.at_level(logging.WARNING, logger="robust_pretrain.vision.loaders"):
        dataset = load_image_folder(tmp_path, unmatched="drop")
    assert dataset["id"] == ["0000", "0002"] and "dropped 3" in caplog.text and "extra" in caplog.text


def write_single(tmp_path: Path, **arrays) -> None:
    for modality, array in arrays.items():
        (tmp_path / "train" / modality).mkdir(parents=True, exist_ok=True)
        Image.fromarray(array).save(tmp_path / "train" / modality / "frame7.png")


@pytest.mark.parametrize(
    ("arrays", "options", "message"),
    [
        (
            {"rgb": np.zeros((8, 8, 3), np.uint8), "depth": np.zeros((8, 8), np.uint16)},
            {},
            "depth map has no valid pixel",
        ),
        ({"semseg": np.full((8, 8), 12, np.uint8)}, {"num_classes": 7}, r"class ids \[12\] outside 0..6"),
        ({"rgb": np.zeros((3, 8, 3), np.uint8)}, {"patch_size": 4}, "smaller than one 4x4 patch"),
        ({"rgb": np.zeros((8, 8, 3), np.uint8), "semseg": np.zeros((8, 12), np.uint8)}, {}, "different aspect ratios"),
    ],
)
def test_bad_examples_name_their_files(tmp_path, arrays, options, message):
    write_single(tmp_path, **arrays)
    with pytest.raises(ValueError, match=message) as error:
        load_image_folder(tmp_path, **options)
    assert "'frame7'" in str(error.value) and str(tmp_path / "train") in str(error.value)


def test_same_aspect_at_another_resolution_is_accepted(tmp_path):
    write_single(tmp_path, rgb=np.zeros((8, 12, 3), np.uint8), depth=np.full((4, 6), 900, np.uint16))
    assert len(load_image_folder(tmp_path)) == 1


def test_corrupt_and_stray_files_are_named(tmp_path, scenes):
    write_layout(tmp_path, scenes)
    broken = tmp_path / "train" / "depth" / "0002.png"
    broken.write_bytes(broken.read_bytes()[:40])
    with pytest.raises(ValueError, match=rf"{broken}: cannot read the image"):
        load_image_folder(tmp_path)
    assert len(load_image_folder(tmp_path, validate=False)) == 4  # checks skipped on request
    (tmp_path / "train" / "rgb" / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="notes.txt: not an image file"):
        load_image_folder(tmp_path)
    (tmp_path / "train" / "rgb" / "notes.txt").unlink()
    scenes[0]["rgb"].save(tmp_path / "train" / "rgb" / "0000.png")
    with pytest.raises(ValueError, match="two files with the stem '0000'"):
        load_image_folder(tmp_path)
    with pytest.raises(FileNotFoundError, match="no modality folder"):
        load_image_folder(tmp_path, split="validation")


def hub_style_dataset(scenes: datasets.Dataset, invalid_depth_row: int | None = None) -> datasets.Dataset:
    """NYUv2-on-the-Hub style: 'image', float 'depth_map' in metres, 'segmentation', 'scene_type'."""
    depth = [np.asarray(d, np.float32) / 1000 for d in scenes["depth"]]
    if invalid_depth_row is not None:
        depth[invalid_depth_row][:] = 0.0
    return datasets.Dataset.from_dict(
        {
            "image": list(scenes["rgb"]),
            "depth_map": depth,
            "segmentation": list(scenes["semseg"]),
            "scene_type": list(scenes["label"]),
            "extra": ["x"] * len(scenes),
        }
    )


def test_mapped_dataset_renames_and_keeps_only_mapped_columns(scenes):
    mapping = {"rgb": "image", "depth": "depth_map", "label": "scene_type"}
    dataset = load_mapped_dataset(hub_style_dataset(scenes), mapping, num_classes=7, patch_size=4)
    assert sorted(dataset.column_names) == ["depth", "id", "label", "rgb"] and dataset["id"] == ["0", "1", "2", "3"]
    assert np.allclose(np.asarray(dataset[1]["depth"]), np.asarray(scenes[1]["depth"]) / 1000, atol=1e-6)
    assert dataset["label"] == scenes["label"]


def test_mapped_dataset_by_path(tmp_path, scenes):
    folder = tmp_path / "nyu-like" / "data"
    folder.mkdir(parents=True)
    hub_style_dataset(scenes).to_parquet(str(folder / "train-00000-of-00001.parquet"))
    dataset = load_mapped_dataset(
        str(tmp_path / "nyu-like"), {"rgb": "image", "semseg": "segmentation"}, split="train", num_classes=7
    )
    assert sorted(dataset.column_names) == ["id", "rgb", "semseg"] and len(dataset) == 4
    assert np.array_equal(np.asarray(dataset[3]["semseg"]), np.asarray(scenes[3]["semseg"]))


@pytest.mark.parametrize(
    ("mapping", "options", "message"),
    [
        ({"rgb": "image", "depth": "depth"}, {}, r"no column 'depth' \(mapped to depth\); its columns are"),
        ({"label": "scene_type"}, {}, "maps no modality"),
        ({"rgb": "image", "normals": "image"}, {}, r"unknown targets \['normals'\]"),
        ({"rgb": "image", "semseg": "image"}, {}, "one column to several targets"),
        ({"rgb": "image", "semseg": "segmentation"}, {"num_classes": 3}, r"row 0 \(id '0'; rgb='image', semseg="),
    ],
)
def test_mapped_dataset_errors_name_the_column(scenes, mapping, options, message):
    with pytest.raises(ValueError, match=message):
        load_mapped_dataset(hub_style_dataset(scenes), mapping, **options)


def test_all_invalid_depth_in_a_mapped_dataset_names_the_row(scenes):
    zeroed = hub_style_dataset(scenes, invalid_depth_row=2)
    with pytest.raises(ValueError, match=r"row 2 \(id '2'; depth='depth_map'\): depth map has no valid pixel"):
        load_mapped_dataset(zeroed, {"depth": "depth_map"})


def test_mapped_dataset_from_a_hub_repo(local_hub, monkeypatch, tmp_path, scenes):
    from huggingface_hub import HfApi
    from local_hub import DEFAULT_TOKEN, DEFAULT_USER

    # `datasets` reads the endpoint and offline flag once, at import: point them at the loopback Hub too.
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", local_hub.endpoint)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    (tmp_path / "data").mkdir()
    hub_style_dataset(scenes).to_parquet(str(tmp_path / "data" / "train-00000-of-00001.parquet"))
    repo_id = f"{DEFAULT_USER}/nyu-like"
    api = HfApi(token=DEFAULT_TOKEN)
    api.create_repo(repo_id, repo_type="dataset")
    api.upload_folder(folder_path=str(tmp_path), repo_id=repo_id, repo_type="dataset")
    dataset = load_mapped_dataset(
        repo_id,
        {"rgb": "image", "depth": "depth_map", "label": "scene_type"},
        split="train",
        cache_dir=str(tmp_path / "cache"),
    )
    assert sorted(dataset.column_names) == ["depth", "id", "label", "rgb"] and dataset["label"] == scenes["label"]
    assert np.allclose(np.asarray(dataset[0]["depth"]), np.asarray(scenes[0]["depth"]) / 1000, atol=1e-6)
