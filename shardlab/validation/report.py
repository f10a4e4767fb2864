"""The markdown report of predictions against measurements, written where asked."""

from __future__ import annotations

from pathlib import Path

from shardlab.files import write_text
from shardlab.validation.predictions import Row, summarize


def write_output(path: Path | None, text: str) -> str:
    """Write ``text`` to ``path`` (its folder made if need be; ``None``: write nothing)
    and return it."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text)
    return text


def write_report(
    by_timing: dict[str, list[Row]], command: str, source: str, *, path: Path | None = None
) -> dict[str, dict]:
    """The markdown table of the predictions side by side (the first set's rows give the
    setups), written to ``path`` if given; return each set's summary numbers."""
    summaries = {name: summarize(rows) for name, rows in by_timing.items()}
    lines = [
        "# Cost model vs measurements",
        "",
        f"Produced by `{command}` from `{source}`; do not edit by hand.",
        "",
    ]
    for name, s in summaries.items():
        lines.append(
            f"- {name}: rows {s['rows']}; median |predicted/measured - 1|: "
            f"{s['median_abs_error']:.1%}; within 25%: {s['within_25pct']}; off by 1.5x or "
            f"more: {s['beyond_1_5x']}; by more than 2x: {s['beyond_2x']}; worst: "
            f"{s['worst_id']} ({s['worst_factor']:.2f}x)"
        )
    names = list(by_timing)
    head = " | ".join(f"{n} predicted | {n} ratio" for n in names)
    lines += [
        "",
        f"| id | setup | metric | measured | {head} | note | source |",
        "|---|---|---|---:|" + "---:|---:|" * len(names) + "---|---|",
    ]
    first = by_timing[names[0]]
    for i, r in enumerate(first):
        cells = " | ".join(
            f"{by_timing[n][i].predicted:,.1f} | {by_timing[n][i].ratio:.2f}" for n in names
        )
        notes = "; ".join(dict.fromkeys(x for n in names if (x := by_timing[n][i].note)))
        lines.append(
            f"| {r.id} | {r.description} | {r.metric} ({r.unit}) | {r.measured:,.1f} | "
            f"{cells} | {notes} | {r.source} |"
        )
    write_output(path, "\n".join(lines) + "\n")
    return summaries
