"""Reference-relative objectives: the per-task reference losses of ``loss_normalization='excess'``.

Two sources, both declared on :class:`~robust_pretrain.trainer.training_args.MinimaxTrainingArguments`:

* ``--reference_run DIR`` (static): the held-out per-task losses of a finished run, read from its
  ``task_report.json`` (typically the same recipe trained with ``proportional``).
* ``--reference_model PATH`` (online, DoReMi's form): a frozen model (no gradient, eval mode, the target-only MLM head
  where the trained model has one) runs on the step's first micro-batch; its per-task losses on the same targets are
  the step's reference, pooled over processes with the trained model's own losses (no extra collective). Under FSDP2
  it is sharded like the trained model (:class:`ShardReferenceCallback`).

Every recipe records its :class:`Provenance` (tasks, tokenizer, training and held-out data, model size) in
``task_report.json``; whatever a run takes from an earlier run (``--reference_run``, the decoder's ``--domain_weights``)
is checked against it by :func:`check_provenance`: any entry it lacks or differs in is refused unless
``--reference_mismatch_ok`` names it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import TrainerCallback

from robust_pretrain.cli import UsageError
from robust_pretrain.task_losses import TargetPositionsHead

TASK_REPORT_NAME = "task_report.json"  # written by robust_pretrain.reporting.task_report
#: the entries of a run's provenance, in the order they are compared and named; ``--reference_mismatch_ok`` takes them
PROVENANCE_ENTRIES = ("tasks", "tokenizer", "training_data", "held_out_data", "model_size")
OVERRIDE_OPTION = "--reference_mismatch_ok"


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 of a tokenizer's full definition (a fast tokenizer's JSON, else its vocabulary and special tokens)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    else:
        text = json.dumps([sorted(tokenizer.get_vocab().items()), tokenizer.special_tokens_map], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


FINGERPRINT_ROWS = 4096
"""Rows serialised at a time by :func:`dataset_fingerprint` (its memory is one such slice, not the dataset)."""


def dataset_fingerprint(dataset: Any, *settings: Any) -> str:
    """SHA-256 of a ``datasets.Dataset``'s content (its Arrow table, row selections applied) and ``settings`` (e.g.
    the seed of the held-out masks): equal for the same examples, whatever their path, cache or chunking."""
    import pyarrow as pa

    if getattr(dataset, "_indices", None) is not None:
        dataset = dataset.flatten_indices()
    table = dataset.data.table.replace_schema_metadata(None)
    digest = hashlib.sha256(table.schema.serialize().to_pybytes())
    for start in range(0, table.num_rows, FINGERPRINT_ROWS):
        rows = table.slice(start, FINGERPRINT_ROWS)
        # ``take`` copies the rows into fresh buffers: the bytes depend on the values, not on how they were stored
        for batch in rows.take(pa.array(range(rows.num_rows))).combine_chunks().to_batches():
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_batch(batch)
            digest.update(sink.getvalue().to_pybytes())
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return digest.hexdigest()


STREAM_SAMPLE_ROWS = 200
"""Rows of a stream that :func:`training_fingerprint` hashes (a stream is not read whole before training)."""


def training_fingerprint(dataset: Any) -> str:
    """:func:`dataset_fingerprint` of a run's training data; of a stream (an ``IterableDataset``), of its first
    :data:`STREAM_SAMPLE_ROWS` rows."""
    from datasets import Dataset, IterableDataset

    if isinstance(dataset, IterableDataset):
        dataset = Dataset.from_list(list(dataset.take(STREAM_SAMPLE_ROWS)))
    return dataset_fingerprint(dataset)


MODEL_SIZE_FIELDS = {  # config attribute -> what the card calls it
    "num_hidden_layers": "layers",
    "hidden_size": "hidden size",
    "num_attention_heads": "attention heads",
}


def model_size(model: Any) -> dict[str, int]:
    """The size of a transformers model (a peft model: its base model with the adapters) as provenance and cards state
    it: the encoder's layers, hidden size and attention heads from its config, and its parameter count (shared
    parameters, such as tied embeddings, counted once; adapters included)."""
    size = {label: getattr(model.config, name) for name, label in MODEL_SIZE_FIELDS.items()}
    size["parameters"] = sum(parameter.numel() for parameter in model.parameters())
    return size


@dataclass(frozen=True)
class Provenance:
    """What a run's results depend on, the ``provenance`` block of its ``task_report.json`` (and of a domain-weights
    file): its tasks (domains, modalities), its tokenizer (``name`` and ``sha256`` of its definition; ``None``
    without one), the SHA-256 (:func:`dataset_fingerprint`) of its training data as read (before tokenisation) and of
    its held-out data as evaluated (tokenised, masked), and its model's size
    (:func:`model_size`). Every recipe writes it; every run that builds on an earlier
    one's output compares it with :func:`check_provenance`."""

    tasks: list[str]
    tokenizer: dict[str, str] | None
    training_data: str
    held_out_data: str
    model_size: dict[str, int]

    @classmethod
    def of_run(
        cls,
        tasks: Sequence[str],
        tokenizer: Any,
        training_data: str,
        held_out_data: str,
        model: torch.nn.Module,
        tokenizer_name: str | None = None,
    ) -> Provenance:
        """A run's provenance from its tasks, tokenizer (``None``: none; named ``tokenizer_name``, else its
        ``name_or_path``), data fingerprints and model."""
        described = None
        if tokenizer is not None:
            name = tokenizer_name or getattr(tokenizer, "name_or_path", None)
            described = {"name": name, "sha256": tokenizer_fingerprint(tokenizer)}
        return cls(list(tasks), described, training_data, held_out_data, model_size(model))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def differences(self, recorded: Any, allowed: Collection[str] = ()) -> list[str]:
        """The entries, not in ``allowed``, that ``recorded`` (an earlier run's provenance; not a mapping: none
        recorded) lacks or holds another value of; a tokenizer is compared by its fingerprint, not by its path."""
        recorded = recorded if isinstance(recorded, Mapping) else {}
        ours = self.to_dict()
        return [
            entry
            for entry in PROVENANCE_ENTRIES
            if entry not in allowed and (entry not in recorded or _identity(recorded[entry]) != _identity(ours[entry]))
        ]

    def describe_difference(self, entry: str, recorded: Any) -> str:
        """``entry`` in words: its recorded value and this run's, digests shortened."""
        if not isinstance(recorded, Mapping) or entry not in recorded:
            return f"{entry} (not recorded)"
        return f"{entry} ({_describe(recorded[entry])} there, {_describe(self.to_dict()[entry])} here)"


