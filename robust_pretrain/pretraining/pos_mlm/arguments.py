"""The options of the PoS-MLM pre-training recipe (:mod:`robust_pretrain.pretraining.pos_mlm.recipe`): model and data
arguments, what a stream cannot do, and the settings a resumed run must share."""

from __future__ import annotations

import glob
from dataclasses import asdict, dataclass, field

from robust_pretrain.data import TaskSpec
from robust_pretrain.data.text_files import matching_files
from robust_pretrain.options import LoraArguments, check_options, option
from robust_pretrain.pretraining.common import file_fingerprint, training_settings
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments

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
