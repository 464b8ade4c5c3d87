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
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, IterableDataset, concatenate_datasets, load_dataset
from datasets.exceptions import DatasetGenerationError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    TrainerCallback,
    set_seed,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState

from robust_pretrain.cli import UsageError, check_checkpoint, run_console
from robust_pretrain.config import OptionParser, parse_with_config
from robust_pretrain.data.domains import (
    DOMAIN_COLUMN,
    EWT_GENRES,
    domain_counts,
    domain_texts,
    ewt_genre_texts,
    pack_domains,
)
from robust_pretrain.data.text_files import TEXT_BUILDERS, check_text_file, matching_files
from robust_pretrain.options import check_options, option
from robust_pretrain.output_dir import resume_or_refuse, write_run_config
from robust_pretrain.pretraining.common import (
    bind_tasks,
    create_trainer,
    named_tokenizer,
    push,
    refuse_given_options,
    setup_logging,
    train_and_evaluate,
    train_tokenizer_once,
    training_settings,
)
from robust_pretrain.pretraining.streams import check_domain_streaming, domain_training_data
from robust_pretrain.reference import (
    Provenance,
    check_override,
    check_provenance,
    check_reference_run,
    dataset_fingerprint,
)
from robust_pretrain.reporting import card_renderer, task_report
from robust_pretrain.reporting.cards import (
    EWT_TRAINING_DATA,
    TrainingData,
    hub_dataset,
    local_files,
)
from robust_pretrain.reporting.recipe_cards import causal_lm_card_content
from robust_pretrain.reporting.task_report import report_settings, write_report_and_card
from robust_pretrain.targets import refuse_tasks_without_targets
from robust_pretrain.task_sampling import FixedWeighting
from robust_pretrain.trainer import MinimaxTrainer
from robust_pretrain.training_args import MinimaxTrainingArguments

logger = logging.getLogger(__name__)

DECODER_SIZES = {  # from-scratch Llama-style presets: layers, hidden, heads, key/value heads, intermediate
    "tiny": (2, 128, 4, 2, 384),
    "mini": (4, 256, 4, 2, 768),
    "small": (6, 512, 8, 4, 1536),
}
MIN_VOCAB_SIZE = 64  # a byte-level BPE vocabulary holds its 256 bytes: smaller sizes are raised to them
FROM_SCRATCH = ["model_size", "vocab_size"]  # options of a decoder trained from scratch
NOT_SETTINGS = {"preprocessing_num_workers", "overwrite_output_dir"}
DOMAIN_WEIGHTS_NAME = "domain_weights.json"
SAMPLING_NAMES = {"none": "natural", "online": "online", "fixed": "fixed"}  # task_sampling, as the report says it
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


@dataclass
class CausalModelArguments:
    model_name_or_path: str | None = option(
        None,
        "Checkpoint (local dir or Hub id) to continue pre-training; it must load with AutoModelForCausalLM. Leave "
        "unset to train a Llama-style decoder from scratch (see model_size).",
    )
    model_size: str = option("tiny", "From-scratch Llama-style preset.", choices=list(DECODER_SIZES))
    tokenizer_name: str | None = option(
        None,
        "Fast tokenizer to use (default: the checkpoint's; from scratch: a byte-level BPE tokenizer trained on the "
        "training text).",
    )
    vocab_size: int = option(4000, "Vocabulary size of a tokenizer trained from scratch.", minimum=MIN_VOCAB_SIZE)

    def __post_init__(self) -> None:
        check_options(self)


