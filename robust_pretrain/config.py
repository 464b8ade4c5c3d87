"""``HfArgumentParser`` with a ``--config`` YAML/JSON file whose values the command line overrides, and one check of
every option's value against its declaration (:mod:`robust_pretrain.options`) before any work."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml
from transformers import HfArgumentParser

from robust_pretrain.cli import ConsoleArgumentParser, UsageError, refuse
from robust_pretrain.configs import resolve_config
from robust_pretrain.options import option_problems


class OptionParser(HfArgumentParser, ConsoleArgumentParser):
    """``HfArgumentParser`` whose argparse errors (bad type or choice, missing option) are one line naming the option
    and what it accepts (a :class:`~robust_pretrain.cli.UsageError`), not the whole usage; an option that takes a
    mapping or a list (e.g. ``task_sampling_weights``) takes one or more tokens (``name=value ...``, values, or one
    JSON object or file), which its dataclass reads (``HfArgumentParser`` takes one string there)."""

    @staticmethod
    def _parse_dataclass_field(parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
        if not takes_mapping(field.type):
            HfArgumentParser._parse_dataclass_field(parser, field)
            return
        names = dict.fromkeys([f"--{field.name}", f"--{field.name.replace('_', '-')}"])
        parser.add_argument(*names, nargs="+", type=str, default=field.default, help=field.metadata.get("help"))


def takes_mapping(kind: Any) -> bool:
    """Whether a field of (resolved) type ``kind`` takes a mapping or a list (``dict[...] | ... | list[...]``)."""
    kinds = {typing.get_origin(each) or each for each in typing.get_args(kind)}
    return {dict, list} <= kinds


def option_names(parser: argparse.ArgumentParser) -> set[str]:
    """The names of every ``--option`` a parser takes (without the dashes)."""
    return {name[2:] for action in parser._actions for name in action.option_strings if name.startswith("--")}


def config_to_argv(config: dict[str, Any], path: Path, mappings: set[str] = frozenset()) -> list[str]:
    """Command-line tokens of a config file's values; a mapping only for the options in ``mappings`` (as
    ``name=value`` tokens)."""
    argv: list[str] = []
    for key, value in config.items():
        if isinstance(value, dict) and key in mappings:
            value = [f"{name}={item}" for name, item in value.items()]
        elif isinstance(value, dict):
            raise UsageError(f"--config {path}: option {key!r} is a mapping; only scalars and lists are supported")
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        argv += [f"--{key}", *(str(item) for item in values)]
    return argv


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a flat YAML (``.yaml``/``.yml``) or JSON mapping of option name -> value; ``path`` may also name a packaged
    config (``demo``, ``vision_demo``: :func:`robust_pretrain.configs.resolve_config`)."""
    path = resolve_config(str(path))
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
    validation as options typed on the command line. Before any dataclass is built, every value is checked against
    its declaration (:func:`~robust_pretrain.options.option_problems`: finite, in range, among the choices, a path
    of the right kind); a key of the config file that is no option, unknown options and every refused value are
    reported together as one :class:`~robust_pretrain.cli.UsageError`, one line each.
    """
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", type=Path, default=None)
    known, rest = pre.parse_known_args(argv)
    config = {} if known.config is None else load_config_file(known.config)
    names = option_names(parser)
    refuse(
        [
            f"--config {known.config}: {key!r} is not an option{_suggestion(key, names)}"
            for key in config
            if key not in names
        ]
    )
    hints = [typing.get_type_hints(dtype) for dtype in parser.dataclass_types]
    mappings = {name for types in hints for name, kind in types.items() if takes_mapping(kind)}
    args = config_to_argv(config, known.config, mappings) + rest
    namespace, unknown = parser.parse_known_args(args=args)
    flags = [token.split("=")[0] for token in unknown if token.startswith("-")]
    problems = [f"unknown option {flag}{_suggestion(flag, names)}" for flag in flags]
    if unknown and not flags:
        problems.append(f"unexpected value(s) {' '.join(unknown)}: a value follows the option it belongs to")
    for dtype in parser.dataclass_types:
        values = {f.name: getattr(namespace, f.name) for f in fields(dtype) if hasattr(namespace, f.name)}
        problems += option_problems(dtype, values)
    refuse(problems)
    try:
        *outputs, _ = parser.parse_args_into_dataclasses(args=args, return_remaining_strings=True)
    except UsageError:
        raise
    except ValueError as err:  # a dataclass's __post_init__ refused a value
        raise UsageError(f"invalid options: {err}") from err
    return tuple(outputs)


def _suggestion(name: str, names: set[str]) -> str:
    close = difflib.get_close_matches(name.lstrip("-").split("=")[0], names, n=1)
    return f" (did you mean --{close[0]}?)" if close else ""
