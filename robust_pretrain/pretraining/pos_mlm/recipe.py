"""Task-robust masked-LM pre-training over part-of-speech tasks (PoS-BERT), in the conventions of HF's run_mlm.py.

    accelerate launch recipes/pretrain_pos_mlm.py --config recipes/configs/demo.yaml [--max_steps 100 ...]
    robust-pretrain-pos-mlm --config recipes/configs/demo.yaml      (the same, one process)

Every option can come from the ``--config`` YAML/JSON file and be overridden on the command line. The run writes into
``output_dir``: the model (safetensors), config and tokenizer (or a peft adapter), ``task_report.json``,
``task_weights.png``, a model card (README.md), ``*_results.json`` and the Trainer's checkpoints; it resumes from the
last checkpoint in ``output_dir`` when there is one.
"""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import set_seed

from robust_pretrain.cli import UsageError, check_checkpoint, run_console
from robust_pretrain.config import OptionParser, parse_with_config
from robust_pretrain.data import UPOS_TAGS, TaskSpec
from robust_pretrain.output_dir import resume_or_refuse, write_run_config
from robust_pretrain.pretraining.common import (
    bind_tasks,
    create_trainer,
    push,
    refuse_given_options,
    setup_logging,
    train_and_evaluate,
)
from robust_pretrain.pretraining.pos_mlm import data as pos_mlm_data
from robust_pretrain.pretraining.pos_mlm import model as pos_mlm_model
from robust_pretrain.pretraining.pos_mlm.arguments import (
    DataArguments,
    ModelArguments,
    run_config,
)
from robust_pretrain.pretraining.pos_mlm.data import (
    PremaskedOrTrainingCollator,
    load_raw_datasets,
    masking_collator,
    premask,
    tag_datasets,
    training_stream,
)
from robust_pretrain.pretraining.pos_mlm.model import (
    load_model,
    load_tokenizer,
    save_merged,
)
from robust_pretrain.pretraining.streams import check_pos_streaming
from robust_pretrain.reference import (
    Provenance,
    check_override,
    check_reference_model,
    check_reference_run,
    dataset_fingerprint,
    training_fingerprint,
)
from robust_pretrain.reporting import card_renderer, task_report
from robust_pretrain.reporting.recipe_cards import pos_mlm_card_content
from robust_pretrain.reporting.task_report import report_settings, write_report_and_card
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments

__all__ = [
    "main",
    "parse_arguments",
    "run",
    "run_provenance",
    "write_report",
]

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``robust-pretrain-pos-mlm``, ``recipes/pretrain_pos_mlm.py``): exit status 2 and one
    paragraph for a bad option, file or checkpoint."""
    return run_console(run, argv, prog="robust-pretrain-pos-mlm")


def run(argv: list[str]) -> dict:
    """Pre-train as ``argv`` says; the held-out metrics and the task report."""
    model_args, data_args, training_args, spec = parse_arguments(argv)
    setup_logging(training_args, logger, pos_mlm_data.logger, pos_mlm_model.logger)
    logger.info(
        "weighting=%s tasks=%s output_dir=%s", training_args.weighting, spec.task_names, training_args.output_dir
    )
    settings = run_config(model_args, data_args, training_args, spec)
    resume_checkpoint = resume_or_refuse(training_args, settings, overwrite=data_args.overwrite_output_dir)
    set_seed(training_args.seed)

    raw = load_raw_datasets(data_args)
    tokenizer = load_tokenizer(model_args, training_args, raw["train"][data_args.text_column_name], resume_checkpoint)
    check_reference_model(training_args.reference_model, tokenizer, training_args.reference_mismatch_ok)
    train_dataset, eval_dataset = tag_datasets(raw, tokenizer, spec, data_args, training_args)
    model = load_model(model_args, tokenizer, data_args.max_seq_length)  # after the data's refusals: they stay quiet
    held_out_masks = masking_collator(tokenizer, spec, data_args, training_args, data_args.eval_masking_seed)
    eval_dataset = premask(eval_dataset, held_out_masks, data_args.max_seq_length, tokenizer.pad_token_id)
    provenance = run_provenance(spec, tokenizer, raw, eval_dataset, model, model_args)
    check_reference_run(training_args.reference_run, training_args.reference_mismatch_ok, provenance)
    train_collator = masking_collator(
        tokenizer, spec, data_args, training_args, training_args.seed + training_args.process_index
    )
    write_run_config(training_args, settings)
    if data_args.streaming:
        train_dataset = training_stream(train_dataset, training_args)
    trainer = create_trainer(
        training_args,
        model=model,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=PremaskedOrTrainingCollator(train_collator),  # new masks each epoch, the same ones on resume
    )
    eval_metrics = train_and_evaluate(trainer, resume_checkpoint)
    report = write_report(trainer, eval_metrics, provenance, tokenizer, spec, model_args, data_args, training_args)
    push(trainer)
    return {**eval_metrics, "report": report}


def parse_arguments(argv: list[str]) -> tuple[ModelArguments, DataArguments, MinimaxTrainingArguments, TaskSpec]:
    """The options and the task spec, checked together (tasks, sampling and masking, streaming, checkpoints)."""
    parser = OptionParser((ModelArguments, DataArguments, MinimaxTrainingArguments), description=__doc__)
    parser.set_defaults(report_to=[], save_total_limit=3)
    model_args, data_args, training_args = parse_with_config(parser, argv)
    given = {"reference_run": training_args.reference_run, "reference_model": training_args.reference_model}
    check_override(training_args.reference_mismatch_ok, given)
    try:
        spec = TaskSpec.resolve(data_args.task_spec)
    except (OSError, ValueError) as err:
        raise UsageError(f"--task_spec {data_args.task_spec}: {err}") from err
    bind_tasks(training_args, spec.task_names, "the task spec's")
    if training_args.task_sampling != "none" and data_args.masking != "per_example":
        raise UsageError(
            f"--task_sampling {training_args.task_sampling} draws one task per sequence: it needs --masking per_example"
        )
    if data_args.streaming:
        check_pos_streaming(model_args, data_args, training_args)
    check_checkpoint(model_args.model_name_or_path)
    if model_args.model_name_or_path is not None:
        refuse_given_options(argv, ["model_size", "vocab_size"], "from-scratch options, unused with a checkpoint")
    check_checkpoint(model_args.tokenizer_name, "--tokenizer_name", model=False)
    return model_args, data_args, training_args, spec


def run_provenance(spec: TaskSpec, tokenizer, raw, eval_dataset, model, model_args: ModelArguments) -> Provenance:
    """What the run's held-out losses depend on: the tasks, the tokenizer, the data, the held-out masks, the model."""
    tokenizer_name = model_args.tokenizer_name or model_args.model_name_or_path
    return Provenance.of_run(
        spec.task_names,
        tokenizer,
        training_fingerprint(raw["train"]),
        dataset_fingerprint(eval_dataset),
        model,
        tokenizer_name or f"WordPiece trained on the training text (vocab_size {model_args.vocab_size})",
    )


def write_report(
    trainer,
    eval_metrics: dict,
    provenance: Provenance,
    tokenizer,
    spec: TaskSpec,
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: MinimaxTrainingArguments,
) -> dict:
    """Write the task report and the model card (and with ``--merge_lora`` the merged model); the report."""
    recipe_settings = {
        "masking": data_args.masking,
        "task_sampling": training_args.task_sampling,
        "mlm_probability": data_args.mlm_probability,
        "max_seq_length": data_args.max_seq_length,
    }
    stated = report_settings(training_args, trainer.state.max_steps, recipe_settings)
    final_weights = trainer.step_weights.tolist()
    report = task_report(spec.task_names, trainer.state.log_history, eval_metrics, stated, final_weights, provenance)
    base = trainer.accelerator.unwrap_model(trainer.model)
    unassigned = [tag for tag in UPOS_TAGS if tag not in spec.tag_to_task]
    content = pos_mlm_card_content(base, tokenizer, report, model_args, data_args, spec.to_dict(), unassigned)
    write_report_and_card(trainer, report, card_renderer(trainer, content))
    if training_args.should_save and model_args.use_lora and model_args.merge_lora:
        save_merged(base, tokenizer, Path(training_args.output_dir) / "merged")
    return report


if __name__ == "__main__":
    raise SystemExit(main())