@dataclass
class DomainDataArguments:
    domain_files: list[str] | None = option(
        None,
        "One data source per domain, as name=path: a .txt/.json/.jsonl/.csv/.parquet file or glob, or a dataset "
        "(a local dataset folder or a Hub id, its train split), e.g. --domain_files web=web/*.jsonl code=code.txt.",
    )
    dataset_name: str | None = option(None, "A dataset (Hub id or local folder) whose --domain_column names domains.")
    train_file: str | None = option(None, "A data file (or glob) whose --domain_column names domains.", path="file")
    domain_column: str | None = option(
        None, "Column of --dataset_name / --train_file holding each text's domain (its distinct values, sorted)."
    )
    text_column_name: str = option("text", "Column holding the raw text.")
    ud_dir: str | None = option(
        None,
        "Default data when no other source is given: UD English-EWT's five genres as domains, read from this folder "
        "(default: $ROBUST_PRETRAIN_UD_DIR, else ../shared/data/ud_ewt from the current directory); EWT test is "
        "held out.",
    )
    validation_split_percentage: int = option(
        5, "Percent of each domain's texts held out (not for the UD default, whose test split is held out).",
        minimum=1, maximum=99,
    )  # fmt: skip
    max_seq_length: int = option(128, "Tokens per packed sequence.", minimum=2, maximum=8192)
    domain_weights: str | None = option(
        None,
        'JSON file of domain sampling weights ({"weights": {domain: weight}}, e.g. robust-pretrain-mixture\'s '
        "domain_weights.json): each training sequence's domain is drawn from them (--task_sampling fixed with the "
        "file's weights). Its provenance (domains, tokenizer, training and held-out data, model size) must match this "
        "run's, see --reference_mismatch_ok.",
        path="file",
    )
    objective_weights: str | None = option(
        None,
        "With --importance_weighting: JSON file of the objective's domain weights w (the format of --domain_weights), "
        "in place of the --weighting strategy's; each target's loss is multiplied by w_d / q_d (q: --domain_weights).",
        path="file",
    )
    max_eval_sequences: int | None = option(None, "Held-out sequences kept per domain (the first ones).", minimum=1)
    streaming: bool = option(
        False,
        "Stream the --domain_files sources (nothing read into memory but the held-out texts): each domain is packed on "
        "the fly and read over and over, and the next sequence's domain is drawn from --domain_weights (uniform "
        "without; --task_sampling online: the strategy's weights); a resumed run continues exactly. Needs --max_steps "
        "and --tokenizer_name or --model_name_or_path.",
    )
    stream_shuffle_buffer: int = option(
        0,
        "With --streaming --task_sampling online: read each domain's texts through a shuffle buffer of this many "
        "texts, in a new order (seeded by --seed) every pass over the stream; 0 reads them in order.",
        minimum=0,
    )
    stream_held_out_texts: int = option(
        100,
        "With --streaming: the first texts of each domain's stream are its held-out data, skipped in training.",
        minimum=1,
    )
    preprocessing_num_workers: int | None = option(None, "Processes for tokenising.", minimum=1)
    overwrite_output_dir: bool = option(False, "Start afresh even if output_dir holds checkpoints (they are deleted).")

    def __post_init__(self) -> None:
        check_options(self)
        sources = [name for name in ("domain_files", "dataset_name", "train_file") if getattr(self, name)]
        if len(sources) > 1:
            raise UsageError(f"give one data source, not {' and '.join('--' + name for name in sources)}")
        if (self.dataset_name or self.train_file) and self.domain_column is None:
            raise UsageError("--dataset_name / --train_file need --domain_column (the column naming each domain)")
        if self.domain_column is not None and not (self.dataset_name or self.train_file):
            raise UsageError("--domain_column names a column of --dataset_name or --train_file: give one of them")


@dataclass
class DomainTexts:
    """The raw texts of a run: ``train`` and ``validation`` with columns ``text`` and ``domain`` (an index into
    ``names``), and where they came from (for the card). Streamed (``streams``: each domain's training texts), ``train``
    holds the first :data:`STREAM_SAMPLE_TEXTS` training texts of each stream, for the checks and the data hashes."""

    names: list[str]
    train: Dataset
    validation: Dataset
    training_data: TrainingData
    streams: list[IterableDataset] | None = None


def parse_domain_files(entries: list[str]) -> dict[str, str]:
    """``name=source`` entries -> ``{name: source}``, names unique and non-empty."""
    sources: dict[str, str] = {}
    for entry in entries:
        name, sep, source = entry.partition("=")
        if not sep or not name or not source:
            raise UsageError(f"--domain_files {entry}: expected name=path (e.g. web=data/web.jsonl)")
        if name in sources:
            raise UsageError(f"--domain_files names the domain {name!r} twice")
        sources[name] = source
    return sources


