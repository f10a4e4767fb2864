"""The solvers see the cost model through its package face only, and never the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

import shardlab.solvers

SOLVERS = Path(shardlab.solvers.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports from (``from m import x``: ``m``; ``import m``: ``m``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_solvers_import_only_the_cost_models_face_and_not_the_cli() -> None:
    files = sorted(SOLVERS.rglob("*.py"))
    assert {"cpsat", "optuna"} <= {f.parent.name for f in files}
    for path in files:
        for name in imported_modules(path):
            where = f"{path.relative_to(SOLVERS)} imports {name}"
            assert name != "shardlab.cli" and not name.startswith("shardlab.cli."), where
            assert not name.startswith("shardlab.costmodel."), where


def test_the_check_sees_a_submodule_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from shardlab.costmodel.tables import degree_tables\nimport shardlab.cli\n")
    assert imported_modules(bad) == {"shardlab.costmodel.tables", "shardlab.cli"}
