"""What several test modules share: data paths, the problems the budget tests and
benchmarks time (fixtures: built when a test asks, not on every worker's collection),
and running the CLI in-process."""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from shardlab import Problem

MODEL_DIR = Path(str(resources.files("shardlab.problems") / "data" / "models"))
DATA_DIR = Path(__file__).parent / "data"

MARGIN = 6.0  # seconds, for slow machines; the benchmark reports the real figure


def within_limit(wall: float, limit: float) -> bool:
    """The budget contract: a run ends within max(1 s, 2%) of its limit (plus MARGIN)."""
    return wall <= limit + max(1.0, 0.02 * limit) + MARGIN


def run_cli(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """``shardlab ARGS`` in this process: its exit code, stdout and stderr."""
    from shardlab.cli import main

    monkeypatch.setattr(sys, "argv", ["shardlab", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_process(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m shardlab.cli ARGS`` in a child process started in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "shardlab.cli", *args], capture_output=True, text=True, cwd=cwd
    )


@pytest.fixture(scope="session")
def hard() -> Problem:
    """No method finishes this in seconds: options per layer over 126 layers, scheduled
    statically (tests/solvers/test_budgets.py and the overrun benchmarks)."""
    return Problem.build(
        model="llama-3.1-405b", cluster="h100x32", workload="chat", tie="layer", schedule="static"
    )


@pytest.fixture(scope="session")
def enumerable() -> Problem:
    """Under exhaustive's size cap (0.9 M plans), still far more than seconds of pricing."""
    return Problem.build(model="llama-3.1-8b", cluster="h100x4", workload="chat")


@pytest.fixture
def llama8b_config() -> dict:
    return json.loads((MODEL_DIR / "meta-llama--Meta-Llama-3.1-8B.json").read_text())


def shared_result(factory: pytest.TempPathFactory, key: str, compute: Callable[[], Any]) -> Any:
    """``compute()`` once per test session, whichever xdist worker asks first (under a
    lock), its result shared with the others through a pickle in the session's base
    directory."""
    base = factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = shared / f"shared-{key}.pickle"
    with open(shared / f"shared-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            tmp = path.with_suffix(".partial")
            tmp.write_bytes(pickle.dumps(compute()))
            tmp.replace(path)
        return pickle.loads(path.read_bytes())


@pytest.fixture(scope="session")
def exhaustive_optimum(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], tuple[str, float]]:
    """``(status, objective)`` of exhaustive search on a suite instance, enumerated once
    per test session (:func:`shared_result`: the ground-truth tests of several modules
    ask for the same instances)."""
    from shardlab.problems.suite import get_instance
    from shardlab.solvers import Budget, solve

    def enumerate_(name: str) -> tuple[str, float]:
        r = solve(get_instance(name).problem(), "exhaustive", budget=Budget(max_evals=None))
        assert r.metrics is not None, r.message
        return r.status, r.metrics.objective

    def optimum(name: str) -> tuple[str, float]:
        return shared_result(tmp_path_factory, f"exhaustive-{name}", lambda: enumerate_(name))

    return optimum
