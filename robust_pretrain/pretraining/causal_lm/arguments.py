"""The options of the decoder pre-training recipe (:mod:`robust_pretrain.pretraining.causal_lm.recipe`): model and data
arguments, the weight files they name (checked before any data is read; ``--domain_weights`` loads the mapping of
``task_sampling_weights``), and the settings a resumed run must share."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from robust_pretrain.cli import UsageError
from robust_pretrain.options import check_options, option
from robust_pretrain.pretraining.common import training_settings
from robust_pretrain.trainer.task_sampling import FixedWeighting, check_importance_sampling
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments

DECODER_SIZES = {  # from-scratch Llama-style presets: layers, hidden, heads, key/value heads, intermediate
    "tiny": (2, 128, 4, 2, 384),
    "mini": (4, 256, 4, 2, 768),
    "small": (6, 512, 8, 4, 1536),
}
MIN_VOCAB_SIZE = 64  # a byte-level BPE vocabulary holds its 256 bytes: smaller sizes are raised to them
FROM_SCRATCH = ["model_size", "vocab_size"]  # options of a decoder trained from scratch
NOT_SETTINGS = {"preprocessing_num_workers", "overwrite_output_dir"}
DOMAIN_WEIGHTS_NAME = "domain_weights.json"


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
    validation_file: str | None = option(
        None,
        "Held-out data for --train_file / --dataset_name: a file (or glob) with the same text and --domain_column "
        "columns, every domain present, in place of --validation_split_percentage.",
        path="file",
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
        if self.validation_file is not None and not (self.dataset_name or self.train_file):
            raise UsageError("--validation_file is the held-out data of --train_file / --dataset_name: give one")
        if self.validation_file is not None and self.streaming:
            raise UsageError("--validation_file: not used with --streaming (held out: --stream_held_out_texts)")
        if self.domain_column is not None and not (self.dataset_name or self.train_file):
            raise UsageError("--domain_column names a column of --dataset_name or --train_file: give one of them")
        if self.stream_shuffle_buffer and not self.streaming:
            raise UsageError("--stream_shuffle_buffer shuffles domain streams: it needs --streaming true")


def check_weight_files(data_args: DomainDataArguments, training_args: MinimaxTrainingArguments) -> None:
    """``--domain_weights`` are the fixed sampling weights, ``--objective_weights`` the objective of importance
    weighting: refuse what contradicts them (before any data is read, on the options as given)."""
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


def sampling_defaults(data_args: DomainDataArguments, training_args: MinimaxTrainingArguments) -> dict[str, Any]:
    """What ``--domain_weights FILE`` loads: the trainer's ``task_sampling='fixed'`` and ``task_sampling_weights``
    ``{domain: weight}`` from the file, as defaults of the options (none when streamed: the streams draw from the
    file). The file is checked here, before any data is read; its domains against the data's by
    :func:`domain_weights`."""
    check_weight_files(data_args, training_args)
    if data_args.domain_weights is None:
        return {}
    weights, _ = load_domain_weights(data_args.domain_weights)
    if training_args.importance_weighting:
        try:
            option = f"--domain_weights {data_args.domain_weights}"
            check_importance_sampling(list(weights.values()), list(weights), option)
        except ValueError as err:
            raise UsageError(str(err)) from None
    return {} if data_args.streaming else {"task_sampling": "fixed", "task_sampling_weights": weights}


def run_settings(
    model_args: CausalModelArguments,
    data_args: DomainDataArguments,
    training_args: MinimaxTrainingArguments,
    domains: list[str],
) -> dict:
    """What the run computes, for the output-directory policy: a resumed run must share it."""
    settings = {k: v for k, v in {**asdict(model_args), **asdict(data_args)}.items() if k not in NOT_SETTINGS}
    settings.update(training_settings(training_args), domains=domains)
    return settings


def load_domain_weights(
    path: str | Path, where: str | None = None, domains: list[str] | None = None
) -> tuple[dict[str, float], dict[str, Any] | None]:
    """The ``{domain: weight}`` and provenance (``None``: none recorded) of a domain-weights file
    (``{"weights": {domain: weight}, "provenance": ...}``): one JSON number >= 0 per domain (with ``domains``, exactly
    those), finite and not all 0. The one reader of the format; refusals start with ``where`` (default
    ``--domain_weights PATH``)."""
    where = where or f"--domain_weights {path}"
    try:
        content = json.loads(Path(path).read_text())
    except OSError as err:
        raise UsageError(f"{where}: cannot read the file ({err.strerror})") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise UsageError(f"{where}: not a JSON file ({err})") from None
    weights = content.get("weights") if isinstance(content, dict) else None
    if not isinstance(weights, dict) or not weights:
        raise UsageError(f'{where}: expected {{"weights": {{domain: weight, ...}}}} with one weight per domain')
    if domains is not None:
        unknown, missing = sorted(set(weights) - set(domains)), [d for d in domains if d not in weights]
        if unknown or missing:
            raise UsageError(
                f"{where}: unknown domain(s) {unknown}, missing domain(s) {missing}; the data's: {domains}"
            )
    for name, value in weights.items():  # float() would take "0.5" and True; NaN fails value >= 0
        if type(value) not in (int, float) or not value >= 0 or value == float("inf"):
            raise UsageError(f"{where}: the weight of {name!r} is {value!r}, not a finite JSON number >= 0")
    if not sum(weights.values()) > 0:
        raise UsageError(f"{where}: the weights are all 0")
    if not math.isfinite(sum(weights.values())):  # the draws normalise by the sum
        raise UsageError(f"{where}: the weights' sum overflows ({weights}); scale them down")
    return {name: float(value) for name, value in weights.items()}, content.get("provenance")


def read_domain_weights(
    path: str, names: list[str], option: str = "--domain_weights"
) -> tuple[list[float], dict[str, Any] | None]:
    """The weights (in the order of the domains ``names``) and provenance of a domain-weights file given as ``option``;
    refuse one whose domains differ."""
    weights, provenance = load_domain_weights(path, f"{option} {path}", names)
    return [weights[name] for name in names], provenance


def domain_weights(
    data_args: DomainDataArguments, names: list[str]
) -> tuple[list[float] | None, dict[str, Any] | None]:
    """The weights of ``--domain_weights`` in the order of the data's domains ``names`` and the provenance saved with
    them (``None, None`` without the option); the file's domains must be the data's."""
    if data_args.domain_weights is None:
        return None, None
    return read_domain_weights(data_args.domain_weights, names)


def objective_weighting(data_args: DomainDataArguments, names: list[str]) -> FixedWeighting | None:
    """The objective of ``--objective_weights`` (``None``: the ``--weighting`` strategy's)."""
    if data_args.objective_weights is None:
        return None
    return FixedWeighting(len(names), read_domain_weights(data_args.objective_weights, names, "--objective_weights")[0])
