"""Stateless randomness for collators and data transforms: every draw comes from ``(seed, epoch, example key)``.

A stateful generator advanced batch after batch breaks as soon as batches are produced elsewhere or skipped: in
DataLoader workers, on other processes, or when a resumed ``Trainer`` fast-forwards past the batches it already
trained on (without collating them). Deriving each example's generator from ``(seed, epoch, key)`` instead, where
``key`` is a stable identity of the example (its ``id`` or a hash of its content), makes the draws

- reproducible, and the same for a resumed run as for an uninterrupted one;
- independent of the number of DataLoader workers, processes, batch size and order (different examples, hence
  different workers' batches, draw differently);
- different per epoch, once the epoch is set with ``set_epoch`` (:class:`SetEpochCallback` does it for a
  ``Trainer`` before each epoch's batches are drawn; ``MinimaxTrainer`` adds it by itself when its data collator or
  its training dataset's transform has ``set_epoch``). Keep the epoch in a :class:`SharedEpoch`: it lives in shared
  memory, so DataLoader workers see the new epoch even when they persist across epochs.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np
import torch
from transformers import TrainerCallback


def stable_hash(value: Any) -> int:
    """A 64-bit hash of ``value`` that is the same in every process and run (unlike ``hash``).

    Strings, bytes, integers, numpy arrays and torch tensors hash by content (arrays by dtype, shape and bytes);
    sequences and mappings hash element-wise, in order.
    """
    digest = hashlib.blake2b(digest_size=8)
    _feed(digest, value)
    return int.from_bytes(digest.digest(), "little")


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, dict):
        digest.update(b"d%d" % len(value))
        for item_key, item in value.items():
            _feed(digest, item_key)
            _feed(digest, item)
        return
    if isinstance(value, list | tuple):
        digest.update(b"l%d" % len(value))
        for item in value:
            _feed(digest, item)
        return
    if isinstance(value, bytes | bytearray | memoryview):
        tag, payload = b"b", bytes(value)
    elif isinstance(value, str):
        tag, payload = b"s", value.encode()
    elif isinstance(value, bool | int | np.integer):
        tag, payload = b"i", str(int(value)).encode()
    elif isinstance(value, float | np.floating):
        tag, payload = b"f", np.float64(value).tobytes()
    else:
        array = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        if array.dtype == object:
            raise TypeError(f"cannot hash a value of type {type(value).__name__} stably")
        tag = f"a{array.dtype.str}{array.shape}".encode()
        payload = np.ascontiguousarray(array).reshape(-1).view(np.uint8)  # the bytes, not copied when contiguous
    digest.update(tag + len(payload).to_bytes(8, "little"))
    digest.update(payload)


def _seed_sequence(seed: int, epoch: int, key: Any) -> np.random.SeedSequence:
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
    return np.random.SeedSequence([seed, epoch, stable_hash(key)])


def keyed_rng(seed: int, epoch: int, key: Any) -> np.random.Generator:
    """The numpy generator for one example: a pure function of ``(seed, epoch, stable_hash(key))``."""
    return np.random.Generator(np.random.PCG64(_seed_sequence(seed, epoch, key)))


def keyed_torch_generator(seed: int, epoch: int, key: Any) -> torch.Generator:
    """A CPU ``torch.Generator`` that is a pure function of ``(seed, epoch, stable_hash(key))``, for draws made with
    torch operations (``torch.rand(..., generator=...)``)."""
    state = _seed_sequence(seed, epoch, key).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


class SharedEpoch:
    """An epoch number shared with DataLoader worker processes (a shared-memory tensor), also persistent ones."""

    def __init__(self, epoch: int = 0) -> None:
        self._value = torch.zeros((), dtype=torch.long).share_memory_()
        self.set(epoch)

    @property
    def value(self) -> int:
        return int(self._value)

    def set(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._value.fill_(int(epoch))


class SupportsSetEpoch(Protocol):
    def set_epoch(self, epoch: int) -> None: ...


class SetEpochCallback(TrainerCallback):
    """Call ``set_epoch(epoch)`` on each target (collators, dataset transforms) when the ``Trainer`` starts an epoch.

    The epoch is the integer epoch the Trainer is about to run, also when it resumes in the middle of one
    (``state.epoch`` is then fractional, e.g. 2.5 -> 2).
    """

    def __init__(self, targets: Iterable[SupportsSetEpoch]) -> None:
        self.targets = list(targets)
        for target in self.targets:
            if not callable(getattr(target, "set_epoch", None)):
                raise TypeError(f"{type(target).__name__} has no set_epoch method")

    @classmethod
    def for_training_data(cls, collator: Any, dataset: Any) -> SetEpochCallback | None:
        """The callback for whichever of ``collator`` and the dataset's transform has ``set_epoch``; None if neither.

        The transform is the one set with ``datasets``' ``with_transform``/``set_transform``, else a ``transform``
        attribute (torchvision-style datasets).
        """
        dataset_format = getattr(dataset, "format", None)
        if isinstance(dataset_format, dict):
            transform = dataset_format.get("format_kwargs", {}).get("transform")
        else:
            transform = getattr(dataset, "transform", None)
        targets = [target for target in (collator, transform) if callable(getattr(target, "set_epoch", None))]
        return cls(targets) if targets else None

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        epoch = math.floor((state.epoch or 0.0) + 1e-6)
        for target in self.targets:
            target.set_epoch(epoch)
