"""Reference-relative objectives: the per-task reference losses of ``loss_normalization='excess'``.

Two sources, both declared on :class:`~robust_pretrain.training_args.MinimaxTrainingArguments`:

* ``--reference_run DIR`` (static): the held-out per-task losses of a finished run, read from its
  ``task_report.json`` (typically the same recipe trained with ``proportional``). The run's ``provenance`` (tasks,
  tokenizer, held-out data) must match this run's: every difference is named, and refused unless it is listed in
  ``--reference_mismatch_ok``.
* ``--reference_model PATH`` (online, DoReMi's form): a frozen model (no gradient, eval mode, the target-only MLM head
  where the trained model has one) runs on the step's first micro-batch; its per-task losses on the same targets are
  the step's reference, pooled over processes with the trained model's own losses (no extra collective).

A run records its provenance in ``task_report.json`` (:func:`run_provenance`) so it can serve as a reference later.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from robust_pretrain.cli import UsageError
from robust_pretrain.task_losses import TargetPositionsHead

TASK_REPORT_NAME = "task_report.json"  # written by robust_pretrain.reporting.task_report
#: what ``--reference_mismatch_ok`` may accept: provenance entries whose difference a user can overrule
PROVENANCE_ENTRIES = ("tasks", "tokenizer", "held_out_data")


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 of a tokenizer's full definition (a fast tokenizer's JSON, else its vocabulary and special tokens)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    else:
        text = json.dumps([sorted(tokenizer.get_vocab().items()), tokenizer.special_tokens_map], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def dataset_fingerprint(dataset: Any, *settings: Any) -> str:
    """SHA-256 of a ``datasets.Dataset``'s content (its Arrow table, row selections applied) and ``settings`` (e.g.
    the seed of the held-out masks): equal for the same held-out examples, whatever their path or cache."""
    import pyarrow as pa

    if getattr(dataset, "_indices", None) is not None:
        dataset = dataset.flatten_indices()
    table = dataset.data.table.replace_schema_metadata(None)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks())
    digest = hashlib.sha256(sink.getvalue().to_pybytes())
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def run_provenance(
    tasks: Sequence[str], held_out_sha256: str, tokenizer: Any = None, tokenizer_name: str | None = None
) -> dict[str, Any]:
    """The ``provenance`` block of ``task_report.json``: the tasks (or modalities), the tokenizer (name and
    fingerprint; ``None`` without one) and the held-out data's fingerprint (:func:`dataset_fingerprint`)."""
    described = None
    if tokenizer is not None:
        name = tokenizer_name or getattr(tokenizer, "name_or_path", None)
        described = {"name": name, "sha256": tokenizer_fingerprint(tokenizer)}
    return {"tasks": list(tasks), "tokenizer": described, "held_out_data": held_out_sha256}


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

    def provenance_problems(self, current: dict[str, Any], allowed: Sequence[str] = ()) -> list[str]:
        """One line per provenance entry that differs from ``current`` (this run's :func:`run_provenance`) and is not
        in ``allowed``; a report without provenance is one problem (unless every entry is allowed)."""
        where = f"--reference_run {self.directory}"
        hint = "; pass --reference_mismatch_ok {} to use it anyway"
        if self.provenance is None:
            if set(PROVENANCE_ENTRIES) <= set(allowed):
                return []
            return [
                f"{where}: its task_report.json records no provenance (tasks, tokenizer, held-out data) to check"
                + hint.format(",".join(PROVENANCE_ENTRIES))
            ]
        problems = []
        for entry in PROVENANCE_ENTRIES:
            theirs, ours = self.provenance.get(entry), current.get(entry)
            if entry in allowed or _identity(entry, theirs) == _identity(entry, ours):
                continue
            if entry == "tokenizer":
                theirs, ours = _describe_tokenizer(theirs), _describe_tokenizer(ours)
            elif entry == "held_out_data":
                theirs, ours = f"sha256 {str(theirs)[:12]}", f"sha256 {str(ours)[:12]}"
            label = entry.replace("_", "-")
            problems.append(f"{where}: {label} differ: it has {theirs}, this run {ours}" + hint.format(entry))
        return problems


def check_reference_run(directory: str | None, allowed: Sequence[str], provenance: dict[str, Any]) -> None:
    """Refuse (:class:`UsageError`, one line per difference) a ``--reference_run`` whose provenance differs from this
    run's ``provenance`` in an entry not in ``allowed``; nothing to do without a reference run."""
    if directory is None:
        return
    problems = ReferenceRun.load(directory).provenance_problems(provenance, allowed)
    if problems:
        raise UsageError(*problems)


def _identity(entry: str, value: Any) -> Any:
    """What must match: a tokenizer's fingerprint (not the path it was loaded from), any other entry whole."""
    return value.get("sha256") if entry == "tokenizer" and isinstance(value, dict) else value


def _describe_tokenizer(tokenizer: dict[str, Any] | None) -> str:
    if tokenizer is None:
        return "no tokenizer"
    return f"{tokenizer.get('name')} (sha256 {str(tokenizer.get('sha256'))[:12]})"


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

    def forward_context(self, mask: torch.Tensor | None) -> Any:
        """Where to run the reference forward pass: its head restricted to ``mask``'s rows when sparse."""
        return self.head.select(mask) if self.head is not None and mask is not None else nullcontext()


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
    "ReferenceModel",
    "ReferenceRun",
    "check_reference_run",
    "compatibility_problems",
    "dataset_fingerprint",
    "run_provenance",
    "tokenizer_fingerprint",
]
