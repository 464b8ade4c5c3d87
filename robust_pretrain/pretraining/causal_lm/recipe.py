"""Domain-robust causal-LM pre-training: data domains as tasks for a decoder, in the conventions of HF's run_clm.py.

    robust-pretrain-causal-lm --config decoder_demo [--max_steps 100 ...]
    accelerate launch recipes/pretrain_causal_lm.py --config decoder_demo

Each domain (a UD English-EWT genre by default; else the values of ``--domain_column`` or one ``--domain_files`` entry
each) is one task: texts are packed into ``max_seq_length`` sequences within their domain
(:mod:`robust_pretrain.data.domains`), every sequence's domain is its task id, and the trainer minimises the weighted
per-domain next-token losses. The batches hold the domains in their natural proportions (``--task_sampling none``),
or each sequence's domain is drawn: from the strategy's current weights (``online``: DoReMi's way of applying weights;
the objective is then the plain mean) or from a file of weights (``--domain_weights``, e.g. the
``domain_weights.json`` of ``robust-pretrain-mixture``; ``--importance_weighting`` corrects the draws toward the
strategy's weights). With ``--streaming`` each ``--domain_files`` source is a stream, packed on the fly and
resumed exactly (online draws: :mod:`robust_pretrain.data.streaming`). The run writes the model
(``AutoModelForCausalLM``) and tokenizer, ``task_report.json`` with the per-domain held-out loss and perplexity
(mean and worst domain), the domains' mixture weights and the run's provenance
(:class:`~robust_pretrain.reference.Provenance`), and a model card.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import TrainerCallback, set_seed
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState

from robust_pretrain.cli import UsageError, check_checkpoint, run_console
from robust_pretrain.config import OptionParser, parse_with_config
from robust_pretrain.data.domains import domain_counts
from robust_pretrain.output_dir import resume_or_refuse, write_run_config
from robust_pretrain.pretraining.causal_lm.arguments import (
    FROM_SCRATCH,
    CausalModelArguments,
    DomainDataArguments,
    domain_weights,
    objective_weighting,
    read_domain_weights,
    run_settings,
    sampling_defaults,
)
from robust_pretrain.pretraining.causal_lm.data import (
    DomainTexts,
    load_domain_texts,
    pack_sequences,
    parse_domain_files,
    require_every_domain,
    text_tokens,
    texts_per_domain,
)
from robust_pretrain.pretraining.causal_lm.model import (
    check_causal_checkpoint,
    load_model,
    load_tokenizer,
)
from robust_pretrain.pretraining.common import (
    bind_tasks,
    create_trainer,
    push,
    refuse_given_options,
    setup_logging,
    train_and_evaluate,
)
from robust_pretrain.pretraining.streams import check_domain_streaming, domain_training_data
from robust_pretrain.reference import (
    Provenance,
    check_override,
    check_provenance,
    check_reference_model,
    check_reference_run,
    dataset_fingerprint,
)
from robust_pretrain.reporting import card_renderer, task_report
from robust_pretrain.reporting.recipe_cards import causal_lm_card_content
from robust_pretrain.reporting.task_report import report_settings, write_report_and_card
from robust_pretrain.trainer import MinimaxTrainer
from robust_pretrain.trainer.task_sampling import ordered_weights
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments

__all__ = [
    "SAMPLING_NAMES",
    "WeightAverageCallback",
    "main",
    "mixture_weights",
    "parse_arguments",
    "refuse_before_reading",
    "run",
    "run_provenance",
    "write_report",
]

logger = logging.getLogger(__name__)

SAMPLING_NAMES = {"none": "natural", "online": "online", "fixed": "fixed"}  # task_sampling, as the report says it


class WeightAverageCallback(TrainerCallback, ExportableState):
    """Sums each optimizer step's domain weights (the sampling weights when domains are drawn online, else the
    objective's), for the time-averaged weights DoReMi exports. The sum is part of every checkpoint's
    ``trainer_state.json`` (an ``ExportableState``: written with the rest of the state) and :meth:`load` restores it,
    so a resumed run averages over all its steps."""

    def __init__(self) -> None:
        self.trainer: MinimaxTrainer | None = None
        self.total: torch.Tensor | None = None
        self.steps = 0

    def state(self) -> dict[str, Any]:
        total = None if self.total is None else self.total.tolist()
        return {"args": {}, "attributes": {"total": total, "steps": self.steps}}

    def load(self, checkpoint: str) -> None:
        """Restore the sum of a checkpoint's steps (one written without it: a warning, the steps after it only)."""
        saved = json.loads((Path(checkpoint) / TRAINER_STATE_NAME).read_text()).get("stateful_callbacks", {})
        if type(self).__name__ not in saved:
            logger.warning("%s holds no weight average: the averaged weights cover the steps after it only", checkpoint)
            return
        attributes = saved[type(self).__name__]["attributes"]
        self.total = None if attributes["total"] is None else torch.tensor(attributes["total"], dtype=torch.float64)
        self.steps = attributes["steps"]

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        schedule = self.trainer.task_schedule
        if schedule is not None and not schedule.fixed:
            weights = schedule.history[state.global_step]
        else:
            weights = self.trainer.step_weights.double().cpu()
        weights = weights.double() / weights.sum()
        self.total = weights if self.total is None else self.total + weights
        self.steps += 1

    def average(self) -> list[float] | None:
        return None if self.total is None else (self.total / self.steps).tolist()


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``robust-pretrain-causal-lm``, ``recipes/pretrain_causal_lm.py``): exit status 2 and one
    line for a bad option, file, column, domain or checkpoint."""
    return run_console(run, argv, prog="robust-pretrain-causal-lm")


def run(argv: list[str]) -> dict:
    """Pre-train as ``argv`` says; the held-out metrics and the task report."""
    model_args, data_args, training_args = parse_arguments(argv)
    setup_logging(training_args, logger)  # before the data are read: datasets' progress bars off
    refuse_before_reading(argv, model_args, data_args, training_args)

    texts = load_domain_texts(data_args)
    text_counts = require_every_domain(texts)
    fixed_weights, saved_provenance = domain_weights(data_args, texts.names)
    bind_tasks(training_args, texts.names, "the data's domains")
    objective = objective_weighting(data_args, texts.names)
    logger.info("domains %s (texts %s) weighting=%s", texts.names, text_counts, training_args.weighting)
    settings = run_settings(model_args, data_args, training_args, texts.names)
    resume_checkpoint = resume_or_refuse(training_args, settings, overwrite=data_args.overwrite_output_dir)
    set_seed(training_args.seed)

    tokenizer = load_tokenizer(model_args, training_args, texts.train["text"], resume_checkpoint)
    check_reference_model(training_args.reference_model, tokenizer, training_args.reference_mismatch_ok)
    train_sequences, eval_sequences = pack_sequences(texts, tokenizer, data_args, training_args)
    model = load_model(model_args, tokenizer, data_args.max_seq_length)  # after the data's refusals: they stay quiet
    provenance = run_provenance(texts, tokenizer, eval_sequences, model, model_args)
    check_reference_run(training_args.reference_run, training_args.reference_mismatch_ok, provenance)
    if data_args.domain_weights is not None:
        allowed = training_args.reference_mismatch_ok
        check_provenance("--domain_weights", data_args.domain_weights, saved_provenance, provenance, allowed)
    sequences = domain_counts(train_sequences, len(texts.names))  # streamed: of the sample
    train_sequences, collator, data_callbacks = domain_training_data(
        texts, train_sequences, tokenizer, data_args, training_args, fixed_weights, resume_checkpoint
    )
    averages = WeightAverageCallback()
    write_run_config(training_args, settings)
    trainer = create_trainer(
        training_args,
        model=model,
        train_dataset=train_sequences,
        eval_dataset=eval_sequences,
        processing_class=tokenizer,
        data_collator=collator,
        weighting=objective,
        callbacks=[averages, *data_callbacks],
    )
    averages.trainer = trainer
    if resume_checkpoint is not None:
        averages.load(resume_checkpoint)
    eval_metrics = train_and_evaluate(trainer, resume_checkpoint)

    mixture = mixture_weights(training_args, texts, sequences, fixed_weights, averages)
    held_out = held_out_size(texts, text_tokens(eval_sequences, tokenizer, len(texts.names)))
    report = write_report(
        trainer,
        eval_metrics,
        provenance,
        texts,
        sequences,
        mixture,
        averages,
        tokenizer,
        model_args,
        data_args,
        held_out,
    )
    push(trainer)
    return {**eval_metrics, "report": report}


def parse_arguments(argv: list[str]) -> tuple[CausalModelArguments, DomainDataArguments, MinimaxTrainingArguments]:
    """The options; ``--reference_mismatch_ok`` is refused without a reference run or domain weights to override."""
    parser = OptionParser((CausalModelArguments, DomainDataArguments, MinimaxTrainingArguments), description=__doc__)
    parser.set_defaults(report_to=[], save_total_limit=2)
    model_args, data_args, training_args = parse_with_config(parser, argv)
    loaded = sampling_defaults(data_args, training_args)
    if loaded:  # --domain_weights: the trainer's options built with the file's weights, not rewritten
        parser.set_defaults(**loaded)
        model_args, data_args, training_args = parse_with_config(parser, argv)
    given = {"reference_run": training_args.reference_run, "domain_weights": data_args.domain_weights}
    given["reference_model"] = training_args.reference_model
    check_override(training_args.reference_mismatch_ok, given)
    return model_args, data_args, training_args


def refuse_before_reading(
    argv: list[str],
    model_args: CausalModelArguments,
    data_args: DomainDataArguments,
    training_args: MinimaxTrainingArguments,
) -> None:
    """Refuse, before any data is read, a checkpoint or tokenizer that cannot serve, options a checkpoint or a stream
    leaves unused, and weight files that contradict the sampling options."""
    if model_args.model_name_or_path is not None:
        refuse_given_options(argv, FROM_SCRATCH, "from-scratch options, unused with --model_name_or_path")
        check_checkpoint(model_args.model_name_or_path)
        check_causal_checkpoint(model_args.model_name_or_path)
    if model_args.tokenizer_name is not None:
        check_checkpoint(model_args.tokenizer_name, "--tokenizer_name", model=False)

    if data_args.domain_files:  # the options name the domains: weights by other names are refused now
        check_weight_names(list(parse_domain_files(data_args.domain_files)), data_args, training_args)
    if data_args.validation_file is not None:
        refuse_given_options(argv, ["validation_split_percentage"], "not used with --validation_file")
    if data_args.streaming:
        held_out = "the held-out texts are the first --stream_held_out_texts of each stream"
        refuse_given_options(argv, ["validation_split_percentage"], f"not used with --streaming ({held_out})")
        check_domain_streaming(model_args, data_args, training_args)


def check_weight_names(
    names: list[str], data_args: DomainDataArguments, training_args: MinimaxTrainingArguments
) -> None:
    """Refuse weight files and ``--task_sampling_weights`` that name other domains than ``names`` (one per domain)."""
    for option, path in (
        ("--domain_weights", data_args.domain_weights),
        ("--objective_weights", data_args.objective_weights),
    ):
        if path is not None:
            read_domain_weights(path, names, option)
    if training_args.task_sampling_weights is not None:
        try:
            ordered_weights(training_args.task_sampling_weights, names)
        except ValueError as err:
            raise UsageError(str(err)) from None


def run_provenance(
    texts: DomainTexts,
    tokenizer: Any,
    eval_sequences: Dataset,
    model: torch.nn.Module,
    model_args: CausalModelArguments,
) -> Provenance:
    """What the run's held-out losses depend on: the domains, the tokenizer, the data, the model."""
    tokenizer_source = model_args.tokenizer_name or model_args.model_name_or_path
    return Provenance.of_run(
        texts.names,
        tokenizer,
        dataset_fingerprint(texts.train),  # streamed: the first texts of each stream
        dataset_fingerprint(eval_sequences),
        model,
        tokenizer_source or f"byte-level BPE trained on the training text (vocab_size {model_args.vocab_size})",
    )


