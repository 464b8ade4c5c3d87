"""``HfArgumentParser`` with a ``--config`` YAML/JSON file whose values the command line overrides."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml
from transformers import HfArgumentParser

from robust_pretrain.cli import UsageError


def _config_to_argv(config: dict[str, Any], path: Path) -> list[str]:
    argv: list[str] = []
    for key, value in config.items():
        if isinstance(value, dict):
            raise UsageError(f"--config {path}: option {key!r} is a mapping; only scalars and lists are supported")
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        argv += [f"--{key}", *(str(item) for item in values)]
    return argv


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a flat YAML (``.yaml``/``.yml``) or JSON mapping of option name -> value."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--config {path}: config file not found")
    try:
        text = path.read_text(encoding="utf-8")
        config = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (UnicodeDecodeError, ValueError, yaml.YAMLError) as err:
        raise UsageError(
            f"--config {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {err}"
        ) from None
    if not isinstance(config, dict):
        raise UsageError(f"--config {path}: expected a mapping of option names to values, got {type(config).__name__}")
    return config


def parse_with_config(parser: HfArgumentParser, argv: list[str] | None = None) -> tuple:
    """Parse dataclasses from ``--config FILE`` (optional) followed by command-line options, which take precedence.

    Config values are turned into command-line tokens, so they get exactly the same type conversion and
    validation as options typed on the command line; unknown names and values a dataclass refuses raise
    :class:`~robust_pretrain.cli.UsageError` naming them.
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", type=Path, default=None)
    known, rest = pre.parse_known_args(argv)
    config_argv = [] if known.config is None else _config_to_argv(load_config_file(known.config), known.config)
    try:
        *outputs, unknown = parser.parse_args_into_dataclasses(args=config_argv + rest, return_remaining_strings=True)
    except UsageError:
        raise
    except ValueError as err:  # a dataclass's __post_init__ refused a value
        raise UsageError(f"invalid options: {err}") from err
    if unknown:
        raise UsageError(f"Unknown or malformed options: {unknown}")
    return tuple(outputs)
