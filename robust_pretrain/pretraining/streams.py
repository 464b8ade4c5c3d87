"""The recipes' ``--streaming``: what a stream cannot do, refused before any work, and the decoder's streamed data.

The PoS recipe streams one corpus (``datasets`` shards it by file over the processes) and draws no tasks: its
``--task_sampling`` draws among a sequence's tasks from map-style data. The decoder recipe streams one source per
domain: with fixed weights (``--domain_weights``, else uniform) one interleaved stream
(:func:`~robust_pretrain.data.domains.stream_domains`); with ``--task_sampling online`` a stream per domain from which
each step's rows are drawn with the strategy's weights, resumed exactly (:mod:`robust_pretrain.data.streaming`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from datasets import Dataset, IterableDataset
from transformers import TrainerCallback

from robust_pretrain.cli import UsageError
from robust_pretrain.data.domains import DomainCollator, stream_domains
from robust_pretrain.data.streaming import DomainStreams, StreamDomainCollator, StreamPositionsCallback

if TYPE_CHECKING:
    from robust_pretrain.pretraining.causal_lm.arguments import CausalModelArguments, DomainDataArguments
    from robust_pretrain.pretraining.causal_lm.data import DomainTexts
    from robust_pretrain.pretraining.pos_mlm.arguments import DataArguments, ModelArguments
    from robust_pretrain.trainer.training_args import MinimaxTrainingArguments


def check_pos_streaming(
    model_args: ModelArguments, data_args: DataArguments, training_args: MinimaxTrainingArguments
) -> None:
    """Refuse, naming the option, what the PoS recipe's stream cannot do."""
    if data_args.dataset_name is None and data_args.train_file is None:
        raise UsageError("--streaming reads --dataset_name or --train_file (the default UD corpus is small: drop it)")
    if training_args.max_steps <= 0:
        raise UsageError(
            "--streaming needs --max_steps: a stream has no length, so the number of steps cannot come from "
            "--num_train_epochs"
        )
    if model_args.tokenizer_name is None and model_args.model_name_or_path is None:
        raise UsageError(
            "--streaming: a tokenizer cannot be trained on a stream; pass --tokenizer_name (a saved tokenizer) or "
            "--model_name_or_path"
        )
    if training_args.task_sampling != "none":
        raise UsageError(
            f"--streaming: --task_sampling {training_args.task_sampling} draws among each sequence's tasks, which "
            "needs map-style data in the PoS recipe (the decoder recipe draws domains from streams); drop one"
        )


def log_stream_sharding(train_dataset: IterableDataset, processes: int, logger: logging.Logger) -> None:
    """Say with ``logger`` (the recipe's) how Accelerate splits the stream over the processes (by file when there are
    enough files)."""
    files = train_dataset.n_shards
    if files >= processes:
        least = files // processes
        share = f"{least}" if files % processes == 0 else f"{least} or {least + 1}"
        logger.info("streaming: each process reads %s of the %d files (shards) of the training stream", share, files)
    else:
        logger.warning(
            "streaming: the training stream has %d file(s) (shards) for %d processes, so every process reads all of "
            "it and keeps its share of the batches; split the corpus into at least %d files to read disjoint data",
            files,
            processes,
            processes,
        )


def check_domain_streaming(
    model_args: CausalModelArguments, data_args: DomainDataArguments, training_args: MinimaxTrainingArguments
) -> None:
    """Refuse, naming the option, what the decoder recipe's domain streams cannot do."""
    if not data_args.domain_files:
        raise UsageError("--streaming reads --domain_files (one stream per domain); give them")
    if training_args.max_steps <= 0:
        raise UsageError("--streaming needs --max_steps: a stream has no length")
    if model_args.tokenizer_name is None and model_args.model_name_or_path is None:
        raise UsageError(
            "--streaming: a tokenizer cannot be trained on a stream; pass --tokenizer_name or --model_name_or_path"
        )
    if training_args.task_sampling == "fixed":
        raise UsageError(
            "--streaming --task_sampling fixed: streams draw fixed weights from a file; give them as --domain_weights"
        )
    if training_args.task_sampling != "online":
        if data_args.stream_shuffle_buffer:
            raise UsageError(
                "--stream_shuffle_buffer shuffles the domain streams of --task_sampling online; with fixed weights "
                "each domain is read in order"
            )
        return
    if training_args.dataloader_num_workers:
        raise UsageError(
            "--streaming --task_sampling online reads the domain streams in the training process: "
            f"--dataloader_num_workers must be 0, got {training_args.dataloader_num_workers}"
        )
    if training_args.restore_callback_states_from_checkpoint:
        raise UsageError(
            "--restore_callback_states_from_checkpoint: --streaming --task_sampling online restores its stream "
            "positions itself; leave it false"
        )


def domain_training_data(
    texts: DomainTexts,
    packed: Dataset,
    tokenizer: Any,
    data_args: DomainDataArguments,
    training_args: MinimaxTrainingArguments,
    fixed_weights: list[float] | None,
    checkpoint: str | None,
) -> tuple[Dataset | IterableDataset | DomainStreams, DomainCollator, list[TrainerCallback]]:
    """The decoder's training data, collator and data callbacks: the ``packed`` sequences (map-style); one stream
    interleaving the domains with ``fixed_weights`` (uniform without); or, with ``--task_sampling online``, a stream
    per domain, its positions continued from ``checkpoint`` (resuming) and saved in every checkpoint."""
    collator = DomainCollator(tokenizer.pad_token_id, task_names=texts.names)
    if texts.streams is None:
        return packed, collator, []
    if training_args.task_sampling != "online":
        weights = fixed_weights or [1.0] * len(texts.names)
        stream = stream_domains(texts.streams, tokenizer, data_args.max_seq_length, weights, training_args.seed)
        training_args.accelerator_config.dispatch_batches = False  # every process reads the streams itself
        return stream, collator, []
    streams = DomainStreams(
        texts.streams, tokenizer, data_args.max_seq_length, training_args.seed, data_args.stream_shuffle_buffer
    )
    positions = StreamPositionsCallback(streams)
    if checkpoint is not None:
        try:
            positions.load(checkpoint)
        except ValueError as err:
            raise UsageError(f"--output_dir: {err}") from err
    return streams, StreamDomainCollator(tokenizer.pad_token_id, task_names=texts.names), [positions]


__all__ = ["check_domain_streaming", "check_pos_streaming", "domain_training_data", "log_stream_sharding"]
