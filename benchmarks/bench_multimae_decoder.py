"""MM-MAE decoders: MultiMAE's cross-attention decoder against the joint self-attention decoder (``decoder_type``).

Time: for each model geometry, two ``MultiMAEForPreTraining`` that share the encoder's weights (same seed) differ
only in ``decoder_type``. Per round, each does one training step on the same batch of generated scenes (processor
crops + ``ModalityMaskCollator`` masks): forward, mean of the task losses, backward, AdamW step; and, separately,
its decoders alone (forward + backward from the same encoded tokens, captured once per batch). The order alternates
between rounds; reported: medians, and the median of the per-round ratios cross_attention / joint.

Reconstruction: the vision demo recipe (``recipes/configs/vision_demo.yaml``, minimax, its defaults) for ``--steps``
steps, both decoder types, seeds 42 and 43, through ``--config_overrides decoder_type=...``; the held-out
per-modality losses of ``task_report.json`` (the fixed evaluation masks), their mean and worst.

Decision rule (fixed before running): ``cross_attention`` becomes the default if its held-out mean task loss
(averaged over the seeds) is at most 2 % above joint's and its median training step is not slower (ratio <= 1.0) at
the paper's geometry; otherwise ``joint`` stays the default.

    python benchmarks/bench_multimae_decoder.py      # writes benchmarks/results/multimae_decoder.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from robust_pretrain.pretraining.multimae import recipe
from robust_pretrain.pretraining.multimae.arguments import MODEL_SIZES
from robust_pretrain.vision.collator import ModalityMaskCollator
from robust_pretrain.vision.multimae.configuration_multimae import DECODER_TYPES, ModalitySpec, MultiMAEConfig
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor
from robust_pretrain.vision.multimae.pretraining import MultiMAEForPreTraining
from robust_pretrain.vision.scenes import NUM_CLASSES, SceneConfig, generate_scenes

RESULTS = Path(__file__).with_name("results")
DEMO_CONFIG = Path(__file__).resolve().parents[1] / "recipes" / "configs" / "vision_demo.yaml"
# name: model preset (recipe's MODEL_SIZES), image side, patch side, visible tokens, batch size
GEOMETRIES = {
    "demo": ("tiny", 32, 4, 32, 32),
    "paper": ("small", 224, 16, 98, 8),
}


def model_config(preset: str, image: int, patch: int, decoder_type: str) -> MultiMAEConfig:
    layers, hidden, heads, intermediate, dec_hidden, dec_layers, dec_heads, dec_intermediate = MODEL_SIZES[preset]
    return MultiMAEConfig(
        modalities=[ModalitySpec("rgb", "rgb"), ModalitySpec("depth", "depth"),
                    ModalitySpec("semseg", "semseg", num_classes=NUM_CLASSES)],
        image_size=image, patch_size=patch, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=intermediate, decoder_hidden_size=dec_hidden, decoder_num_hidden_layers=dec_layers,
        decoder_num_attention_heads=dec_heads, decoder_intermediate_size=dec_intermediate, decoder_type=decoder_type,
    )  # fmt: skip


def scene_batches(count: int, batch_size: int, image: int, patch: int, visible: int) -> list[dict]:
    scenes = generate_scenes(batch_size * count, "train", 0, SceneConfig(image_size=image + image // 4))
    processor = MultiMAEImageProcessor(size=image, num_classes=NUM_CLASSES)
    collator = ModalityMaskCollator(visible, patch, seed=0)
    rng = np.random.default_rng(0)
    examples = [{**processor.process_example(row, train=True, rng=rng), "id": row["id"]} for row in scenes]
    return [collator(examples[i : i + batch_size]) for i in range(0, len(examples), batch_size)]


def decoder_inputs(model: MultiMAEForPreTraining, batch: dict) -> dict[str, tuple]:
    """Each decoder's positional arguments in a forward pass on ``batch`` (encoded tokens detached)."""
    captured: dict[str, tuple] = {}
    hooks = [
        decoder.register_forward_pre_hook(lambda module, args, name=name: captured.__setitem__(name, args))
        for name, decoder in model.decoders.items()
    ]
    with torch.no_grad():
        model(**batch)
    for hook in hooks:
        hook.remove()
    return {name: (args[0].detach().requires_grad_(), *args[1:]) for name, args in captured.items()}


