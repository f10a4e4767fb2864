"""The Azure LLM inference trace read with the stdlib, for the peer scripts beside this
file: they run in the peers' own venvs, where shardlab is not installed."""

from __future__ import annotations

import calendar
import csv
import gzip
import time
from collections.abc import Iterator
from pathlib import Path

TICKS_PER_S = 10_000_000  # the trace's timestamps have 100 ns digits


def _ticks(stamp: str) -> int:
    """`2023-11-16 18:15:46.6805900` in 100 ns ticks, exactly (no float)."""
    whole, _, frac = stamp.strip().partition(".")
    seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%d %H:%M:%S"))
    return seconds * TICKS_PER_S + int((frac + "0000000")[:7])


def azure_rows(path: Path) -> Iterator[tuple[int, int, int]]:
    """(ticks after the first request, input tokens, output tokens) per row of an Azure
    trace (`TIMESTAMP, ContextTokens, GeneratedTokens`, optionally gzip-compressed)."""
    with gzip.open(path, "rt", newline="") if path.suffix == ".gz" else path.open(newline="") as f:
        first: int | None = None
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                ticks = _ticks(row["TIMESTAMP"])
                prompt, output = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (KeyError, ValueError) as exc:
                raise SystemExit(f"{path}:{line}: not an Azure trace row ({exc})") from exc
            if prompt < 1 or output < 1:
                raise SystemExit(f"{path}:{line}: lengths must be at least 1")
            first = ticks if first is None else first
            yield ticks - first, prompt, output