def _load_source(source: str, option_name: str, text_column: str, streaming: bool = False) -> Dataset | IterableDataset:
    """The train split of a file / glob / dataset folder / Hub dataset (streamed or not), with a text column."""
    if Path(source).is_dir() or not (Path(source).suffix or any(ch in source for ch in "*?[")):
        try:
            raw = load_dataset(source, split="train", streaming=streaming)
        except (OSError, ValueError, DatasetGenerationError) as err:
            raise UsageError(f"{option_name} {source}: could not load it as a dataset ({err})") from err
    else:
        paths = matching_files(source, option_name)
        builder = TEXT_BUILDERS.get(Path(paths[0]).suffix.lstrip("."))
        if builder is None:
            raise UsageError(f"{option_name} {source}: expected a .txt, .json, .jsonl, .csv or .parquet file")
        for path in paths:
            check_text_file(Path(path), option_name, builder)
        try:
            raw = load_dataset(builder, data_files={"train": paths}, split="train", streaming=streaming)
        except DatasetGenerationError as err:
            cause = err.__cause__ or err
            raise UsageError(f"{option_name} {source}: could not read it as {builder} data ({cause})") from err
    if raw.column_names is not None and text_column not in raw.column_names:
        raise UsageError(
            f"{option_name} {source} has no text column {text_column!r} (columns: {raw.column_names}); set "
            "--text_column_name"
        )
    return raw


def _split(dataset: Dataset, percentage: int) -> tuple[Dataset, Dataset]:
    """Each domain's texts split into training and held-out ones (at least one held out per domain, seed 0)."""
    train, held_out = [], []
    for domain in sorted(set(dataset[DOMAIN_COLUMN])):
        texts = domain_texts(dataset, domain)
        if len(texts) < 2:
            train.append(texts)
            continue
        size = max(1, round(len(texts) * percentage / 100))
        parts = texts.train_test_split(test_size=size, seed=0)
        train.append(parts["train"])
        held_out.append(parts["test"])
    return concatenate_datasets(train), concatenate_datasets(held_out) if held_out else dataset.select([])


def load_domain_texts(data_args: DomainDataArguments) -> DomainTexts:
    """The texts of every domain, from whichever source the options name (UD-EWT genres by default)."""
    column = data_args.text_column_name
    if data_args.streaming:
        return stream_domain_texts(data_args)
    if data_args.domain_files:
        sources = parse_domain_files(data_args.domain_files)
        parts = []
        for index, (name, source) in enumerate(sources.items()):
            raw = _load_source(source, f"--domain_files {name}=", column)
            parts.append(Dataset.from_dict({"text": raw[column], DOMAIN_COLUMN: [index] * len(raw)}))
        train, validation = _split(concatenate_datasets(parts), data_args.validation_split_percentage)
        return DomainTexts(list(sources), train, validation, local_files(*sources.values()))
    if data_args.dataset_name or data_args.train_file:
        option_name = "--dataset_name" if data_args.dataset_name else "--train_file"
        source = data_args.dataset_name or data_args.train_file
        raw = _load_source(source, option_name, column)
        if data_args.domain_column not in raw.column_names:
            raise UsageError(
                f"--domain_column {data_args.domain_column}: {source} has no such column (columns: {raw.column_names})"
            )
        values = raw[data_args.domain_column]
        names = sorted({str(value) for value in values})
        index = {name: i for i, name in enumerate(names)}
        raw = Dataset.from_dict({"text": raw[column], DOMAIN_COLUMN: [index[str(value)] for value in values]})
        train, validation = _split(raw, data_args.validation_split_percentage)
        data = hub_dataset(source) if data_args.dataset_name else local_files(source)
        return DomainTexts(names, train, validation, data)
    try:
        train, validation = ewt_genre_texts("train", data_args.ud_dir), ewt_genre_texts("test", data_args.ud_dir)
    except (OSError, ValueError) as err:
        raise UsageError(f"--ud_dir: {err}") from err
    return DomainTexts(list(EWT_GENRES), train, validation, EWT_TRAINING_DATA)


STREAM_SAMPLE_TEXTS = 200
"""Training texts read from each domain's stream before training: checked for data and hashed (the provenance)."""


def stream_domain_texts(data_args: DomainDataArguments) -> DomainTexts:
    """Each ``--domain_files`` source as a stream: its first ``stream_held_out_texts`` texts held out (read now), the
    rest its training stream."""
    sources = parse_domain_files(data_args.domain_files)
    held_out, sample, streams = [], [], []
    for index, (name, source) in enumerate(sources.items()):
        stream = _load_source(source, f"--domain_files {name}=", data_args.text_column_name, streaming=True)
        stream = stream.select_columns([data_args.text_column_name])
        if data_args.text_column_name != "text":
            stream = stream.rename_column(data_args.text_column_name, "text")
        first = [row["text"] for row in stream.take(data_args.stream_held_out_texts)]
        training = stream.skip(data_args.stream_held_out_texts)
        held_out.append(Dataset.from_dict({"text": first, DOMAIN_COLUMN: [index] * len(first)}))
        texts = [row["text"] for row in training.take(STREAM_SAMPLE_TEXTS)]
        sample.append(Dataset.from_dict({"text": texts, DOMAIN_COLUMN: [index] * len(texts)}))
        streams.append(training)
    return DomainTexts(
        list(sources),
        concatenate_datasets(sample),
        concatenate_datasets(held_out),
        local_files(*sources.values()),
        streams=streams,
    )


