"""Fine-tuned MM-MAE checkpoints as a Hugging Face user meets them (issue 20 items 1 and 7): the image processor's
post-processing and calling convention, ``pipeline("image-segmentation")`` / ``pipeline("depth-estimation")`` on the
dense recipe's outputs, the card's model-index split, and LoRA outputs loading with ``AutoModelFor*``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from huggingface_hub import ModelCard
from PIL import Image
from test_recipe_pretrain import single_thread
from tiny_vision import tiny_config
from transformers import AutoModelForDepthEstimation, AutoModelForSemanticSegmentation, pipeline
from transformers.modeling_outputs import DepthEstimatorOutput, SemanticSegmenterOutput

from robust_pretrain.vision.finetune import recipe as finetune
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor
from robust_pretrain.vision.multimae.pretraining import MultiMAEForPreTraining

CLASS_NAMES = ["wall", "floor", "chair"]
HEIGHT, WIDTH = 24, 32


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with single_thread():
        yield


def test_post_processing_honours_target_sizes() -> None:
    logits = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    processor = MultiMAEImageProcessor()
    maps = processor.post_process_semantic_segmentation(SemanticSegmenterOutput(logits=logits), [(6, 8), (3, 5)])
    assert [tuple(m.shape) for m in maps] == [(6, 8), (3, 5)] and maps[0].dtype == torch.int64
    by_hand = F.interpolate(logits[1:], size=(3, 5), mode="bilinear", align_corners=False)[0].argmax(0)
    assert torch.equal(maps[1], by_hand)
    as_tensor = processor.post_process_semantic_segmentation(
        SemanticSegmenterOutput(logits=logits), torch.tensor([[6, 8], [3, 5]])
    )
    assert all(torch.equal(a, b) for a, b in zip(maps, as_tensor, strict=True))
    unresized = processor.post_process_semantic_segmentation(SemanticSegmenterOutput(logits=logits))
    assert torch.equal(unresized[0], logits[0].argmax(0))
    with pytest.raises(ValueError, match="got 1 target_sizes for the 2 images"):
        processor.post_process_semantic_segmentation(SemanticSegmenterOutput(logits=logits), [(6, 8)])

    depth = 0.5 + 3 * torch.rand(2, 4, 4, generator=torch.Generator().manual_seed(1))
    results = processor.post_process_depth_estimation(DepthEstimatorOutput(predicted_depth=depth), [(6, 8), (4, 4)])
    assert [set(r) for r in results] == [{"predicted_depth"}] * 2
    assert tuple(results[0]["predicted_depth"].shape) == (6, 8)
    assert (
        depth[0].min() <= results[0]["predicted_depth"].min() <= results[0]["predicted_depth"].max() <= depth[0].max()
    )
    torch.testing.assert_close(results[1]["predicted_depth"], depth[1])  # same size: unchanged
    assert torch.equal(
        processor.post_process_depth_estimation(DepthEstimatorOutput(predicted_depth=depth))[0]["predicted_depth"],
        depth[0],
    )


def test_segmentation_maps_are_the_second_argument_and_depth_a_keyword() -> None:
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8))
    classes = Image.fromarray(rng.integers(0, 3, (HEIGHT, WIDTH), dtype=np.uint8))
    depth = Image.fromarray(rng.integers(500, 5000, (HEIGHT, WIDTH)).astype(np.uint16))
    processor = MultiMAEImageProcessor(size=16, num_classes=3)
    positional = processor(image, classes, depth=depth)
    assert set(positional) == {"rgb", "semseg", "depth"}
    keyword = processor(images=image, segmentation_maps=classes, depth=depth)
    by_modality = processor(images=image, semseg=classes, depth=depth)  # the modality name, as before
    for name in positional:
        assert torch.equal(positional[name], keyword[name]) and torch.equal(positional[name], by_modality[name])
    with pytest.raises(ValueError, match="give the class maps once"):
        processor(image, classes, semseg=classes)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mmmae") / "pretrained"
    torch.manual_seed(0)
    MultiMAEForPreTraining(tiny_config()).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder layout of 4:3 PNGs: rgb, 16-bit depth (mm), semseg ids 0..2 in blocks."""
    root = tmp_path_factory.mktemp("folder")
    rng = np.random.default_rng(0)
    for split, count in (("train", 4), ("test", 2)):
        for modality in ("rgb", "depth", "semseg"):
            (root / split / modality).mkdir(parents=True)
        for index in range(count):
            stem = f"{split}_{index}"
            Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)).save(
                root / split / "rgb" / f"{stem}.png"
            )
            depth = rng.integers(500, 5000, (HEIGHT, WIDTH)).astype(np.uint16)
            Image.fromarray(depth).save(root / split / "depth" / f"{stem}.png")
            blocks = rng.integers(0, 3, (HEIGHT // 8, WIDTH // 8))
            Image.fromarray(np.kron(blocks, np.ones((8, 8))).astype(np.uint8)).save(
                root / split / "semseg" / f"{stem}.png"
            )
    return root


def fine_tune(checkpoint: Path, folder: Path, task: str, output_dir: Path, *extra: str) -> Path:
    argv = [
        "--model_name_or_path", str(checkpoint), "--task", task, "--output_dir", str(output_dir),
        "--image_folder", str(folder), "--max_steps", "2", "--per_device_train_batch_size", "2",
        "--per_device_eval_batch_size", "2", "--warmup_steps", "0", "--learning_rate", "1e-3",
        "--report_to", "none", "--disable_tqdm", "true", "--num_prediction_images", "0",
        *(["--class_names", *CLASS_NAMES] if task == "semseg" else []), *extra,
    ]  # fmt: skip
    assert finetune.main(argv) == 0
    return output_dir


def image_file(folder: Path) -> Path:
    return folder / "test" / "rgb" / "test_1.png"


def logits_by_hand(model_dir: Path, image: Image.Image) -> torch.Tensor:
    model = AutoModelForSemanticSegmentation.from_pretrained(model_dir).eval()
    inputs = MultiMAEImageProcessor.from_pretrained(model_dir)(images=image)
    with torch.no_grad():
        logits = model(**inputs).logits
    return F.interpolate(logits, size=(image.height, image.width), mode="bilinear", align_corners=False)[0]


def assert_segmentation_pipeline_matches(model_dir: Path, image_path: Path) -> None:
    """The pipeline's masks: one per predicted class, named by the class names, at the image's size, equal to the
    model's upsampled argmax."""
    annotations = pipeline("image-segmentation", model=str(model_dir))(str(image_path))
    with Image.open(image_path) as image:
        expected = logits_by_hand(model_dir, image.convert("RGB")).argmax(0).numpy()
    assert {a["label"] for a in annotations} == {CLASS_NAMES[i] for i in np.unique(expected)}
    for annotation in annotations:
        assert annotation["mask"].size == (WIDTH, HEIGHT) and annotation["score"] is None
        np.testing.assert_array_equal(
            np.asarray(annotation["mask"]) == 255, expected == CLASS_NAMES.index(annotation["label"])
        )


def test_segmentation_pipeline_on_the_recipe_output(checkpoint: Path, folder: Path, tmp_path: Path) -> None:
    out = fine_tune(checkpoint, folder, "semseg", tmp_path / "semseg")
    assert_segmentation_pipeline_matches(out, image_file(folder))
    # The card's model-index names the split the metrics come from.
    results = ModelCard.load(out / "README.md").data.to_dict()["model-index"][0]["results"]
    assert {result["dataset"]["split"] for result in results} == {"test"}
    assert ModelCard.load(out / "README.md").data.to_dict()["pipeline_tag"] == "image-segmentation"


def test_depth_pipeline_on_the_recipe_output(checkpoint: Path, folder: Path, tmp_path: Path) -> None:
    out = fine_tune(checkpoint, folder, "depth", tmp_path / "depth", "--max_eval_samples", "1")
    result = pipeline("depth-estimation", model=str(out))(str(image_file(folder)))
    assert tuple(result["predicted_depth"].shape) == (HEIGHT, WIDTH) and result["depth"].size == (WIDTH, HEIGHT)
    with Image.open(image_file(folder)) as image:
        inputs = MultiMAEImageProcessor.from_pretrained(out)(images=image.convert("RGB"))
    model = AutoModelForDepthEstimation.from_pretrained(out).eval()
    with torch.no_grad():
        predicted = model(**inputs).predicted_depth[:, None]
    by_hand = F.interpolate(predicted, size=(HEIGHT, WIDTH), mode="bilinear", align_corners=False)[0, 0]
    torch.testing.assert_close(result["predicted_depth"], by_hand)
    results = ModelCard.load(out / "README.md").data.to_dict()["model-index"][0]["results"]
    assert {result["dataset"]["split"] for result in results} == {"test[:1]"}  # only the first eval image scored


@pytest.mark.parametrize("task", ["semseg", "depth"])
def test_lora_output_loads_with_the_auto_classes(checkpoint: Path, folder: Path, tmp_path: Path, task: str) -> None:
    from peft import PeftModel

    out = fine_tune(checkpoint, folder, task, tmp_path / task, "--use_lora", "true", "--lora_r", "4")
    assert (out / "adapter_config.json").is_file() and (out / "merged" / "model.safetensors").is_file()
    auto_class = AutoModelForSemanticSegmentation if task == "semseg" else AutoModelForDepthEstimation
    merged = auto_class.from_pretrained(out / "merged").eval()
    base = auto_class.from_pretrained(out / "merged")  # the fine-tuned config (classes, inputs, head sizes)
    base.load_state_dict(auto_class.from_pretrained(checkpoint, config=base.config).state_dict())
    adapted = PeftModel.from_pretrained(base, out).eval()
    with Image.open(image_file(folder)) as image:
        inputs = MultiMAEImageProcessor.from_pretrained(out / "merged")(images=image.convert("RGB"))
    field = "logits" if task == "semseg" else "predicted_depth"
    with torch.no_grad():
        merged_output = getattr(merged(**inputs), field)
        torch.testing.assert_close(merged_output, getattr(adapted(**inputs), field), atol=1e-5, rtol=1e-4)
        with adapted.disable_adapter():  # the checkpoint and an untrained head: not what the merged copy holds
            assert not torch.allclose(merged_output, getattr(adapted(**inputs), field), atol=1e-3)
    if task == "semseg":
        assert_segmentation_pipeline_matches(out / "merged", image_file(folder))
        assert "`merged/`" in (out / "README.md").read_text()
