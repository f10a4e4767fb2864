"""Files are replaced whole: the old content or the new, never a temporary left over."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from shardlab.files import replacing, write_text


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_file_gets_the_mode_open_would_give(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "plan.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "plan.json").read_text() == "{}"
    assert _mode(tmp_path / "plan.json") == 0o644  # not mkstemp's 0600
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "summary.md"
    target.write_text("old")
    target.chmod(0o640)
    write_text(target, "new")
    assert target.read_text() == "new"
    assert _mode(target) == 0o640


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, error: type[BaseException]
) -> None:
    target = tmp_path / "results.json"
    target.write_text("old")
    with pytest.raises(error), replacing(target) as tmp:
        tmp.write_text("half")
        raise error
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_concurrent_writers_get_their_own_temporary(tmp_path: Path) -> None:
    target = tmp_path / "policy.pt"
    with replacing(target) as a, replacing(target) as b:
        assert a != b
        a.write_text("a")
        b.write_text("b")
    assert target.read_text() == "a"  # the outer block ends last and wins