def require_every_domain(texts: DomainTexts) -> list[int]:
    """Texts per domain in the training data; refuse a domain without any training or held-out text."""
    for split, dataset in (("training", texts.train), ("held-out", texts.validation)):
        counts = torch.bincount(torch.as_tensor(dataset[DOMAIN_COLUMN], dtype=torch.long), minlength=len(texts.names))
        empty = [name for name, count in zip(texts.names, counts.tolist(), strict=True) if count == 0]
        if empty:
            raise UsageError(
                f"domain {', '.join(empty)} has no {split} text"
                + (" (a domain needs at least 2 texts: one is held out)" if split == "held-out" else "")
            )
    return torch.bincount(torch.as_tensor(texts.train[DOMAIN_COLUMN]), minlength=len(texts.names)).tolist()


def train_bpe_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 style: any text encodes, none is unknown) trained on ``texts``, with
    ``<s>``, ``</s>`` (end of text), ``<pad>`` and ``<unk>``; deterministic for the same texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer, length=len(texts))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=8192, **SPECIAL_TOKENS)


def load_tokenizer(
    model_args: CausalModelArguments, training_args: MinimaxTrainingArguments, texts: list[str], checkpoint: str | None
) -> PreTrainedTokenizerFast:
    named = named_tokenizer(model_args.tokenizer_name, model_args.model_name_or_path, checkpoint)
    if named is not None:
        tokenizer, source = named
        if tokenizer.eos_token is None:
            raise UsageError(f"{source}: the tokenizer has no eos token to end each packed text")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token  # padding is masked out of attention and labels
        return tokenizer
    return train_tokenizer_once(
        training_args, "training the BPE tokenizer", lambda: train_bpe_tokenizer(texts, model_args.vocab_size)
    )


def check_causal_checkpoint(name: str) -> None:
    """Refuse a checkpoint whose architecture AutoModelForCausalLM cannot load, before any data is read."""
    try:
        config = AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise UsageError(f"--model_name_or_path {name}: {err}") from err
    causal_names = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    architectures = config.architectures or []
    # an encoder family with a decoder head (BERT's BertLMHeadModel) is causal only when its checkpoint is one
    in_mapping = config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    encoder = in_mapping and bool(architectures) and not set(architectures) & causal_names and not config.is_decoder
    if not in_mapping or config.is_encoder_decoder or encoder:
        raise UsageError(
            f"--model_name_or_path {name} ({config.model_type}, {', '.join(architectures) or 'no architecture'}) is "
            "not a causal LM; give a decoder checkpoint that AutoModelForCausalLM loads (GPT-2, Llama, Qwen2, ...) or "
            "leave it unset to train one from scratch"
        )


def load_model(model_args: CausalModelArguments, tokenizer: Any, max_seq_length: int) -> torch.nn.Module:
    if model_args.model_name_or_path is not None:
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
        if len(tokenizer) > model.get_input_embeddings().num_embeddings:
            model.resize_token_embeddings(len(tokenizer))
        return model
    layers, hidden, heads, kv_heads, intermediate = DECODER_SIZES[model_args.model_size]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_seq_length,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def check_weight_files(data_args: DomainDataArguments, training_args: MinimaxTrainingArguments) -> None:
    """``--domain_weights`` are the fixed sampling weights, ``--objective_weights`` the objective of importance
    weighting: refuse what contradicts them (before any data is read)."""
    if data_args.domain_weights is not None and (
        training_args.task_sampling == "online" or training_args.task_sampling_weights is not None
    ):
        raise UsageError(
            "--domain_weights are the fixed sampling weights: they exclude --task_sampling online and "
            "--task_sampling_weights"
        )
    if data_args.objective_weights is not None and not training_args.importance_weighting:
        raise UsageError(
            "--objective_weights are the objective of importance weighting: add --task_sampling fixed "
            "--importance_weighting true and the sampling weights (--domain_weights)"
        )


