"""Traces read into :class:`~shardlab.problems.traffic.Traffic`: each request's arrival
and lengths as the trace recorded them, arrival seconds relative to the first request.

Formats (``TRACE_FORMATS``), detected from the extension and the header, or given:

- ``azure``: the Azure LLM inference traces (Azure/AzurePublicDataset), CSV
  ``TIMESTAMP,ContextTokens,GeneratedTokens``, timestamps as ``2023-11-16
  18:15:46.6805900`` (read exactly, to the 100 ns the trace states);
- ``mooncake``: Mooncake's JSONL (kvcache-ai/Mooncake ``FAST25-release/traces``), one
  object a line with ``timestamp`` (ms), ``input_length``, ``output_length`` and
  ``hash_ids`` (the prompt's shared-prefix blocks);
- ``vidur``: Vidur's processed CSV (microsoft/vidur ``data/processed_traces``),
  ``arrived_at`` (s), ``num_prefill_tokens``, ``num_decode_tokens``;
- ``csv``: shardlab's plain CSV, ``arrival_s`` (seconds, any origin), ``input_len``
  and ``output_len`` (tokens), a row per request; other columns are ignored.

A file ending in ``.gz`` is read through gzip. A row that cannot be read (a missing
or non-numeric value, a length below 1) is refused with its line and reason, and the
rest are kept; a file is refused whole, in one line naming the file, the row and the
field, when it lacks a column, its requests are out of arrival order or none is left.
"""

from __future__ import annotations

import csv
import functools
import gzip
import json
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.problems.refusal import Refusal
from shardlab.problems.traffic import Traffic

# Each format's columns: arrival, input tokens, output tokens.
COLUMNS: dict[str, tuple[str, str, str]] = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "mooncake": ("timestamp", "input_length", "output_length"),
    "vidur": ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    "csv": ("arrival_s", "input_len", "output_len"),
}
TRACE_FORMATS = tuple(COLUMNS)
_TICKS = 10**7  # the Azure traces' timestamps state 100 ns


class _BadRow(Exception):
    """A row that cannot be read; the file reads on."""


def _open_text(path: Path) -> str:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8-sig") as f:
                return f.read()
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise ShardlabError(
            f"trace {str(path)!r}: cannot read it ({exc})", field="traffic"
        ) from None


def detect_format(path: Path, text: str) -> str:
    """The format of a trace, from its extension and its first line."""
    stem = path.name.removesuffix(".gz")
    if stem.endswith((".jsonl", ".json")):
        return "mooncake"
    header = {c.strip() for c in text.partition("\n")[0].split(",")}
    for fmt in ("azure", "vidur", "csv"):
        if COLUMNS[fmt][0] in header:
            return fmt
    raise ShardlabError(
        f"trace {str(path)!r}: cannot tell its format from its header "
        f"{text.partition(chr(10))[0].strip()[:80]!r}",
        field="traffic",
        fix=f"give its format, one of {', '.join(TRACE_FORMATS)}",
    )


def _number(row: Mapping[str, Any], key: str) -> tuple[float, object]:
    """The row's ``key`` as a float, and its text as written (for messages)."""
    text = row.get(key)
    if text is None or (isinstance(text, str) and not text.strip()):
        raise _BadRow(f"{key} is missing")
    try:
        return float(text), text
    except (TypeError, ValueError):
        raise _BadRow(f"{key} {text!r} is not a number") from None


def _tokens(row: Mapping[str, Any], key: str) -> int:
    value, text = _number(row, key)
    if not np.isfinite(value) or value != int(value) or value < 1:
        raise _BadRow(f"{key} must be a positive integer, got {text!r}")
    return int(value)


def _seconds(row: Mapping[str, Any], key: str, scale: float) -> float:
    value, text = _number(row, key)
    if not np.isfinite(value):
        raise _BadRow(f"{key} {text!r} is not a finite number")
    return value * scale


def _azure_ticks(row: Mapping[str, Any], key: str, scale: float) -> int:
    """100 ns ticks since the epoch, exactly: floats of seconds since 1970 would keep
    only ~0.2 us, and datetime keeps 6 of the trace's 7 fractional digits."""
    text = (row.get(key) or "").strip()
    whole, _, fraction = text.partition(".")
    try:
        if len(fraction) > 7 or (fraction and not fraction.isdigit()):
            raise ValueError
        return _epoch_seconds(whole) * _TICKS + int(fraction.ljust(7, "0") or 0)
    except ValueError:
        raise _BadRow(f"{key} {text!r} is not a time like 2023-11-16 18:15:46.6805900") from None


