"""What every console entry point shares: expected user errors end with one line per problem and exit status 2.

    def main(argv: list[str] | None = None) -> int:
        return run_console(run, argv, prog="robust-pretrain-pos-mlm")

``run(argv)`` raises :class:`UsageError` (a ``ValueError``) for a bad option, file or checkpoint, naming it; the
console prints ``<prog>: error: <message>`` (one line per problem) and returns 2. Parsers derive from
:class:`ConsoleArgumentParser`, whose argparse errors are such an error too (one line, no usage). Anything else is a
bug and keeps its traceback. The traceback of an expected error too is shown with ``--traceback`` on the command line
or ``ROBUST_PRETRAIN_TRACEBACK=1`` in the environment.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from huggingface_hub import is_offline_mode, try_to_load_from_cache

TRACEBACK_FLAG = "--traceback"
TRACEBACK_ENV = "ROBUST_PRETRAIN_TRACEBACK"
USAGE_ERROR_STATUS = 2
# A Hub model id: "name" or "namespace/name" of letters, digits, "-", "_" and "." (huggingface_hub's rule).
_HUB_ID = re.compile(r"[\w.\-]{1,96}(/[\w.\-]{1,96})?")


class UsageError(ValueError):
    """An expected user error (bad option, file or checkpoint); the message names it and says what to do. Several
    problems found at once are several arguments, shown one line each."""

    def __str__(self) -> str:
        return "\n".join(str(problem) for problem in self.args)


class ConsoleArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors (unknown option, bad type or choice, missing argument) raise a
    :class:`UsageError` of one line naming the option and what it accepts, instead of printing the whole usage."""

    def error(self, message: str):
        raise UsageError(message)


def refuse(problems: Sequence[str]) -> None:
    """Raise one :class:`UsageError` listing every problem (one line each), if there are any."""
    if problems:
        raise UsageError(*problems)


def run_console(run: Callable[[list[str]], Any], argv: Sequence[str] | None = None, *, prog: str) -> int:
    """Call ``run(argv)``; a :class:`UsageError` prints one paragraph to stderr and returns 2, success returns 0."""
    args = list(sys.argv[1:] if argv is None else argv)
    show_traceback = TRACEBACK_FLAG in args or os.environ.get(TRACEBACK_ENV, "") not in ("", "0")
    args = [arg for arg in args if arg != TRACEBACK_FLAG]
    try:
        run(args)
    except UsageError as err:
        if show_traceback:
            raise
        problems = [" ".join(str(problem).split()) for problem in err.args] or [type(err).__name__]
        problems[-1] += f" (run with {TRACEBACK_FLAG} or {TRACEBACK_ENV}=1 for the traceback)"
        for problem in problems:  # one line each: paths stay whole for copy-paste
            print(f"{prog}: error: {problem}", file=sys.stderr)
        return USAGE_ERROR_STATUS
    return 0


def looks_like_path(name: str) -> bool:
    """Whether a model name is meant as a local path rather than a Hub id: it starts with ``/``, ``.`` or ``~``, has
    more than one ``/``, a backslash, a first component that exists locally, or is no valid Hub id."""
    if name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1:
        return True
    if "/" in name and Path(name.split("/", 1)[0]).is_dir():
        return True
    return _HUB_ID.fullmatch(name) is None or "--" in name or ".." in name


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the Hub cache holds a model, adapter or tokenizer configuration of ``repo_id``."""
    files = ("config.json", "adapter_config.json", "tokenizer_config.json")
    return any(isinstance(try_to_load_from_cache(repo_id, name), str) for name in files)


def check_checkpoint(name: str | None, option: str = "--model_name_or_path", *, model: bool = True) -> None:
    """Refuse at once, naming ``option``, a checkpoint that cannot load: a path-like name that does not exist (it
    would otherwise be tried on the Hub), or a local folder without ``config.json`` (``model=False``: a tokenizer
    folder, which needs none) or with a truncated or corrupt ``*.safetensors`` file. Hub ids pass unchecked, except in
    offline mode, where one that is not in the Hub cache cannot load."""
    if name is None:
        return
    path = Path(name).expanduser()
    if not path.exists():
        if looks_like_path(name):
            raise UsageError(f"{option} {name}: no such checkpoint directory")
        if is_offline_mode() and not _in_hub_cache(name):
            raise UsageError(
                f"{option} {name}: no such local directory, and not in the Hub cache, the only place offline mode "
                "(HF_HUB_OFFLINE=1) can load a Hub id from"
            )
        return
    if not path.is_dir():
        raise UsageError(f"{option} {name} is a file; give the checkpoint's directory")
    if model and not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
        found = ", ".join(sorted(p.name for p in path.iterdir())) or "nothing"
        raise UsageError(f"{option} {name} is not a saved model: it has no config.json (it holds: {found})")
    from safetensors import SafetensorError, safe_open

    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(weights, framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise UsageError(f"{option} {name}: {weights.name} cannot be read ({err}); is it truncated?") from None
