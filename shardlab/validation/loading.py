"""Reading measurements in any format shardlab knows: its own CSV or the measured
serving sample's columns (:mod:`shardlab.validation.serving_sample`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from shardlab.errors import ShardlabError
from shardlab.validation.measurements import (
    MeasurementSet,
    Refusal,
    builtin_measurements,
    measurement_of,
    read_csv,
)
from shardlab.validation.serving_sample import SAMPLE, SAMPLE_COLUMNS, read_sample, sample_rows


def load_measurements(
    path: str | Path | None = None, filters: Mapping[str, list[str]] | None = None
) -> MeasurementSet:
    """Read measurements: shardlab's CSV (see the module docstring; the built-in one
    by default), aiconfigurator-core's measured serving sample (``path`` =
    ``aiconfigurator-sample``) or a CSV in its columns (:mod:`shardlab.validation.serving_sample`;
    ``filters`` keeps some of its rows: gpu, backend, family, mode, protocol). Rows
    that cannot be read are refused, each with its reason; the others are returned."""
    filters = {k: v for k, v in (filters or {}).items() if v}
    if path is not None and str(path) == SAMPLE:
        return read_sample(**filters)
    path = Path(path) if path is not None else builtin_measurements()
    rows = read_csv(path)
    columns = set(rows[0]) if rows else set()
    if rows and columns >= SAMPLE_COLUMNS:
        return sample_rows(rows, str(path), **filters)
    gpus = set(filters.pop("gpu", []))  # shardlab's own columns filter by GPU alone
    if filters:
        raise ShardlabError(
            f"filtering by {', '.join(filters)}: filters rows of measured serving (the "
            f"sample's columns); {str(path)!r} is in shardlab's own columns",
            field="filters",
            fix="filter by gpu alone, or give measurements in the sample's columns",
        )
    if not rows:
        raise ShardlabError(f"measurements {str(path)!r}: no rows")
    required = {"id", "metric", "value", "cluster"}
    missing = required - columns
    if missing:
        raise ShardlabError(
            f"measurements {str(path)!r}: missing column(s) {', '.join(sorted(missing))}"
        )
    out, refused = [], []
    for n, row in enumerate(rows, start=2):
        where = f"line {n} ({row.get('id') or 'no id'})"
        try:
            out.append(measurement_of(row, path.parent, where))
        except ShardlabError as exc:
            refused.append(Refusal(id=(row.get("id") or "").strip(), line=n, reason=str(exc)))
    if gpus:
        out = [m for m in out if m.gpu in gpus]
        if not out:
            raise ShardlabError(
                f"measurements {str(path)!r}: no row on gpu {', '.join(sorted(gpus))}",
                field="filters",
                fix="name a GPU of the file's cluster column",
            )
    return MeasurementSet(source=str(path), rows=out, refused=refused)
