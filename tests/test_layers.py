"""The layers are real: every import of a project app is where a reader and import-linter see it.

The layers contract in pyproject.toml (run by ``make test`` through
``lint-imports``) says which layer may import which. It sees only the imports
it can find, so this test keeps the hiding places shut: an import of a
project app inside a function, and ``importlib`` loading one by name.

The one place a function may import an app is ``AppConfig.ready()``, which is
Django's own hook for connecting signals once every app is loaded. The top
package's process entry points (``llmgw.serve``, ``llmgw.gateway_server``)
import llmgw's own ASGI and Celery modules only after ``django.setup()``:
those are llmgw modules, not apps, and are not hidden from the contract
either way (nothing sits above ``llmgw``).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
APPS = ("core", "inventory", "catalog", "placement", "gateway", "observability", "api", "agentapi", "dashboard")
PACKAGES = (*APPS, "llmgw", "agent")


def _sources() -> list[Path]:
    files = []
    for package in PACKAGES:
        files += [p for p in (REPO / package).rglob("*.py") if "migrations" not in p.parts]
    return sorted(files)


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def _is_app(module: str) -> bool:
    return module.split(".")[0] in APPS


class _Finder(ast.NodeVisitor):
    """Collects function-local imports of apps and importlib calls that name one."""

    def __init__(self) -> None:
        self.stack: list[ast.AST] = []
        self.found: list[str] = []

    def _in_ready(self) -> bool:
        # ready() directly inside a class: AppConfig.ready, Django's hook for signals.
        return (
            len(self.stack) >= 2
            and getattr(self.stack[-1], "name", "") == "ready"
            and isinstance(self.stack[-2], ast.ClassDef)
        )

    def _scoped(self, node: ast.AST) -> None:
        self.stack.append(node)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        in_function = any(isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) for s in self.stack)
        if in_function and not self._in_ready():
            for module in _imported(node):
                if _is_app(module):
                    self.found.append(f"line {node.lineno}: imports {module} inside a function")

    visit_ImportFrom = visit_Import

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("import_module", "__import__") and node.args:
            first = node.args[0]
            if not isinstance(first, ast.Constant):
                self.found.append(f"line {node.lineno}: loads {ast.unparse(first)} through {name}")
            elif _is_app(str(first.value)):
                self.found.append(f"line {node.lineno}: loads {first.value} through {name}")
        self.generic_visit(node)


def _hidden_imports(path: Path) -> list[str]:
    finder = _Finder()
    finder.visit(ast.parse(path.read_text(), filename=str(path)))
    return finder.found


# The CLI picks a command's module by name so that ``llmgw ctl`` and the node
# commands start without Django; none of those modules is an app.
DYNAMIC_BY_DESIGN = {"llmgw/cli.py"}


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_app_is_imported_out_of_sight(path: Path) -> None:
    found = _hidden_imports(path)
    if str(path.relative_to(REPO)) in DYNAMIC_BY_DESIGN:
        from llmgw import cli

        assert not [m for m in cli.OWN_COMMANDS.values() if _is_app(m)], "the CLI loads only non-app modules"
        return
    assert not found, f"{path.relative_to(REPO)}: " + "; ".join(found)


def test_the_finder_sees_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import importlib\n"
        "from django.apps import AppConfig\n"
        "def f():\n    from placement.models import Shard\n"
        "def g():\n    return importlib.import_module('placement.signals')\n"
        "def h(name):\n    return importlib.import_module(name)\n"
        "class C(AppConfig):\n    def ready(self):\n        from dashboard import receivers\n"
        "def k():\n    import json\n"
    )
    found = _hidden_imports(sample)
    assert [line.split(":")[0] for line in found] == ["line 4", "line 6", "line 8"]


def test_the_layers_contract_has_no_exceptions() -> None:
    """The contract lists every app in a layer, and lets no import through by name."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = [c for c in contracts if c["type"] == "layers"]
    assert len(layers) == 1
    (contract,) = layers
    assert "ignore_imports" not in contract and "unmatched_ignore_imports_alerting" not in contract
    named = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
    assert named == {*APPS, "llmgw"}


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Each project module and the project modules its top level imports (``from a import b``: a.b if a module)."""
    modules = {_module_of(p): p for p in _sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            for target in _imported(node) or []:
                names = [f"{target}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else []
                found.update(n for n in names if n in modules)
                # ``from package import submodule`` is an import of the submodule; anything else, of the target.
                if target in modules and not (names and all(n in modules for n in names)):
                    found.add(target)
        graph[name] = found - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_no_module_imports_one_that_imports_it_back():
    """A reader follows imports one way; a circle (placement.signals → tasks → writes.reconciler → signals) hides
    which module is below which, and works only while nobody reorders an import."""
    assert _cycles(_import_graph()) == []


def test_the_circle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
