"""MM-MAE: the minimax step against the average step and the plain Trainer, and the data pipeline's throughput.

Step time: three copies of the same ``MultiMAEForPreTraining`` (same initial weights) train on the same batches of
generated scenes (processor crops + ``ModalityMaskCollator`` masks, made once): the plain ``Trainer`` on the model's
``loss`` (the mean of the three reconstruction losses, i.e. their plain sum / 3), ``MinimaxTrainer`` with the
``average`` weighting, and ``MinimaxTrainer`` with ``minimax``. A step is what the Trainer's loop does per optimizer
step: ``get_batch_samples`` + ``training_step`` (forward, per-task losses, weights, backward) + ``optimizer.step``.
Steps are interleaved (one step of each configuration per round, the order alternating), so machine noise hits all
alike; the reported ratios are medians over rounds of the per-round ratios.

Throughput (one thread, repeats interleaved, median): the collator alone (stack + Dirichlet masks) on processed
examples, and the whole per-example pipeline (decode + aligned random resized crop + flip, then collate) on raw PIL
examples, at the demo's size (64 px scenes -> 32 px, 4 px patches) and at the paper's (256 px -> 224 px, 16 px
patches, 98 visible tokens).

    python benchmarks/bench_multimae_step.py      # writes benchmarks/results/multimae_step.{json,md}
"""

from __future__ import annotations

import argparse
import copy
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
from PIL import Image
from transformers import Trainer, TrainingArguments

from robust_pretrain.trainer import MinimaxTrainer
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments
from robust_pretrain.vision.collator import ModalityMaskCollator
from robust_pretrain.vision.multimae.configuration_multimae import ModalitySpec, MultiMAEConfig
from robust_pretrain.vision.multimae.image_processing_multimae import MultiMAEImageProcessor
from robust_pretrain.vision.multimae.pretraining import MultiMAEForPreTraining
from robust_pretrain.vision.scenes import NUM_CLASSES, SceneConfig, generate_scenes

RESULTS = Path(__file__).with_name("results")
CONFIGS = ("plain", "average", "minimax")
# encoder layers, hidden, heads; decoder hidden, layers (as the recipe's presets)
MODELS = {"tiny": (2, 64, 4, 64, 1), "small": (6, 256, 4, 128, 2)}


def model_config(size: str, image: int, patch: int) -> MultiMAEConfig:
    layers, hidden, heads, dec_hidden, dec_layers = MODELS[size]
    return MultiMAEConfig(
        modalities=[ModalitySpec("rgb", "rgb"), ModalitySpec("depth", "depth"),
                    ModalitySpec("semseg", "semseg", num_classes=NUM_CLASSES)],
        image_size=image, patch_size=patch, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * hidden, decoder_hidden_size=dec_hidden, decoder_num_hidden_layers=dec_layers,
        decoder_num_attention_heads=4, decoder_intermediate_size=4 * dec_hidden,
    )  # fmt: skip


def scene_batches(count: int, batch_size: int, image: int, patch: int, visible: int) -> list[dict]:
    scenes = generate_scenes(batch_size * count, "train", 0, SceneConfig(image_size=2 * image))
    processor = MultiMAEImageProcessor(size=image, num_classes=NUM_CLASSES)
    collator = ModalityMaskCollator(visible, patch, seed=0)
    rng = np.random.default_rng(0)
    examples = [{**processor.process_example(row, train=True, rng=rng), "id": row["id"]} for row in scenes]
    return [collator(examples[i : i + batch_size]) for i in range(0, len(examples), batch_size)]


def make_trainer(name: str, model: MultiMAEForPreTraining, out: str) -> Trainer:
    common = dict(
        output_dir=out,
        report_to=[],
        use_cpu=True,
        learning_rate=1e-4,
        max_grad_norm=0.0,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    if name == "plain":
        trainer = Trainer(model=model, args=TrainingArguments(**common))
    else:
        args = MinimaxTrainingArguments(**common, task_names=model.config.task_names, weighting=name)
        trainer = MinimaxTrainer(model=model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=10_000)
    return trainer


def step(trainer: Trainer, batch: dict[str, torch.Tensor]) -> None:
    samples, num_items = trainer.get_batch_samples(iter([batch]), 1, trainer.args.device)
    trainer.current_gradient_accumulation_steps = 1
    trainer.training_step(trainer.model, samples[0], num_items)
    trainer.optimizer.step()
    trainer.model.zero_grad()


def time_steps(cli: argparse.Namespace, size: str) -> dict:
    torch.manual_seed(0)
    model = MultiMAEForPreTraining(model_config(size, cli.image, cli.patch))
    batches = scene_batches(cli.rounds + cli.warmup, cli.batch_size, cli.image, cli.patch, cli.visible)
    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as out:
        trainers = {name: make_trainer(name, copy.deepcopy(model), out) for name in CONFIGS}
        for index, batch in enumerate(batches):
            for name in CONFIGS if index % 2 == 0 else CONFIGS[::-1]:
                start = time.perf_counter()
                step(trainers[name], batch)
                if index >= cli.warmup:
                    times[name].append(time.perf_counter() - start)
    ratios = {
        f"{a}_vs_{b}": statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))
        for a, b in (("minimax", "average"), ("minimax", "plain"), ("average", "plain"))
    }
    return {
        "model": size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "median_step_s": {name: statistics.median(values) for name, values in times.items()},
        "median_ratio": ratios,
    }


