"""The shape DESIGN.md asks the code to keep, checked from the source (no imports run).

Data flows one way (problems → costmodel → solvers → the CLI); the module import graph
has no cycle, lazy imports inside functions included; a solver sees the cost model only
through the face ``shardlab.costmodel`` exports; errors raised below the CLI never name
a command-line flag (the CLI adds that advice); and no module outgrows one role.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "shardlab"
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """Every shardlab module ``path`` imports, at the top or inside a function, except
    under ``if TYPE_CHECKING`` (types only: nothing runs)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for n in ast.walk(node)}
    found: set[str] = set()
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path.parent)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m in _modules()}


@cache
def _graph() -> dict[str, set[str]]:
    return {name: _imports(path) - {name} for name, path in _modules().items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``edges`` (a depth-first search), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges.get(m, ())):
            if state.get(d) == 1:
                return [*stack[stack.index(d) :], d]
            if d not in state and (found := visit(d)) is not None:
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def test_the_import_graph_has_no_cycle() -> None:
    # A package's __init__ importing its own modules is how a package shows its face;
    # the edge from a module to its own package's face is not counted as a way back.
    edges = {
        m: {d for d in deps if not (m.startswith(d + ".") and _modules()[d].name == "__init__.py")}
        for m, deps in _graph().items()
    }
    cycle = _cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_search_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) is None


def test_lazy_imports_count() -> None:
    """An import inside a function is an edge too: that is how cycles hid before."""
    assert "shardlab.validation.serving_sample" in _graph()["shardlab.validation.loading"]
    assert "shardlab.solvers.cpsat.disagg" in _graph()["shardlab.solvers.solve"]


@pytest.mark.parametrize(
    ("layer", "may_not_import"),
    [
        ("problems", ("costmodel", "solvers", "cli", "compare", "validation", "launch")),
        ("costmodel", ("solvers", "cli", "compare", "validation", "launch")),
        ("solvers", ("cli", "compare", "validation")),
    ],
)
def test_data_flows_one_way(layer: str, may_not_import: tuple[str, ...]) -> None:
    wrong = sorted(
        f"{m} imports {d}"
        for m, deps in _graph().items()
        if _layer(m) == layer
        for d in deps
        if _layer(d) in may_not_import
    )
    assert not wrong, wrong


def test_solvers_see_only_the_cost_models_face() -> None:
    wrong = sorted(
        f"{m} imports {d}"
        for m, deps in _graph().items()
        if _layer(m) == "solvers"
        for d in deps
        if d.startswith("shardlab.costmodel.")
    )
    assert not wrong, wrong


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]+")
# another program's command line, quoted in a fix ('ray start --head'), is not ours
QUOTED = re.compile(r"'[^']*'")


def _error_texts(path: Path) -> list[tuple[int, str]]:
    """The string parts of every ``ShardlabError(...)`` raised in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ShardlabError":
            for part in ast.walk(node):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    out.append((node.lineno, part.value))
    return out


def test_errors_below_the_cli_name_inputs_not_flags() -> None:
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {text!r}"
        for name, path in _modules().items()
        if _layer(name) != "cli"
        for line, text in _error_texts(path)
        if FLAG.search(QUOTED.sub("", text))
    ]
    assert not wrong, "\n".join(wrong)


def test_the_flag_check_sees_a_flag() -> None:
    assert FLAG.search("use --space engine") and not FLAG.search("a so-called x--y")
    assert not FLAG.search(QUOTED.sub("", "start one with 'ray start --head'"))


def test_no_module_outgrows_one_role() -> None:
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in _modules().values()
        if (n := p.read_text().count("\n")) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}"
