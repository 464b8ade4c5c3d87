"""Option declarations: each option is one dataclass field holding its default, help and accepted values.

    learning_rate: float = option(1e-4, "Peak learning rate.", above=0)
    tagger: str = option("shipped", "PoS tagger backend.", choices=["shipped", "nltk"])
    image_folder: str | None = option(None, "Image folder.", path="dir")

:func:`option_problems` checks values against those declarations: every float must be finite, numbers must lie in
their range, choices must be among the accepted ones, and paths must be of the declared kind (``"file"``: an existing
file or a glob matching one; ``"dir"``: an existing directory; ``"output_dir"``: not a file, and writable). The
console layer reports every problem at once (:func:`robust_pretrain.config.parse_with_config`); a dataclass's
``__post_init__`` raises them as one ``ValueError`` (:func:`check_options`). Fields a dataclass inherits from a class
it does not own (``TrainingArguments``) are declared with :func:`declare_inherited`.
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

PATH_KINDS = ("file", "dir", "output_dir")


@dataclass(frozen=True)
class Accepted:
    """What an option accepts: a closed or open numeric interval, a set of choices and/or a kind of path."""

    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    below: float | None = None
    choices: tuple[Any, ...] | None = None
    path: str | None = None
    excluded: tuple[float, ...] = ()
    description: str | None = None
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.path is not None and self.path not in PATH_KINDS:
            raise TypeError(f"path kind must be one of {PATH_KINDS}, got {self.path!r}")

    def describe(self) -> str:
        """The accepted values in words, e.g. ``in (0, 1]``, ``> 0`` or ``a positive integer``."""
        if self.description is not None:
            return self.description
        low = (f"[{self.minimum:g}", self.minimum) if self.minimum is not None else None
        low = (f"({self.above:g}", self.above) if self.above is not None else low
        high = (f"{self.maximum:g}]", self.maximum) if self.maximum is not None else None
        high = (f"{self.below:g})", self.below) if self.below is not None else high
        if self.choices is not None:
            return "one of " + ", ".join(str(choice) for choice in self.choices)
        if low and high:
            return f"in {low[0]}, {high[0]}"
        if low and self.minimum == 1:
            return "a positive integer"
        if low:
            return f"{'>=' if self.minimum is not None else '>'} {low[1]:g}"
        if high:
            return f"{'<=' if self.maximum is not None else '<'} {high[1]:g}"
        return {"file": "an existing file", "dir": "an existing directory"}.get(self.path or "", "a writable directory")

    def number_problem(self, value: float) -> str | None:
        """Why a number is not accepted, or None."""
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number" + (f" {self.describe()}" if self.has_range() else "")
        below_low = (self.minimum is not None and value < self.minimum) or (
            self.above is not None and value <= self.above
        )
        above_high = (self.maximum is not None and value > self.maximum) or (
            self.below is not None and value >= self.below
        )
        return f"must be {self.describe()}" if below_low or above_high or value in self.excluded else None

    def has_range(self) -> bool:
        return any(bound is not None for bound in (self.minimum, self.above, self.maximum, self.below))


class OptionHelp(str):
    """An option's help text, carrying what the option accepts (``HfArgumentParser`` passes every metadata key to
    ``argparse``, which takes no other key: the help is where the declaration can travel)."""

    accepted: Accepted

    def __new__(cls, text: str, accepted: Accepted) -> OptionHelp:
        help = super().__new__(cls, text)
        help.accepted = accepted
        return help

    def __reduce__(self) -> tuple:
        return OptionHelp, (str(self), self.accepted)


def option(
    default: Any = MISSING,
    help: str = "",
    *,
    default_factory: Any = MISSING,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    below: float | None = None,
    choices: Sequence[Any] | None = None,
    path: str | None = None,
    description: str | None = None,
    reason: str | None = None,
    **metadata: Any,
) -> Any:
    """A dataclass field declaring an option: ``default`` (or ``default_factory``), ``help`` and what it accepts (a
    range ``minimum``/``above`` .. ``maximum``/``below``, ``choices``, a ``path`` kind; ``description`` replaces the
    generated wording of what is accepted, ``reason`` is said after a refused value). ``HfArgumentParser`` reads the
    help and the choices; :func:`option_problems` reads the rest."""
    choices = None if choices is None else tuple(choices)
    accepted = Accepted(minimum, above, maximum, below, choices, path, description=description, reason=reason)
    if accepted.has_range():
        help = f"{help} Accepted: {accepted.describe()}.".strip()
    metadata = {"help": OptionHelp(help, accepted), **metadata}
    if choices is not None:
        metadata["choices"] = list(choices)
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


_INHERITED: dict[type, dict[str, Accepted]] = {}


def declare_inherited(owner: type, accepted: Mapping[str, Accepted]) -> None:
    """Declare what the fields of a dataclass this project does not own (e.g. ``TrainingArguments``) accept; every
    subclass inherits the declaration unless it redeclares the field with :func:`option`."""
    _INHERITED.setdefault(owner, {}).update(accepted)


def declared(cls: type) -> dict[str, Accepted]:
    """What each field of the dataclass ``cls`` accepts (fields without a declaration are left out)."""
    table: dict[str, Accepted] = {}
    for base in reversed(cls.__mro__):
        table.update(_INHERITED.get(base, {}))
    for each in dataclasses.fields(cls):
        if isinstance(each.metadata.get("help"), OptionHelp):
            table[each.name] = each.metadata["help"].accepted
    return table


def path_problem(value: str, kind: str) -> str | None:
    """Why ``value`` is not a path of ``kind`` (see :data:`PATH_KINDS`), or None."""
    path = Path(value).expanduser()
    if kind == "file":
        if glob.has_magic(value):
            return None if any(Path(match).is_file() for match in glob.glob(value)) else "no file matches"
        if path.is_dir():
            return "is a directory, not a file"
        return None if path.is_file() else "no such file"
    if kind == "dir":
        if path.is_file():
            return "is a file, not a directory"
        return None if path.is_dir() else "no such directory"
    if path.exists() and not path.is_dir():
        return "is a file, not a directory"
    existing = next((parent for parent in (path, *path.parents) if parent.exists()), Path("."))
    if not existing.is_dir():
        return f"cannot be created: {existing} is a file"
    try:  # os.access is blind to read-only mounts for root: try a probe that leaves nothing behind
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as err:
        return f"is not writable ({existing}: {err.strerror or err})"
    return None


def value_problems(value: Any, accepted: Accepted | None, check_paths: bool = True) -> list[str]:
    """Why ``value`` (a scalar or a list) is not accepted, each reason completing "<option> ...": an empty list when it
    is accepted. ``None`` (unset) is accepted; a mapping's values are checked."""
    items = list(value.values()) if isinstance(value, Mapping) else value
    items = items if isinstance(items, list | tuple) else [items]
    problems = []
    for item in items:
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, float) and not math.isfinite(item) and (accepted is None or not accepted.has_range()):
            problems.append(f"must be a finite number, got {item}")
        elif accepted is None:
            continue
        elif accepted.choices is not None and item not in accepted.choices:
            problems.append(f"must be {accepted.describe()}, got {item!r}")
        elif isinstance(item, (int, float)) and (problem := accepted.number_problem(item)):
            problems.append(f"{problem}, got {item}" + (f": {accepted.reason}" if accepted.reason else ""))
        elif check_paths and accepted.path and isinstance(item, (str, os.PathLike)):
            problem = path_problem(str(item), accepted.path)
            problems.append(f"{item}: {problem} (expected {accepted.describe()})" if problem else "")
    return list(dict.fromkeys(problem for problem in problems if problem))