def time_geometry(name: str, rounds: int, warmup: int) -> dict:
    preset, image, patch, visible, batch_size = GEOMETRIES[name]
    models = {}
    for decoder_type in DECODER_TYPES:
        torch.manual_seed(0)
        models[decoder_type] = MultiMAEForPreTraining(model_config(preset, image, patch, decoder_type)).train()
    optimizers = {kind: torch.optim.AdamW(model.parameters(), lr=1e-4) for kind, model in models.items()}
    batches = scene_batches(rounds + warmup, batch_size, image, patch, visible)
    step_times: dict[str, list[float]] = {kind: [] for kind in DECODER_TYPES}
    decoder_times: dict[str, list[float]] = {kind: [] for kind in DECODER_TYPES}
    for index, batch in enumerate(batches):
        for kind in DECODER_TYPES if index % 2 == 0 else DECODER_TYPES[::-1]:
            model = models[kind]
            start = time.perf_counter()
            loss = model(**batch).loss
            loss.backward()
            optimizers[kind].step()
            optimizers[kind].zero_grad()
            elapsed = time.perf_counter() - start
            inputs = decoder_inputs(model, batch)
            start = time.perf_counter()
            sum(model.decoders[task](*args).square().mean() for task, args in inputs.items()).backward()
            decoder_elapsed = time.perf_counter() - start
            model.zero_grad()
            if index >= warmup:
                step_times[kind].append(elapsed)
                decoder_times[kind].append(decoder_elapsed)

    def ratio(times: dict[str, list[float]]) -> float:
        return statistics.median(a / b for a, b in zip(times["cross_attention"], times["joint"], strict=True))

    return {
        "geometry": name,
        "model": preset,
        "image_size": image,
        "patch_size": patch,
        "num_visible_tokens": visible,
        "batch_size": batch_size,
        "parameters": {kind: sum(p.numel() for p in model.parameters()) for kind, model in models.items()},
        "median_step_s": {kind: statistics.median(values) for kind, values in step_times.items()},
        "median_decoder_s": {kind: statistics.median(values) for kind, values in decoder_times.items()},
        "step_ratio_cross_vs_joint": ratio(step_times),
        "decoder_ratio_cross_vs_joint": ratio(decoder_times),
    }


def reconstruction(steps: int, seeds: list[int]) -> dict:
    runs = []
    with tempfile.TemporaryDirectory() as out:
        for seed in seeds:
            for decoder_type in DECODER_TYPES:
                argv = ["--config", str(DEMO_CONFIG), "--output_dir", f"{out}/{decoder_type}-{seed}",
                        "--max_steps", str(steps), "--seed", str(seed), "--save_steps", str(10 * steps),
                        "--config_overrides", f"decoder_type={decoder_type}", "--disable_tqdm", "true",
                        "--num_reconstructions", "0", "--report_to", "none"]  # fmt: skip
                start = time.perf_counter()
                report = recipe.run(argv)["report"]
                runs.append(
                    {
                        "decoder_type": decoder_type,
                        "seed": seed,
                        "eval_task_loss": report["eval_task_loss"],
                        "eval_mean_task_loss": report["eval_mean_task_loss"],
                        "eval_worst_task_loss": report["eval_worst_task_loss"],
                        "worst_task": report["worst_task"],
                        "wall_s": time.perf_counter() - start,
                    }
                )
    summary = {
        kind: {
            key: statistics.fmean(run[key] for run in runs if run["decoder_type"] == kind)
            for key in ("eval_mean_task_loss", "eval_worst_task_loss")
        }
        for kind in DECODER_TYPES
    }
    return {"steps": steps, "seeds": seeds, "runs": runs, "mean_over_seeds": summary}


