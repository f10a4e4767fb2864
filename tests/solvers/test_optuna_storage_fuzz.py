"""A storage file that is not a database is refused in one line, never a traceback.

Random bytes (and random bytes behind SQLite's header, which SQLite itself then reads)
are written to the file a ``sqlite:///`` storage names: the solve either works (an
empty file is a new database) or raises :class:`ShardlabError` with ``field ==
"storage"``; no other exception escapes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardlab import Problem, ShardlabError
from shardlab.solvers import Budget, get_solver
from shardlab.solvers.optuna.storage import SQLITE_HEADER, check_storage_url

FUZZ = settings(
    max_examples=int(os.environ.get("SHARDLAB_FUZZ_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,  # the same inputs every run: CI is reproducible
    database=None,
)
PROBLEM = Problem.build("llama-3.1-8b", "h100x1", "chat")
CONTENTS = st.one_of(
    st.binary(max_size=4096),
    st.binary(max_size=4096).map(lambda b: SQLITE_HEADER + b),
    st.sampled_from([b"", b'{"study": "not a database"}\n', SQLITE_HEADER]),
)


def solve_with(url: str):
    return get_solver("optuna", storage=url).solve(PROBLEM, budget=Budget(max_evals=2))


@FUZZ
@given(CONTENTS)
def test_random_bytes_in_the_storage_file_work_or_are_refused(data: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="shardlab-storage-") as tmp:
        path = Path(tmp) / "study.db"
        path.write_bytes(data)
        try:
            r = solve_with(f"sqlite:///{path}")
        except ShardlabError as exc:
            assert exc.field == "storage"
            assert str(path) in exc.message and exc.fix
            assert "\n" not in str(exc) and "--" not in str(exc)
        else:
            assert r.status in ("optimal", "feasible") and r.n_evals >= 1


def test_a_json_file_is_refused_naming_the_file_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "some.json"
    path.write_text('{"a": 1}\n')
    with pytest.raises(ShardlabError) as caught:
        check_storage_url(f"sqlite:///{path}")
    assert caught.value.field == "storage"
    assert f"{path} is not an SQLite database" in caught.value.message
    assert "give the path of an SQLite database" in caught.value.fix


def test_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ShardlabError, match="is a folder, not a database file") as caught:
        solve_with(f"sqlite:///{tmp_path}")
    assert caught.value.field == "storage"


def test_an_unreadable_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "study.db"
    path.write_bytes(SQLITE_HEADER)
    if os.geteuid() == 0:  # root reads every file: the read fails as it would for a user

        def denied(self: Path, *args: object, **kwargs: object):
            raise PermissionError(13, "Permission denied", str(self))

        monkeypatch.setattr(Path, "open", denied)
    else:
        path.chmod(0)
    with pytest.raises(ShardlabError, match=r"cannot read .*Permission denied") as caught:
        check_storage_url(f"sqlite:///{path}")
    assert caught.value.field == "storage"


def test_a_path_through_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ShardlabError, match="does not exist") as caught:
        check_storage_url(f"sqlite:///{tmp_path / 'file.txt' / 'study.db'}")
    assert caught.value.field == "storage"


def test_the_command_line_refuses_a_json_storage_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "some.json").write_text('{"a": 1}\n')
    argv = ["solve", "--method", "optuna", "--max-evals", "2", "--model", "llama-3.1-8b"]
    argv += ["--cluster", "h100x1", "--storage", "sqlite:///some.json"]
    proc = subprocess.run(
        [sys.executable, "-m", "shardlab", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: ") and "some.json is not an SQLite database" in lines[0]
    assert "Traceback" not in proc.stderr
