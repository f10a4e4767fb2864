"""A fit's report: its corrections, and its errors before, fitted and on rows held out
of the fit, per grouping and per group (``shardlab calibrate --report``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from shardlab.files import markdown_table
from shardlab.validation import write_output
from shardlab.validation.calibrate import Report, errors, groups_of

TIED = {
    "shared": " (one shared by every class)",
    "compute": " (one shared by the kernels, one for communication)",
}


def _error_cells(s: Mapping[str, float]) -> list[str]:
    """One group's errors as table cells: its rows, median |error|, median ratio, and
    the shares within 15%, off by 1.5x and off by 2x."""
    n = max(s["rows"], 1)
    shares = (s[k] / n for k in ("within_15pct", "beyond_1_5x", "beyond_2x"))
    cells = [f"{s['rows']:,}", f"{s['median_abs_error']:.1%}", f"{s['median_ratio']:.2f}"]
    return cells + [f"{v:.0%}" for v in shares]


def write_fit_report(report: Report, command: str, source: str, *, path: Path | None = None) -> str:
    """A fit's corrections and its errors per metric: before, fitted (in-sample) and on
    rows held out of the fit, per grouping and per group, as markdown written to ``path``
    if given."""
    f = report.fitted
    lines = [
        "# A fit and the rows it did not see",
        "",
        f"Produced by `{command}` from {source}; do not edit by hand.",
        "",
        *markdown_table(
            ["engine", "per request (ms)", "per iteration (ms)"],
            "lrr",
            (
                [e, f"{f.request_ms[e]:.2f}", f"{f.iteration_ms[e]:.3f}"]
                for e in sorted(f.request_ms)
            ),
        ),
        "",
    ]
    if f.factors:
        lines += [
            f"Kernel factors{TIED.get(report.tie, '')}: "
            + ", ".join(f"{k} {v:.3f}" for k, v in f.factors.items()),
            "",
        ]
    head = ["metric", "rows", "median \\|error\\|", "median predicted/measured", "within 15%"]
    head += ["off 1.5x+", "off 2x+"]
    sets = {
        "shipped before this fit": report.before,
        "fitted on every row (in-sample)": report.after,
        **{
            ("leave-one-out" if g == "row" else f"each {g} held out"): e
            for g, e in report.held_out_by.items()
        },
    }
    lines += markdown_table(
        ["predicted by", *head],
        "ll" + "r" * 6,
        (
            [name, metric, *_error_cells(s)]
            for name, rel in sets.items()
            for metric, s in report.by_metric(rel).items()
        ),
    )
    for grouping, rel in report.held_out_by.items():
        if grouping == "row":
            continue
        lines += ["", f"## Each {grouping} held out, one at a time", ""]
        lines += _per_group(report, grouping, rel, head)
        # the same groups under the fit on every row: a fit that holds on the rows it
        # saw but not on a group held out is one that does not carry to a new group
        lines += ["", f"## Fitted on every row (in-sample), per {grouping}", ""]
        lines += _per_group(report, grouping, report.after, head)
    return write_output(path, "\n".join(lines) + "\n")


def _per_group(report: Report, grouping: str, rel: Sequence[float], head: list[str]) -> list[str]:
    """Errors (relative, one per row) per group of ``grouping`` and metric, as a table."""
    labels = np.array(groups_of(report.rows, grouping))
    ratio = 1.0 + np.asarray(rel)
    metrics = np.array([lin.measurement.metric for lin in report.rows.rows])
    body: list[list[str]] = []
    for g in sorted(set(labels.tolist())):
        for metric in dict.fromkeys(metrics.tolist()):
            sel = (labels == g) & (metrics == metric)
            s = errors(ratio[sel], np.ones(int(sel.sum())))
            if s["rows"]:
                body.append([g, metric, *_error_cells(s)])
    return markdown_table([grouping, *head], "ll" + "r" * 6, body)
