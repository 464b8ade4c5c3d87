"""The files of a ``robust-pretrain-decide`` folder, safe for cells run as concurrent jobs in one folder.

* every file is written atomically (a temporary file renamed over it); ``protocol.json`` is created exclusively
  (a hard link that fails if another job wrote it first, then compared);
* a cell runs under a lock (``cells/<arm>/seed-<seed>.lock``, ``flock``: released when its process ends, however it
  ends); under ``accelerate launch`` only the main process (``RANK`` 0) takes it and records the cell;
* a finished cell is recorded in ``cells/<arm>/seed-<seed>/decide_cell.json`` (its options, paths inside the folder
  written relative to it, and its task report): the folder is recognised by its contents, wherever it lies.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from robust_pretrain.cli import UsageError

logger = logging.getLogger(__name__)

PROTOCOL_NAME = "protocol.json"
CELLS_NAME = "cells.json"
RECORD_NAME = "decide_cell.json"
#: what a decision writes beside its protocol: never written into a folder that holds them without a protocol
OUTPUT_NAMES = (CELLS_NAME, "cells", "decision.md", "decision.json", "decision.png", "winner_weights.json")
#: how a path inside the decision folder is recorded
ROOT_MARK = "<output_dir>"


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in its folder renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as stream:
        stream.write(text)
    os.replace(temporary, path)


def write_json(path: Path, content: Any) -> None:
    atomic_write(path, json.dumps(content, indent=2) + "\n")


def main_process() -> bool:
    """Whether this is the main process of a launch (or no launch)."""
    return int(os.environ.get("RANK", "0")) == 0


def cell_dir(root: Path, arm: str, seed: int) -> Path:
    return root / "cells" / arm / f"seed-{seed}"


@contextlib.contextmanager
def cell_lock(root: Path, arm: str, seed: int) -> Iterator[None]:
    """Hold cell ``arm:seed``'s lock (the main process only); refuse when another process holds it."""
    if not main_process():
        yield
        return
    path = cell_dir(root, arm, seed).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"cell {arm}:{seed} is being run by another process (it holds {path})") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def portable(options: list[str], root: Path) -> list[str]:
    """``options`` with the paths inside ``root`` written relative to it (:data:`ROOT_MARK`)."""
    prefix = str(root)
    return [ROOT_MARK + option[len(prefix) :] if option.startswith(prefix + os.sep) else option for option in options]


def read_record(root: Path, arm: str, seed: int) -> dict[str, Any] | None:
    """A finished cell's record, or None; a corrupt one is refused, naming the folder to delete."""
    path = cell_dir(root, arm, seed) / RECORD_NAME
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or not {"options", "report"} <= set(record):
            raise ValueError("not a record of options and report")
    except (ValueError, UnicodeDecodeError) as err:
        raise UsageError(f"{path} is corrupt ({err}): delete {path.parent} to run the cell again") from None
    return record


def finished(root: Path, arm: str, seed: int, options: list[str]) -> dict[str, Any] | None:
    """The report of cell ``arm:seed`` when it finished with ``options`` (None when it has not); refused when it
    finished with other ones."""
    record = read_record(root, arm, seed)
    if record is None:
        return None
    if record["options"] != portable(options, root):
        raise UsageError(
            f"cell {arm}:{seed} finished with other options ({cell_dir(root, arm, seed)}): use another "
            "--output_dir, or delete the cell folder to run it again"
        )
    return record["report"]


def record_cell(root: Path, arm: str, seed: int, options: list[str], report: dict[str, Any]) -> None:
    if main_process():
        write_json(cell_dir(root, arm, seed) / RECORD_NAME, {"options": portable(options, root), "report": report})


def protocol_digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def check_folder(root: Path) -> None:
    """Refuse a folder without ``protocol.json`` that holds files a decision writes (a user's own, or a decision whose
    protocol is gone): nothing in it is overwritten."""
    if (root / PROTOCOL_NAME).is_file() or not root.is_dir():
        return
    found = [name for name in OUTPUT_NAMES if (root / name).exists()]
    if found:
        raise UsageError(
            f"--output_dir {root} holds {', '.join(found)} but no {PROTOCOL_NAME}: not this decision's folder; "
            "use another --output_dir (nothing was changed)"
        )


def fix_protocol(root: Path, protocol: dict[str, Any], write: bool = True) -> dict[str, Any]:
    """Write ``protocol.json`` with its hash (``write``; else it must exist), or refuse a protocol other than the
    written one, naming what changed."""
    body = {key: value for key, value in protocol.items() if key != "hash"}
    digest, path = protocol_digest(body), root / PROTOCOL_NAME
    if not path.is_file():
        if not write:
            raise UsageError(f"{path} does not exist: run --plan (or the cells) first")
        root.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=root, prefix=f".{PROTOCOL_NAME}.")
        with os.fdopen(handle, "w") as stream:
            stream.write(json.dumps({**body, "hash": digest}, indent=2) + "\n")
        with contextlib.suppress(FileExistsError):  # another job wrote it first: compared below
            os.link(temporary, path)
        os.unlink(temporary)
    try:
        written = json.loads(path.read_text())
    except ValueError as err:
        raise UsageError(f"{path} is not JSON ({err}): restore it or use another --output_dir") from err
    if written.get("hash") != digest:
        changed = sorted(k for k in {*body, *written} - {"hash"} if written.get(k) != body.get(k))
        raise UsageError(
            f"{path} fixed another protocol before the first run (changed: {', '.join(changed)}): rerun with the "
            "same options, or use another --output_dir"
        )
    return {**body, "hash": digest}


__all__ = [
    "CELLS_NAME",
    "OUTPUT_NAMES",
    "PROTOCOL_NAME",
    "atomic_write",
    "cell_dir",
    "cell_lock",
    "check_folder",
    "finished",
    "fix_protocol",
    "portable",
    "record_cell",
    "write_json",
]
