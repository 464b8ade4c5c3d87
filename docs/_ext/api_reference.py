"""The API reference from each package's ``__all__``: one page per package listing what it exports (an autosummary
table, each object on a page of its own), the root package's names first as "start here"; modules that export
nothing (recipe internals) are left out. Also keeps Napoleon from reading an attribute comment ``#: a: b`` as the
type ``a`` with the description ``b``.

The package pages are written into ``api/packages/`` (not committed) when the configuration is read.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

ROOT = "robust_pretrain"
#: the packages whose exports make the reference, in the order of the landing page, with a line on each
PACKAGES = {
    "robust_pretrain": "Start here: the trainer, its arguments and the weighting registry.",
    "robust_pretrain.weighting": "Weighting strategies (one per module), loss normalisation, automatic alpha.",
    "robust_pretrain.data": "Text data: task specs, tagging, preprocessing, collators, domains.",
    "robust_pretrain.vision": "Images: the multi-modal MAE (Auto-registered), its processor, collator and heads.",
    "robust_pretrain.glue": "GLUE tasks, loading and fine-tuning.",
    "robust_pretrain.evaluation": "The downstream suite: tasks x seeds x checkpoints, worst task.",
    "robust_pretrain.reporting": "Cards, plots, tables, scoring and statistics.",
}


def package_page(package: str, names: list[str], summary: str) -> str:
    title = f"``{package}``"
    lines = [title, "=" * len(title), "", summary, "", f".. automodule:: {package}", "   :no-members:", ""]
    lines += [f".. currentmodule:: {package}", "", ".. autosummary::", "   :toctree: ../generated", ""]
    lines += [f"   {name}" for name in names] + [""]
    return "\n".join(lines)


def defining_name(package: str, name: str, value: Any) -> str:
    """The export's name for autosummary, relative to ``package``: a class or function as exported (autodoc follows
    it to its module) unless the submodule of its name hides it (a lazy export), a constant by its defining module
    (its ``#:`` comment is there, not in the package's ``__init__``)."""
    if inspect.isclass(value) or inspect.isroutine(value):
        if inspect.ismodule(getattr(sys.modules[package], name)):  # by its module
            return f"{value.__module__.removeprefix(package + '.')}.{name}"
        return name
    for module_name, module in sorted(sys.modules.items()):
        if module_name.startswith(f"{package}.") and getattr(module, name, None) is value and module.__file__:
            if re.search(rf"^{name}\s*[:=]", Path(module.__file__).read_text(), re.MULTILINE):
                return f"{module_name.removeprefix(package + '.')}.{name}"
    return name


def own_parts(cls: type, documented: set[int]) -> list[type]:
    """The package's own mixins that ``cls`` is assembled from (plain classes, such as the trainer's parts) and that
    the reference does not document on a page of their own."""
    return [
        base
        for base in cls.__mro__[1:]
        if base.__module__.startswith(f"{ROOT}.") and base.__bases__ == (object,) and id(base) not in documented
    ]


def write_pages(app: Any, config: Any) -> None:
    folder = Path(app.srcdir) / "api" / "packages"
    folder.mkdir(parents=True, exist_ok=True)
    documented: set[int] = set()
    classes: dict[str, type] = {}
    for package, summary in PACKAGES.items():
        module = importlib.import_module(package)
        names = []
        for name in module.__all__:  # an object re-exported by an earlier package is documented there
            value = getattr(module, name)
            if id(value) not in documented and not inspect.ismodule(value):
                documented.add(id(value))
                names.append(defining_name(package, name, value))
                if inspect.isclass(value):
                    classes[f"{package}.{name}"] = value
        (folder / f"{package}.rst").write_text(package_page(package, names, summary))
    # a class assembled from undocumented mixins shows their members as its own, and no other base's (read by the
    # class template: autodoc's inherited-members leaves out the members of the bases it names)
    parts = {name: own_parts(cls, documented) for name, cls in classes.items()}
    config.autosummary_context["inherited_from_parts"] = {
        name: ", ".join(base.__name__ for base in classes[name].__mro__[1:] if base not in parts[name])
        for name in classes
        if parts[name]
    }
    app.undocumented_parts = {id(part) for each in parts.values() for part in each}


def bases_without_parts(app: Any, name: str, obj: Any, options: Any, bases: list[Any]) -> None:
    """A class's bases as the reader knows them: the undocumented parts it is assembled from left out."""
    bases[:] = [base for base in bases if id(base) not in getattr(app, "undocumented_parts", ())]


#: an attribute's comment as written, between the two docstring hooks
_ATTRIBUTE_COMMENTS: dict[str, list[str]] = {}


def keep_attribute_comment(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """An attribute's or constant's comment is a description: its first line is not ``type: description``.

    Napoleon reads the first line of an attribute's docstring as ``type: description`` (a blank line put before it
    does not help: Napoleon skips leading blank lines), so the comment is kept as written before Napoleon runs
    and put back after it."""
    if what in ("attribute", "data"):
        _ATTRIBUTE_COMMENTS[name] = list(lines)


def restore_attribute_comment(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    kept = _ATTRIBUTE_COMMENTS.pop(name, None)
    if what in ("attribute", "data") and kept is not None:
        lines[:] = kept


def setup(app: Any) -> dict[str, Any]:
    app.connect("config-inited", write_pages)  # before Sphinx lists the sources and autosummary writes its stubs
    app.connect("autodoc-process-docstring", keep_attribute_comment, priority=400)  # before Napoleon's (500)
    app.connect("autodoc-process-docstring", restore_attribute_comment, priority=600)  # and after it
    app.connect("autodoc-process-bases", bases_without_parts)
    return {"parallel_read_safe": True}