def check_provenance(
    option: str, source: str | Path, recorded: Any, current: Provenance, allowed: Collection[str]
) -> None:
    """The one provenance check of every input that an earlier run produced (``--reference_run``, ``--domain_weights``,
    ...): refuse (:class:`UsageError`, one line naming ``option``, the differing entries and the override) an input
    whose ``recorded`` provenance lacks or differs in an entry of ``current`` that ``allowed`` does not name."""
    differences = current.differences(recorded, allowed)
    if differences:
        described = "; ".join(current.describe_difference(entry, recorded) for entry in differences)
        raise UsageError(
            f"{option} {source}: its provenance differs from this run's in {described}; use an input made for this "
            f"run, or pass {OVERRIDE_OPTION} {' '.join(differences)} to use it anyway"
        )


def check_override(allowed: Collection[str], inputs: Mapping[str, Any]) -> None:
    """Refuse ``--reference_mismatch_ok`` (``allowed``) when none of the ``inputs`` (option name -> value given) whose
    provenance it overrides is given."""
    if allowed and all(value is None for value in inputs.values()):
        raise UsageError(f"{OVERRIDE_OPTION.lstrip('-')}: only used with {' or '.join(inputs)}")


def _identity(value: Any) -> Any:
    """What must match: a tokenizer's fingerprint (not the path it was loaded from), any other entry whole."""
    return value.get("sha256") if isinstance(value, dict) and "sha256" in value else value


def _describe(value: Any) -> str:
    if isinstance(value, dict) and "sha256" in value:
        return f"{value.get('name')} sha256 {str(value['sha256'])[:12]}"
    if isinstance(value, str) and len(value) == 64:
        return f"sha256 {value[:12]}"
    return "none" if value is None else json.dumps(value)


