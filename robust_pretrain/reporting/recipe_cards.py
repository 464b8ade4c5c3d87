"""What each recipe's model card states, taken from the run: its arguments, model, tokenizer, data and results.

Each function returns the content :mod:`robust_pretrain.reporting.cards` renders: a :class:`ModelCardContent` for the
pre-training recipes (PoS masked LM, MM-MAE), a :class:`FineTuningCardContent` for GLUE and dense fine-tuning. A new
recipe (e.g. causal-LM pre-training) adds its :class:`~robust_pretrain.reporting.cards.CardTaskFamily` and one function
here. The argument objects are the recipes' own dataclasses (duck-typed: this module imports no recipe).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from robust_pretrain.reference import model_size
from robust_pretrain.reporting.cards import (
    EWT_TRAINING_DATA,
    CardTaskFamily,
    FineTunedMetric,
    FineTuningCardContent,
    ModelCardContent,
    TrainingData,
    checkpoint_tokenizer,
    hub_dataset,
    local_files,
    modality_tasks,
    pos_tasks,
    trained_tokenizer,
)
from robust_pretrain.reporting.task_report import TRAJECTORY_PLOT_NAME

RECONSTRUCTIONS_NAME = "reconstructions.png"
LOSS_DESCRIPTIONS = {"mse": "MSE", "l1": "L1 on valid pixels", "cross_entropy": "cross-entropy"}
DENSE_TASK_TYPES = {
    "semseg": "image-segmentation",
    "depth": "depth-estimation",
    "classification": "image-classification",
}
DENSE_CARD_METRICS = {
    "semseg": ("mean_iou", "pixel_accuracy"),
    "depth": ("delta1", "abs_rel", "rmse"),
    "classification": ("top1_accuracy", "top5_accuracy"),
}
# TrainingArguments a fine-tuning card states (besides the recipe's own options).
FINETUNING_SETTINGS = (
    "learning_rate",
    "weight_decay",
    "lr_scheduler_type",
    "warmup_steps",
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "seed",
)


def _base_model(model: Any) -> Any:
    """The transformers model inside a peft model (the model itself otherwise)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


# ------------------------------------------------------------------------------------------------ pre-training


def text_training_data(data_args: Any) -> TrainingData:
    """The data of a text run: a Hub dataset, local files, or the embedded UD English-EWT text."""
    if data_args.dataset_name:
        return hub_dataset(data_args.dataset_name, data_args.dataset_config_name)
    if data_args.train_file:
        return local_files(*filter(None, (data_args.train_file, data_args.validation_file)))
    return EWT_TRAINING_DATA


def pos_mlm_card_content(
    model: Any,
    tokenizer: Any,
    report: dict[str, Any],
    model_args: Any,
    data_args: Any,
    task_groups: dict[str, list[str]],
    unassigned_tags: list[str],
) -> ModelCardContent:
    """The card of a PoS masked-LM run: its model and size, tokenizer origin, PoS tasks, data and report."""
    tokenizer_source = model_args.tokenizer_name or model_args.model_name_or_path
    return ModelCardContent(
        architecture=type(_base_model(model)).__name__,
        tasks=pos_tasks(
            task_groups, unassigned_tags=unassigned_tags, tagger=f"the `{data_args.tagger}` tagger backend"
        ),
        report=report,
        training_data=text_training_data(data_args),
        base_model=model_args.model_name_or_path,
        plot=TRAJECTORY_PLOT_NAME,
        model_size=model_size(model),
        tokenizer=checkpoint_tokenizer(tokenizer_source, len(tokenizer))
        if tokenizer_source
        else trained_tokenizer(len(tokenizer)),
    )


GENERATION_USAGE = """\
from transformers import pipeline

generator = pipeline("text-generation", model="{model_id}")
print(generator("The weather today", max_new_tokens=30)[0]["generated_text"])"""


def domain_tasks(
    names: list[str], sequences: list[int] | list[str], mixture: list[float], report: dict[str, Any]
) -> CardTaskFamily:
    """The card's task family: one row per domain with its training sequences, mixture weight, held-out perplexity."""
    perplexity = report.get("eval_task_perplexity", {})
    rows = {
        name: (str(count), f"{weight:.4f}", f"{perplexity[name]:.2f}" if name in perplexity else "n/a")
        for name, count, weight in zip(names, sequences, mixture, strict=True)
    }
    return CardTaskFamily(
        objective="causal language modelling (next-token prediction)",
        task_split="one per data domain: every packed sequence holds text of a single domain.",
        table_title="Domains",
        task_column="domain",
        columns=("training sequences", "mixture weight", "held-out perplexity"),
        rows=rows,
        loss_name="next-token loss",
        pipeline_tag="text-generation",
        data_kind="text",
        usage_title="Text generation",
        usage=GENERATION_USAGE,
        notes=(
            "Mixture weight: each domain's share of the training sequences (natural proportions), or the weights the "
            "domains were drawn with (from a file, or time-averaged over the steps when drawn online).",
        ),
        limitations=("A small decoder trained briefly: its generations are not fluent text.",),
    )


