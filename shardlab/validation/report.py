"""The markdown report of predictions against measurements, written where asked."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from shardlab.files import markdown_table, write_text
from shardlab.validation.measurements import Measurement
from shardlab.validation.predictions import Row, summarize
from shardlab.validation.protocol import percentile_of


def write_output(path: Path | None, text: str) -> str:
    """Write ``text`` to ``path`` (its folder made if need be; ``None``: write nothing)
    and return it."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text)
    return text


def no_analytic_percentile(rows: Sequence[Measurement]) -> str:
    """One line on the rows of a median or percentile, which the analytic model (means
    only) does not predict."""
    counts = Counter(m.statistic for m in rows)
    by = ", ".join(f"{s} {n:,}" for s, n in sorted(counts.items(), key=_by_percentile))
    return (
        f"{len(rows):,} rows state a median or percentile ({by}): no analytic percentile "
        "(the analytic model predicts means)"
    )


def _by_percentile(item: tuple[str, int]) -> float:
    return percentile_of(item[0]) or 0.0


def write_report(
    by_timing: dict[str, list[Row]],
    command: str,
    source: str,
    *,
    path: Path | None = None,
    percentiles: Sequence[Measurement] = (),
    sections: Sequence[str] = (),
) -> dict[str, dict]:
    """The markdown table of the predictions side by side (the first set's rows give the
    setups), and the count of ``percentiles`` (rows no analytic mean compares with, by
    statistic and metric), written to ``path`` if given, with ``sections`` (markdown
    lines: the replay's) after the summary; return each set's summary numbers."""
    summaries = {name: summarize(rows) for name, rows in by_timing.items() if rows}
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
    if sections:
        lines += ["", *sections]
    if percentiles:
        counts = Counter((m.statistic, m.metric) for m in percentiles)
        body = [
            [stat, metric, f"{n:,}"]
            for (stat, metric), n in sorted(
                counts.items(), key=lambda kv: (percentile_of(kv[0][0]) or 0.0, kv[0][1])
            )
        ]
        lines += ["", no_analytic_percentile(percentiles), ""]
        lines += markdown_table(["statistic", "metric", "rows"], "llr", body)
    if not summaries:
        write_output(path, "\n".join(lines) + "\n")
        return summaries
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
