"""The markdown report of predictions against measurements, written where asked."""

from __future__ import annotations

from pathlib import Path

from shardlab.files import markdown_table, write_text
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
    head = ["id", "setup", "metric", "measured"]
    head += [c for n in names for c in (f"{n} predicted", f"{n} ratio")]
    body: list[list[str]] = []
    for i, r in enumerate(by_timing[names[0]]):
        row = [r.id, r.description, f"{r.metric} ({r.unit})", f"{r.measured:,.1f}"]
        for n in names:
            row += [f"{by_timing[n][i].predicted:,.1f}", f"{by_timing[n][i].ratio:.2f}"]
        row.append("; ".join(dict.fromkeys(x for n in names if (x := by_timing[n][i].note))))
        body.append([*row, r.source])
    align = "lllr" + "rr" * len(names) + "ll"
    lines += ["", *markdown_table([*head, "note", "source"], align, body)]
    write_output(path, "\n".join(lines) + "\n")
    return summaries
