"""Files written whole or not at all: plans, results, plots and policy checkpoints."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        tmp.chmod(_new_file_mode(target))
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through :func:`replacing`."""
    with replacing(path) as tmp:
        tmp.write_text(text)
