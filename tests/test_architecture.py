"""The import rules of docs/architecture.md hold for the code: floors, allowed exceptions, light packages.

The page is the single source of the rules: its tables are parsed here, and every import of the package (parsed with
``ast``, type-checking-only imports left out) is checked against them.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = REPO_ROOT / "robust_pretrain"
PAGE = REPO_ROOT / "docs" / "architecture.md"
ROOT = "robust_pretrain"  # the package root itself, as an importer


def page_table(text: str, name: str) -> list[list[str]]:
    """The body rows (cells) of the Markdown table right after the ``<!-- architecture: NAME ... -->`` marker."""
    match = re.search(rf"<!-- architecture: {name}\b.*?-->\n((?:\|.*\n?)+)", text)
    if match is None:
        raise AssertionError(f"{PAGE} has no table marked <!-- architecture: {name} -->")
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in match.group(1).splitlines()]
    return rows[2:]  # header and separator


def names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def floors(text: str) -> dict[str, int]:
    placed: dict[str, int] = {}
    for floor, packages, _ in page_table(text, "floors"):
        for package in names(packages):
            assert package not in placed, f"{package} is on two floors of {PAGE.name}"
            placed[package] = int(floor)
    return placed


def exceptions(text: str) -> set[tuple[str, str]]:
    return {
        (names(importer)[0], imported)
        for importer, targets, _ in page_table(text, "exceptions")
        for imported in names(targets)
    }


def third_party_allowed(text: str) -> dict[str, set[str]]:
    """Package or module (its dotted path in the package, e.g. ``trainer.task_metrics``) -> the third-party imports
    it may make."""
    return {names(package)[0]: set(names(allowed)) for package, allowed in page_table(text, "third-party")}


def top_level_packages(package_dir: Path) -> set[str]:
    """Sub-packages and modules directly under the package (``__init__`` and private helpers excluded)."""
    found = {p.name for p in package_dir.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    found |= {p.stem for p in package_dir.glob("*.py") if p.stem != "__init__"}
    return found


def owner(path: Path, package_dir: Path) -> str:
    """The top-level package (or module) a source file belongs to; the root ``__init__`` is the root."""
    parts = path.relative_to(package_dir).with_suffix("").parts
    return ROOT if parts == ("__init__",) else parts[0]


def runtime_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement except those under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported_modules(node: ast.Import | ast.ImportFrom, path: Path, package_dir: Path) -> list[str]:
    """Absolute dotted names a statement imports (relative imports resolved against ``path``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level == 0:
        return [node.module or ""]
    base = [package_dir.name, *path.relative_to(package_dir).parent.parts]
    base = base[: len(base) - (node.level - 1)]
    if node.module:
        return [".".join([*base, node.module])]
    return [".".join([*base, alias.name]) for alias in node.names]


def module_third_party_imports(package_dir: Path) -> dict[str, dict[str, list[str]]]:
    """Module (dotted path in the package) -> third-party package it imports -> where."""
    found: dict[str, dict[str, list[str]]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        module = ".".join(path.relative_to(package_dir).with_suffix("").parts)
        for node in runtime_imports(ast.parse(path.read_text(), filename=str(path))):
            for imported in imported_modules(node, path, package_dir):
                top = imported.split(".")[0]
                if top not in (package_dir.name, "__future__") and top not in sys.stdlib_module_names:
                    where = f"{path.relative_to(package_dir.parent)}:{node.lineno}"
                    found.setdefault(module, {}).setdefault(top, []).append(where)
    return found


def package_imports(package_dir: Path) -> dict[tuple[str, str], list[str]]:
    """``(importer, imported) -> [where]`` for imports between distinct top-level packages, and
    ``(importer, "third-party:NAME") -> [where]`` for imports from outside the package and the standard library."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        importer = owner(path, package_dir)
        for node in runtime_imports(ast.parse(path.read_text(), filename=str(path))):
            for module in imported_modules(node, path, package_dir):
                parts = module.split(".")
                if parts[0] == package_dir.name:
                    imported = parts[1] if len(parts) > 1 else ROOT
                    if imported == importer:
                        continue
                elif parts[0] in sys.stdlib_module_names or parts[0] == "__future__":
                    continue
                else:
                    imported = f"third-party:{parts[0]}"
                where = f"{path.relative_to(package_dir.parent)}:{node.lineno}"
                edges.setdefault((importer, imported), []).append(where)
    return edges


def missing_modules(package_dir: Path) -> list[str]:
    """Imports of a module of the package that is no file of it (e.g. a moved module's old name, which
    ``robust_pretrain.MOVED_MODULES`` keeps importable for saved files only)."""
    problems = []
    for path in sorted(package_dir.rglob("*.py")):
        for node in runtime_imports(ast.parse(path.read_text(), filename=str(path))):
            for module in imported_modules(node, path, package_dir):
                parts = module.split(".")
                if parts[0] != package_dir.name:
                    continue
                target = package_dir.parent.joinpath(*parts)
                if not (target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()):
                    problems.append(f"{path.relative_to(package_dir.parent)}:{node.lineno} imports {module}, no module")
    return problems


def violations(package_dir: Path, page_text: str) -> list[str]:
    """Every way the package breaks the page's rules, one line each (empty when it keeps them)."""
    placed = floors(page_text)
    allowed = exceptions(page_text)
    light = third_party_allowed(page_text)
    problems = [
        f"{name}: no floor of {PAGE.name} names it" for name in sorted(top_level_packages(package_dir) - set(placed))
    ]
    problems += [
        f"{name}: on a floor of {PAGE.name} but not in the package"
        for name in sorted(set(placed) - top_level_packages(package_dir))
    ]
    edges = package_imports(package_dir)
    for (importer, imported), where in sorted(edges.items()):
        if imported.startswith("third-party:"):
            name = imported.split(":", 1)[1]
            if importer in light and name not in light[importer]:
                problems.append(
                    f"{importer} imports {name} (allowed: {sorted(light[importer]) or 'nothing'}) at {where[0]}"
                )
            continue
        if (importer, imported) in allowed:
            continue
        if importer == ROOT or imported == ROOT or placed.get(imported, -1) >= placed.get(importer, -1):
            problems.append(
                f"{importer} (floor {placed.get(importer, '?')}) imports {imported} "
                f"(floor {placed.get(imported, '?')}) at {', '.join(where)}"
            )
    problems += [f"exception {a} -> {b} is not used any more" for a, b in sorted(allowed - set(edges))]
    problems += missing_modules(package_dir)
    by_module = module_third_party_imports(package_dir)
    for module in sorted(name for name in light if "." in name):
        if not (package_dir / f"{module.replace('.', '/')}.py").is_file():
            problems.append(f"{module}: named in the third-party table of {PAGE.name} but not in the package")
        for name, where in sorted(by_module.get(module, {}).items()):
            if name not in light[module]:
                problems.append(
                    f"{module} imports {name} (allowed: {sorted(light[module]) or 'nothing'}) at {where[0]}"
                )
    return problems


def test_package_keeps_the_import_rules_of_the_architecture_page() -> None:
    problems = violations(PACKAGE, PAGE.read_text())
    assert not problems, "docs/architecture.md import rules broken:\n" + "\n".join(problems)


def test_text_and_vision_never_import_each_other() -> None:
    edges = package_imports(PACKAGE)
    text = {"data", "glue"}
    crossing = [(a, b) for a, b in edges if (a in text and b == "vision") or (a == "vision" and b in text)]
    assert not crossing, crossing


def test_weighting_imports_only_torch_and_the_standard_library() -> None:
    outside = {b for a, b in package_imports(PACKAGE) if a == "weighting" and b.startswith("third-party:")}
    assert outside <= {"third-party:torch"}, outside


@pytest.fixture
def toy_package(tmp_path: Path) -> Path:
    package = tmp_path / "robust_pretrain"
    for sub in ("low", "high"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "low" / "core.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..high import thing\nimport torch\n"
    )
    (package / "high" / "user.py").write_text("from robust_pretrain.low import core\n")
    return package


TOY_PAGE = """
<!-- architecture: floors -->
| floor | packages | role |
|---|---|---|
| 1 | `high` | |
| 0 | `low` | |

<!-- architecture: exceptions -->
| package | may import | why |
|---|---|---|

<!-- architecture: third-party -->
| package | third-party imports allowed |
|---|---|
| `low` | `torch` |
"""


def test_checker_accepts_downward_and_type_checking_imports(toy_package: Path) -> None:
    assert violations(toy_package, TOY_PAGE) == []


def test_checker_reports_an_import_of_a_module_that_is_not_there(toy_package: Path) -> None:
    (toy_package / "high" / "old.py").write_text("from robust_pretrain.low.moved import thing\n")
    assert violations(toy_package, TOY_PAGE) == [
        "robust_pretrain/high/old.py:1 imports robust_pretrain.low.moved, no module"
    ]


def test_checker_reports_an_upward_import_inside_a_function(toy_package: Path) -> None:
    (toy_package / "low" / "late.py").write_text("def f():\n    from robust_pretrain.high import user\n")
    (problem,) = violations(toy_package, TOY_PAGE)
    assert problem.startswith("low (floor 0) imports high (floor 1) at robust_pretrain/low/late.py:2")


def test_checker_reports_a_forbidden_third_party_import_and_an_unplaced_package(toy_package: Path) -> None:
    (toy_package / "low" / "heavy.py").write_text("import transformers\n")
    (toy_package / "extra.py").write_text("")
    problems = violations(toy_package, TOY_PAGE)
    assert "extra: no floor of architecture.md names it" in problems
    assert any(p.startswith("low imports transformers (allowed: ['torch'])") for p in problems)


def test_checker_reports_a_third_party_import_of_a_light_module_inside_a_package(toy_package: Path) -> None:
    (toy_package / "high" / "light.py").write_text("import numpy\n")
    page = TOY_PAGE + "| `high.light` | none |\n| `high.gone` | none |\n"
    assert violations(toy_package, page) == [
        "high.gone: named in the third-party table of architecture.md but not in the package",
        "high.light imports numpy (allowed: nothing) at robust_pretrain/high/light.py:1",
    ]


# --- one home per concern (docs/architecture.md, "House rules") ------------------------------------------------------

#: the longest a library module and a function may be, in lines (no exceptions: a larger room is split)
MODULE_LINES, FUNCTION_LINES = 600, 80
#: what only reporting/ builds: a recipe hands its results over instead of building a card itself
CARD_BUILDERS = ("ModelCardContent", "FineTuningCardContent")


def house_problems(package_dir: Path) -> list[str]:
    """Private names imported across modules, cards built outside reporting/, function-local imports and import
    cycles inside reporting/, and rooms larger than the limits, one line each."""
    problems, reporting_edges = [], set()
    for path in sorted(package_dir.rglob("*.py")):
        name = path.relative_to(package_dir.parent).as_posix()
        tree = ast.parse(path.read_text(), filename=str(path))
        lines = len(path.read_text().splitlines())
        if lines > MODULE_LINES:
            problems.append(f"{name}: {lines} lines (at most {MODULE_LINES})")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > FUNCTION_LINES:
                    problems.append(f"{name}:{node.name}: {size} lines (at most {FUNCTION_LINES})")
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(package_dir.name)):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private:
                    problems.append(f"{name}:{node.lineno} imports the private {', '.join(private)} of {node.module}")
            if path.parent.name == "pretraining" and isinstance(node, ast.Call):
                called = ast.unparse(node.func).rsplit(".", 1)[-1]
                if called in CARD_BUILDERS:
                    problems.append(f"{name}:{node.lineno} builds a {called}: cards are built in reporting/")
        if path.parent.name == "reporting":
            for node in runtime_imports(tree):
                for module in imported_modules(node, path, package_dir):
                    if module.startswith(f"{package_dir.name}.reporting.") and module.split(".")[-1] != path.stem:
                        reporting_edges.add((path.stem, module.split(".")[-1]))
                        if node.col_offset:
                            problems.append(f"{name}:{node.lineno} imports {module} inside a function")
    problems += [f"reporting/ import cycle: {' -> '.join(cycle)}" for cycle in cycles(reporting_edges)]
    return problems


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """One cycle through each node that lies on one (depth-first search)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    found = []

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == path[0]:
                found.append([*path, nxt])
            elif nxt not in path and nxt > path[0]:  # each cycle once, from its smallest node
                walk(nxt, [*path, nxt])

    for start in sorted(graph):
        walk(start, [start])
    return found


def test_the_package_keeps_the_house_rules() -> None:
    problems = house_problems(PACKAGE)
    assert not problems, "one home per concern, small rooms:\n" + "\n".join(problems)


def test_house_rules_catch_a_private_import_a_card_in_a_recipe_a_reporting_cycle_and_a_big_room(tmp_path) -> None:
    package = tmp_path / "robust_pretrain"
    for sub in ("pretraining", "reporting"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "pretraining" / "one.py").write_text("def _helper():\n    pass\n")
    (package / "pretraining" / "two.py").write_text(
        "from robust_pretrain.pretraining.one import _helper\n"
        "from robust_pretrain.reporting.cards import ModelCardContent\n"
        "card = ModelCardContent(title='x')\n"
    )
    (package / "reporting" / "cards.py").write_text("from robust_pretrain.reporting.plots import draw\n")
    (package / "reporting" / "plots.py").write_text("def draw():\n    from robust_pretrain.reporting.cards import x\n")
    (package / "big.py").write_text("x = 1\n" * 601 + "def f():\n" + "    pass\n" * 80)
    problems = house_problems(package)
    assert problems == [
        "robust_pretrain/big.py: 682 lines (at most 600)",
        "robust_pretrain/big.py:f: 81 lines (at most 80)",
        "robust_pretrain/pretraining/two.py:1 imports the private _helper of robust_pretrain.pretraining.one",
        "robust_pretrain/pretraining/two.py:3 builds a ModelCardContent: cards are built in reporting/",
        "robust_pretrain/reporting/plots.py:2 imports robust_pretrain.reporting.cards inside a function",
        "reporting/ import cycle: cards -> plots -> cards",
    ]


# --- __all__ means public: a module exports what it defines ---------------------------------------------------------


def defined_names(body: list[ast.stmt]) -> set[str]:
    """The names a module's own statements bind at module level (imports left out; `if`/`try` blocks looked into)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody"):
                names |= defined_names(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                names |= defined_names(handler.body)
    return names


def foreign_exports(package_dir: Path) -> list[str]:
    """Each name a module's ``__all__`` lists but the module does not define, one line each (a package's
    ``__init__`` may export its modules' names)."""
    problems = []
    for path in sorted(package_dir.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        exported = [
            element.value
            for node in tree.body
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
            for element in ast.walk(node.value)
            if isinstance(element, ast.Constant) and isinstance(element.value, str)
        ]
        foreign = sorted(set(exported) - defined_names(tree.body))
        if foreign:
            name = path.relative_to(package_dir.parent).as_posix()
            problems.append(f"{name}: __all__ lists {', '.join(foreign)}, defined elsewhere")
    return problems


def test_a_module_exports_only_the_names_it_defines() -> None:
    problems = foreign_exports(PACKAGE)
    assert not problems, "__all__ means public: import a name from the module that defines it\n" + "\n".join(problems)


def test_the_export_check_catches_a_reexported_name_and_spares_package_inits(tmp_path: Path) -> None:
    package = tmp_path / "robust_pretrain"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "__init__.py").write_text("from .own import VALUE, helper\n__all__ = ['VALUE', 'helper']\n")
    (package / "sub" / "own.py").write_text(
        "from pathlib import Path\nVALUE: int = 1\ntry:\n    X = 2\nexcept ImportError:\n    pass\n"
        "def helper():\n    pass\n__all__ = ['VALUE', 'X', 'helper']\n"
    )
    assert foreign_exports(package) == []
    (package / "sub" / "facade.py").write_text(
        "from .own import helper\nfrom pathlib import Path\n__all__ = ['Path', 'helper']\n"
    )
    assert foreign_exports(package) == ["robust_pretrain/sub/facade.py: __all__ lists Path, helper, defined elsewhere"]


def test_the_packages_export_each_public_name_for_one_object_only() -> None:
    """No two public classes (or functions, constants) share a name: ``TaskSpec`` is the PoS task spec only."""
    import importlib

    exported: dict[str, dict[int, str]] = {}
    for init in sorted(PACKAGE.rglob("__init__.py")):
        package = ".".join(init.parent.relative_to(PACKAGE.parent).parts)
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", ()):
            exported.setdefault(name, {}).setdefault(id(getattr(module, name)), package)
    clashes = {name: sorted(owners.values()) for name, owners in exported.items() if len(owners) > 1}
    assert not clashes, clashes
