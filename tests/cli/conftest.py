"""The fuzz tests' harness: run the command line in-process in a fresh folder and
check that a bad input is refused in one line with status 2, leaving no file."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from shardlab.cli import main

MODEL_DIR = Path(str(resources.files("shardlab.problems") / "data" / "models"))

FUZZ = settings(
    max_examples=int(os.environ.get("SHARDLAB_FUZZ_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # the same inputs every run: CI is reproducible
    database=None,
)

# A folder's contents, recursively, as relative paths.
Listing = frozenset[str]


def listing(folder: Path) -> Listing:
    return frozenset(str(p.relative_to(folder)) for p in folder.rglob("*"))


def run(argv: list[str], folder: Path) -> tuple[object, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    with (
        contextlib.chdir(folder),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def refused(argv: list[str], prepare: Callable[[Path], None] | None = None) -> str:
    """Run ``argv`` in a fresh folder (``prepare`` writes its input files there) and
    check the refusal; returns the error line."""
    with tempfile.TemporaryDirectory(prefix="shardlab-fuzz-") as tmp:
        folder = Path(tmp)
        if prepare is not None:
            prepare(folder)
        before = listing(folder)
        code, _out, err = run(argv, folder)
        lines = err.strip().splitlines()
        assert code == 2, (argv, code, err[-2000:])
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err[-2000:])
        assert "Traceback" not in err
        assert listing(folder) == before, (argv, listing(folder) - before)
        return lines[0]


def write(name: str, data: str | bytes) -> Callable[[Path], None]:
    def prepare(folder: Path) -> None:
        path = folder / name
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)

    return prepare


# -- values that no integer or size field takes ---------------------------------------

BAD_COUNTS = st.sampled_from([0, -1, -(10**12), 2.5, "8", True, [], {}, 10**12, 10**40])
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])


def json_text(value: object) -> str:
    return json.dumps(value, allow_nan=True)  # NaN and Infinity: JSON as Python writes it