def causal_lm_card_content(
    model: Any,
    tokenizer: Any,
    tokenizer_source: str | None,
    report: dict[str, Any],
    texts: Any,
    sequences: list[int] | list[str],
    mixture: list[float],
    model_args: Any,
) -> ModelCardContent:
    """The card of a decoder run over domains: its model and size, tokenizer origin, domains (training sequences,
    mixture weight, held-out perplexity), data and report."""
    trained = f"a byte-level BPE tokenizer trained on this run's training text (vocabulary of {len(tokenizer)} tokens)"
    return ModelCardContent(
        architecture=type(model).__name__,
        tasks=domain_tasks(texts.names, sequences, mixture, report),
        report=report,
        training_data=texts.training_data,
        base_model=model_args.model_name_or_path,
        plot=TRAJECTORY_PLOT_NAME,
        model_size=model_size(model),
        tokenizer=checkpoint_tokenizer(tokenizer_source, len(tokenizer)) if tokenizer_source else trained,
    )


def _loss_description(spec: Any) -> str:
    if spec.loss == "mse" and spec.norm_pix_loss:
        return "MSE on per-patch normalised pixels"
    if spec.kind == "semseg":
        return f"cross-entropy (ignore index {spec.ignore_index})"
    if spec.kind != "depth":
        return LOSS_DESCRIPTIONS[spec.loss]
    unit = "metres" if spec.depth_normalization == "none" else "per-image standardised depth"
    cap = "" if spec.max_depth is None else f", cap {spec.max_depth:g} m"
    return f"{LOSS_DESCRIPTIONS[spec.loss]} ({unit}{cap})"


def card_modalities(config: Any) -> dict[str, dict[str, Any]]:
    """An MM-MAE config's modalities as the card's table rows: kind, channels (or classes) and loss."""
    return {
        spec.name: {
            "kind": spec.kind,
            "channels": f"{spec.num_classes} classes" if spec.kind == "semseg" else spec.channels,
            "loss": _loss_description(spec),
        }
        for spec in config.modalities
    }


def vision_training_data(data_args: Any, train_size: int, eval_size: int) -> TrainingData:
    """The data of an MM-MAE run: a Hub dataset, a local folder or dataset, or the generated scenes."""
    if data_args.dataset_name is not None and not Path(data_args.dataset_name).exists():
        return hub_dataset(data_args.dataset_name, data_args.dataset_config_name)
    if data_args.dataset_name is not None or data_args.image_folder is not None:
        kind = "image folder" if data_args.image_folder else "local dataset"
        name = Path(data_args.image_folder or data_args.dataset_name).resolve().name
        return TrainingData(
            f"The {kind} `{name}` ({train_size} training and {eval_size} held-out images; see its own license)."
        )
    from robust_pretrain.vision import scenes

    return TrainingData(
        f"{train_size} procedural indoor scenes rendered by `robust_pretrain.vision.scenes` (generator "
        f"v{scenes.GENERATOR_VERSION}, seed {data_args.scene_seed}, {data_args.scene_size}x{data_args.scene_size} "
        f"pixels): RGB, metric depth and class maps ({', '.join(scenes.CLASS_NAMES)}), mutually consistent by "
        f"ray casting; no external images. {eval_size} other scenes (the `test` split) are held out."
    )


def multimae_card_content(
    model: Any,
    report: dict[str, Any],
    model_args: Any,
    data_args: Any,
    train_size: int,
    eval_size: int,
    reconstructions: bool,
) -> ModelCardContent:
    """The card of an MM-MAE run: its model and size, modalities, data, report (and the reconstructions figure)."""
    notes = ()
    if reconstructions:
        notes = (
            f"Held-out reconstructions (input, masked input, prediction, target per modality):\n\n"
            f"![Held-out reconstructions]({RECONSTRUCTIONS_NAME})",
        )
    return ModelCardContent(
        architecture=type(model).__name__,
        tasks=replace(modality_tasks(card_modalities(model.config)), notes=notes),
        report=report,
        training_data=vision_training_data(data_args, train_size, eval_size),
        base_model=model_args.model_name_or_path,
        plot=TRAJECTORY_PLOT_NAME,
        model_size=model_size(model),
    )


# ------------------------------------------------------------------------------------------------- fine-tuning


def _lora_method(lora_args: Any, head: str) -> str:
    if not lora_args.use_lora:
        return "full fine-tuning"
    return f"LoRA r={lora_args.lora_r} on {', '.join(lora_args.lora_target_modules)} + full {head}"