def mixture_weights(
    training_args: MinimaxTrainingArguments,
    texts: DomainTexts,
    sequences: list[int],
    fixed_weights: list[float] | None,
    averages: WeightAverageCallback,
) -> tuple[list[float], str]:
    """The domains' mixture weights as the report states them, and what they are (their kind)."""
    num_domains = len(texts.names)
    if fixed_weights is not None:
        return [w / sum(fixed_weights) for w in fixed_weights], "file"
    if training_args.task_sampling == "online":
        return averages.average() or [1 / num_domains] * num_domains, "online time-average"
    if texts.streams is not None:
        return [1 / num_domains] * num_domains, "uniform (streamed)"
    if training_args.task_sampling == "fixed":
        weights = training_args.task_sampling_weights
        return [w / sum(weights) for w in weights], "fixed"
    return [count / sum(sequences) for count in sequences], "natural"


def held_out_size(texts: DomainTexts, tokens: list[int]) -> dict[str, dict[str, int]]:
    """Per domain, the held-out texts (documents) and the tokens scored of them."""
    counts = texts_per_domain(texts.validation, len(texts.names))
    return {
        "held_out_texts": dict(zip(texts.names, counts, strict=True)),
        "held_out_tokens": dict(zip(texts.names, tokens, strict=True)),
    }


