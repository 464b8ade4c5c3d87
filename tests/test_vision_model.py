"""MM-MAE encoder and pre-training model: shapes, losses against hand-computed references, masking, absent
modalities, Auto save/load in a fresh interpreter, ViT export, MinimaxTrainer."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from ports import free_port
from processes import checkout_env
from safetensors.torch import load_file, save_file
from tiny_vision import IMAGE, NUM_CLASSES, NUM_PATCHES, PATCH, BatchExamples, random_batch, tiny_config
from torch.nn import functional as F
from transformers import (
    AutoImageProcessor,
    Trainer,
    TrainingArguments,
    ViTConfig,
    ViTForImageClassification,
    ViTModel,
)

from robust_pretrain import MinimaxTrainer, MinimaxTrainingArguments
from robust_pretrain.vision.multimae.configuration_multimae import DECODER_TYPES, ModalitySpec, MultiMAEConfig
from robust_pretrain.vision.multimae.decoder import MultiMAECrossAttention
from robust_pretrain.vision.multimae.encoder import MultiMAEModel
from robust_pretrain.vision.multimae.export import export_vit
from robust_pretrain.vision.multimae.export import main as export_main
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor
from robust_pretrain.vision.multimae.pretraining import MultiMAEForPreTraining


def tiny_model(seed: int = 0, **overrides) -> MultiMAEForPreTraining:
    torch.manual_seed(seed)
    return MultiMAEForPreTraining(tiny_config(**overrides)).eval()


def pixel_mask(patch_mask: torch.Tensor) -> torch.Tensor:
    """(B, N) patch flags -> (B, H, W) pixel flags."""
    grid = patch_mask.view(-1, IMAGE // PATCH, IMAGE // PATCH)
    return grid.repeat_interleave(PATCH, 1).repeat_interleave(PATCH, 2)


def reference_losses(batch: dict, predictions: dict) -> dict[str, tuple[float, float]]:
    """(mean, count) per modality, computed pixel by pixel / patch by patch from the predictions."""
    refs = {}
    hidden = pixel_mask(batch["mask_rgb"])
    squared, count = 0.0, 0
    for b in range(hidden.shape[0]):
        for i in range(0, IMAGE, PATCH):
            for j in range(0, IMAGE, PATCH):
                if not hidden[b, i, j]:
                    continue
                target = batch["rgb"][b, :, i : i + PATCH, j : j + PATCH]
                mean, std = target.mean(), (target.var() + 1e-6).sqrt()
                predicted = predictions["rgb"][b, :, i : i + PATCH, j : j + PATCH].detach()
                squared += float((((predicted - mean) / std - (target - mean) / std) ** 2).sum())
                count += target.numel()
    refs["rgb"] = (squared / count, count)
    depth = batch["depth"][:, 0]
    valid = pixel_mask(batch["mask_depth"]) & (depth > 0)
    refs["depth"] = (float((predictions["depth"][:, 0].detach() - depth).abs()[valid].mean()), int(valid.sum()))
    labels = batch["semseg"]
    valid = pixel_mask(batch["mask_semseg"]) & (labels != 255)
    losses = F.cross_entropy(predictions["semseg"].detach(), labels.clamp(max=NUM_CLASSES - 1), reduction="none")
    refs["semseg"] = (float(losses[valid].mean()), int(valid.sum()))
    return refs


@pytest.mark.parametrize("decoder_type", DECODER_TYPES)
def test_shapes_and_losses_match_hand_computed_references(decoder_type):
    model = tiny_model(decoder_type=decoder_type)
    batch = random_batch(batch=3)
    with torch.no_grad():
        out = model(**batch)
    assert out.predictions["rgb"].shape == (3, 3, IMAGE, IMAGE)
    assert out.predictions["depth"].shape == (3, 1, IMAGE, IMAGE)
    assert out.predictions["semseg"].shape == (3, NUM_CLASSES, IMAGE, IMAGE)
    refs = reference_losses(batch, out.predictions)
    for name, (mean, count) in refs.items():
        assert out.task_counts[name] == count, name
        assert float(out.task_losses[name]) == pytest.approx(mean, rel=1e-4), name
    assert float(out.loss) == pytest.approx(sum(m for m, _ in refs.values()) / 3, rel=1e-4)
    encoded = model.multimae(**{k: v for k, v in batch.items()})
    assert encoded.last_hidden_state.shape == (3, 1 + 12, 32)  # global token + the 12 visible patches


@pytest.mark.parametrize("decoder_type", DECODER_TYPES)
def test_loss_only_scores_hidden_patches(decoder_type):
    """The gradient of each task loss w.r.t. its decoder's patch predictions is zero exactly at visible patches."""
    model = tiny_model(decoder_type=decoder_type)
    batch = random_batch(batch=2, visible=20)
    captured = {}
    for name, decoder in model.decoders.items():
        decoder.register_forward_hook(lambda module, args, output, name=name: captured.__setitem__(name, output))
    out = model(**batch)
    for name in ("rgb", "depth", "semseg"):
        (grad,) = torch.autograd.grad(out.task_losses[name], captured[name], retain_graph=True)
        per_patch = grad.abs().sum(-1)
        hidden = batch[f"mask_{name}"]
        assert torch.all(per_patch[~hidden] == 0), name
        assert (per_patch[hidden] > 0).float().mean() > 0.9, name  # a few hidden patches may be all-invalid


