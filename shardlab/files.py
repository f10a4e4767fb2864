"""Files written whole or not at all: plans, results, plots and policy checkpoints; and
the markdown table, the one way every report of shardlab writes one (results/, docs)."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from shardlab.errors import ShardlabError


def _new_file_mode(target: Path) -> int:
    """The mode ``open(target, "w")`` would leave: the old file's, else 0666 less umask.

    ``mkstemp`` creates its file 0600, which would make every replaced file private.
    """
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary path next to ``path``; when the block ends normally the
    file written there replaces ``path`` in one rename.

    Readers see the old file or the new one, never part of one. If the block raises (an
    error, Ctrl-C) the temporary file is removed and ``path`` is left as it was. Each
    call gets its own temporary name, so concurrent writers do not clobber each other's
    half-written files.
    """
    target = Path(path)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _unwritable(target, exc) from None
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        tmp.chmod(_new_file_mode(target))
        os.replace(tmp, target)
    except OSError as exc:
        raise _unwritable(target, exc) from None
    finally:
        tmp.unlink(missing_ok=True)


def _unwritable(target: Path, exc: OSError) -> ShardlabError:
    return ShardlabError(
        f"{target}: cannot write it ({exc.strerror or exc}); give a path in a directory "
        "you can write"
    )


def check_output_file(path: str | Path, *, flag: str, parents: bool = False) -> Path:
    """Refuse now, before any work, a file the command could not write when done: an
    empty path, a directory, a missing parent directory (``parents``: the command
    creates it, so it must be creatable) or one that takes no new file (``/proc``,
    read-only). Nothing is left behind by the check."""
    text = str(path)
    if not text.strip() or "\0" in text:
        raise ShardlabError(f"{flag} {text!r}: give a file path")
    target = Path(text)
    if target.is_dir():
        raise ShardlabError(f"{flag} {text}: is a directory; give a file path")
    parent = target.parent
    if parents and not parent.exists():
        check_output_dir(parent, flag=flag)
        return target
    if not parent.is_dir():
        what = "is a file, not a directory" if parent.exists() else "does not exist"
        raise ShardlabError(f"{flag} {text}: {parent} {what}; write elsewhere")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise ShardlabError(
            f"{flag} {text}: cannot create a file in {parent} ({exc.strerror or exc}); "
            "write elsewhere"
        ) from None
    os.close(fd)
    os.unlink(probe)
    return target


def check_output_dir(path: str | Path, *, flag: str) -> Path:
    """Refuse now a directory the command could not create or write into: its nearest
    existing ancestor must be a writable directory. Nothing is created by the check."""
    text = str(path)
    if not text.strip() or "\0" in text:
        raise ShardlabError(f"{flag} {text!r}: give a directory path")
    target = Path(text)
    existing = target
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise ShardlabError(
            f"{flag} {text}: {existing} is a file, not a directory; write elsewhere"
        )
    try:  # a probe, not os.access: root passes access() where mkdir fails (/proc)
        os.rmdir(tempfile.mkdtemp(prefix=".shardlab-", dir=existing))
    except OSError as exc:
        raise ShardlabError(
            f"{flag} {text}: cannot create a directory in {existing} ({exc.strerror or exc}); "
            "write elsewhere"
        ) from None
    return target


def make_dir(path: Path) -> Path:
    """``path`` and its parents, created; a failure is the user's to fix, in one line."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ShardlabError(
            f"{path}: cannot create the directory ({exc.strerror or exc}); write elsewhere"
        ) from None
    return path


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through :func:`replacing`."""
    with replacing(path) as tmp:
        tmp.write_text(text)


def folder_name(name: str) -> str:
    """``name`` as one folder inside another: not empty, no path separators, not a
    dot name (``compare --name ../../x`` must not write outside the results)."""
    if not name.strip() or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise ShardlabError(
            f"{name!r} is not one folder name (no '/', not '.' or '..')",
            field="name",
            fix="e.g. my-comparison",
        )
    return name


_RULES = {"l": "---", "r": "---:"}


def markdown_table(head: Sequence[str], align: str, rows: Iterable[Sequence[object]]) -> list[str]:
    """A GitHub-flavoured markdown table as lines: the header, the rule, one line per row.

    ``align`` has one letter per column, ``l`` (left) or ``r`` (right: numbers). Cells
    are written as ``str`` gives them, unescaped: a ``|`` inside one must come as ``\\|``.
    """
    if len(align) != len(head) or set(align) - set(_RULES):
        raise ValueError(f"align {align!r}: one of 'l' or 'r' per column of {list(head)}")
    lines = [_line(head, len(head)), "|" + "".join(_RULES[a] + "|" for a in align)]
    lines += [_line([str(c) for c in row], len(head)) for row in rows]
    return lines


def _line(cells: Sequence[str], width: int) -> str:
    if len(cells) != width:
        raise ValueError(f"a row of {len(cells)} cells in a table of {width} columns: {cells}")
    return "| " + " | ".join(cells) + " |"
