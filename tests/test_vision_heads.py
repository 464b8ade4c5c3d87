"""MM-MAE fine-tuning heads: output shapes, losses, bad input, training with the plain Trainer, loading from a
pre-training checkpoint."""

from __future__ import annotations

import pytest
import torch
from tiny_vision import IMAGE, PATCH, tiny_config
from transformers import (
    AutoModelForDepthEstimation,
    AutoModelForImageClassification,
    AutoModelForSemanticSegmentation,
    BertConfig,
    Trainer,
    TrainingArguments,
)

from robust_pretrain.vision.multimae.heads import (
    MultiMAEForDepthEstimation,
    MultiMAEForImageClassification,
    MultiMAEForSemanticSegmentation,
)
from robust_pretrain.vision.multimae.pretraining import MultiMAEForPreTraining

NUM_LABELS = 3


def tiny_head(head_class, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return head_class(tiny_config(num_labels=NUM_LABELS, **overrides))


def learnable_examples(task: str, n: int = 32, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """RGB images whose red channel is piecewise constant on patches with levels -1, 0, 1 (one level for the whole
    image for classification); the targets are functions of it: the image's level (classification), the level per
    pixel (semseg, 5% ignored), 1.5 + level metres (depth, 10% invalid)."""
    g = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(n):
        levels = torch.randint(0, NUM_LABELS, (IMAGE // PATCH, IMAGE // PATCH), generator=g)
        if task == "classification":
            levels = levels[:1, :1].expand_as(levels)
        per_pixel = levels.repeat_interleave(PATCH, 0).repeat_interleave(PATCH, 1)
        rgb = 0.3 * torch.randn(3, IMAGE, IMAGE, generator=g)
        rgb[0] += per_pixel.float() - 1
        if task == "classification":
            labels = levels[0, 0]
        elif task == "semseg":
            labels = torch.where(torch.rand(IMAGE, IMAGE, generator=g) < 0.05, 255, per_pixel)
        else:
            labels = (0.5 + per_pixel.float()) * (torch.rand(IMAGE, IMAGE, generator=g) > 0.1)
        examples.append({"pixel_values": rgb, "labels": labels})
    return examples


HEADS = {
    "classification": MultiMAEForImageClassification,
    "semseg": MultiMAEForSemanticSegmentation,
    "depth": MultiMAEForDepthEstimation,
}


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(HEADS))
def test_head_trains_with_the_plain_trainer(task, tmp_path):
    model = tiny_head(HEADS[task])
    data = learnable_examples(task)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=16,
        max_steps=24 if task == "classification" else 12,  # the global token learns to pool more slowly
        learning_rate=3e-3,
        warmup_steps=0,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        logging_steps=4,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert after < 0.7 * before, (before, after)


@pytest.mark.parametrize("task", sorted(HEADS))
def test_head_loads_the_encoder_of_a_pretraining_checkpoint(task, tmp_path):
    torch.manual_seed(1)
    pretrained = MultiMAEForPreTraining(tiny_config())
    pretrained.save_pretrained(tmp_path)
    head, info = HEADS[task].from_pretrained(tmp_path, num_labels=NUM_LABELS, output_loading_info=True)
    assert info["missing_keys"] and all(k.startswith(("classifier.", "neck.", "head.")) for k in info["missing_keys"])
    assert not info["unexpected_keys"]
    for key, value in pretrained.multimae.state_dict().items():
        assert torch.equal(head.multimae.state_dict()[key], value), key
    auto_class = {
        "classification": AutoModelForImageClassification,
        "semseg": AutoModelForSemanticSegmentation,
        "depth": AutoModelForDepthEstimation,
    }[task]
    assert type(auto_class.from_pretrained(tmp_path, num_labels=NUM_LABELS)) is HEADS[task]


def test_output_shapes_and_label_sizes():
    rgb = torch.randn(2, 3, IMAGE, IMAGE)
    assert tiny_head(MultiMAEForImageClassification)(pixel_values=rgb).logits.shape == (2, NUM_LABELS)
    segmenter = tiny_head(MultiMAEForSemanticSegmentation)
    assert segmenter(pixel_values=rgb).logits.shape == (2, NUM_LABELS, IMAGE, IMAGE)
    # A label map of another size is scored at its own size: the logits are upsampled to it.
    out = segmenter(pixel_values=rgb, labels=torch.randint(0, NUM_LABELS, (2, 20, 24)))
    assert out.logits.shape == (2, NUM_LABELS, 20, 24) and torch.isfinite(out.loss)
    depth_model = tiny_head(MultiMAEForDepthEstimation)
    predicted = depth_model(pixel_values=rgb).predicted_depth
    assert predicted.shape == (2, IMAGE, IMAGE) and (predicted >= 0).all()
    labels = 1 + torch.rand(2, 1, 8, 8)  # (B, 1, H, W) labels are accepted as (B, H, W)
    out = depth_model(pixel_values=rgb, labels=labels)
    assert out.predicted_depth.shape == (2, 8, 8)
    assert float(out.loss) == pytest.approx(float((out.predicted_depth - labels[:, 0]).abs().mean()), rel=1e-5)


def test_losses_ignore_invalid_pixels_and_never_nan():
    rgb = torch.randn(2, 3, IMAGE, IMAGE)
    segmenter = tiny_head(MultiMAEForSemanticSegmentation)
    labels = torch.randint(0, NUM_LABELS, (2, IMAGE, IMAGE))
    labels[0, :8] = 255
    out = segmenter(pixel_values=rgb, labels=labels)
    valid = labels != 255
    reference = torch.nn.functional.cross_entropy(out.logits.permute(0, 2, 3, 1)[valid], labels[valid])
    assert float(out.loss) == pytest.approx(float(reference), rel=1e-5)
    all_ignored = segmenter(pixel_values=rgb, labels=torch.full((2, IMAGE, IMAGE), 255))
    assert float(all_ignored.loss) == 0.0
    all_ignored.loss.backward()
    depth_model = tiny_head(MultiMAEForDepthEstimation)
    no_valid = depth_model(pixel_values=rgb, labels=torch.zeros(2, IMAGE, IMAGE))
    assert float(no_valid.loss) == 0.0
    no_valid.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in depth_model.parameters() if p.grad is not None)


def test_bad_labels_and_inputs_are_clear_errors(tmp_path):
    rgb = torch.randn(2, 3, IMAGE, IMAGE)
    with pytest.raises(ValueError, match=r"labels: class ids \[3\] are outside 0..2"):
        tiny_head(MultiMAEForSemanticSegmentation)(pixel_values=rgb, labels=torch.full((2, IMAGE, IMAGE), 3))
    with pytest.raises(ValueError, match=r"labels: class ids \[5\] are outside 0..2"):
        tiny_head(MultiMAEForImageClassification)(pixel_values=rgb, labels=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="give the RGB input once"):
        tiny_head(MultiMAEForImageClassification)(pixel_values=rgb, rgb=rgb)
    with pytest.raises(TypeError, match="unexpected input 'semseg'"):
        tiny_head(MultiMAEForImageClassification)(pixel_values=rgb, semseg=torch.zeros(2, IMAGE, IMAGE))
    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"model_type 'bert', not an MM-MAE checkpoint"):
        MultiMAEForSemanticSegmentation.from_pretrained(tmp_path)


def test_depth_as_an_extra_fine_tuning_input():
    model = tiny_head(MultiMAEForSemanticSegmentation, finetune_modalities=["rgb", "depth"]).eval()
    rgb, depth = torch.randn(2, 3, IMAGE, IMAGE), 1 + torch.rand(2, 1, IMAGE, IMAGE)
    with torch.no_grad():
        logits = model(pixel_values=rgb, depth=depth).logits
        assert not torch.allclose(logits, model(pixel_values=rgb, depth=depth + 1).logits)
        assert torch.equal(logits, model(rgb=rgb, depth=depth).logits)
    with pytest.raises(ValueError, match=r"missing \['depth'\]"):
        model(pixel_values=rgb)
