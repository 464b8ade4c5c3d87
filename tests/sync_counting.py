"""Counting, on the CPU, the operations of a training step that would make the host wait for a CUDA device.

A ``TorchDispatchMode`` sees the same aten op stream on the CPU as on a GPU, but on the CPU every tensor is a host
tensor. :class:`DeviceSyncCounter` therefore tracks which tensors *would* live on the device: those that derive from
a training batch, the model's parameters and buffers (every op with such an input tags its outputs; in-place ops tag
their target), and counts, among the ops on those tensors, the ones that force a device->host synchronisation on
CUDA (``.item()``/``int()``/``float()``/``bool()`` as ``_local_scalar_dense``, ``nonzero``, ``masked_select``,
``bincount``, ``unique``, ``equal``, ``repeat_interleave`` without ``output_size``, boolean-mask ``index`` /
``index_put``), plus explicit transfers of such tensors to the host (``.cpu()``, ``.tolist()``, ``.numpy()``, which
dispatch nothing on the CPU: the counter wraps them). A host copy made by ``.cpu()`` is a host tensor, so host-side
bookkeeping (the weighting strategies' estimates, Adam's step counter) is not counted, as it would not sync on CUDA.

Limit: a tensor created by a factory function on the device (``torch.zeros(T, device=device)``) counts as a device
tensor only once an op combines it with one; a sync on such a tensor alone (data-independent) goes uncounted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

#: aten ops that block the host until the device's queue has run up to them
SYNCING_OPS = {
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "bincount",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "equal",
}
BOOLEAN_INDEX_OPS = {"index", "index_put", "index_put_", "_index_put_impl_"}
#: tensor methods that copy to the host without dispatching anything on the CPU
HOST_TRANSFERS = ("cpu", "tolist", "numpy")
_TAG = "_on_device"


def on_device(tensor: torch.Tensor) -> bool:
    return getattr(tensor, _TAG, False)


def mark_on_device(tensors: Iterable[Any]) -> None:
    for tensor in tensors:
        if torch.is_tensor(tensor):
            setattr(tensor, _TAG, True)


class DeviceSyncCounter(TorchDispatchMode):
    """Counts syncing ops on device tensors while :attr:`counting` is true (``counts``: op name -> number)."""

    def __init__(self) -> None:
        super().__init__()
        self.counting = False
        self.counts: Counter[str] = Counter()

    def record(self, name: str) -> None:
        if self.counting:
            self.counts[name] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        inputs = [leaf for leaf in tree_leaves((args, kwargs)) if torch.is_tensor(leaf)]
        if any(on_device(tensor) for tensor in inputs):
            name = func._schema.name.split("::")[-1]
            if name in SYNCING_OPS or (name == "repeat_interleave" and kwargs.get("output_size") is None):
                self.record(name)
            elif name in BOOLEAN_INDEX_OPS and any(
                torch.is_tensor(index) and index.dtype == torch.bool for index in tree_leaves(args[1])
            ):
                self.record(f"{name} (boolean mask)")
            mark_on_device(tree_leaves(result))
        return result

    @contextmanager
    def watching_host_transfers(self) -> Iterator[None]:
        """Within the block, ``.cpu()`` / ``.tolist()`` / ``.numpy()`` of a device tensor count as transfers and
        ``.cpu()`` returns an (untagged) host copy."""
        originals = {name: getattr(torch.Tensor, name) for name in HOST_TRANSFERS}

        def wrap(name: str):
            original = originals[name]

            def transfer(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                if not on_device(tensor):
                    return original(tensor, *args, **kwargs)
                self.record(f"{name}()")
                if name != "cpu":
                    return original(tensor, *args, **kwargs)
                with torch.utils._python_dispatch._disable_current_modes():
                    return original(tensor, *args, **kwargs).clone()

            return transfer

        for name in HOST_TRANSFERS:
            setattr(torch.Tensor, name, wrap(name))
        try:
            yield
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)


def count_step_syncs(trainer: Any, step: int = 1, cuda_sync_debug: bool = False) -> DeviceSyncCounter:
    """Train ``trainer`` (``max_steps > step``) and count the syncs of optimizer step ``step`` (0-based): from its
    ``get_batch_samples`` to ``on_step_end``, so logging, saving and the first step's lazy set-up are outside.
    ``cuda_sync_debug``: also turn on ``torch.cuda``'s sync debug mode (a warning per actual sync) in that window."""
    from transformers import TrainerCallback

    counter = DeviceSyncCounter()
    model = trainer.model
    mark_on_device([*model.parameters(), *model.buffers()])
    get_batch_samples = trainer.get_batch_samples

    def tagged(batches: Iterator[dict]) -> Iterator[dict]:
        for batch in batches:
            mark_on_device(batch.values())
            yield batch

    def counted_get_batch_samples(epoch_iterator, num_batches, device):
        counter.counting = trainer.state.global_step == step
        if counter.counting and cuda_sync_debug:
            torch.cuda.set_sync_debug_mode("warn")
        return get_batch_samples(tagged(epoch_iterator), num_batches, device)

    class StopCounting(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            counter.counting = False
            if cuda_sync_debug:
                torch.cuda.set_sync_debug_mode(0)

    trainer.get_batch_samples = counted_get_batch_samples
    trainer.add_callback(StopCounting())
    with counter, counter.watching_host_transfers():
        trainer.train()
    return counter
