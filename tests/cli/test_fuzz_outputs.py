"""Bad inputs, fuzzed (where results go and how runs are set: output
paths, storage URLs, numeric flags): every one is refused in one line on stderr
with status 2.

Hypothesis draws inputs that are wrong by construction (a config.json, a cluster, a
workload, a plan, an output path, a storage URL, a numeric flag) and runs the command
line in-process on each, in a fresh empty folder. Each must end with ``SystemExit(2)``
(any other exception fails the test with its traceback), print exactly one line on
stderr, starting ``error:``, and leave the folder as it found it. What the strategies
cover is listed with each; argv never holds a NUL (no shell can pass one).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.cli.conftest import (
    FUZZ,
    refused,
)

# -- output paths, storage URLs ---------------------------------------------------------

OUTPUT_PATHS = st.sampled_from(
    [
        "",  # nothing
        ".",  # a folder
        "missing/plan.json",  # under a folder that does not exist
        "file.txt/plan.json",  # under a regular file
        "/proc/shardlab-fuzz.json",  # a folder that takes no new file
    ]
)


def with_file(folder: Path) -> None:
    (folder / "file.txt").write_text("a regular file\n")


SOLVE = ["solve", "--method", "megatron", "--model", "llama-3.1-8b", "--cluster", "h100x2"]


@FUZZ
@given(
    OUTPUT_PATHS,
    st.sampled_from(["solve", "pareto", "calibrate", "validate", "train", "bench", "launch"]),
)
def test_bad_output_path_is_refused(path: str, command: str) -> None:
    argv = {
        "solve": [*SOLVE, "--out", path],
        "pareto": [*SOLVE, "--objective", "pareto", "--plot", path],
        "calibrate": ["calibrate", "--out", path],
        "validate": ["validate", "--out", path],
        "train": ["train-policy", "--suite", "llama8b-h100x2-chat", "--out", path],
        "bench": ["bench", "evaluator", "--out", path],
        "launch": ["launch", "--plan", "p.json", "--engine", "vllm", "--config-dir", path],
    }[command]
    if command in ("validate", "bench") and path.startswith("missing/"):
        return  # these create their report's folder
    if command == "launch" and path == ".":
        return  # a folder is what --config-dir names
    refused(argv, with_file)


def test_the_console_script_refuses_in_one_line(tmp_path: Path) -> None:
    """The whole process, as a shell runs it: ``python -m shardlab``."""
    for argv in (
        ["solve", "--max-evals", "0"],
        ["space", "--cluster", "h100x1000000000000"],
        ["evaluate", "--ttft-ms", "nan"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "shardlab", *argv],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (argv, proc.stderr)
        assert lines[0].startswith("error: ")
    proc = subprocess.run([sys.executable, "-m", "shardlab", "--version"], capture_output=True)
    assert proc.returncode == 0 and proc.stdout.decode().startswith("shardlab ")
    assert not list(tmp_path.iterdir())


@FUZZ
@given(
    st.sampled_from(["", "../outside", "a/b", ".", "..", "../../etc/x"]),
    st.sampled_from(["", "file.txt/results", "/proc/results"]),
)
def test_bad_comparison_folder_is_refused(name: str, results_dir: str) -> None:
    argv = ["compare", "--suite", "llama8b-h100x2-chat", "--methods", "megatron", "--seeds", "1"]
    if name:
        argv += ["--name", name]
    if results_dir:
        argv += ["--results-dir", results_dir]
    if not name and not results_dir:
        argv += ["--methods", ""]  # nothing to run
    refused(argv, with_file)


STORAGE_URLS = st.one_of(
    st.sampled_from(
        [
            "",
            "notaurl",
            "foo://x",
            "redis://localhost:6379",
            "sqlite:///missing/study.db",
            "sqlite:///file.txt/study.db",
            "sqlite:////proc/study.db",
            "postgresql+psycopg2://shardlab@127.0.0.1:1/none",  # nothing listens on port 1
            "mysql://user@localhost/db",  # no MySQL driver is installed
        ]
    ),
    st.from_regex(r"[a-z]{2,8}://[a-z]{1,8}", fullmatch=True).filter(
        lambda u: not u.startswith(("sqlite", "postgres", "mysql", "oracle", "mssql"))
    ),
)


@FUZZ
@given(STORAGE_URLS)
def test_bad_storage_url_is_refused(url: str) -> None:
    argv = ["solve", "--method", "optuna", "--max-evals", "2", "--model", "llama-3.1-8b"]
    refused([*argv, "--cluster", "h100x2", "--storage", url], with_file)


# -- numeric flags of the commands ---------------------------------------------------------

NUMERIC_FLAGS = st.sampled_from(
    [
        [*SOLVE, "--seed", "-1"],
        [*SOLVE, "--max-evals", "0"],
        [*SOLVE, "--max-evals", "abc"],
        [*SOLVE, "--time-limit", "0"],
        [*SOLVE, "--time-limit", "nan"],
        [*SOLVE, "--time-limit", "-5"],
        [*SOLVE, "--ttft-ms", "1"],  # an SLO no plan meets
        ["solve", "--method", "cpsat", "--model", "llama-3.1-8b", "--tpot-ms", "0.5"],
        ["solve", "--method", "cpsat", "--workers", "0"],
        ["solve", "--method", "nope"],
        ["solve", "--format", "xml"],
        ["evaluate", "--tp", "0"],
        ["evaluate", "--tp", "3"],
        ["evaluate", "--concurrency", "0"],
        ["explain", "--top", "abc"],
        ["compare", "--seeds", "0"],
        ["compare", "--jobs", "0"],
        ["compare", "--budgets", "a,b"],
        ["compare", "--budgets", "0,-5"],
        ["compare", "--time-limit", "nan", "--suite", "llama8b-h100x2-chat"],
        ["compare", "--executor", "slurm"],
        ["compare", "--aiconfigurator", "missing.csv", "--serving", "best"],
        ["compare", "--aiconfigurator", "missing.csv"],
        ["compare", "--serving", "disagg", "--methods", "anneal"],
        ["solve", "--serving", "disagg", "--method", "random"],
        ["solve", "--serving", "both"],
        ["compare", "--suite", "nope"],
        ["bench", "nothing"],
        ["launch", "--plan", "missing.json", "--engine", "vllm"],
        ["nosuchcommand"],
        ["solve", "--nosuchflag"],
    ]
)


@FUZZ
@given(NUMERIC_FLAGS)
def test_bad_flag_is_refused(argv: list[str]) -> None:
    refused(argv)
