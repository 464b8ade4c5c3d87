"""Fine-tune one checkpoint on one GLUE task with the paper's protocol (conventions of HF's ``run_glue.py``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    EvalPrediction,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Trainer,
    TrainingArguments,
    set_seed,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
from transformers.trainer_utils import SaveStrategy

from robust_pretrain.cli import UsageError, check_checkpoint, run_console
from robust_pretrain.config import OptionParser, parse_with_config
from robust_pretrain.glue.data import HUB_DATASET, load_glue
from robust_pretrain.glue.metrics import load_glue_metric
from robust_pretrain.glue.tasks import GLUE_TASKS, GlueTask, get_task
from robust_pretrain.options import LoraArguments, check_options, option
from robust_pretrain.output_dir import claim_for_new_run, disk_full_is_one_line
from robust_pretrain.reporting.cards import render_finetuning_card
from robust_pretrain.reporting.recipe_cards import glue_card_content
from robust_pretrain.reporting.train_results import log_train_results
from robust_pretrain.trainer import register_process_group_teardown
from robust_pretrain.trainer.training_args import use_cpu_when_launched_without_accelerator

logger = logging.getLogger(__name__)


@dataclass
class GlueRunArguments:
    """What to fine-tune on which task."""

    model_name_or_path: str = field(metadata={"help": "Checkpoint to fine-tune: local directory or Hub model id."})
    task_name: str = field(metadata={"help": f"GLUE task, one of: {', '.join(GLUE_TASKS)}."})
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer directory or Hub id, if not the checkpoint's own."}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Write into an output_dir that holds an earlier run; its checkpoint-* folders, weights and "
            "prediction files are deleted first."
        },
    )


@dataclass
class GlueDataArguments:
    """Where the GLUE data comes from and how much of it is used."""

    glue_dir: str | None = option(
        None, "Directory in the original GLUE TSV layout (<dir>/<TASK>/train.tsv, dev.tsv); default: Hub.", path="dir"
    )
    max_seq_length: int = option(128, "Truncate inputs to this many tokens.", minimum=1)
    max_train_samples: int | None = option(None, "Use only the first N training examples.", minimum=1)
    max_eval_samples: int | None = option(None, "Use only the first N examples per eval split.", minimum=1)
    cache_dir: str | None = field(default=None, metadata={"help": "Cache directory for Hub downloads."})

    def __post_init__(self) -> None:
        check_options(self)


@dataclass
class GlueTrainingArguments(TrainingArguments):
    """``TrainingArguments`` with the paper's GLUE fine-tuning defaults; trains, evaluates, saves the final model."""

    learning_rate: float = field(default=2e-5, metadata={"help": "Peak learning rate (paper: 2e-5)."})
    per_device_train_batch_size: int = field(default=32, metadata={"help": "Training batch size (paper: 32)."})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay (paper: 0.1)."})
    warmup_steps: float = field(
        default=0.06, metadata={"help": "Warmup: ratio of total steps if < 1, else a step count (paper: 6%%)."}
    )
    save_strategy: SaveStrategy | str = field(
        default="no", metadata={"help": "Intermediate checkpoints ('no', 'epoch', 'steps'); the final model is saved."}
    )
    do_train: bool = field(default=True, metadata={"help": "Fine-tune (disable to only evaluate the checkpoint)."})
    do_eval: bool = field(default=True, metadata={"help": "Evaluate on the task's dev split(s) after training."})

    def __post_init__(self) -> None:
        check_options(self)
        use_cpu_when_launched_without_accelerator(self)
        super().__post_init__()


# What an earlier run leaves besides the model (robust_pretrain.output_dir deletes weights and checkpoints).
_STALE_PREDICTIONS = ("predict_results_*.txt",)


def predictions_file_name(task: str, split: str) -> str:
    """``predict_results_<task>.txt`` (MNLI mismatched: ``predict_results_mnli-mm.txt``), as HF's ``run_glue.py``."""
    return f"predict_results_{task}{'-mm' if split == 'validation_mismatched' else ''}.txt"


def _predicted_labels(spec: GlueTask, predictions: np.ndarray | tuple) -> np.ndarray:
    logits = predictions[0] if isinstance(predictions, tuple) else predictions
    return np.squeeze(logits, axis=-1) if spec.is_regression else np.argmax(logits, axis=-1)