def finetuning_settings(training_args: Any, steps: int, *option_groups: Any, skip: tuple[str, ...] = ()) -> dict:
    """The settings a fine-tuning card states: every field of the recipe's option dataclasses (LoRA ones only with
    ``use_lora``; paths and ``skip`` left out), the optimiser, schedule, budget, batch and seed, the optimizer steps
    trained and the number of processes."""
    settings: dict[str, Any] = {}
    for options in option_groups:
        for option in fields(options):
            value = getattr(options, option.name)
            lora_off = option.name.startswith("lora_") and not getattr(options, "use_lora", True)
            if option.name in skip or lora_off or isinstance(value, (Path, dict)):
                continue
            settings[option.name] = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
    for name in FINETUNING_SETTINGS:
        value = getattr(training_args, name)
        settings[name] = getattr(value, "value", value)  # enums by their value
    settings.update(optimizer_steps=steps, processes=training_args.world_size)
    return settings


def glue_card_content(
    spec: Any,
    run_args: Any,
    data_args: Any,
    lora_args: Any,
    training_args: Any,
    metrics: dict[str, float],
    steps: int,
    hub_dataset_id: str,
    prediction_files: Sequence[str],
) -> FineTuningCardContent:
    """The card of a GLUE fine-tuning run: the task, every metric of each dev split it was scored on (the first
    ``max_eval_samples`` rows, when limited, as ``split[:N]``), base checkpoint and settings."""
    limit = data_args.max_eval_samples
    results = []
    for split in spec.eval_splits:
        suffix = "_mm" if split == "validation_mismatched" else ""
        used = f"{split}[:{limit}]" if limit is not None else split
        results += [
            FineTunedMetric(metric, metrics[f"eval_{metric}{suffix}"], used)
            for metric in spec.metrics
            if f"eval_{metric}{suffix}" in metrics
        ]
    source = (
        f"the local GLUE copy `{Path(data_args.glue_dir).resolve().name}` (`{spec.glue_dir_name}/`)"
        if data_args.glue_dir
        else f"the Hub dataset `{hub_dataset_id}` (configuration `{spec.name}`)"
    )
    limited = data_args.max_train_samples is not None
    listed = ", ".join(f"`{name}`" for name in prediction_files)
    trained = "training split" + (f" (first {data_args.max_train_samples} rows)" if limited else "")
    return FineTuningCardContent(
        recipe="finetune_glue",
        task=spec.name,
        task_type="text-classification",
        base_model=run_args.model_name_or_path,
        method=_lora_method(lora_args, "classification head"),
        settings=finetuning_settings(
            training_args, steps, data_args, lora_args, skip=("glue_dir", "cache_dir", "use_lora")
        )
        | {"tokenizer": run_args.tokenizer_name or "the checkpoint's"},
        data=f"GLUE {spec.glue_dir_name} from {source}: fine-tuned on its {trained}, scored on "
        + " and ".join(f"`{result}`" for result in dict.fromkeys(m.split for m in results)),
        dataset_type=hub_dataset_id,
        dataset_name=f"GLUE {spec.glue_dir_name}",
        dataset_config=spec.name,
        metrics=tuple(results),
        notes=(f"Per-example predictions (index, prediction, label): {listed}.",) if prediction_files else (),
    )


def dense_card_content(
    run_args: Any,
    model_args: Any,
    lora_args: Any,
    training_args: Any,
    data: Any,
    metrics: dict[str, float],
    steps: int,
    predictions_file: str,
) -> FineTuningCardContent:
    """The card of a dense fine-tuning run (semseg, depth, classification): task, metrics, base checkpoint, protocol."""
    task, schedule = run_args.task, training_args.lr_scheduler_type
    start = "from random initialisation (the base model's architecture only), " if run_args.random_init else ""
    return FineTuningCardContent(
        recipe="finetune_dense",
        task=task,
        task_type=DENSE_TASK_TYPES[task],
        base_model=run_args.model_name_or_path,
        method=f"{start}{_lora_method(lora_args, 'head')}; AdamW, layer-wise lr decay {training_args.layer_decay}, "
        f"warm-up then a {getattr(schedule, 'value', schedule)} schedule",
        settings={
            **finetuning_settings(training_args, steps, lora_args, skip=("use_lora",)),
            "layer_decay": training_args.layer_decay,
            "global_batch_size": training_args.per_device_train_batch_size * training_args.world_size,
        },
        data=data.description,
        dataset_type="local",
        dataset_name=data.description.split(" (")[0],
        metrics=tuple(
            FineTunedMetric(name, metrics[f"eval_{name}"], data.eval_split)
            for name in DENSE_CARD_METRICS[task]
            if f"eval_{name}" in metrics
        ),
        inputs=" + ".join(model_args.input_modalities),
        notes=(
            f"Per-image predictions: `{predictions_file}` (`robust_pretrain.vision.finetune.metrics.recompute_metrics` "
            "recomputes the table from it); input / prediction / target of a few images: `predictions.png`.",
            *(
                (
                    "This folder holds the LoRA adapters, the trained head and the model's config: "
                    "`AutoModelFor*.from_pretrained(<this folder>)` loads the base checkpoint named in "
                    "`adapter_config.json` with them merged in; `merged/` holds that merged model as plain weights, "
                    "which the pipelines load like any checkpoint.",
                )
                if lora_args.use_lora
                else ()
            ),
        ),
    )
