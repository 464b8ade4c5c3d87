"""Refusing a task without targets (issue 29): after preprocessing and before the first step, every recipe counts each
task's targets (tokens of text, words of a PoS task, valid depth pixels, labelled pixels, images with a modality) in
its training and held-out data. A task with none would silently drop out of the run and out of its "worst task"."""

from __future__ import annotations

from collections.abc import Sequence

from robust_pretrain.cli import UsageError


def refuse_tasks_without_targets(kind: str, names: Sequence[str], counts: Sequence[int], split: str, why: str) -> None:
    """Raise a :class:`UsageError` naming each of ``names`` (``kind``: "domain", "task" or "modality") whose target
    count in ``counts`` is 0 in the ``split`` data ("training" or "held-out"), with ``why`` it has none."""
    empty = [name for name, count in zip(names, counts, strict=True) if count == 0]
    if empty:
        plural = "s" if len(empty) > 1 else ""
        raise UsageError(
            f"{kind}{plural} {', '.join(empty)}: no target in the {split} data ({why}); it would silently drop out of "
            f"the run and of the worst {kind}: give it data or leave it out"
        )
