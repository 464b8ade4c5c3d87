"""The teardown of the default process group at interpreter exit (see :func:`register_process_group_teardown`)."""

from __future__ import annotations

import atexit
import functools
import time

import torch

#: how long the exit handler releases the GIL for the process group's threads to finish their last work
WORKER_DRAIN_SECONDS = 0.2


@functools.cache  # registered once per process
def register_process_group_teardown() -> None:
    """Destroy the default process group, if one is alive, at interpreter exit (whoever created it, e.g. Accelerate
    for the Trainer's arguments). ``MinimaxTrainer`` registers it; scripts training with the plain ``Trainer`` call it.

    Left alive, a gloo worker thread may still be releasing its last work (which holds Python tensors) when the
    interpreter finalises; it cannot take the GIL then, and the finished process aborts (``terminate called without an
    active exception``, exit -6): torchrun reports a failure. So the group is destroyed and the GIL released briefly
    while the interpreter is alive, letting those threads finish; freeing the group here (a garbage collection) could
    deadlock instead, its destructor joining a thread that waits for the GIL.
    """
    atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
        time.sleep(WORKER_DRAIN_SECONDS)
