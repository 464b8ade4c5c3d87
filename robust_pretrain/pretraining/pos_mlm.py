"""Task-robust masked-LM pre-training over part-of-speech tasks (PoS-BERT), in the conventions of HF's run_mlm.py.

    accelerate launch recipes/pretrain_pos_mlm.py --config recipes/configs/demo.yaml [--max_steps 100 ...]
    robust-pretrain-pos-mlm --config recipes/configs/demo.yaml      (the same, one process)

Every option can come from the ``--config`` YAML/JSON file and be overridden on the command line. The run writes into
``output_dir``: the model (safetensors), config and tokenizer (or a peft adapter), ``task_report.json``,
``task_weights.png``, a model card (README.md), ``*_results.json`` and the Trainer's checkpoints; it resumes from the
last checkpoint in ``output_dir`` when there is one.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, DatasetDict, IterableDataset, load_dataset
from datasets.exceptions import DatasetGenerationError
from transformers import (
    AutoConfig,
    AutoModelForMaskedLM,
    BertConfig,
    BertForMaskedLM,
    BertTokenizerFast,
    default_data_collator,
    set_seed,
)

from robust_pretrain.cli import UsageError, check_checkpoint, run_console
from robust_pretrain.config import OptionParser, parse_with_config
from robust_pretrain.data import (
    UPOS_TAGS,
    TaskGroupedMLMCollator,
    TaskSpec,
    load_ewt_corpus,
    tokenize_and_tag,
)
from robust_pretrain.data.preprocessing import (
    STREAM_POSITION_COLUMN,
    repeat_stream,
    task_word_counts,
    words_per_task,
)
from robust_pretrain.data.tasks import IMPLAUSIBLE_SHARE_FRACTION, JUDGED_MIN_EXPECTED_SHARE
from robust_pretrain.data.text_files import TEXT_BUILDERS, check_text_file, matching_files
from robust_pretrain.options import LoraArguments, check_options, option
from robust_pretrain.output_dir import resume_or_refuse, write_run_config
from robust_pretrain.pretraining.common import (
    bind_tasks,
    create_trainer,
    file_fingerprint,
    named_tokenizer,
    push,
    refuse_given_options,
    setup_logging,
    train_and_evaluate,
    train_tokenizer_once,
    training_settings,
)
from robust_pretrain.pretraining.streams import check_pos_streaming, log_stream_sharding
from robust_pretrain.reference import (
    Provenance,
    check_override,
    check_reference_run,
    dataset_fingerprint,
    training_fingerprint,
)
from robust_pretrain.reporting import card_renderer, task_report
from robust_pretrain.reporting.recipe_cards import pos_mlm_card_content
from robust_pretrain.reporting.task_report import report_settings, write_report_and_card
from robust_pretrain.targets import refuse_tasks_without_targets
from robust_pretrain.task_losses import mlm_head_name
from robust_pretrain.task_sampling import TaskSamplingSchedule
from robust_pretrain.training_args import MinimaxTrainingArguments

logger = logging.getLogger(__name__)

MODEL_SIZES = {  # from-scratch BERT presets: layers, hidden, heads, intermediate
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "medium": (8, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
}
MAX_SCRATCH_SEQ_LENGTH = 8192  # position embeddings of a from-scratch model; beyond this is a typo, not a plan
MIN_VOCAB_SIZE = 16  # a WordPiece vocabulary needs its 5 special tokens and some characters
# Options that do not change what a run computes: they may differ when it resumes.
NOT_SETTINGS = {"merge_lora", "preprocessing_num_workers", "overwrite_cache", "overwrite_output_dir"}


@dataclass
class ModelArguments(LoraArguments):
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Checkpoint (local dir or Hub id) to continue pre-training; it must load with "
            "AutoModelForMaskedLM. Leave unset to train a BERT from scratch (see model_size)."
        },
    )
    model_size: str = option("tiny", "From-scratch BERT preset.", choices=list(MODEL_SIZES))
    tokenizer_name: str | None = field(
        default=None,
        metadata={
            "help": "Fast tokenizer to use (default: the checkpoint's; from scratch: a WordPiece tokenizer "
            "trained on the training text)."
        },
    )
    vocab_size: int = option(8000, "Vocabulary size of a tokenizer trained from scratch.", minimum=MIN_VOCAB_SIZE)
    merge_lora: bool = field(
        default=False, metadata={"help": "Also save the base model with the adapters merged into output_dir/merged."}
    )


@dataclass
class DataArguments:
    dataset_name: str | None = field(default=None, metadata={"help": "Dataset on the Hub (datasets.load_dataset)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of dataset_name."})
    train_file: str | None = option(
        None, "Training text: .txt, .json/.jsonl, .csv or .parquet (a path or a glob pattern).", path="file"
    )
    validation_file: str | None = option(None, "Held-out text, same formats as train_file.", path="file")
    text_column_name: str = field(default="text", metadata={"help": "Column holding the raw text."})
    ud_dir: str | None = field(
        default=None,
        metadata={
            "help": "Default corpus when neither dataset_name nor train_file is given: a folder holding UD English-EWT "
            "en_ewt-ud-{train,dev,test}.conllu, or hf://datasets/<owner>/<name>[/<folder>] (default: "
            "$ROBUST_PRETRAIN_UD_DIR, else ../shared/data/ud_ewt from the current directory)."
        },
    )
    validation_split_percentage: int = option(
        5, "Percent of the training data held out when there is no validation split.", minimum=1, maximum=99
    )
    max_seq_length: int = option(
        128,
        "Tokens per sequence (special tokens included).",
        minimum=8,
        maximum=MAX_SCRATCH_SEQ_LENGTH,
        description=f"between 8 and {MAX_SCRATCH_SEQ_LENGTH} tokens",
    )
    pack: bool = field(default=True, metadata={"help": "Concatenate texts and cut them into max_seq_length blocks."})
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Stream --dataset_name / --train_file (a datasets IterableDataset, nothing cached): texts are "
            "tagged and packed on the fly where batches are drawn (in --dataloader_num_workers workers), each "
            "process reads its own files (Accelerate shards the stream by file: give at least as many files as "
            "processes), each process reads its files over and over (one endless epoch), and a resumed run replays "
            "the batches drawn so far, also past the end of a process's files, so it ends exactly like an "
            "uninterrupted one. Needs --max_steps, held-out data (--validation_file or a validation/test split, read "
            "whole or its first --max_eval_samples texts) and --tokenizer_name or --model_name_or_path."
        },
    )
    preprocessing_num_workers: int | None = option(None, "Processes for tagging.", minimum=1)
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the tagged datasets."})
    task_spec: str | None = field(
        default=None,
        metadata={"help": "YAML file mapping task name -> UPOS tags (default: the paper's nine PoS tasks)."},
    )
    tagger: str = option("shipped", "PoS tagger backend.", choices=["shipped", "nltk"])
    masking: str = field(
        default="per_token",
        metadata={
            "help": "'per_token': mask words of every task; 'per_example': one task per sequence.",
            "choices": ["per_token", "per_example"],
        },
    )
    mlm_probability: float = option(
        0.15,
        "Fraction of task words masked.",
        above=0,
        maximum=1,
        reason="with nothing masked there is nothing to learn",
    )
    max_train_samples: int | None = option(None, "Truncate the training set (debugging).", minimum=1)
    max_eval_samples: int | None = option(None, "Truncate the held-out set.", minimum=1)
    eval_masking_seed: int = option(
        1234,
        "Seed of the held-out masks, fixed once so every evaluation and every run sees the same targets.",
        minimum=0,
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Start afresh even if output_dir holds checkpoints (they are deleted)."}
    )

    def __post_init__(self) -> None:
        check_options(self)


def run_config(
    model_args: ModelArguments, data_args: DataArguments, training_args: MinimaxTrainingArguments, spec: TaskSpec
) -> dict:
    """Every setting that changes the result (model, tokenizer, data and its content, task spec, masking, strategy,
    optimiser, schedule, seeds): a run resumes only with the same ones (``max_steps`` may grow)."""
    config = {k: v for k, v in {**asdict(model_args), **asdict(data_args)}.items() if k not in NOT_SETTINGS}
    config.update(
        train_file_sha256=files_fingerprint(data_args.train_file, "--train_file"),
        validation_file_sha256=files_fingerprint(data_args.validation_file, "--validation_file"),
        task_groups=spec.to_dict(),
        **training_settings(training_args),
    )
    return config


def files_fingerprint(pattern: str | None, option: str) -> str | list[str | None] | None:
    """SHA-256 of the file (or of each file matching the glob pattern) a data option names."""
    if pattern is None or not glob.has_magic(pattern):
        return file_fingerprint(pattern)
    return [file_fingerprint(path) for path in matching_files(pattern, option)]


def load_raw_datasets(data_args: DataArguments) -> DatasetDict:
    """UD-EWT text (``ud_dir``) by default, else a Hub dataset or local files; always a train and a validation split."""
    if data_args.dataset_name is not None:
        raw = load_dataset(data_args.dataset_name, data_args.dataset_config_name, streaming=data_args.streaming)
    elif data_args.train_file is not None:
        files = {"train": matching_files(data_args.train_file, "--train_file")}
        if data_args.validation_file is not None:
            files["validation"] = matching_files(data_args.validation_file, "--validation_file")
        builder = TEXT_BUILDERS.get(Path(files["train"][0]).suffix.lstrip("."))
        if builder is None:
            raise UsageError(f"--train_file must be .txt, .json, .jsonl, .csv or .parquet, got {data_args.train_file}")
        for split, paths in files.items():
            for path in paths:
                check_text_file(Path(path), f"--{split}_file", builder)
        try:
            raw = load_dataset(builder, data_files=files, streaming=data_args.streaming)
        except DatasetGenerationError as err:
            cause = err.__cause__ or err
            names = " and ".join(path for paths in files.values() for path in paths)
            raise UsageError(f"could not read {names} as {builder} data: {type(cause).__name__}: {cause}") from err
    else:
        try:
            raw = DatasetDict(
                {
                    split: load_ewt_corpus(source, data_args.ud_dir)
                    for split, source in (("train", "train"), ("validation", "test"))
                }
            )
        except (OSError, ValueError) as err:
            raise UsageError(f"--ud_dir: {err}") from err
    if "validation" not in raw:
        if "test" in raw:
            raw["validation"] = raw["test"]
        elif data_args.streaming:
            raise UsageError(
                "--streaming needs held-out data: pass --validation_file (or a dataset with a validation or test "
                "split); a stream cannot be split by --validation_split_percentage"
            )
        else:
            split = raw["train"].train_test_split(test_size=data_args.validation_split_percentage / 100, seed=0)
            raw = DatasetDict({"train": split["train"], "validation": split["test"]})
    if data_args.streaming:  # the held-out set is read once (whole, or its first --max_eval_samples texts)
        held_out = raw["validation"]
        if data_args.max_eval_samples is not None:
            held_out = held_out.take(data_args.max_eval_samples)
        raw["validation"] = Dataset.from_list(list(held_out))
    for name in ("train", "validation"):
        columns = raw[name].column_names
        if columns is not None and data_args.text_column_name not in columns:
            raise UsageError(
                f"the {name} data has no text column {data_args.text_column_name!r} "
                f"(columns: {raw[name].column_names}); set --text_column_name"
            )
    return raw


def train_wordpiece_tokenizer(texts: list[str], vocab_size: int) -> BertTokenizerFast:
    """An uncased BERT WordPiece tokenizer trained on ``texts``, the same for the same texts in every run.

    The ``tokenizers`` trainer numbers the word-continuation pieces (``##x``) in hash-map order, which differs between
    runs and breaks ties between equally frequent merges differently (huggingface/tokenizers#1794). Listing every
    ``##x`` of the texts up front, sorted, fixes their numbering and so the whole vocabulary.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    started = time.monotonic()
    logger.info("Training a WordPiece tokenizer (vocab_size %d) on %d texts", vocab_size, len(texts))
    continuations: set[str] = set()
    for text in texts:
        for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(tokenizer.normalizer.normalize_str(text)):
            continuations.update(word[1:])
    pieces = [f"##{char}" for char in sorted(continuations)]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special + pieces, show_progress=True)
    tokenizer.train_from_iterator(texts, trainer, length=len(texts))
    # the pieces were listed as special tokens only to fix their ids: rebuild with the vocabulary, 5 special tokens
    trained = Tokenizer(models.WordPiece(tokenizer.get_vocab(with_added_tokens=False), unk_token="[UNK]"))
    trained.normalizer, trained.pre_tokenizer = tokenizer.normalizer, tokenizer.pre_tokenizer
    trained.decoder = decoders.WordPiece()
    trained.add_special_tokens(special)
    cls_id, sep_id = trained.token_to_id("[CLS]"), trained.token_to_id("[SEP]")
    trained.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    logger.info("Trained the tokenizer (%d tokens) in %.1f s", trained.get_vocab_size(), time.monotonic() - started)
    return BertTokenizerFast(tokenizer_object=trained, model_max_length=512)


def load_tokenizer(
    model_args: ModelArguments, training_args: MinimaxTrainingArguments, texts: list[str], checkpoint: str | None
):
    named = named_tokenizer(model_args.tokenizer_name, model_args.model_name_or_path, checkpoint)
    if named is not None:
        tokenizer, source = named
        if not tokenizer.is_fast:
            raise UsageError(f"{source} has no fast tokenizer; PoS alignment needs character offsets")
        return tokenizer
    return train_tokenizer_once(
        training_args,
        "training the WordPiece tokenizer",
        lambda: train_wordpiece_tokenizer(texts, model_args.vocab_size),
    )


def load_model(model_args: ModelArguments, tokenizer, max_seq_length: int):
    if model_args.model_name_or_path is None:
        layers, hidden, heads, intermediate = MODEL_SIZES[model_args.model_size]
        config = BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            max_position_embeddings=max(512, max_seq_length),
            pad_token_id=tokenizer.pad_token_id,
        )
        model = BertForMaskedLM(config)
        fresh_head = False
    else:
        try:
            config = AutoConfig.from_pretrained(model_args.model_name_or_path)
        except OSError as err:
            raise UsageError(f"--model_name_or_path {model_args.model_name_or_path}: {err}") from err
        positions = getattr(config, "max_position_embeddings", None)
        if positions is not None and max_seq_length > positions:
            raise UsageError(
                f"--max_seq_length {max_seq_length} exceeds the {positions} positions of --model_name_or_path "
                f"{model_args.model_name_or_path}; use at most {positions}"
            )
        try:
            model, loading = AutoModelForMaskedLM.from_pretrained(
                model_args.model_name_or_path, output_loading_info=True
            )
        except ValueError as error:
            raise UsageError(
                f"--model_name_or_path {model_args.model_name_or_path} ({config.model_type}) has no masked-LM head "
                "that AutoModelForMaskedLM can load"
            ) from error
        head = mlm_head_name(model)
        fresh_head = head is not None and any(key.startswith(f"{head}.") for key in loading["missing_keys"])
        if fresh_head:
            logger.info(
                "%s has no masked-LM head: the '%s' weights reported missing above start from random values and are "
                "trained by this run (expected for an encoder such as a sentence-embedding model)",
                model_args.model_name_or_path,
                head,
            )
        if len(tokenizer) > model.get_input_embeddings().num_embeddings:
            model.resize_token_embeddings(len(tokenizer))
    if model_args.use_lora:
        from peft import LoraConfig, get_peft_model

        if model_args.model_name_or_path is None:
            raise UsageError("--use_lora: LoRA adapts a pretrained checkpoint; give --model_name_or_path")
        # A checkpoint without an MLM head (e.g. a sentence encoder) gets a fresh random head: train it and save it
        # with the adapter, or base + adapter would not reproduce the trained masked LM.
        lora = LoraConfig(
            r=model_args.lora_r,
            lora_alpha=model_args.lora_alpha,
            lora_dropout=model_args.lora_dropout,
            target_modules=model_args.lora_target_modules,
            modules_to_save=[mlm_head_name(model)] if fresh_head else None,
        )
        model = get_peft_model(model, lora)
    return model