def _display(spec: GlueTask, value: float | int) -> str:
    return repr(float(value)) if spec.label_names is None else spec.label_names[int(value)]


def write_predictions(
    path: Path, spec: GlueTask, indices: list[int], predictions: np.ndarray, labels: np.ndarray
) -> Path:
    """Tab-separated ``index  prediction  label`` per eval example: label names, or exact float scores (STS-B)."""
    rows = ["index\tprediction\tlabel"]
    rows += [
        f"{i}\t{_display(spec, p)}\t{_display(spec, y)}" for i, p, y in zip(indices, predictions, labels, strict=True)
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def read_predictions(task: str | GlueTask, path: str | Path) -> dict[str, list]:
    """Read a ``write_predictions`` file back: ``index``, ``prediction`` and ``label`` (label ids or scores)."""
    spec = task if isinstance(task, GlueTask) else get_task(task)
    columns: dict[str, list] = {"index": [], "prediction": [], "label": []}
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for line in lines[1:]:
        index, prediction, label = line.split("\t")
        columns["index"].append(int(index))
        for name, value in (("prediction", prediction), ("label", label)):
            columns[name].append(float(value) if spec.label_names is None else spec.label_names.index(value))
    return columns


def _limit(dataset: datasets.Dataset, count: int | None) -> datasets.Dataset:
    return dataset if count is None else dataset.select(range(min(count, len(dataset))))


def _prepare(
    splits: datasets.DatasetDict,
    spec: GlueTask,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    data_args: GlueDataArguments,
) -> datasets.DatasetDict:
    """Keep the first ``max_*_samples`` examples of each split, then tokenize (dynamic padding happens per batch)."""

    def encode(batch: dict[str, list]) -> dict[str, list]:
        return tokenizer(*(batch[name] for name in spec.text_columns), max_length=max_length, truncation=True)

    limited = datasets.DatasetDict(
        {
            split: _limit(dataset, data_args.max_train_samples if split == "train" else data_args.max_eval_samples)
            for split, dataset in splits.items()
        }
    )
    return limited.map(encode, batched=True, remove_columns=[*spec.text_columns, "idx"], desc="Tokenizing")


def build_compute_metrics(spec: GlueTask) -> Callable[[EvalPrediction], dict[str, float]]:
    """``compute_metrics`` for the Trainer, backed by the shipped ``evaluate`` module."""
    metric = load_glue_metric(spec.name)

    def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
        return metric.compute(
            predictions=_predicted_labels(spec, prediction.predictions), references=prediction.label_ids
        )

    return compute_metrics


def check_text_model(checkpoint: str, cache_dir: str | None) -> None:
    """Refuse, naming it, a checkpoint whose model type has no sequence-classification model (an image model)."""
    try:
        config, _ = PretrainedConfig.get_config_dict(checkpoint, cache_dir=cache_dir)
    except OSError:  # a PEFT adapter folder, or a Hub id resolved later
        return
    model_type = config.get("model_type")
    if model_type is not None and model_type not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
        raise UsageError(
            f"--model_name_or_path {checkpoint} ({model_type}) is not a text model: AutoModelForSequenceClassification "
            "cannot load it (fine-tune image checkpoints with robust-pretrain-finetune-dense)"
        )


def _load_model(
    run_args: GlueRunArguments, lora_args: LoraArguments, spec: GlueTask, cache_dir: str | None
) -> PreTrainedModel | PeftModel:
    labels = (
        {}
        if spec.label_names is None
        else {
            "id2label": dict(enumerate(spec.label_names)),
            "label2id": {name: i for i, name in enumerate(spec.label_names)},
        }
    )
    config = AutoConfig.from_pretrained(
        run_args.model_name_or_path,
        num_labels=spec.num_labels,
        finetuning_task=spec.name,
        problem_type="regression" if spec.is_regression else "single_label_classification",
        cache_dir=cache_dir,
        **labels,
    )
    model = AutoModelForSequenceClassification.from_pretrained(
        run_args.model_name_or_path, config=config, cache_dir=cache_dir
    )
    if not lora_args.use_lora:
        return model
    # TaskType.SEQ_CLS makes peft train and save the classification head (modules_to_save) alongside the adapters.
    lora_config = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=lora_args.lora_r,
        lora_alpha=lora_args.lora_alpha,
        lora_dropout=lora_args.lora_dropout,
        target_modules=list(lora_args.lora_target_modules),
    )
    model = get_peft_model(model, lora_config)
    model.print_trainable_parameters()
    return model