@pytest.mark.parametrize("decoder_type", DECODER_TYPES)
def test_hidden_inputs_change_targets_not_predictions(decoder_type):
    model = tiny_model(decoder_type=decoder_type)
    batch = random_batch(batch=2)
    out = model(**batch)
    changed = dict(batch)
    hidden = pixel_mask(batch["mask_depth"])[:, None]
    changed["depth"] = torch.where(hidden, batch["depth"] + 1.0, batch["depth"])
    out2 = model(**changed)
    for name in ("rgb", "depth", "semseg"):
        assert torch.equal(out.predictions[name], out2.predictions[name]), name
    assert torch.equal(out.task_losses["rgb"], out2.task_losses["rgb"])
    assert float(out2.task_losses["depth"]) != pytest.approx(float(out.task_losses["depth"]))
    # Changing visible depth pixels changes what the encoder sees, hence every prediction.
    visible_changed = dict(batch, depth=torch.where(hidden, batch["depth"], batch["depth"] + 1.0))
    assert not torch.allclose(model(**visible_changed).predictions["semseg"], out.predictions["semseg"])


def test_absent_modality_is_an_absent_task():
    model = tiny_model()
    batch = random_batch(modalities=("rgb", "semseg"))
    out = model(**batch)
    assert set(out.task_losses) == set(out.task_counts) == set(out.predictions) == {"rgb", "semseg"}
    assert float(out.loss) == pytest.approx((float(out.task_losses["rgb"]) + float(out.task_losses["semseg"])) / 2)


@pytest.mark.parametrize("invalid", [0.0, float("nan")])
def test_depth_without_valid_hidden_pixels_counts_zero_and_stays_finite(invalid):
    model = tiny_model().train()
    batch = random_batch()
    hidden = pixel_mask(batch["mask_depth"])[:, None]
    batch["depth"] = torch.where(hidden, torch.full_like(batch["depth"], invalid), batch["depth"])
    out = model(**batch)
    assert out.task_counts["depth"] == 0 and float(out.task_losses["depth"]) == 0.0
    assert float(out.loss) == pytest.approx((float(out.task_losses["rgb"]) + float(out.task_losses["semseg"])) / 2)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_fully_visible_modality_has_no_targets():
    batch = random_batch(visible=NUM_PATCHES + 4)
    batch["mask_depth"] = torch.zeros_like(batch["mask_depth"])
    out = tiny_model()(**batch)
    assert out.task_counts["depth"] == 0 and float(out.task_losses["depth"]) == 0.0


