"""Sphinx directives that render the recipes' options from the code, so the reference cannot drift from it.

``option-table``
    One table per argument dataclass named in the directive's content (one dotted path per line): every field's
    command-line name, type, default and ``help``. For subclasses of ``transformers.TrainingArguments`` only the
    fields declared (or re-declared with another default) in this project are listed.

``command-help``
    The ``--help`` text of a console entry point (``module:function``, called with ``["--help"]`` while
    ``sys.argv[0]`` is the ``:prog:`` option), for the commands whose options are plain ``argparse`` arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import io
import sys
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

PROJECT_PACKAGE = "robust_pretrain"


def import_object(dotted: str) -> Any:
    """``package.module.Name`` or ``package.module:function`` to the object it names."""
    module_name, _, attribute = dotted.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(module_name), attribute)


def declaring_class(cls: type, name: str) -> type:
    """The class of ``cls``'s MRO nearest to ``cls`` whose own annotations declare field ``name``."""
    for klass in cls.__mro__:
        if name in inspect.get_annotations(klass):
            return klass
    raise LookupError(f"{cls.__name__} has no annotation for {name}")


def project_fields(cls: type) -> list[dataclasses.Field]:
    """The dataclass fields of ``cls`` declared by classes of this project (inherited transformers fields left out)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__module__}.{cls.__qualname__} is not a dataclass")
    return [
        f
        for f in dataclasses.fields(cls)
        if f.init and declaring_class(cls, f.name).__module__.startswith(PROJECT_PACKAGE)
    ]


def default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    return repr(getattr(value, "value", value))  # enums by value, as on the command line


def type_text(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", repr(f.type))


def help_text(f: dataclasses.Field) -> str:
    text = f.metadata.get("help", "").replace("%%", "%")  # argparse's escape of a literal %
    if choices := f.metadata.get("choices"):
        text = f"{text} Choices: {', '.join(map(str, choices))}.".strip()
    accepted = f.metadata.get("accepted")  # robust_pretrain.options.Accepted: ranges are already in the help
    if getattr(accepted, "path", None):
        text = f"{text} Must be {accepted.describe()}.".strip()
    return text


def inherits_training_arguments(cls: type) -> bool:
    return any(k.__module__.startswith("transformers") and k.__name__ == "TrainingArguments" for k in cls.__mro__)


class OptionTable(SphinxDirective):
    """Tables of the options of argument dataclasses, read from their fields."""

    has_content = True

    def run(self) -> list[nodes.Node]:
        result: list[nodes.Node] = []
        for dotted in (line.strip() for line in self.content if line.strip()):
            try:
                cls = import_object(dotted)
                fields = project_fields(cls)
            except (ImportError, AttributeError, TypeError, LookupError) as err:
                raise self.error(f"option-table: cannot read {dotted}: {err}") from err
            title = nodes.paragraph()
            title += nodes.strong(text=cls.__name__)
            title += nodes.Text(" (")
            title += nodes.literal(text=dotted)
            title += nodes.Text(")")
            if inherits_training_arguments(cls):
                title += nodes.Text(
                    ": the options below, plus every option of transformers' TrainingArguments "
                    "(output_dir, learning_rate, max_steps, seed, report_to, ...)"
                )
            result += [title, self.table(cls, fields)]
        return result

    @staticmethod
    def table(cls: type, fields: list[dataclasses.Field]) -> nodes.table:
        headers = ("option", "type", "default", "help")
        table = nodes.table(classes=["option-table"])
        group = nodes.tgroup(cols=len(headers))
        table += group
        for width in (22, 14, 14, 50):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        head += OptionTable.row([nodes.paragraph(text=h) for h in headers])
        body = nodes.tbody()
        for f in fields:
            name = nodes.paragraph()
            name += nodes.literal(text=f"--{f.name}")
            kind = nodes.paragraph()
            kind += nodes.literal(text=type_text(f))
            default = nodes.paragraph()
            default += nodes.literal(text=default_text(f))
            body += OptionTable.row([name, kind, default, nodes.paragraph(text=help_text(f))])
        group += [head, body]
        return table

    @staticmethod
    def row(cells: list[nodes.Node]) -> nodes.row:
        row = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += cell
            row += entry
        return row


class CommandHelp(SphinxDirective):
    """The ``--help`` output of a console entry point, as a literal block."""

    required_arguments = 1
    option_spec = {"prog": directives.unchanged_required}

    def run(self) -> list[nodes.Node]:
        target = self.arguments[0]
        try:
            entry_point = import_object(target)
        except (ImportError, AttributeError) as err:
            raise self.error(f"command-help: cannot import {target}: {err}") from err
        output = io.StringIO()
        argv = sys.argv
        sys.argv = [self.options.get("prog", target)]  # argparse's default prog
        try:
            with contextlib.redirect_stdout(output), contextlib.suppress(SystemExit):
                entry_point(["--help"])
        finally:
            sys.argv = argv
        text = output.getvalue().strip()
        if not text.startswith("usage:"):
            raise self.error(f"command-help: {target}(['--help']) printed no usage text")
        return [nodes.literal_block(text, text, language="text")]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("option-table", OptionTable)
    app.add_directive("command-help", CommandHelp)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