def text_tokens(packed: Dataset, tokenizer: Any, num_domains: int) -> list[int]:
    """The tokens of text (not a special token such as the eos ending each text) per domain of packed sequences:
    the domain's targets, blank texts having none."""
    import numpy as np
    import pyarrow.compute as pc

    counts = np.zeros(num_domains, dtype=np.int64)
    for table in packed.select_columns(["input_ids", "task_ids"]).with_format("arrow").iter(batch_size=4096):
        sequences = table.column("input_ids").combine_chunks()
        ids = np.asarray(pc.list_flatten(sequences))
        domains = np.repeat(np.asarray(table.column("task_ids")), np.asarray(pc.list_value_length(sequences)))
        counts += np.bincount(domains[~np.isin(ids, tokenizer.all_special_ids)], minlength=num_domains)
    return counts.tolist()


def sample_from_file(training_args: MinimaxTrainingArguments, weights: list[float]) -> None:
    """``--domain_weights``: draw the domains from the file's weights (``task_sampling='fixed'``)."""
    training_args.task_sampling, training_args.task_sampling_weights = "fixed", weights


def read_domain_weights(path: str, names: list[str]) -> tuple[list[float], dict[str, Any] | None]:
    """The weights (in domain order) and provenance (``None``: none recorded) of a domain-weights file; refuse one
    whose domains differ."""
    try:
        content = json.loads(Path(path).read_text())
        weights = content["weights"]
        values = [float(weights[name]) for name in weights]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UsageError(f'--domain_weights {path}: expected JSON {{"weights": {{domain: weight}}}} ({err})') from err
    if sorted(weights) != sorted(names):
        raise UsageError(f"--domain_weights {path} has the domains {sorted(weights)}, this run {sorted(names)}")
    not_numbers = {name: value for name, value in weights.items() if type(value) not in (int, float)}
    if not_numbers:  # float() would take "0.5" and True
        raise UsageError(f"--domain_weights {path}: weights must be JSON numbers, got {not_numbers}")
    if any(not value >= 0 or value == float("inf") for value in values) or sum(values) <= 0:
        raise UsageError(f"--domain_weights {path}: weights must be finite, >= 0 and not all 0, got {weights}")
    if not math.isfinite(sum(values)):  # the draws normalise by the sum
        raise UsageError(f"--domain_weights {path}: the weights' sum overflows ({weights}); scale them down")
    return [float(weights[name]) for name in names], content.get("provenance")


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
    parser = OptionParser((CausalModelArguments, DomainDataArguments, MinimaxTrainingArguments), description=__doc__)
    parser.set_defaults(report_to=[], save_total_limit=2)
    model_args, data_args, training_args = parse_with_config(parser, argv)
    given = {"reference_run": training_args.reference_run, "domain_weights": data_args.domain_weights}
    check_override(training_args.reference_mismatch_ok, given)
    setup_logging(training_args, logger)  # before the data are read: datasets' progress bars off
    if model_args.model_name_or_path is not None:
        refuse_given_options(argv, FROM_SCRATCH, "from-scratch options, unused with --model_name_or_path")
        check_checkpoint(model_args.model_name_or_path)
        check_causal_checkpoint(model_args.model_name_or_path)
    if model_args.tokenizer_name is not None:
        check_checkpoint(model_args.tokenizer_name, "--tokenizer_name", model=False)

    check_weight_files(data_args, training_args)
    if data_args.streaming:
        held_out = "the held-out texts are the first --stream_held_out_texts of each stream"
        refuse_given_options(argv, ["validation_split_percentage"], f"not used with --streaming ({held_out})")
        check_domain_streaming(model_args, data_args, training_args)
    texts = load_domain_texts(data_args)
    text_counts = require_every_domain(texts)
    fixed_weights, saved_provenance = None, None
    if data_args.domain_weights is not None:
        fixed_weights, saved_provenance = read_domain_weights(data_args.domain_weights, texts.names)
        if not data_args.streaming:
            sample_from_file(training_args, fixed_weights)
    bind_tasks(training_args, texts.names, "the data's domains")
    objective = None
    if data_args.objective_weights is not None:
        objective = FixedWeighting(len(texts.names), read_domain_weights(data_args.objective_weights, texts.names)[0])

    logger.info("domains %s (texts %s) weighting=%s", texts.names, text_counts, training_args.weighting)
    settings = {k: v for k, v in {**asdict(model_args), **asdict(data_args)}.items() if k not in NOT_SETTINGS}
    settings.update(training_settings(training_args), domains=texts.names)
    resume_checkpoint = resume_or_refuse(training_args, settings, overwrite=data_args.overwrite_output_dir)
    set_seed(training_args.seed)

    tokenizer = load_tokenizer(model_args, training_args, texts.train["text"], resume_checkpoint)
    model = load_model(model_args, tokenizer, data_args.max_seq_length)

    num_domains = len(texts.names)
    with training_args.main_process_first(desc="tokenizing and packing"):
        train_sequences = pack_domains(
            texts.train, tokenizer, num_domains, data_args.max_seq_length, num_proc=data_args.preprocessing_num_workers
        )
        eval_sequences = pack_domains(
            texts.validation, tokenizer, num_domains, data_args.max_seq_length,
            num_proc=data_args.preprocessing_num_workers,
        )  # fmt: skip
    for split, packed in (("training", train_sequences), ("held-out", eval_sequences)):
        reason = "no text after tokenisation: its texts are blank or empty"
        refuse_tasks_without_targets("domain", texts.names, text_tokens(packed, tokenizer, num_domains), split, reason)
    if data_args.max_eval_sequences is not None:
        keep = [i for d in range(num_domains) for i in _first_rows(eval_sequences, d, data_args.max_eval_sequences)]
        eval_sequences = eval_sequences.select(keep)
    tokenizer_source = model_args.tokenizer_name or model_args.model_name_or_path
    provenance = Provenance.of_run(
        texts.names,
        tokenizer,
        dataset_fingerprint(texts.train),  # streamed: the first texts of each stream
        dataset_fingerprint(eval_sequences),
        model,
        tokenizer_source or f"byte-level BPE trained on the training text (vocab_size {model_args.vocab_size})",
    )
    check_reference_run(training_args.reference_run, training_args.reference_mismatch_ok, provenance)
    if data_args.domain_weights is not None:
        allowed = training_args.reference_mismatch_ok
        check_provenance("--domain_weights", data_args.domain_weights, saved_provenance, provenance, allowed)
    sequences = domain_counts(train_sequences, num_domains)  # streamed: of the sample
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

    if fixed_weights is not None:
        mixture, mixture_kind = [w / sum(fixed_weights) for w in fixed_weights], "file"
    elif training_args.task_sampling == "online":
        mixture, mixture_kind = averages.average() or [1 / num_domains] * num_domains, "online time-average"
    elif texts.streams is not None:
        mixture, mixture_kind = [1 / num_domains] * num_domains, "uniform (streamed)"
    elif training_args.task_sampling == "fixed":
        weights = training_args.task_sampling_weights
        mixture, mixture_kind = [w / sum(weights) for w in weights], "fixed"
    else:
        mixture, mixture_kind = [count / sum(sequences) for count in sequences], "natural"
    recipe_settings = {
        "domain_sampling": "file" if fixed_weights is not None else SAMPLING_NAMES[training_args.task_sampling],
        "max_seq_length": data_args.max_seq_length,
    }
    stated = report_settings(training_args, trainer.state.max_steps, recipe_settings)
    report = task_report(texts.names, trainer.state.log_history, eval_metrics, stated, trainer.step_weights.tolist())
    report.update(
        eval_task_perplexity={
            name: eval_metrics[f"eval_task_perplexity/{name}"]
            for name in texts.names
            if f"eval_task_perplexity/{name}" in eval_metrics
        },
        eval_worst_task_perplexity=eval_metrics.get("eval_worst_task_perplexity"),
        training_sequences=None if texts.streams else dict(zip(texts.names, sequences, strict=True)),
        mixture_weights=dict(zip(texts.names, mixture, strict=True)),
        mixture_kind=mixture_kind,
        time_averaged_weights=dict(zip(texts.names, averages.average() or [], strict=False)),
        provenance=provenance.to_dict(),
    )
    perplexities = list(report["eval_task_perplexity"].values())
    report["eval_mean_task_perplexity"] = sum(perplexities) / len(perplexities) if perplexities else None
    base = trainer.accelerator.unwrap_model(trainer.model)
    counts = ["streamed"] * num_domains if texts.streams else sequences
    content = causal_lm_card_content(base, tokenizer, tokenizer_source, report, texts, counts, mixture, model_args)
    write_report_and_card(trainer, report, card_renderer(trainer, content))
    push(trainer)
    return {**eval_metrics, "report": report}


def _first_rows(sequences: Dataset, domain: int, count: int) -> list[int]:
    rows = [i for i, task in enumerate(sequences["task_ids"]) if task == domain]
    return rows[:count]


__all__ = ["DOMAIN_WEIGHTS_NAME", "CausalModelArguments", "DomainDataArguments", "main", "run"]