def decide(timings: list[dict], losses: dict) -> dict:
    paper = next(entry for entry in timings if entry["geometry"] == "paper")
    means = losses["mean_over_seeds"]
    relative = means["cross_attention"]["eval_mean_task_loss"] / means["joint"]["eval_mean_task_loss"] - 1
    chosen = "cross_attention" if relative <= 0.02 and paper["step_ratio_cross_vs_joint"] <= 1.0 else "joint"
    return {
        "mean_task_loss_change": relative,
        "paper_step_ratio": paper["step_ratio_cross_vs_joint"],
        "default": chosen,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds per geometry")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200, help="recipe steps of the reconstruction comparison")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43])
    cli = parser.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    timings = [time_geometry(name, cli.rounds, cli.warmup) for name in GEOMETRIES]
    losses = reconstruction(cli.steps, cli.seeds)
    decision = decide(timings, losses)
    setup = {
        "rounds": cli.rounds, "warmup": cli.warmup, "threads": 1, "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "load_average_1min_at_start": round(load, 2), "load_average_1min_at_end": round(os.getloadavg()[0], 2),
    }  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    payload = {"setup": setup, "timings": timings, "reconstruction": losses, "decision": decision}
    (RESULTS / "multimae_decoder.json").write_text(json.dumps(payload, indent=1) + "\n")
    lines = [
        "# MM-MAE decoders: cross-attention (MultiMAE) vs joint self-attention",
        "",
        f"Command: `python benchmarks/bench_multimae_decoder.py --rounds {cli.rounds} --warmup {cli.warmup} --steps "
        f"{cli.steps} --seeds {' '.join(map(str, cli.seeds))}` (one thread; the machine was shared, load average "
        f"{setup['load_average_1min_at_start']} at the start, {setup['load_average_1min_at_end']} at the end).",
        "",
        f"Setup: {json.dumps(setup)}",
        "",
        "## Time (median over interleaved rounds; ratio = median of per-round cross_attention / joint)",
        "",
        "| geometry | model | image / patch / visible / batch | parameters (cross / joint) | step s (cross / joint) "
        "| step ratio | decoders s (cross / joint) | decoder ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for entry in timings:
        lines.append(
            f"| {entry['geometry']} | {entry['model']} | {entry['image_size']} / {entry['patch_size']} / "
            f"{entry['num_visible_tokens']} / {entry['batch_size']} | {entry['parameters']['cross_attention']:,} / "
            f"{entry['parameters']['joint']:,} | {entry['median_step_s']['cross_attention']:.4f} / "
            f"{entry['median_step_s']['joint']:.4f} | {entry['step_ratio_cross_vs_joint']:.3f} | "
            f"{entry['median_decoder_s']['cross_attention']:.4f} / {entry['median_decoder_s']['joint']:.4f} | "
            f"{entry['decoder_ratio_cross_vs_joint']:.3f} |"
        )
    lines += [
        "",
        f"## Reconstruction: held-out task loss after {cli.steps} steps of the vision demo (lower is better)",
        "",
        "| decoder | seed | rgb | depth | semseg | mean | worst | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in losses["runs"]:
        task = run["eval_task_loss"]
        lines.append(
            f"| {run['decoder_type']} | {run['seed']} | {task['rgb']:.4f} | {task['depth']:.4f} | "
            f"{task['semseg']:.4f} | {run['eval_mean_task_loss']:.4f} | {run['eval_worst_task_loss']:.4f} "
            f"({run['worst_task']}) | {run['wall_s']:.0f} |"
        )
    for kind, means in losses["mean_over_seeds"].items():
        lines.append(
            f"| **{kind}, mean over seeds** | | | | | {means['eval_mean_task_loss']:.4f} | "
            f"{means['eval_worst_task_loss']:.4f} | |"
        )
    lines += [
        "",
        "## Decision (rule fixed before running: cross_attention if its mean task loss is at most 2 % above joint's "
        "and its paper-geometry step ratio <= 1.0)",
        "",
        f"Mean task loss change cross_attention vs joint: {100 * decision['mean_task_loss_change']:+.2f} %; "
        f"paper-geometry step ratio: {decision['paper_step_ratio']:.3f}. Default: **{decision['default']}**.",
        "",
    ]
    (RESULTS / "multimae_decoder.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
