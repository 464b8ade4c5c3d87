"""How the suite names a checkpoint (local directory or Hub id) and detects that a local one has changed.

An entry ``random-init:<checkpoint>`` (families that support it) stands for the checkpoint's architecture with
randomly initialised weights: the no-pre-training baseline. It is named, keyed and fingerprinted apart from the
checkpoint itself, and only the checkpoint's ``config.json`` enters its state.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

# Files whose size and modification time identify a local checkpoint's weights (retraining in place changes them).
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")


RANDOM_INIT_PREFIX = "random-init:"


def random_init_source(checkpoint: str) -> str | None:
    """The checkpoint whose architecture a ``random-init:<checkpoint>`` entry names, or None for any other entry."""
    return checkpoint.removeprefix(RANDOM_INIT_PREFIX) if checkpoint.startswith(RANDOM_INIT_PREFIX) else None


def local_dir(checkpoint: str) -> Path | None:
    """The resolved directory of a local checkpoint, or None for a Hub id or a random-init entry (no weights of its
    own, no card to edit)."""
    if random_init_source(checkpoint) is not None:
        return None
    path = Path(checkpoint).expanduser()
    return path.resolve() if path.is_dir() else None


def checkpoint_identity(checkpoint: str) -> str:
    """A local directory's resolved path, or the Hub id; ``random-init:`` and its source's identity for a random-init
    entry."""
    source = random_init_source(checkpoint)
    if source is not None:
        return RANDOM_INIT_PREFIX + checkpoint_identity(source)
    local = local_dir(checkpoint)
    return checkpoint if local is None else str(local)


def checkpoint_label(checkpoint: str) -> str:
    """Short display name: a local directory's name, or the Hub id; ``random-init:`` and its source's label for a
    random-init entry."""
    source = random_init_source(checkpoint)
    if source is not None:
        return RANDOM_INIT_PREFIX + checkpoint_label(source)
    local = local_dir(checkpoint)
    return checkpoint if local is None else local.name


def checkpoint_key(checkpoint: str) -> str:
    """File-system-safe unique name: the label plus a hash of the identity."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", checkpoint_label(checkpoint)).strip("-")
    return f"{slug}-{hashlib.sha1(checkpoint_identity(checkpoint).encode()).hexdigest()[:8]}"


def checkpoint_state(checkpoint: str) -> dict[str, str] | None:
    """For a local checkpoint: its ``config.json`` hash and each weight file's size and modification time, so cells
    of a checkpoint retrained in place are recomputed; for a random-init entry its source's ``config.json`` hash only.
    None for a Hub id."""
    source = random_init_source(checkpoint)
    local = local_dir(checkpoint if source is None else source)
    if local is None:
        return None
    state = {}
    config = local / "config.json"
    if config.is_file():
        state["config.json"] = hashlib.sha256(config.read_bytes()).hexdigest()
    if source is not None:
        return state
    for pattern in _WEIGHT_PATTERNS:
        for path in sorted(local.glob(pattern)):
            stat = path.stat()
            state[path.name] = f"{stat.st_size}:{stat.st_mtime_ns}"
    return state