@pytest.mark.parametrize("decoder_type", DECODER_TYPES)
def test_unequal_visible_counts_are_padded_without_leaking(decoder_type):
    """Samples with different visible budgets give the same outputs batched as alone."""
    model = tiny_model(decoder_type=decoder_type)
    first, second = random_batch(batch=1, seed=1, visible=10), random_batch(batch=1, seed=2, visible=17)
    batched = model(**{k: torch.cat([first[k], second[k]]) for k in first})
    for row, single in enumerate((first, second)):
        alone = model(**single)
        for name in ("rgb", "depth", "semseg"):
            assert torch.allclose(batched.predictions[name][row], alone.predictions[name][0], atol=1e-5), name


def test_modalities_are_configuration():
    """Other names and a subset of kinds: the names are the batch keys and the task names."""
    specs = [ModalitySpec("image", "rgb", norm_pix_loss=False), ModalitySpec("height", "depth")]
    model = tiny_model(modalities=specs)
    assert model.config.task_names == ["image", "height"]
    batch = random_batch(modalities=("rgb", "depth"))
    renamed = {"image": batch["rgb"], "mask_image": batch["mask_rgb"], "height": batch["depth"]}
    renamed["mask_height"] = batch["mask_depth"]
    out = model(**renamed)
    assert set(out.task_losses) == {"image", "height"}
    hidden = pixel_mask(batch["mask_rgb"])[:, None].expand_as(batch["rgb"])
    squared_error = (out.predictions["image"].detach() - batch["rgb"]) ** 2  # raw pixels: norm_pix_loss=False
    assert out.task_losses["image"].item() == pytest.approx(float(squared_error[hidden].mean()), rel=1e-5)
    with pytest.raises(TypeError, match="unexpected input 'rgb'"):
        model(rgb=batch["rgb"])


def test_config_round_trip_and_validation(tmp_path):
    config = tiny_config(image_size=[8, 12], finetune_modalities=["rgb", "depth"])
    config.save_pretrained(tmp_path)
    loaded = MultiMAEConfig.from_pretrained(tmp_path)
    assert loaded.modalities == config.modalities and loaded.to_dict() == config.to_dict()
    assert loaded.num_patches == 2 * 3 and loaded.task_names == ["rgb", "depth", "semseg"]
    for settings, message in [
        (dict(modalities=[ModalitySpec("a", "rgb"), ModalitySpec("a", "depth")]), "unique names"),
        (dict(finetune_modalities=["normals"]), "must be a non-empty subset"),
        (dict(image_size=18), "multiple of patch_size"),
        (dict(head_layer_indices=[0, 1, 2]), "four encoder layers"),
        (dict(decoder_type="self_attention"), "decoder_type 'self_attention' is not one of"),
    ]:
        with pytest.raises(ValueError, match=message):
            tiny_config(**settings)
    for spec, message in [
        (dict(name="s", kind="semseg"), "needs num_classes"),
        (dict(name="s", kind="semseg", num_classes=300), "ignore_index 255 is a class id"),
        (dict(name="s", kind="semseg", num_classes=4, channels=3), "channels 1"),
        (dict(name="d", kind="depth", loss="cross_entropy"), "needs kind 'semseg'"),
        (dict(name="x", kind="normals"), "kind 'normals' is not one of"),
        (dict(name="mask-1", kind="rgb"), "identifier"),
        (dict(name="d", kind="depth", depth_normalization="log"), "depth_normalization 'log' is not one of"),
        (dict(name="d", kind="depth", max_depth=0.0), "max_depth must be > 0"),
        (dict(name="i", kind="rgb", max_depth=10.0), "apply to kind 'depth'"),
    ]:
        with pytest.raises(ValueError, match=message):
            ModalitySpec(**spec)