def premask(dataset: Dataset, collator: TaskGroupedMLMCollator, max_seq_length: int, pad_id: int) -> Dataset:
    """Apply the masking once (fixed seed) and store the result, so every evaluation scores the same targets."""
    columns: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": [], "task_ids": []}
    fill = {"input_ids": pad_id, "attention_mask": 0, "labels": -100, "task_ids": -100}
    for start in range(0, len(dataset), 256):
        batch = collator([dataset[i] for i in range(start, min(start + 256, len(dataset)))])
        for key, values in columns.items():
            for row in batch[key].tolist():
                values.append(row + [fill[key]] * (max_seq_length - len(row)))
    return Dataset.from_dict(columns)


@dataclass
class PremaskedOrTrainingCollator:
    """Held-out features are already masked (:func:`premask`) and only stacked; training features are masked on the
    fly, with new masks each epoch (``MinimaxTrainer`` calls :meth:`set_epoch`). A streamed batch
    (:func:`~robust_pretrain.data.preprocessing.repeat_stream`) is masked with its first row's stream position as the
    epoch: new masks in every pass over the stream, the same ones in a resumed run."""

    training: TaskGroupedMLMCollator
    _streamed: TaskGroupedMLMCollator | None = field(default=None, init=False, repr=False)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if "labels" in features[0]:
            return default_data_collator(features)
        if STREAM_POSITION_COLUMN in features[0]:
            return self._collate_streamed(features)
        return self.training(features)

    def _collate_streamed(self, features: list[dict]) -> dict[str, torch.Tensor]:
        if self._streamed is None:  # a copy whose epoch (set per batch) is this process's own
            self._streamed = dataclasses.replace(self.training)
        self._streamed.set_epoch(features[0][STREAM_POSITION_COLUMN])
        return self._streamed([{k: v for k, v in row.items() if k != STREAM_POSITION_COLUMN} for row in features])

    @property
    def task_names(self) -> list[str] | None:
        return self.training.task_names

    def sample_tasks(self, schedule: TaskSamplingSchedule, train_dataset: Any, args: Any) -> Any:
        """Training batches draw their tasks by ``schedule`` (:meth:`TaskGroupedMLMCollator.sample_tasks`)."""
        return self.training.sample_tasks(schedule, train_dataset, args)

    def set_epoch(self, epoch: int) -> None:
        self.training.set_epoch(epoch)


