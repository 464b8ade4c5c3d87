"""``HfArgumentParser`` with a ``--config`` YAML/JSON file whose values the command line overrides."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml
from transformers import HfArgumentParser


def _config_to_argv(config: dict[str, Any], path: Path) -> list[str]:
    argv: list[str] = []
    for key, value in config.items():
        if isinstance(value, dict):
            raise ValueError(f"{path}: option {key!r} is a mapping; only scalars and lists are supported")
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        argv += [f"--{key}", *(str(item) for item in values)]
    return argv


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a flat YAML (``.yaml``/``.yml``) or JSON mapping of option name -> value."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} not found")
    text = path.read_text(encoding="utf-8")
    config = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a mapping of option names to values, got {type(config).__name__}")
    return config


def parse_with_config(parser: HfArgumentParser, argv: list[str] | None = None) -> tuple:
    """Parse dataclasses from ``--config FILE`` (optional) followed by command-line options, which take precedence.

    Config values are turned into command-line tokens, so they get exactly the same type conversion and
    validation as options typed on the command line; unknown names raise an error naming them.
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", type=Path, default=None)
    known, rest = pre.parse_known_args(argv)
    config_argv = [] if known.config is None else _config_to_argv(load_config_file(known.config), known.config)
    *outputs, unknown = parser.parse_args_into_dataclasses(args=config_argv + rest, return_remaining_strings=True)
    if unknown:
        raise ValueError(f"Unknown or malformed options: {unknown}")
    return tuple(outputs)
