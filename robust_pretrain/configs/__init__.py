"""The recipes' demo configs, shipped with the package: ``--config demo`` or ``--config vision_demo`` works from any
directory, with or without a clone (``recipes/configs/*.yaml`` in a clone are links to these files)."""

from __future__ import annotations

import difflib
from importlib.resources import files
from pathlib import Path

from robust_pretrain.cli import UsageError

SUFFIX = ".yaml"


def packaged_configs() -> dict[str, Path]:
    """Name (file name without ``.yaml``) -> path of every packaged config."""
    return {
        resource.name.removesuffix(SUFFIX): Path(str(resource))
        for resource in files(__name__).iterdir()
        if resource.name.endswith(SUFFIX)
    }


def resolve_config(name_or_path: str) -> Path:
    """The config file ``--config`` names: an existing file wins; else a bare name (no suffix, no slash) is a packaged
    config (``demo`` -> ``demo.yaml`` of this package); anything else is a :class:`~robust_pretrain.cli.UsageError`
    naming ``--config``, the value and the packaged names."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    packaged = packaged_configs()
    is_name = bool(name_or_path) and not path.suffix and "/" not in name_or_path and "\\" not in name_or_path
    if is_name and name_or_path in packaged:
        return packaged[name_or_path]
    close = difflib.get_close_matches(name_or_path, packaged, n=1)
    hint = f"did you mean {close[0]}? " if is_name and close else ""
    what = "is neither a file nor a packaged config" if is_name else "config file not found"
    raise UsageError(f"--config {name_or_path}: {what} ({hint}packaged configs: {', '.join(sorted(packaged))})")