def test_cross_attention_block_matches_a_hand_computation():
    """Queries attend to the real context tokens only (softmax(q k^T / sqrt(d)) v per head, padded tokens weigh 0),
    then output projection, residual, pre-norm MLP, residual."""
    config = tiny_config(decoder_hidden_size=16, decoder_num_attention_heads=2, decoder_intermediate_size=32)
    decoder_config = MultiMAEForPreTraining(config).decoders["rgb"].config
    torch.manual_seed(0)
    block = MultiMAECrossAttention(decoder_config).eval()
    queries, context = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    context_mask = torch.ones(2, 7, dtype=torch.long)
    context_mask[1, 4:] = 0
    with torch.no_grad():
        out = block(queries, context, context_mask)
        expected = torch.empty_like(out)
        for row in range(2):
            real = context[row, : int(context_mask[row].sum())]
            q = block.query(block.query_norm(queries[row])).view(5, 2, 8).transpose(0, 1)
            k = block.key(block.context_norm(real)).view(-1, 2, 8).transpose(0, 1)
            v = block.value(block.context_norm(real)).view(-1, 2, 8).transpose(0, 1)
            weights = torch.softmax(q @ k.transpose(1, 2) / 8**0.5, dim=-1)
            hidden = queries[row] + block.output((weights @ v).transpose(0, 1).reshape(5, 16))
            expected[row] = hidden + block.mlp(block.mlp_norm(hidden))
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        changed = context.clone()
        changed[1, 4:] += 100.0  # padding: no influence
        torch.testing.assert_close(block(queries, changed, context_mask), out)


def test_a_config_saved_before_decoder_type_keeps_the_joint_decoders(tmp_path):
    """Checkpoints written before the option load as they were trained (joint), every weight found; new configs
    default to MultiMAE's cross-attention decoders and keep their choice through save/load."""
    assert MultiMAEConfig().decoder_type == "cross_attention"
    model = tiny_model(decoder_type="joint")
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["decoder_type"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    loaded, info = MultiMAEForPreTraining.from_pretrained(tmp_path, output_loading_info=True)
    assert loaded.config.decoder_type == "joint" and not any(info.values())
    batch = random_batch()
    torch.testing.assert_close(loaded.eval()(**batch).loss, model(**batch).loss)
    cross = tiny_model(decoder_type="cross_attention")
    cross.save_pretrained(tmp_path / "cross")
    assert MultiMAEConfig.from_pretrained(tmp_path / "cross").decoder_type == "cross_attention"


def test_bad_inputs_are_clear_errors():
    model = tiny_model()
    batch = random_batch()
    with pytest.raises(ValueError, match=r"input 'semseg': class ids \[7\] are outside 0..4"):
        model(**dict(batch, semseg=batch["semseg"].masked_fill(batch["semseg"] == 0, 7)))
    with pytest.raises(TypeError, match="unexpected input 'normals'"):
        model(**batch, normals=batch["rgb"])
    with pytest.raises(ValueError, match="differ in batch size or image size"):
        model(**dict(batch, depth=batch["depth"][..., :8]))
    with pytest.raises(ValueError, match="do not tile into 4x4 patches"):
        model(rgb=torch.randn(1, 3, 18, 18))
    with pytest.raises(ValueError, match=r"mask_rgb has shape \(2, 3\)"):
        model(**dict(batch, mask_rgb=torch.zeros(2, 3, dtype=torch.bool)))


def test_non_multimae_checkpoint_is_refused(tmp_path):
    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"model_type 'vit', not an MM-MAE checkpoint.*ViTModel"):
        MultiMAEForPreTraining.from_pretrained(tmp_path)