def option_problems(cls: type, values: Mapping[str, Any], *, style: str = "cli", check_paths: bool = True) -> list[str]:
    """One line per option of the dataclass ``cls`` whose value in ``values`` is not accepted, naming it as ``--name``
    (``style="cli"``) or ``name`` (``style="api"``)."""
    table = declared(cls)
    prefix = "--" if style == "cli" else ""
    return [
        f"{prefix}{each.name} {problem}"
        for each in dataclasses.fields(cls)
        if each.name in values
        for problem in value_problems(values[each.name], table.get(each.name), check_paths)
    ]


def check_options(instance: Any) -> None:
    """Raise one ``ValueError`` naming every field of the dataclass ``instance`` whose value its declaration does not
    accept; paths are not checked (a Python object may name a path that is created later)."""
    values = {each.name: getattr(instance, each.name) for each in dataclasses.fields(instance)}
    problems = option_problems(type(instance), values, style="api", check_paths=False)
    if problems:
        raise ValueError("\n".join(problems))


def declared_defaults(cls: type) -> dict[str, Any]:
    """``{field: default}`` of a dataclass (``default_factory`` called)."""
    defaults = {}
    for each in dataclasses.fields(cls):
        if each.default is not MISSING:
            defaults[each.name] = each.default
        elif each.default_factory is not MISSING:
            defaults[each.name] = each.default_factory()
    return defaults


@dataclass
class LoraArguments:
    """LoRA via peft (text pre-training, GLUE and dense fine-tuning): declared once for every recipe.

    ``lora_dropout`` 0.1: the dropout QLoRA (Dettmers et al., 2023) found best for models up to 13B parameters and the
    one PEFT's sequence-classification examples use; every model this project trains is far smaller.
    """

    use_lora: bool = option(False, "Train LoRA adapters (peft) instead of all weights.")
    lora_r: int = option(8, "LoRA rank.", minimum=1)
    lora_alpha: int = option(16, "LoRA scaling alpha.", above=0)
    lora_dropout: float = option(0.1, "Dropout on the LoRA branch.", minimum=0, below=1)
    lora_target_modules: list[str] = option(
        default_factory=lambda: ["query", "value"], help="Module names that get LoRA adapters."
    )

    def __post_init__(self) -> None:
        check_options(self)