def save_merged(model, tokenizer, directory: Path) -> None:
    """Save the base model with its LoRA adapters merged in (and the tokenizer) into ``directory``."""
    merged = model.merge_and_unload()
    if not merged.config.tie_word_embeddings:
        # A trained head is no longer tied to the embeddings, and then transformers re-ties no parameter at load: a
        # parameter shared inside the model (BERT's decoder.bias = predictions.bias) must be saved under every
        # name, or it loads freshly initialised.
        seen = set()
        for name, param in list(merged.named_parameters(remove_duplicate=False)):
            if id(param) in seen:
                module, _, leaf = name.rpartition(".")
                setattr(merged.get_submodule(module), leaf, torch.nn.Parameter(param.detach().clone()))
            seen.add(id(param))
    merged.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


STREAM_SHARE_ROWS = 1000  # sequences of a stream whose words are counted before training


def require_targets(dataset: Dataset | IterableDataset, split: str, data_args: DataArguments, spec: TaskSpec) -> None:
    """Refuse data in which the tagger finds no word of any task (training would learn nothing), or implausibly few
    for English text (:data:`~robust_pretrain.data.tasks.IMPLAUSIBLE_SHARE_FRACTION`): text in another language."""
    streamed = isinstance(dataset, IterableDataset)
    task_words, words = task_word_counts(dataset, STREAM_SHARE_ROWS if streamed else None)
    source = data_args.dataset_name or getattr(data_args, f"{split}_file", None) or data_args.train_file
    where = f" ({source})" if source else ""
    expected = spec.expected_share()
    counted = f"in its first {STREAM_SHARE_ROWS} sequences" if streamed else "in it"
    if task_words == 0:
        raise UsageError(
            f"the {split} data{where} contains no word of the tasks {spec.task_names}: none of the {words} words "
            f"{counted} belongs to one (English text has {expected:.1%} of its words in them); the "
            f"`{data_args.tagger}` tagger tags English: is the text in another language, or empty? Nothing could be "
            "masked, so nothing would be learned."
        )
    found = task_words / words
    if expected >= JUDGED_MIN_EXPECTED_SHARE and found < IMPLAUSIBLE_SHARE_FRACTION * expected:
        raise UsageError(
            f"the {split} data{where} does not look like English text: {found:.1%} of the {words} words {counted} "
            f"belong to a task, where English text has {expected:.1%} (at least "
            f"{IMPLAUSIBLE_SHARE_FRACTION * expected:.1%} is accepted); the `{data_args.tagger}` tagger tags English "
            "and gives words of other scripts X, so they would never be masked."
        )
    held_out = "held-out" if split == "validation" else "training"
    counts = words_per_task(dataset, spec.num_tasks, STREAM_SHARE_ROWS if streamed else None)
    reason = f"the `{data_args.tagger}` tagger found no word of its UPOS tags {counted}: nothing could be masked"
    refuse_tasks_without_targets("task", spec.task_names, counts, held_out, reason)


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``robust-pretrain-pos-mlm``, ``recipes/pretrain_pos_mlm.py``): exit status 2 and one
    paragraph for a bad option, file or checkpoint."""
    return run_console(run, argv, prog="robust-pretrain-pos-mlm")


def run(argv: list[str]) -> dict:
    """Pre-train as ``argv`` says; the held-out metrics and the task report."""
    parser = OptionParser((ModelArguments, DataArguments, MinimaxTrainingArguments), description=__doc__)
    parser.set_defaults(report_to=[], save_total_limit=3)
    model_args, data_args, training_args = parse_with_config(parser, argv)
    check_override(training_args.reference_mismatch_ok, {"reference_run": training_args.reference_run})
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

    setup_logging(training_args, logger)
    logger.info(
        "weighting=%s tasks=%s output_dir=%s", training_args.weighting, spec.task_names, training_args.output_dir
    )
    settings = run_config(model_args, data_args, training_args, spec)
    resume_checkpoint = resume_or_refuse(training_args, settings, overwrite=data_args.overwrite_output_dir)
    set_seed(training_args.seed)

    raw = load_raw_datasets(data_args)
    tokenizer = load_tokenizer(model_args, training_args, raw["train"][data_args.text_column_name], resume_checkpoint)
    model = load_model(model_args, tokenizer, data_args.max_seq_length)

    with training_args.main_process_first(desc="tokenizing and PoS-tagging"):
        tagged = {
            name: tokenize_and_tag(
                raw[name],
                tokenizer,
                spec,
                data_args.tagger,
                text_column=data_args.text_column_name,
                max_seq_length=data_args.max_seq_length,
                pack=data_args.pack,
                num_proc=data_args.preprocessing_num_workers,
                load_from_cache_file=not data_args.overwrite_cache,
            )
            for name in ("train", "validation")
        }
    train_dataset, eval_dataset = tagged["train"], tagged["validation"]
    if data_args.max_train_samples is not None and data_args.streaming:
        train_dataset = train_dataset.take(data_args.max_train_samples)
    elif data_args.max_train_samples is not None:
        train_dataset = train_dataset.select(range(min(data_args.max_train_samples, len(train_dataset))))
    if data_args.max_eval_samples is not None:
        eval_dataset = eval_dataset.select(range(min(data_args.max_eval_samples, len(eval_dataset))))
    require_targets(train_dataset, "train", data_args, spec)
    require_targets(eval_dataset, "validation", data_args, spec)

    def collator(seed: int) -> TaskGroupedMLMCollator:
        return TaskGroupedMLMCollator(
            tokenizer,
            spec,
            mode=data_args.masking,
            mlm_probability=data_args.mlm_probability,
            pad_to_multiple_of=8 if training_args.fp16 or training_args.bf16 else None,
            seed=seed,
        )

    eval_dataset = premask(
        eval_dataset, collator(data_args.eval_masking_seed), data_args.max_seq_length, tokenizer.pad_token_id
    )
    tokenizer_name = model_args.tokenizer_name or model_args.model_name_or_path
    provenance = Provenance.of_run(
        spec.task_names,
        tokenizer,
        training_fingerprint(raw["train"]),
        dataset_fingerprint(eval_dataset),
        model,
        tokenizer_name or f"WordPiece trained on the training text (vocab_size {model_args.vocab_size})",
    )
    check_reference_run(training_args.reference_run, training_args.reference_mismatch_ok, provenance)
    train_collator = collator(training_args.seed + training_args.process_index)
    write_run_config(training_args, settings)
    if data_args.streaming:  # every process reads its own files (Accelerate's default would read on process 0 only)
        training_args.accelerator_config.dispatch_batches = False
        log_stream_sharding(train_dataset, training_args.world_size, logger)
        train_dataset = repeat_stream(train_dataset)  # one endless epoch: a resume replays it exactly across passes
    trainer = create_trainer(
        training_args,
        model=model,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=PremaskedOrTrainingCollator(train_collator),  # new masks each epoch, the same ones on resume
    )
    eval_metrics = train_and_evaluate(trainer, resume_checkpoint)

    recipe_settings = {
        "masking": data_args.masking,
        "task_sampling": training_args.task_sampling,
        "mlm_probability": data_args.mlm_probability,
        "max_seq_length": data_args.max_seq_length,
    }
    stated = report_settings(training_args, trainer.state.max_steps, recipe_settings)
    final_weights = trainer.step_weights.tolist()
    report = task_report(spec.task_names, trainer.state.log_history, eval_metrics, stated, final_weights, provenance)
    output_dir = Path(training_args.output_dir)
    base = trainer.accelerator.unwrap_model(trainer.model)
    unassigned = [tag for tag in UPOS_TAGS if tag not in spec.tag_to_task]
    content = pos_mlm_card_content(base, tokenizer, report, model_args, data_args, spec.to_dict(), unassigned)
    write_report_and_card(trainer, report, card_renderer(trainer, content))
    if training_args.should_save and model_args.use_lora and model_args.merge_lora:
        save_merged(base, tokenizer, output_dir / "merged")
    push(trainer)
    return {**eval_metrics, "report": report}


if __name__ == "__main__":
    raise SystemExit(main())