@dataclass
class ReferenceRun:
    """A finished run's held-out per-task losses and provenance (``None``: a report written before provenance)."""

    directory: Path
    losses: dict[str, float]
    provenance: dict[str, Any] | None

    @classmethod
    def load(cls, directory: str | Path, option: str = "reference_run") -> ReferenceRun:
        """Read ``DIR/task_report.json``; a ``ValueError`` in one line, starting with ``option``, names what is
        missing or unreadable."""
        directory = Path(directory)
        path = directory / TASK_REPORT_NAME
        if not directory.is_dir():
            raise ValueError(f"{option} {directory}: no such directory")
        if not path.is_file():
            raise ValueError(f"{option} {directory}: no {TASK_REPORT_NAME} (is it a finished run's output_dir?)")
        try:
            report = json.loads(path.read_text())
            losses = {str(name): float(value) for name, value in report["eval_task_loss"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{option} {path}: not a task report with eval_task_loss ({err})") from err
        return cls(directory, losses, report.get("provenance"))

    def reference_losses(self, tasks: Sequence[str]) -> list[float]:
        """The reference loss of each of ``tasks``, in order; a ``ValueError`` names the tasks it lacks."""
        missing = [name for name in tasks if name not in self.losses]
        if missing:
            raise ValueError(
                f"reference_run {self.directory}: no held-out loss for task(s) {missing} (it has {sorted(self.losses)})"
            )
        return [self.losses[name] for name in tasks]


def check_reference_run(directory: str | None, allowed: Collection[str], provenance: Provenance) -> None:
    """:func:`check_provenance` of a ``--reference_run`` (nothing to do without one)."""
    if directory is not None:
        check_provenance("--reference_run", directory, ReferenceRun.load(directory).provenance, provenance, allowed)


def reference_model_tokenizer(path: str | Path) -> str | None:
    """The fingerprint of a reference model's tokenizer: the one its ``task_report.json`` provenance records (a run of
    this project), else that of the tokenizer saved beside it; ``None`` when it has neither."""
    path = Path(path)
    report = path / TASK_REPORT_NAME
    if report.is_file():
        try:
            recorded = json.loads(report.read_text()).get("provenance", {}).get("tokenizer")
        except (ValueError, AttributeError):
            recorded = None
        if isinstance(recorded, Mapping) and isinstance(recorded.get("sha256"), str):
            return recorded["sha256"]
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        return None
    from transformers import AutoTokenizer

    return tokenizer_fingerprint(AutoTokenizer.from_pretrained(str(path)))


def check_reference_model(path: str | None, tokenizer: Any, allowed: Collection[str]) -> None:
    """Refuse a ``--reference_model`` whose tokenizer is not this run's (compared by fingerprint, as for
    ``--reference_run``; the same vocabulary size is not enough: the same ids would be other strings), or that
    records none, unless ``allowed`` (``--reference_mismatch_ok``) names ``tokenizer``."""
    if path is None or tokenizer is None or "tokenizer" in allowed:
        return
    theirs, ours = reference_model_tokenizer(path), tokenizer_fingerprint(tokenizer)
    override = f"pass {OVERRIDE_OPTION} tokenizer to use it anyway"
    if theirs is None:
        raise UsageError(
            f"--reference_model {path}: records no tokenizer (no {TASK_REPORT_NAME} provenance, no tokenizer files), "
            f"so its token ids cannot be checked against this run's tokenizer; {override}"
        )
    if theirs != ours:
        raise UsageError(
            f"--reference_model {path}: its tokenizer (sha256 {theirs[:12]}) differs from this run's (sha256 "
            f"{ours[:12]}), so it reads the same ids as other text; use a reference trained with this run's tokenizer, "
            f"or {override}"
        )


class ReferenceModel:
    """A frozen reference model for DoReMi's online excess loss: no gradient, eval mode (no dropout), the trained
    model's device, and the target-only MLM head when ``sparse_head`` (its logits only at target positions)."""

    def __init__(self, model: torch.nn.Module, device: torch.device | str, sparse_head: bool) -> None:
        self.model = model.to(device).eval().requires_grad_(False)
        self.head = TargetPositionsHead.attach(self.model) if sparse_head else None

    @classmethod
    def load(cls, path: str, like: torch.nn.Module, device: torch.device | str, sparse_head: bool) -> ReferenceModel:
        """Load ``path`` with the class and dtype of the trained model ``like``; a :class:`UsageError` (a
        ``ValueError``) names every way in which it cannot be that model's reference (another vocabulary, other tasks
        or modalities)."""
        model_class = type(like.get_base_model() if hasattr(like, "get_base_model") else like)
        try:
            model = model_class.from_pretrained(path, dtype=next(like.parameters()).dtype)
        except (OSError, ValueError, TypeError, KeyError) as err:
            raise UsageError(f"--reference_model {path}: cannot be loaded as a {model_class.__name__} ({err})") from err
        problems = compatibility_problems(model, like)
        if problems:
            raise UsageError(f"--reference_model {path}: " + "; ".join(problems))
        return cls(model, device, sparse_head)

    @classmethod
    def of_trainer(cls, args: Any, like: torch.nn.Module, accelerator: Any, sparse_head: bool) -> ReferenceModel | None:
        """The ``reference_model`` of the training arguments ``args`` (None without one), :meth:`load`-ed onto their
        device; under Accelerate's FSDP2 onto the CPU, from where :meth:`shard_like` moves the shards to the device
        (no full copy on the device)."""
        if args.reference_model is None:
            return None
        device = "cpu" if getattr(accelerator, "is_fsdp2", False) else args.device
        return cls.load(args.reference_model, like, device, sparse_head)

    def forward_context(self, mask: torch.Tensor | None) -> Any:
        """Where to run the reference forward pass: its head restricted to ``mask``'s rows when sparse."""
        return self.head.select(mask) if self.head is not None and mask is not None else nullcontext()

    def shard_like(
        self,
        model: torch.nn.Module,
        layer_classes: Collection[str],
        mp_policy: MixedPrecisionPolicy | None = None,
        offload_policy: OffloadPolicy | None = None,
    ) -> None:
        """Shard the reference as FSDP2 shards the trained ``model``: ``fully_shard`` of each module whose class is
        one of ``layer_classes`` (the decoder layers), then of the rest as the root, on the device mesh of ``model``'s
        DTensor parameters, with the same mixed-precision and offload policies. Every unit reshards after its forward
        pass (no backward pass follows), so outside it each process holds its shard only. Done once; a ``ValueError``
        when ``model`` holds no DTensor parameter (it is not sharded)."""
        if isinstance(self.model, FSDPModule):
            return
        mesh = next((p.device_mesh for p in model.parameters() if isinstance(p, DTensor)), None)
        if mesh is None:
            raise ValueError(f"{type(model).__name__} holds no DTensor parameter: it is not sharded by FSDP2")
        options = {"mesh": mesh, "reshard_after_forward": True, "mp_policy": mp_policy or MixedPrecisionPolicy()}
        options["offload_policy"] = offload_policy or OffloadPolicy()
        for layer in [module for module in self.model.modules() if type(module).__name__ in set(layer_classes)]:
            fully_shard(layer, **options)
        fully_shard(self.model, **options)


class ShardReferenceCallback(TrainerCallback):
    """Under Accelerate's FSDP2, shards the reference model like the trained one (:meth:`ReferenceModel.shard_like`)
    once the Trainer has sharded the model, at the start of training: the decoder layers Accelerate wraps
    (``fsdp_transformer_layer_cls_to_wrap``, else the model's ``_no_split_modules``), the plugin's policies. Without
    FSDP2 the reference stays whole on every process."""

    def __init__(self, reference: ReferenceModel, accelerator: Any) -> None:
        self.reference, self.accelerator = reference, accelerator

    def on_train_begin(self, args: Any, state: Any, control: Any, model: torch.nn.Module | None = None, **kwargs: Any):
        plugin = getattr(self.accelerator.state, "fsdp_plugin", None)
        if model is None or plugin is None or getattr(plugin, "fsdp_version", None) != 2:
            return
        layers = plugin.transformer_cls_names_to_wrap or getattr(self.reference.model, "_no_split_modules", None)
        self.reference.shard_like(model, layers or [], plugin.mixed_precision_policy, plugin.cpu_offload)


#: configuration entries that define what a model predicts: a reference must have the trained model's
TASK_DEFINING_CONFIG = ("vocab_size", "modalities", "model_type")


def compatibility_problems(reference: torch.nn.Module, model: torch.nn.Module) -> list[str]:
    """Why ``reference`` cannot give per-task losses on ``model``'s targets: each differing task-defining config
    entry (vocabulary size, modalities, model type), named with both values."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    ours, theirs = base.config.to_dict(), reference.config.to_dict()
    return [
        f"its {key} {theirs.get(key)!r} differs from the trained model's {ours.get(key)!r}"
        for key in TASK_DEFINING_CONFIG
        if key in ours and theirs.get(key) != ours.get(key)
    ]


__all__ = [
    "PROVENANCE_ENTRIES",
    "Provenance",
    "ReferenceModel",
    "ReferenceRun",
    "ShardReferenceCallback",
    "check_override",
    "check_provenance",
    "check_reference_model",
    "check_reference_run",
    "compatibility_problems",
    "dataset_fingerprint",
    "tokenizer_fingerprint",
    "training_fingerprint",
]