def raw_examples(count: int, side: int, seed: int = 0) -> list[dict]:
    """PIL examples as a loader gives them (content does not matter for the throughput)."""
    rng = np.random.default_rng(seed)
    return [
        {
            "id": str(i),
            "rgb": Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)),
            "depth": Image.fromarray(rng.integers(300, 8000, (side, side)).astype(np.uint16)),
            "semseg": Image.fromarray(rng.integers(0, NUM_CLASSES, (side, side), dtype=np.uint8)),
        }
        for i in range(count)
    ]


def throughput(setting: dict, batch_size: int, repeats: int) -> dict:
    """Images per second: the collator alone, and processor + collator (one thread)."""
    processor = MultiMAEImageProcessor(size=setting["image"], num_classes=NUM_CLASSES)
    collator = ModalityMaskCollator(setting["visible"], setting["patch"], seed=0)
    raw = raw_examples(setting["images"], setting["source"])
    rng = np.random.default_rng(1)
    processed = [{**processor.process_example(row, train=True, rng=rng), "id": row["id"]} for row in raw]

    def collate_only() -> None:
        for start in range(0, len(processed), batch_size):
            collator(processed[start : start + batch_size])

    def pipeline() -> None:
        for start in range(0, len(raw), batch_size):
            chunk = raw[start : start + batch_size]
            collator([{**processor.process_example(row, train=True, rng=rng), "id": row["id"]} for row in chunk])

    rates: dict[str, list[float]] = {"collator": [], "processor + collator": []}
    for _ in range(repeats):
        for name, work in (("collator", collate_only), ("processor + collator", pipeline)):
            start = time.perf_counter()
            work()
            rates[name].append(len(raw) / (time.perf_counter() - start))
    return {**setting, "batch_size": batch_size, "images_per_s": {k: statistics.median(v) for k, v in rates.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--patch", type=int, default=4)
    parser.add_argument("--visible", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=30, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="throughput repeats (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the step timing")
    cli = parser.parse_args()
    torch.set_num_threads(cli.threads)
    load = os.getloadavg()[0]
    steps = [time_steps(cli, size) for size in cli.models]
    torch.set_num_threads(1)
    pipelines = [
        throughput(
            {"name": "demo", "source": 64, "image": 32, "patch": 4, "visible": 32, "images": 256}, 32, cli.repeats
        ),
        throughput(
            {"name": "paper", "source": 256, "image": 224, "patch": 16, "visible": 98, "images": 64}, 32, cli.repeats
        ),
    ]
    setup = {
        "image_size": cli.image, "patch_size": cli.patch, "num_visible_tokens": cli.visible,
        "batch_size": cli.batch_size, "rounds": cli.rounds, "step_threads": cli.threads, "throughput_threads": 1,
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "load_average_1min_at_start": round(load, 2),
    }  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "multimae_step.json").write_text(
        json.dumps({"setup": setup, "steps": steps, "throughput": pipelines}, indent=1) + "\n"
    )
    lines = [
        f"Setup: {json.dumps(setup)}",
        "",
        "Step time (median over interleaved rounds; ratios are medians of per-round ratios):",
        "",
        "| model | parameters | plain Trainer (s) | average (s) | minimax (s) | minimax / average | minimax / plain |"
        " average / plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in steps:
        t, r = row["median_step_s"], row["median_ratio"]
        lines.append(
            f"| {row['model']} | {row['parameters']:,} | {t['plain']:.4f} | {t['average']:.4f} | {t['minimax']:.4f} "
            f"| {r['minimax_vs_average']:.3f} | {r['minimax_vs_plain']:.3f} | {r['average_vs_plain']:.3f} |"
        )
    lines += [
        "",
        "Data pipeline throughput (images/s, one thread, median of repeats):",
        "",
        "| setting | source -> model size | patches | visible | collator | processor + collator |",
        "|---|---|---|---|---|---|",
    ]
    for row in pipelines:
        rate = row["images_per_s"]
        patches = 3 * (row["image"] // row["patch"]) ** 2
        lines.append(
            f"| {row['name']} | {row['source']} px -> {row['image']} px | 3 x {patches // 3} | {row['visible']} | "
            f"{rate['collator']:,.0f} | {rate['processor + collator']:,.0f} |"
        )
    (RESULTS / "multimae_step.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
