"""Finished runs of a comparison, on disk as they finish, so that a re-run resumes.

One JSON line per finished run, appended with one ``write`` and ``fsync``-ed: a run
is on disk once reported, and a process killed while writing leaves at most a torn
last line, which the next reader drops (and rewrites the file without). Each line
holds the run's key (everything that defines the run: instance, method and its
options, seed, budgets, kernel timing, engine, space) and its record.

A comparison's ``results.json`` holds the same records, each with its key (a run read
at several budgets appears once per budget, :func:`is_whole_run` telling its own):
:meth:`Journal.start_from` fills an absent journal from it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardlab.errors import ShardlabError
from shardlab.files import make_dir, write_text

JOURNAL = "runs.jsonl"


def is_whole_run(record: dict[str, Any]) -> bool:
    """Whether a comparison's record is its run's own, not the run read at a smaller
    budget than it ran (:func:`shardlab.compare.run_comparison`)."""
    return record.get("budget") in (None, record.get("task_max_evals"))


class Journal:
    """The finished runs of one comparison folder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs: dict[str, dict[str, Any]] = {}
        if path.exists():
            self._read()

    def _read(self) -> None:
        text = self.path.read_text()
        lines = text.splitlines()
        kept = []
        for i, line in enumerate(lines):
            try:
                entry = json.loads(line)
                key, record = entry["key"], entry["run"]
            except (json.JSONDecodeError, KeyError, TypeError):
                if i == len(lines) - 1:  # torn by a kill while it was written
                    break
                raise ShardlabError(
                    f"{self.path}: line {i + 1} is not a finished run; delete the file to "
                    "start the comparison over"
                ) from None
            self.runs[key] = record
            kept.append(line)
        if len(kept) < len(lines) or (text and not text.endswith("\n")):
            # (a kill can also leave a whole record without its newline)
            write_text(self.path, "".join(f"{line}\n" for line in kept))

    def __contains__(self, key: str) -> bool:
        return key in self.runs

    def __iter__(self) -> Iterator[str]:
        return iter(self.runs)

    def start_from(self, results: Path) -> int:
        """Take the finished runs of a comparison's ``results.json`` into this (empty)
        journal; how many. Records written before records carried their key are not
        taken: their runs are run again."""
        if self.runs or not results.exists():
            return 0
        try:
            runs = json.loads(results.read_text())["runs"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ShardlabError(
                f"{results}: not a comparison's results.json",
                field="fresh",
                fix="delete it, or start the comparison afresh",
            ) from None
        taken = 0
        for r in runs:
            if not isinstance(r, dict) or "key" not in r or r.get("status") == "error":
                continue
            if is_whole_run(r):
                self.add(r["key"], {k: v for k, v in r.items() if k not in ("key", "budget")})
                taken += 1
        return taken

    def add(self, key: str, record: dict[str, Any]) -> None:
        line = json.dumps({"key": key, "run": record}, default=str) + "\n"
        make_dir(self.path.parent)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            data = line.encode()
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        self.runs[key] = json.loads(line)["run"]