def eval_readings(log_history: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    """The held-out per-domain losses of each evaluation during and after training, by step."""
    readings = {
        entry["step"]: {name: entry[f"eval_task_loss/{name}"] for name in names}
        for entry in log_history
        if all(f"eval_task_loss/{name}" in entry for name in names)
    }
    return [{"step": step, "eval_task_loss": losses} for step, losses in sorted(readings.items())]


def write_report(
    trainer: MinimaxTrainer,
    eval_metrics: dict,
    provenance: Provenance,
    texts: DomainTexts,
    sequences: list[int],
    mixture: tuple[list[float], str],
    averages: WeightAverageCallback,
    tokenizer: Any,
    model_args: CausalModelArguments,
    data_args: DomainDataArguments,
    held_out: dict[str, dict[str, int]],
) -> dict:
    """Write the task report (per-domain held-out loss and perplexity, its size and its readings over training, the
    mixture weights, the global batch, provenance) and the model card; the report."""
    training_args, (weights, kind), names = trainer.args, mixture, texts.names
    recipe_settings = {
        "domain_sampling": "file"
        if data_args.domain_weights is not None
        else SAMPLING_NAMES[training_args.task_sampling],
        "max_seq_length": data_args.max_seq_length,
    }
    if training_args.max_epochs_per_task is not None:
        recipe_settings["max_epochs_per_task"] = training_args.max_epochs_per_task
    stated = report_settings(training_args, trainer.state.max_steps, recipe_settings)
    report = task_report(names, trainer.state.log_history, eval_metrics, stated, trainer.step_weights.tolist())
    report.update(
        eval_task_perplexity={
            name: eval_metrics[f"eval_task_perplexity/{name}"]
            for name in names
            if f"eval_task_perplexity/{name}" in eval_metrics
        },
        eval_worst_task_perplexity=eval_metrics.get("eval_worst_task_perplexity"),
        training_sequences=None if texts.streams else dict(zip(names, sequences, strict=True)),
        mixture_weights=dict(zip(names, weights, strict=True)),
        mixture_kind=kind,
        time_averaged_weights=dict(zip(names, averages.average() or [], strict=False)),
        provenance=provenance.to_dict(),
        global_batch_sequences=training_args.per_device_train_batch_size
        * training_args.world_size
        * training_args.gradient_accumulation_steps,
        eval_readings=eval_readings(trainer.state.log_history, names),
        **held_out,
    )
    cap = getattr(trainer.weighting, "cap", None)
    if cap is not None:
        report["epochs_drawn"] = dict(zip(names, cap.epochs(), strict=True))
    perplexities = list(report["eval_task_perplexity"].values())
    report["eval_mean_task_perplexity"] = sum(perplexities) / len(perplexities) if perplexities else None
    base = trainer.accelerator.unwrap_model(trainer.model)
    counts = ["streamed"] * len(names) if texts.streams else sequences
    tokenizer_source = model_args.tokenizer_name or model_args.model_name_or_path
    content = causal_lm_card_content(base, tokenizer, tokenizer_source, report, texts, counts, weights, model_args)
    write_report_and_card(trainer, report, card_renderer(trainer, content))
    return report
