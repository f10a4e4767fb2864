"""The shape DESIGN.md asks the code to keep, checked from the source (no imports run).

Each top-level package and module imports only what its entry in ``ALLOWED`` names (an
allow-list: a unit it does not name fails); packages import one another without a
cycle, and so do modules, lazy imports inside functions included; outside the cost
model only the face ``shardlab.costmodel`` exports is seen; errors raised below the CLI
never name a command-line flag (the CLI adds that advice); and no module outgrows one
role.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

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


# What each top-level package or module of shardlab may import (besides itself). Data flows
# one way, problems -> costmodel -> solvers -> sizing, with validation, compare and launch
# beside them and the CLI over all. A unit missing here fails the test: a new package
# states what it may see before it lands.
ALLOWED: dict[str, frozenset[str]] = {
    name: frozenset(deps)
    for name, deps in {
        "__init__": (),  # the lazy face: names resolved on first use, no import at load
        "__main__": ("cli", "errors"),
        "errors": (),
        "files": ("errors",),
        "executors": ("errors",),
        "problems": ("errors",),
        "costmodel": ("errors", "problems"),
        "simulate": ("errors", "problems", "costmodel"),
        "solvers": ("errors", "files", "problems", "costmodel", "simulate"),
        "sizing": ("errors", "files", "executors", "problems", "costmodel", "simulate", "solvers"),
        "validation": ("errors", "files", "problems", "costmodel", "simulate"),
        "compare": ("errors", "files", "executors", "problems", "costmodel", "solvers"),
        "launch": ("errors", "problems", "costmodel"),
        "envs": ("errors", "problems", "solvers"),
        "dtensor_check": ("errors", "problems", "costmodel"),
        "plots": ("errors", "files", "problems", "solvers", "simulate"),
        "bench": ("errors", "files", "problems", "costmodel", "simulate", "solvers", "sizing"),
        "cli": (
            "__init__",
            "errors",
            "files",
            "executors",
            "problems",
            "costmodel",
            "simulate",
            "solvers",
            "sizing",
            "validation",
            "compare",
            "launch",
            "envs",
            "dtensor_check",
            "plots",
            "bench",
        ),
    }.items()
}


def _unit(module: str) -> str:
    """The top-level package or module of shardlab that ``module`` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _faces() -> set[str]:
    """What other units may import of the cost model: its package face, and the modules
    the face itself re-exports as modules (``shardlab.costmodel.silicon``)."""
    tree = ast.parse(_modules()["shardlab.costmodel"].read_text())
    face = {"shardlab.costmodel"}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "shardlab.costmodel":
            face |= {f"shardlab.costmodel.{a.name}" for a in node.names}
    return face


def violations(graph: dict[str, set[str]], allowed: dict[str, frozenset[str]]) -> list[str]:
    """Every import ``allowed`` does not name, every unit it does not list, and every
    import of a cost-model module behind its face from outside the cost model."""
    found = sorted(
        f"{u} is not in the allow-list" for u in {_unit(m) for m in graph} if u not in allowed
    )
    face = _faces()
    for m, deps in sorted(graph.items()):
        if (u := _unit(m)) not in allowed:
            continue
        for d in sorted(deps):
            if (v := _unit(d)) != u and v not in allowed.get(u, frozenset()):
                found.append(f"{m} imports {d} ({u} may not import {v})")
            elif u != "costmodel" and v == "costmodel" and d not in face:
                found.append(f"{m} imports {d}, behind the cost model's face")
    return found


def _unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(_unit(m), set()).update(_unit(d) for d in deps if _unit(d) != _unit(m))
    return out


def test_every_import_is_allowed() -> None:
    wrong = violations(_graph(), ALLOWED)
    assert not wrong, "\n".join(wrong)


def test_the_packages_import_one_another_without_a_cycle() -> None:
    cycle = _cycle(_unit_graph(_graph()))
    assert cycle is None, "cycle between packages: " + " -> ".join(cycle or [])


def test_the_allow_list_catches_what_it_should() -> None:
    """Planted faults on a copy of the real graph: an upward import, an unnamed package,
    a cost-model internal seen from a solver, and a cycle between packages."""
    graph = {m: set(d) for m, d in _graph().items()}
    assert not violations(graph, ALLOWED)
    upward = {
        **graph,
        "shardlab.problems.model": graph["shardlab.problems.model"] | {"shardlab.solvers.solve"},
    }
    assert violations(upward, ALLOWED) == [
        "shardlab.problems.model imports shardlab.solvers.solve (problems may not import solvers)"
    ]
    unnamed = {**graph, "shardlab.newpkg.thing": {"shardlab.problems"}}
    assert violations(unnamed, ALLOWED) == ["newpkg is not in the allow-list"]
    internal = {
        **graph,
        "shardlab.solvers.grid": graph["shardlab.solvers.grid"] | {"shardlab.costmodel.regimes"},
    }
    assert violations(internal, ALLOWED) == [
        "shardlab.solvers.grid imports shardlab.costmodel.regimes, behind the cost model's face"
    ]
    lazy_cycle = {
        **graph,
        "shardlab.launch.servers": graph["shardlab.launch.servers"] | {"shardlab.cli.app"},
    }
    assert _cycle(_unit_graph(lazy_cycle)) is not None


def test_every_unit_of_the_allow_list_exists() -> None:
    """An entry for a package that is gone is a rule nobody reads."""
    assert set(ALLOWED) == {_unit(m) for m in _modules()}


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
        if _unit(name) != "cli"
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


def test_the_architecture_page_states_the_allow_list() -> None:
    """docs/architecture.md's table is the allow-list as written for people; it may not
    drift from the one the test holds."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+) \|$", page, re.M))
    for unit, deps in rows.items():
        named = set(re.findall(r"`(\w+)`", deps))
        if unit == "cli":
            assert deps == "every package above"
            named = set(rows) - {"cli"}
            assert named <= ALLOWED["cli"], unit
            continue
        assert named == ALLOWED[unit], unit
    assert set(ALLOWED) - set(rows) == {"__init__", "__main__", "errors", "files"}