@pytest.mark.slow
def test_auto_classes_load_the_checkpoint_in_a_fresh_interpreter(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "multimae"
    batch = random_batch()
    out = model(**batch)
    save_file({k: v.contiguous() for k, v in batch.items()}, tmp_path / "batch.safetensors")
    expected = {name: float(loss) for name, loss in out.task_losses.items()}
    encoder_features = model.multimae(rgb=batch["rgb"]).last_hidden_state
    save_file({"features": encoder_features.detach()}, tmp_path / "features.safetensors")
    script = textwrap.dedent(
        f"""
        import json, sys, torch
        import robust_pretrain
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModel, AutoModelForPreTraining
        path = {str(tmp_path)!r}
        assert type(AutoConfig.from_pretrained(path)).__name__ == "MultiMAEConfig"
        model = AutoModelForPreTraining.from_pretrained(path).eval()
        out = model(**load_file(path + "/batch.safetensors"))
        encoder = AutoModel.from_pretrained(path).eval()
        rgb = load_file(path + "/batch.safetensors")["rgb"]
        gap = (encoder(rgb=rgb).last_hidden_state - load_file(path + "/features.safetensors")["features"]).abs().max()
        print(json.dumps({{"classes": [type(model).__name__, type(encoder).__name__], "gap": float(gap),
                          "losses": {{k: float(v) for k, v in out.task_losses.items()}}}}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=checkout_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["classes"] == ["MultiMAEForPreTraining", "MultiMAEModel"]
    assert report["gap"] == 0.0
    assert report["losses"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow
def test_registration_is_lazy_and_independent_of_import_order():
    light = "import sys, robust_pretrain; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    transformers_first = (
        "from transformers import AutoConfig, AutoModelForSemanticSegmentation\n"
        "import robust_pretrain\n"
        "from robust_pretrain.vision.multimae.configuration_multimae import MultiMAEConfig\n"
        "print([type(AutoConfig.for_model('multimae')).__name__,"
        " AutoModelForSemanticSegmentation._model_mapping[MultiMAEConfig].__name__])"
    )
    outputs = []
    for script in (light, transformers_first):
        result = subprocess.run(
            [sys.executable, "-c", script], env=checkout_env(), capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr[-3000:]
        outputs.append(result.stdout.strip().splitlines()[-1])
    assert outputs == ["[]", "['MultiMAEConfig', 'MultiMAEForSemanticSegmentation']"]


def test_vit_export_round_trip(tmp_path, capsys):
    model = tiny_model(seed=3, image_size=[IMAGE, 2 * IMAGE])
    with torch.no_grad():  # move the weights away from their initial values, global token included
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    export_vit(model, tmp_path / "vit")
    vit = ViTModel.from_pretrained(tmp_path / "vit", add_pooling_layer=False).eval()
    rgb = torch.randn(2, 3, IMAGE, 2 * IMAGE)
    with torch.no_grad():
        ours, theirs = model.multimae(rgb=rgb).last_hidden_state, vit(rgb).last_hidden_state
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=0)
    _, info = ViTForImageClassification.from_pretrained(tmp_path / "vit", num_labels=3, output_loading_info=True)
    assert sorted(info["missing_keys"]) == ["classifier.bias", "classifier.weight"]
    assert not (tmp_path / "vit" / "preprocessor_config.json").exists()  # a model object carries no processor
    # The command line path: from a saved pre-training checkpoint with its processor, which becomes ViT's.
    model.save_pretrained(tmp_path / "mmmae")
    mean, std = [0.3, 0.4, 0.5], [0.2, 0.25, 0.3]
    MultiMAEImageProcessor(size=(IMAGE, 2 * IMAGE), image_mean=mean, image_std=std).save_pretrained(tmp_path / "mmmae")
    assert export_main([str(tmp_path / "mmmae"), str(tmp_path / "vit2")]) == 0
    vit2 = ViTModel.from_pretrained(tmp_path / "vit2", add_pooling_layer=False)
    assert torch.allclose(vit2(rgb).last_hidden_state, theirs, atol=1e-6, rtol=0)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (IMAGE, 2 * IMAGE, 3), dtype=np.uint8))
    vit_pixels = AutoImageProcessor.from_pretrained(tmp_path / "vit2")(image, return_tensors="pt")["pixel_values"]
    ours = MultiMAEImageProcessor.from_pretrained(tmp_path / "mmmae")(image)["rgb"]
    assert torch.allclose(vit_pixels, ours, atol=1e-5)
    assert export_main([str(tmp_path / "mmmae"), str(tmp_path / "mmmae")]) == 2  # refused, nothing overwritten
    assert "holds another (non-ViT) checkpoint" in capsys.readouterr().err
    assert json.loads((tmp_path / "mmmae" / "config.json").read_text())["model_type"] == "multimae"
    with pytest.raises(ValueError, match="class-id map"):
        export_vit(model, tmp_path / "vit3", modality="semseg")


@pytest.mark.slow
@pytest.mark.parametrize("modalities", [("rgb", "depth", "semseg"), ("rgb", "semseg")])
def test_minimax_trainer_trains_multimae_and_logs_task_losses(modalities, tmp_path):
    model = tiny_model().train()
    args = MinimaxTrainingArguments(
        output_dir=str(tmp_path),
        task_names=model.config.task_names,
        weighting="minimax",
        per_device_train_batch_size=4,
        max_steps=3,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    data = BatchExamples(random_batch(batch=8, modalities=modalities))
    trainer = MinimaxTrainer(model=model, args=args, train_dataset=data)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 3
    for entry in logs:
        # minimax, alpha = 1: the weights are the softmax of the step's task losses; an absent task weighs 0.
        losses = torch.tensor([entry[f"task_loss/{name}"] for name in modalities])
        expected = dict(zip(modalities, torch.softmax(losses, dim=0).tolist(), strict=True))
        for name in ("rgb", "depth", "semseg"):
            assert entry[f"task_weight/{name}"] == pytest.approx(expected.get(name, 0.0), abs=1e-5), name
        assert ("task_loss/depth" in entry) == ("depth" in modalities)


@pytest.mark.slow
def test_ddp_two_processes_with_a_modality_absent_on_one_rank(tmp_path):
    """A batch without depth on one process and with depth on the other: DDP still syncs every parameter, the depth
    task is present for the step (its loss logged, its weight > 0) and both processes agree."""
    script = Path(__file__).with_name("vision_ddp_run.py")
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    command = [*launch, str(script), "--out", str(tmp_path)]
    result = subprocess.run(command, env=checkout_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert runs[0]["logs"] == runs[1]["logs"]
    had_depth = list(zip(runs[0]["had_depth"], runs[1]["had_depth"], strict=True))
    depth_steps = [step for step, ranks in enumerate(had_depth) if any(ranks)]
    assert any(had_depth[step][0] != had_depth[step][1] for step in depth_steps)
    for step, entry in enumerate(runs[0]["logs"]):
        assert ("task_loss/depth" in entry) == (step in depth_steps)
        assert (entry["task_weight/depth"] > 0) == (step in depth_steps)
    params = [load_file(tmp_path / f"params-rank{rank}.safetensors") for rank in (0, 1)]
    assert all(torch.equal(params[0][key], params[1][key]) for key in params[0])


def test_encoder_loads_from_pretraining_checkpoint(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    encoder = MultiMAEModel.from_pretrained(tmp_path)
    for key, value in encoder.state_dict().items():
        assert torch.equal(value, model.multimae.state_dict()[key]), key


def test_plain_trainer_evaluates_and_predicts(tmp_path):
    model = tiny_model()
    batch = random_batch(batch=6)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_eval_batch_size=4,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = Trainer(model=model, args=args, eval_dataset=BatchExamples(batch))
    with torch.no_grad():
        first = model(**{k: v[:4] for k, v in batch.items()})
        second = model(**{k: v[4:] for k, v in batch.items()})
    expected = (4 * float(first.loss) + 2 * float(second.loss)) / 6
    assert trainer.evaluate()["eval_loss"] == pytest.approx(expected, rel=1e-5)
    predictions = trainer.predict(BatchExamples(batch)).predictions
    assert {k: v.shape for k, v in predictions.items()} == {
        "rgb": (6, 3, IMAGE, IMAGE),
        "depth": (6, 1, IMAGE, IMAGE),
        "semseg": (6, NUM_CLASSES, IMAGE, IMAGE),
    }
    assert predictions["depth"][4:] == pytest.approx(second.predictions["depth"].numpy(), abs=1e-5)


def test_gradient_checkpointing_gives_the_same_loss_and_gradients():
    model = tiny_model().train()
    batch = random_batch()
    model(**batch).loss.backward()
    reference = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.gradient_checkpointing_enable()
    layers = [*model.multimae.layers, *(layer for decoder in model.decoders.values() for layer in decoder.layers)]
    assert all(layer.gradient_checkpointing for layer in layers)
    model(**batch).loss.backward()
    for name, grad in reference.items():
        assert torch.allclose(dict(model.named_parameters())[name].grad, grad, atol=1e-6), name
