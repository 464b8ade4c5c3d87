"""Local text data files as the recipes read them: the ``datasets`` builder of each suffix, the files a path or glob
names, and a check that refuses a missing, empty or binary file by name before ``datasets`` fails on it."""

from __future__ import annotations

import glob
from pathlib import Path

from robust_pretrain.cli import UsageError


def subject(option: str, value: object) -> str:
    """``option value`` as a message names it: ``--domain_files web=path`` has no space after its ``=``."""
    return f"{option}{value}" if option.endswith("=") else f"{option} {value}"


#: the ``datasets`` builder reading each file suffix
TEXT_BUILDERS = {"txt": "text", "jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet"}


def check_text_file(path: Path, option: str, builder: str) -> None:
    """Refuse a missing, empty or binary data file by name, before ``datasets`` fails on it with a generic error."""
    if not path.is_file():
        raise UsageError(f"{subject(option, path)}: data file not found")
    if path.stat().st_size == 0:
        raise UsageError(f"{subject(option, path)} is empty: give a file with one text per line (or record)")
    if builder == "parquet":
        from pyarrow import ArrowException
        from pyarrow.parquet import ParquetFile

        try:
            ParquetFile(path).close()
        except (ArrowException, OSError) as err:
            raise UsageError(f"{subject(option, path)} is not a readable Parquet file ({err})") from None
        return
    with open(path, "rb") as stream:
        head = stream.read(1 << 16)
    if b"\0" in head:
        offset = head.index(b"\0")
        raise UsageError(f"{subject(option, path)} is not text (NUL byte at offset {offset}); is it a binary file?")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 3:  # not just a character cut at the 64 KiB boundary
            where = f"invalid byte at offset {err.start}"
            raise UsageError(f"{subject(option, path)} is not UTF-8 text ({where})") from None


def matching_files(pattern: str, option: str) -> list[str]:
    """The files a --train_file / --validation_file names: one path, or every match of a glob pattern, sorted."""
    if not glob.has_magic(pattern):
        return [pattern]
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise UsageError(f"{subject(option, pattern)}: no file matches")
    return paths