def run_finetune(
    run_args: GlueRunArguments,
    data_args: GlueDataArguments,
    lora_args: LoraArguments,
    training_args: GlueTrainingArguments,
    save_model: bool = True,
) -> dict[str, float]:
    """Fine-tune and/or evaluate; returns the eval metrics (MNLI mismatched keys end in ``_mm``).

    Writes ``train_results.json``, ``eval_results.json``, ``all_results.json``, the per-example predictions of each
    eval split (:func:`predictions_file_name`), a model card ``README.md`` (task, metrics with the split they were
    measured on, base checkpoint, settings; also as ``model-index`` metadata) and (if ``save_model``) the final model
    (full weights, or the peft adapter + head with ``use_lora``) plus tokenizer to ``training_args.output_dir``, which
    must be empty or new unless ``run_args.overwrite_output_dir``.
    """
    spec = get_task(run_args.task_name)
    check_checkpoint(run_args.model_name_or_path)
    check_text_model(run_args.model_name_or_path, data_args.cache_dir)
    check_checkpoint(run_args.tokenizer_name, "--tokenizer_name", model=False)
    splits = load_glue(spec.name, data_args.glue_dir, data_args.cache_dir)
    claim_for_new_run(
        training_args.output_dir, run_args.overwrite_output_dir, training_args.should_save, _STALE_PREDICTIONS
    )
    set_seed(training_args.seed)

    tokenizer = AutoTokenizer.from_pretrained(
        run_args.tokenizer_name or run_args.model_name_or_path, cache_dir=data_args.cache_dir
    )
    max_length = min(data_args.max_seq_length, tokenizer.model_max_length)
    if max_length < data_args.max_seq_length:
        logger.warning(
            "max_seq_length %d exceeds the tokenizer's limit; using %d", data_args.max_seq_length, max_length
        )
    model = _load_model(run_args, lora_args, spec, data_args.cache_dir)
    encoded = _prepare(splits, spec, tokenizer, max_length, data_args)

    register_process_group_teardown()  # a finished torchrun process must not abort at exit
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=encoded["train"] if training_args.do_train else None,
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=build_compute_metrics(spec),
    )
    if training_args.do_train:
        with disk_full_is_one_line(training_args.output_dir, resumes=False):
            train_result = trainer.train()
            if save_model:
                trainer.save_model()
        log_train_results(trainer, train_result, len(trainer.train_dataset))

    eval_metrics: dict[str, float] = {}
    if training_args.do_eval:
        for split in spec.eval_splits:
            output = trainer.predict(encoded[split], metric_key_prefix="eval")
            metrics = {**output.metrics, "eval_samples": len(encoded[split])}
            suffix = "_mm" if split == "validation_mismatched" else ""
            eval_metrics.update({f"{key}{suffix}": value for key, value in metrics.items()})
            if trainer.is_world_process_zero():
                path = Path(training_args.output_dir) / predictions_file_name(spec.name, split)
                indices = list(_limit(splits[split], data_args.max_eval_samples)["idx"])  # the rows _prepare kept
                write_predictions(path, spec, indices, _predicted_labels(spec, output.predictions), output.label_ids)
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
    if trainer.is_world_process_zero():
        steps = trainer.state.global_step
        files = [predictions_file_name(spec.name, split) for split in spec.eval_splits] if training_args.do_eval else []
        content = glue_card_content(
            spec, run_args, data_args, lora_args, training_args, eval_metrics, steps, HUB_DATASET, files
        )
        render_finetuning_card(training_args.output_dir, content)
    return eval_metrics


def run(argv: list[str]) -> dict[str, float]:
    """Parse ``[--config FILE] [--option value ...]``, fine-tune and evaluate; returns the eval metrics."""
    parser = OptionParser(
        (GlueRunArguments, GlueDataArguments, LoraArguments, GlueTrainingArguments),
        description="Fine-tune a checkpoint on a GLUE task. --config FILE (YAML/JSON) sets defaults for any option.",
    )
    run_args, data_args, lora_args, training_args = parse_with_config(parser, argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    datasets.utils.logging.set_verbosity_warning()
    return run_finetune(run_args, data_args, lora_args, training_args)


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``robust-pretrain-finetune-glue``): exit status 2 and one paragraph for a bad input."""
    return run_console(run, argv, prog="robust-pretrain-finetune-glue")
