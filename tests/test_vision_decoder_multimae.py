"""MultiMAE's cross-attention decoder (issue 32 item 1): with ``DECODER_VARIANTS["multimae"]`` a decoder computes,
on the same weights, what a hand-written MultiMAE output adapter computes (``SpatialOutputAdapter`` with
``use_task_queries`` and ``use_xattn``, written here from the paper and the reference code's semantics), and each of
the four switches alone changes the result."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_recipe_multimae import argv
from test_recipe_pretrain import single_thread
from tiny_vision import IMAGE, NUM_PATCHES, PATCH, random_batch, tiny_config
from torch.nn import functional as F

from robust_pretrain.config import load_config_file
from robust_pretrain.pretraining.multimae import recipe
from robust_pretrain.vision.multimae.configuration_multimae import DECODER_VARIANTS, MultiMAEConfig
from robust_pretrain.vision.multimae.pretraining import MultiMAEForPreTraining

MODALITIES = ("rgb", "depth", "semseg")
GRID = IMAGE // PATCH
HEADS = 2


def moco_sincos(grid: int, dim: int) -> torch.Tensor:
    """MultiMAE's (MoCo-v3's) fixed 2D sine-cosine embedding of a square grid, (grid * grid, dim) row-major: patch
    (i, j) gets [sin(i w), cos(i w), sin(j w), cos(j w)] with w_k = 10000^(-k / (dim / 4)), stored in
    float32 as MultiMAE's (and the model's) table is."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))
    steps = torch.arange(grid, dtype=torch.float64)
    rows, cols = torch.meshgrid(steps, steps, indexing="ij")
    out_rows, out_cols = rows.flatten()[:, None] * omega, cols.flatten()[:, None] * omega
    return torch.cat([out_rows.sin(), out_rows.cos(), out_cols.sin(), out_cols.cos()], dim=1).float().double()


def layer_norm(x: torch.Tensor, weights: dict, name: str) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], weights[f"{name}.weight"], weights[f"{name}.bias"], eps=1e-6)


def linear(x: torch.Tensor, weights: dict, name: str) -> torch.Tensor:
    return x @ weights[f"{name}.weight"].T + weights[f"{name}.bias"]


def attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T * head_dim^-0.5) v per head; (n, d) x (m, d) x (m, d) -> (n, d)."""
    q, k, v = (t.reshape(t.shape[0], HEADS, -1).transpose(0, 1) for t in (queries, keys, values))
    weights = (q @ k.transpose(1, 2) * q.shape[-1] ** -0.5).softmax(dim=-1)
    return (weights @ v).transpose(0, 1).reshape(queries.shape[0], -1)


def gelu_mlp(x: torch.Tensor, weights: dict, first: str, second: str) -> torch.Tensor:
    return linear(F.gelu(linear(x, weights, first)), weights, second)


def multimae_output_adapter(
    weights: dict, encoder_tokens: torch.Tensor, ids_keep: torch.Tensor, task: int, num_global: int, layers: int
) -> torch.Tensor:
    """MultiMAE's spatial output adapter for the modality ``task`` on one image.

    ``encoder_tokens`` (V + G, D): the encoder's last layer (MultiMAE's encoder has no final norm), the visible tokens
    in ``ids_keep`` order (indices into the modality-major concatenation of all patches), then the global tokens.
    Steps: project to the decoder width; append one mask token per hidden patch and unshuffle; add each modality's
    embedding and the position embedding to every token; the queries are the decoder's own modality's tokens (its
    visible tokens as encoded, its hidden ones mask tokens); the context is the visible tokens again plus the projected
    global tokens (no embedding); cross-attention (pre-norm on queries and context, no residual), then a pre-norm MLP
    with residual, then ``layers`` pre-norm transformer blocks, then the output projection (no norm).
    """
    projected = linear(encoder_tokens, weights, "decoder_embed")
    visible, global_tokens = projected[:-num_global], projected[-num_global:]
    total, dim = len(MODALITIES) * NUM_PATCHES, projected.shape[-1]
    hidden_ids = torch.tensor([i for i in range(total) if i not in set(ids_keep.tolist())], dtype=torch.long)
    ids_restore = torch.argsort(torch.cat([ids_keep, hidden_ids]))
    shuffled = torch.cat([visible, weights["mask_token"].reshape(1, dim).expand(total - len(ids_keep), dim)])
    tokens = shuffled[ids_restore]
    position = moco_sincos(GRID, dim)
    tokens = tokens + torch.cat([weights["modality_embeddings"][m] + position for m in range(len(MODALITIES))])
    queries = tokens[task * NUM_PATCHES : (task + 1) * NUM_PATCHES]
    context = torch.cat([tokens[ids_keep], global_tokens])

    normed_context = layer_norm(context, weights, "cross_attention.context_norm")
    x = attention(
        linear(layer_norm(queries, weights, "cross_attention.query_norm"), weights, "cross_attention.query"),
        linear(normed_context, weights, "cross_attention.key"),
        linear(normed_context, weights, "cross_attention.value"),
    )
    x = linear(x, weights, "cross_attention.output")
    x = x + gelu_mlp(
        layer_norm(x, weights, "cross_attention.mlp_norm"), weights, "cross_attention.mlp.0", "cross_attention.mlp.2"
    )
    for index in range(layers):
        block = f"layers.{index}"
        normed = layer_norm(x, weights, f"{block}.layernorm_before")
        projections = [linear(normed, weights, f"{block}.attention.{p}_proj") for p in "qkv"]
        x = x + linear(attention(*projections), weights, f"{block}.attention.o_proj")
        x = x + gelu_mlp(
            layer_norm(x, weights, f"{block}.layernorm_after"), weights, f"{block}.mlp.fc1", f"{block}.mlp.fc2"
        )
    return linear(x, weights, "prediction")


def model_and_batch(**switches: bool) -> tuple[MultiMAEForPreTraining, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = tiny_config(decoder_num_hidden_layers=2, decoder_num_attention_heads=HEADS, **switches)
    model = MultiMAEForPreTraining(config).double().eval()  # float64: agreement to ~1e-12, not float32's 1e-5
    with torch.no_grad():  # decoder weights of unit scale, norms far from the identity: a skipped step shows
        for name, parameter in model.decoders.named_parameters():
            parameter.normal_(mean=1.0 if "norm" in name and name.endswith("weight") else 0.0, std=0.5)
    batch = {key: value.double() if value.is_floating_point() else value for key, value in random_batch(3, 3).items()}
    batch["mask_rgb"][1, :] = True  # image 1: no visible rgb patch (all its rgb queries are mask tokens)
    batch["mask_depth"][2, :3] = False  # image 2: more visible patches than the others (padded batch)
    return model, batch


def decoder_outputs(model: MultiMAEForPreTraining, batch: dict) -> dict[str, torch.Tensor]:
    captured: dict[str, torch.Tensor] = {}
    hooks = [
        decoder.register_forward_hook(lambda module, args, output, name=name: captured.__setitem__(name, output))
        for name, decoder in model.decoders.items()
    ]
    with torch.no_grad():
        model(**batch)
    for hook in hooks:
        hook.remove()
    return captured


def reference_outputs(model: MultiMAEForPreTraining, batch: dict) -> dict[str, torch.Tensor]:
    """The hand-written adapter per image (no padding), fed the encoder's last layer in MultiMAE's token order."""
    inputs = {name: batch[name] for name in MODALITIES}
    masks = {name: batch[f"mask_{name}"] for name in MODALITIES}
    with torch.no_grad():
        encoded = model.multimae.encode(inputs, masks, output_hidden_states=True)
    last, num_global = encoded.hidden_states[-1], model.config.num_global_tokens
    hidden = torch.cat([masks[name] for name in MODALITIES], dim=1)
    outputs = {name: [] for name in MODALITIES}
    for image in range(hidden.shape[0]):
        ids_keep = torch.nonzero(~hidden[image])[:, 0]
        tokens = torch.cat([last[image, num_global : num_global + len(ids_keep)], last[image, :num_global]])
        for task, name in enumerate(MODALITIES):
            weights = dict(model.decoders[name].state_dict())
            outputs[name].append(
                multimae_output_adapter(
                    weights, tokens, ids_keep, task, num_global, model.config.decoder_num_hidden_layers
                )
            )
    return {name: torch.stack(values) for name, values in outputs.items()}


def test_the_multimae_variant_computes_multimae_s_output_adapter() -> None:
    model, batch = model_and_batch(**DECODER_VARIANTS["multimae"])
    assert not hasattr(model.decoders["rgb"], "norm")  # no final norm, hence no unused weights
    outputs, expected = decoder_outputs(model, batch), reference_outputs(model, batch)
    for name in MODALITIES:
        assert outputs[name].shape == (3, NUM_PATCHES, PATCH * PATCH * model.config.modality(name).output_channels)
        torch.testing.assert_close(outputs[name], expected[name], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("switch", list(DECODER_VARIANTS["project"]))
def test_each_switch_alone_departs_from_multimae(switch: str) -> None:
    """Set back to the project's value, each switch changes every modality's output by far more than float error."""
    model, batch = model_and_batch(**{**DECODER_VARIANTS["multimae"], switch: DECODER_VARIANTS["project"][switch]})
    outputs, expected = decoder_outputs(model, batch), reference_outputs(model, batch)
    for name in MODALITIES:
        if switch == "decoder_use_task_queries" and name == "rgb":
            outputs[name], expected[name] = outputs[name][[0, 2]], expected[name][[0, 2]]  # image 1 has none
        assert (outputs[name] - expected[name]).abs().max() > 0.05 * expected[name].abs().max(), name


def test_defaults_are_the_project_variant_and_the_switches_need_cross_attention(tmp_path: Path) -> None:
    """A config without the keys (every checkpoint before the option) is the project's variant; the switches
    survive save/load; they are refused with the joint decoder, which has no cross-attention block."""
    config = MultiMAEConfig()
    assert {key: getattr(config, key) for key in DECODER_VARIANTS["project"]} == DECODER_VARIANTS["project"]
    tiny_config(**DECODER_VARIANTS["multimae"]).save_pretrained(tmp_path)
    loaded = MultiMAEConfig.from_pretrained(tmp_path)
    assert {key: getattr(loaded, key) for key in DECODER_VARIANTS["multimae"]} == DECODER_VARIANTS["multimae"]
    with pytest.raises(ValueError, match=r"\['decoder_final_norm'\] apply to decoder_type 'cross_attention'"):
        tiny_config(decoder_type="joint", decoder_final_norm=False)


def test_the_recipe_and_the_vision_demo_reach_the_variant(tmp_path: Path) -> None:
    """``--decoder_variant multimae`` trains and saves MultiMAE's switches; the demo config names the variant."""
    assert load_config_file("vision_demo")["decoder_variant"] == "multimae"  # chosen by the decoder comparison
    with single_thread():
        recipe.run(
            argv(tmp_path / "run", "--decoder_variant", "multimae", "--max_steps", "1", "--num_reconstructions", "0")
        )
    saved = MultiMAEConfig.from_pretrained(tmp_path / "run")
    assert {key: getattr(saved, key) for key in DECODER_VARIANTS["multimae"]} == DECODER_VARIANTS["multimae"]
