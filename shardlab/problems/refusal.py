"""A row of an input file that could not be read: files of many rows (measurements,
traces) refuse their bad rows one by one, with the line and the reason, and keep the
rest."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """A row that could not be read, and why."""

    id: str
    line: int | None  # the file's line (None: not a line of a file)
    reason: str
