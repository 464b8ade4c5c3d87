import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from transformers import Trainer, TrainingArguments

from robust_pretrain.seeding import SetEpochCallback, keyed_rng
from robust_pretrain.vision.collator import ModalityMaskCollator, split_budget

SIZE, PATCH = 16, 2
NUM_PATCHES = (SIZE // PATCH) ** 2  # 64


def example(index: int, modalities=("rgb", "depth", "semseg")) -> dict:
    generator = torch.Generator().manual_seed(index)
    data = {"id": f"scene-{index}"}
    if "rgb" in modalities:
        data["rgb"] = torch.randn(3, SIZE, SIZE, generator=generator)
    if "depth" in modalities:
        data["depth"] = torch.rand(1, SIZE, SIZE, generator=generator) * 5
    if "semseg" in modalities:
        data["semseg"] = torch.randint(0, 7, (SIZE, SIZE), generator=generator)
    return data


def visible_counts(batch: dict, names=("rgb", "depth", "semseg")) -> np.ndarray:
    """(B, M) number of visible patches per sample and modality."""
    return np.stack([(~batch[f"mask_{n}"]).sum(dim=1).numpy() for n in names], axis=1)


def test_output_layout_and_budget_exact_for_every_sample():
    collator = ModalityMaskCollator(num_visible_tokens=48, patch_size=PATCH, alpha=1.0, seed=3)
    features = [example(i) for i in range(64)]
    batch = collator(features)
    assert set(batch) == {"rgb", "depth", "semseg", "mask_rgb", "mask_depth", "mask_semseg"}
    assert batch["rgb"].shape == (64, 3, SIZE, SIZE) and batch["depth"].shape == (64, 1, SIZE, SIZE)
    assert batch["semseg"].shape == (64, SIZE, SIZE) and batch["semseg"].dtype == torch.int64
    assert torch.equal(batch["rgb"][5], features[5]["rgb"])
    for name in ("rgb", "depth", "semseg"):
        assert batch[f"mask_{name}"].shape == (64, NUM_PATCHES) and batch[f"mask_{name}"].dtype == torch.bool
    counts = visible_counts(batch)
    assert (counts.sum(axis=1) == 48).all()
    assert len({tuple(c) for c in counts}) > 30  # the split varies per sample


def test_shares_follow_the_dirichlet_moments():
    # alpha = 1 over 3 modalities: each share has mean 1/3 and variance (1/3)(2/3)/(3+1) = 1/18.
    collator = ModalityMaskCollator(num_visible_tokens=60, patch_size=PATCH, alpha=1.0, seed=0)
    counts = visible_counts(collator([example(i % 8) | {"id": i} for i in range(1500)]))
    shares = counts / 60
    assert np.allclose(shares.mean(axis=0), 1 / 3, atol=0.04)
    assert np.allclose(shares.var(axis=0), 1 / 18, rtol=0.2)


@pytest.mark.parametrize("alpha", [math.inf, 1e7])
def test_large_alpha_splits_evenly(alpha):
    collator = ModalityMaskCollator(num_visible_tokens=50, patch_size=PATCH, alpha=alpha, seed=1)
    counts = visible_counts(collator([example(i) for i in range(200)]))
    assert (counts.sum(axis=1) == 50).all()
    assert (counts.max(axis=1) - counts.min(axis=1) <= 1).all()  # 17/17/16 in some order
    assert set(np.unique(counts)) == {16, 17}
    # The modality getting the rounding-short count is random, not always the same one.
    assert len({int(np.argmin(c)) for c in counts}) == 3


def test_small_alpha_gives_one_modality_samples():
    collator = ModalityMaskCollator(num_visible_tokens=32, patch_size=PATCH, alpha=0.01, seed=2)
    counts = visible_counts(collator([example(i) for i in range(400)]))
    one_modality = (counts == 32).any(axis=1)
    # P(max share >= 1 - 1/64) under Dirichlet(0.01, 0.01, 0.01) is about 0.96; which modality is uniform.
    assert one_modality.mean() > 0.9
    winners = np.bincount(counts[one_modality].argmax(axis=1), minlength=3) / one_modality.sum()
    assert np.allclose(winners, 1 / 3, atol=0.1)


def test_budget_over_a_modality_capacity_spills_to_the_others():
    # 100 visible tokens, 64 patches per modality: no modality can take more than 64.
    collator = ModalityMaskCollator(num_visible_tokens=100, patch_size=PATCH, alpha=0.05, seed=4)
    counts = visible_counts(collator([example(i) for i in range(200)]))
    assert (counts.sum(axis=1) == 100).all() and counts.max() == 64


def test_absent_modality_in_the_whole_batch_is_an_absent_task():
    collator = ModalityMaskCollator(num_visible_tokens=20, patch_size=PATCH, seed=0)
    batch = collator([example(i, ("rgb", "semseg")) for i in range(10)])
    assert set(batch) == {"rgb", "semseg", "mask_rgb", "mask_semseg"}
    assert (visible_counts(batch, ("rgb", "semseg")).sum(axis=1) == 20).all()


def test_modality_absent_from_some_examples_is_filled_invalid_and_fully_hidden():
    collator = ModalityMaskCollator(num_visible_tokens=20, patch_size=PATCH, seed=0)
    features = [example(i) if i % 2 else example(i, ("rgb", "semseg")) for i in range(10)]
    batch = collator(features)
    counts = visible_counts(batch)
    assert (counts.sum(axis=1) == 20).all()
    assert (counts[0::2, 1] == 0).all() and batch["mask_depth"][0::2].all()
    assert (batch["depth"][0::2] == 0).all()  # 0 = invalid depth: no loss target
    assert torch.equal(batch["depth"][1], features[1]["depth"])
    without_fill = ModalityMaskCollator(num_visible_tokens=20, patch_size=PATCH, fill_values={})
    with pytest.raises(ValueError, match="'depth' is missing from some examples"):
        without_fill(features)


def test_split_budget_is_exact_and_capped():
    rng = np.random.default_rng(0)
    for _ in range(300):
        proportions = rng.dirichlet([0.3] * 4)
        caps = rng.integers(0, 20, 4)
        budget = int(rng.integers(0, caps.sum() + 1))
        counts = split_budget(proportions, budget, caps, rng)
        assert counts.sum() == budget and (counts <= caps).all() and (counts >= 0).all()
        if (proportions * budget <= caps).all():  # no cap binds: largest remainders, within 1 of the target
            assert (np.abs(counts - proportions * budget) < 1).all()
    with pytest.raises(ValueError, match="does not fit"):
        split_budget(np.ones(2) / 2, 5, np.array([2, 2]), rng)


def test_masks_depend_only_on_seed_epoch_and_example_key():
    collator = ModalityMaskCollator(num_visible_tokens=30, patch_size=PATCH, seed=7)
    first = collator([example(i) for i in range(6)])
    # Same example in another batch, at another position: same masks.
    other = collator([example(9), example(3), example(8)])
    for name in ("rgb", "depth", "semseg"):
        assert torch.equal(first[f"mask_{name}"][3], other[f"mask_{name}"][1])
    assert not torch.equal(first["mask_rgb"][0], first["mask_rgb"][1])
    collator.set_epoch(1)
    next_epoch = collator([example(i) for i in range(6)])
    assert not torch.equal(first["mask_rgb"], next_epoch["mask_rgb"])
    collator.set_epoch(0)
    assert torch.equal(collator([example(i) for i in range(6)])["mask_rgb"], first["mask_rgb"])
    reseeded = ModalityMaskCollator(num_visible_tokens=30, patch_size=PATCH, seed=8)
    assert not torch.equal(reseeded([example(i) for i in range(6)])["mask_rgb"], first["mask_rgb"])


def test_examples_without_id_are_keyed_by_content():
    collator = ModalityMaskCollator(num_visible_tokens=30, patch_size=PATCH, seed=0)
    anonymous = [{k: v for k, v in example(i).items() if k != "id"} for i in range(4)]
    batch = collator(anonymous)
    again = collator([anonymous[2], anonymous[0]])
    assert torch.equal(batch["mask_rgb"][2], again["mask_rgb"][0])
    assert not torch.equal(batch["mask_rgb"][0], batch["mask_rgb"][1])


class _Examples(Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> dict:
        return example(index)


def test_dataloader_workers_draw_the_same_masks_as_the_main_process():
    collator = ModalityMaskCollator(num_visible_tokens=30, patch_size=PATCH, seed=5)
    in_process = [b["mask_semseg"] for b in DataLoader(_Examples(), batch_size=4, collate_fn=collator)]
    in_workers = [b["mask_semseg"] for b in DataLoader(_Examples(), batch_size=4, collate_fn=collator, num_workers=2)]
    assert all(torch.equal(a, b) for a, b in zip(in_process, in_workers, strict=True))
    assert not torch.equal(in_process[0], in_process[1])  # the workers' batches differ


def test_persistent_workers_follow_set_epoch():
    collator = ModalityMaskCollator(num_visible_tokens=30, patch_size=PATCH, seed=5)
    loader = DataLoader(_Examples(), batch_size=4, collate_fn=collator, num_workers=1, persistent_workers=True)
    epoch0 = [b["mask_rgb"] for b in loader]
    collator.set_epoch(1)
    epoch1 = [b["mask_rgb"] for b in loader]
    expected = [collator([example(i) for i in range(s, s + 4)])["mask_rgb"] for s in (0, 4, 8)]
    assert all(torch.equal(a, b) for a, b in zip(epoch1, expected, strict=True))
    assert not any(torch.equal(a, b) for a, b in zip(epoch0, epoch1, strict=True))


class _MaskRecorder(nn.Module):
    """A one-parameter model that records the images and masks it is fed."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(()))
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, rgb, depth, semseg, mask_rgb, mask_depth, mask_semseg):
        self.seen.append((rgb, torch.cat([mask_rgb, mask_depth, mask_semseg], dim=1)))
        return {"loss": (self.weight - rgb.mean()) ** 2}


def _train(output_dir, max_steps: int, resume: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    collator = ModalityMaskCollator(num_visible_tokens=30, patch_size=PATCH, seed=11)
    model = _MaskRecorder()
    args = TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        max_steps=max_steps,
        save_steps=4,
        save_strategy="steps",
        report_to=[],
        logging_strategy="no",
        seed=0,
        use_cpu=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=_Examples(),
        data_collator=collator,
        callbacks=[SetEpochCallback([collator])],
    )
    trainer.train(resume_from_checkpoint=resume or None)
    return model.seen


@pytest.mark.slow
def test_a_resumed_trainer_run_draws_the_masks_of_an_uninterrupted_one(tmp_path):
    # 12 examples, batch 4: 3 steps per epoch; 7 steps cross two epoch boundaries, the resume (after step 4) one.
    uninterrupted = _train(tmp_path / "full", max_steps=7)
    _train(tmp_path / "resumed", max_steps=4)
    resumed = _train(tmp_path / "resumed", max_steps=7, resume=True)
    assert len(resumed) == 3
    for (full_rgb, full_masks), (rgb, masks) in zip(uninterrupted[4:], resumed, strict=True):
        assert torch.equal(full_rgb, rgb) and torch.equal(full_masks, masks)

    def masks_by_example(steps):
        return {float(r.sum()): m for rgb, masks in steps for r, m in zip(rgb, masks, strict=True)}

    epoch0, epoch1 = masks_by_example(uninterrupted[:3]), masks_by_example(uninterrupted[3:6])
    assert epoch0.keys() == epoch1.keys() and len(epoch0) == 12
    assert all(not torch.equal(epoch0[k], epoch1[k]) for k in epoch0)  # the callback moved the epoch on


def test_keyed_rng_is_a_pure_function():
    assert keyed_rng(1, 2, "a").random() == keyed_rng(1, 2, "a").random()
    assert keyed_rng(1, 2, "a").random() != keyed_rng(1, 3, "a").random()
    assert keyed_rng(1, 2, "a").random() != keyed_rng(1, 2, "b").random()


@pytest.mark.parametrize(
    ("features", "options", "message"),
    [
        ([example(0), {"rgb": torch.zeros(3, 8, 8)}], {}, "'rgb' has shape"),
        ([{"rgb": torch.zeros(3, 16, 16), "depth": torch.zeros(1, 8, 8)}], {}, "modalities differ in size"),
        ([{"rgb": torch.zeros(3, 1, 1)}], {}, "do not tile into 2x2 patches"),
        ([{"rgb": torch.zeros(3, 15, 16)}], {}, "do not tile into 2x2 patches"),
        ([example(0, ("rgb",))], {"num_visible_tokens": 65}, "exceeds the 64 patches"),
        ([{"label": 1}], {}, "no example of the batch has any of the modalities"),
        ([], {}, "empty batch"),
    ],
)
def test_bad_input_is_reported(features, options, message):
    collator = ModalityMaskCollator(**({"num_visible_tokens": 8, "patch_size": PATCH} | options))
    with pytest.raises(ValueError, match=message):
        collator(features)


def test_bad_settings_are_reported():
    with pytest.raises(ValueError, match="alpha must be > 0"):
        ModalityMaskCollator(num_visible_tokens=8, patch_size=2, alpha=0)
    with pytest.raises(ValueError, match="num_visible_tokens must be >= 1"):
        ModalityMaskCollator(num_visible_tokens=0, patch_size=2)
    with pytest.raises(ValueError, match="distinct names"):
        ModalityMaskCollator(num_visible_tokens=8, patch_size=2, modalities=("rgb", "rgb"))


def test_scenes_processor_collator_and_model_fit_together():
    """The data path end to end: generated scenes -> MultiMAETransform -> ModalityMaskCollator -> MM-MAE losses."""
    from tiny_vision import IMAGE, PATCH, tiny_config

    from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor, MultiMAETransform
    from robust_pretrain.vision.multimae.pretraining import MultiMAEForPreTraining
    from robust_pretrain.vision.scenes import NUM_CLASSES, SceneConfig, generate_scenes

    dataset = generate_scenes(4, config=SceneConfig(image_size=24))
    transform = MultiMAETransform(MultiMAEImageProcessor(size=IMAGE, num_classes=NUM_CLASSES), train=True)
    dataset.set_transform(transform)
    collator = ModalityMaskCollator(num_visible_tokens=10, patch_size=PATCH, alpha=1.0)
    batch = next(iter(DataLoader(dataset, batch_size=4, collate_fn=collator)))
    assert batch["rgb"].shape == (4, 3, IMAGE, IMAGE) and batch["semseg"].max() < NUM_CLASSES
    model = MultiMAEForPreTraining(
        tiny_config(
            modalities=[
                {"name": "rgb", "kind": "rgb"},
                {"name": "depth", "kind": "depth"},
                {"name": "semseg", "kind": "semseg", "num_classes": NUM_CLASSES},
            ]
        )
    )
    output = model(**batch)
    assert set(output.task_losses) == {"rgb", "depth", "semseg"}
    assert all(torch.isfinite(loss) for loss in output.task_losses.values())
    # Scenes label every pixel and have valid depth everywhere: each hidden patch's pixels are all targets.
    for name in ("depth", "semseg"):
        assert output.task_counts[name] == batch[f"mask_{name}"].sum().item() * PATCH * PATCH