@functools.lru_cache(maxsize=8192)
def _epoch_seconds(whole: str) -> int:
    """Whole seconds since the epoch; cached since a trace's requests share seconds."""
    return int(datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp())


def _csv_rows(text: str) -> Iterator[tuple[int, dict[str, str]]]:
    reader = csv.DictReader(text.splitlines())
    for row in reader:
        yield reader.line_num, row


def _jsonl_rows(text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        # a line that is not an object reads as a row missing every field
        yield n, row if isinstance(row, dict) else {}


def read_trace(path: str | Path, trace_format: str | None = None) -> Traffic:
    """The requests of a trace file (``trace_format``: one of ``TRACE_FORMATS``; None:
    detected). Rows that cannot be read are the traffic's ``refused``."""
    path = Path(path)
    where = f"trace {str(path)!r}"
    text = _open_text(path)
    fmt = trace_format or detect_format(path, text)
    if fmt not in COLUMNS:
        raise ShardlabError(
            f"trace format {fmt!r} is not one of {', '.join(TRACE_FORMATS)}", field="trace_format"
        )
    time_key, in_key, out_key = COLUMNS[fmt]
    if fmt == "mooncake":
        rows: Iterator[tuple[int, Mapping[str, Any]]] = _jsonl_rows(text)
    else:
        header = [c.strip() for c in next(csv.reader(text.splitlines()[:1]), [])]
        missing = [c for c in COLUMNS[fmt] if c not in header]
        if missing:
            raise ShardlabError(
                f"{where} line 1: a {fmt} trace needs the columns {', '.join(COLUMNS[fmt])}; "
                f"missing {', '.join(missing)}",
                field="traffic",
            )
        rows = _csv_rows(text)
    clock: Callable[[Mapping[str, Any], str, float], float | int]
    clock = _azure_ticks if fmt == "azure" else _seconds
    scale = 1e-3 if fmt == "mooncake" else 1.0  # Mooncake's timestamps are ms
    times: list[float | int] = []
    ins: list[int] = []
    outs: list[int] = []
    blocks: list[tuple[int, ...]] = []
    lines: list[int] = []
    last: Any = None  # the last kept row's time as the file states it
    refused: list[Refusal] = []
    for line, row in rows:
        try:
            t = clock(row, time_key, scale)
            i, o = _tokens(row, in_key), _tokens(row, out_key)
            if fmt == "mooncake":
                blocks.append(_hash_ids(row))
        except _BadRow as exc:
            refused.append(
                Refusal(id=f"line {line}", line=line, reason=f"{where} line {line}: {exc}")
            )
            continue
        if times and t < times[-1]:
            raise ShardlabError(
                f"{where} line {line}: {time_key} {row.get(time_key)!r} is before line "
                f"{lines[-1]}'s {last!r}; a trace's requests must be in arrival order",
                field="traffic",
                fix=f"sort the file by {time_key}",
            )
        last = row.get(time_key)
        times.append(t)
        ins.append(i)
        outs.append(o)
        lines.append(line)
    if not times:
        first = f"; the first: {refused[0].reason}" if refused else ""
        raise ShardlabError(
            f"{where} holds no request that can be read ({len(refused)} refused{first})",
            field="traffic",
        )
    if fmt == "azure":
        start = int(times[0])
        arrival = np.array([t - start for t in times], dtype=np.int64) / _TICKS
    else:
        arrival = np.array(times, dtype=float) - float(times[0])
    return Traffic(
        input_len=np.array(ins, dtype=np.int64),
        output_len=np.array(outs, dtype=np.int64),
        arrival_s=arrival,
        arrival="trace",
        prefix_blocks=tuple(blocks) if fmt == "mooncake" else None,
        source=str(path),
        refused=tuple(refused),
    )


def _hash_ids(row: Mapping[str, Any]) -> tuple[int, ...]:
    ids = row.get("hash_ids", [])
    if not isinstance(ids, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in ids
    ):
        raise _BadRow("hash_ids must be a list of integers")
    return tuple(ids)
