"""Reports of predictions against many measured serving rows: errors by protocol and
mode, by concurrency band, by GPU, engine and model family; the worst rows; every
refused row with its reason. Markdown for reading, CSV with one line per row."""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.files import markdown_table
from shardlab.validation import Measurement, MeasurementSet, Row, write_output

METRICS = ("ttft_ms", "tpot_ms")
# clients per attention-DP rank
BANDS = ((1, 8), (9, 32), (33, 128), (129, 512), (513, None))


def band(requests_per_rank: int | None) -> str:
    if requests_per_rank is None:
        return "-"
    for lo, hi in BANDS:
        if hi is None or requests_per_rank <= hi:
            return f"{lo}+" if hi is None else f"{lo}-{hi}"
    return "-"


def stats(rows: Sequence[Row]) -> dict[str, float]:
    """How far a set of rows' predictions are from their measurements."""
    ratio = np.array([r.ratio for r in rows], dtype=float)
    n = len(ratio)
    if not n:
        return {"rows": 0}
    off = np.maximum(ratio, 1 / ratio)
    return {
        "rows": n,
        "median_abs_error": float(np.median(np.abs(ratio - 1))),
        "median_ratio": float(np.median(ratio)),
        "within_15pct": float(np.mean(np.abs(ratio - 1) <= 0.15)),
        "beyond_1_5x": float(np.mean(off >= 1.5)),
        "beyond_2x": float(np.mean(off >= 2)),
    }


def _cells(s: Mapping[str, float]) -> list[str]:
    """A group's errors as table cells (a group holds one row at least)."""
    return [
        f"{s['rows']:,}",
        f"{s['median_abs_error']:.1%}",
        f"{s['median_ratio']:.2f}",
        f"{s['within_15pct']:.0%}",
        f"{s['beyond_1_5x']:.0%}",
        f"{s['beyond_2x']:.0%}",
    ]


HEAD = (
    "rows",
    "median \\|error\\|",
    "median predicted/measured",
    "within 15%",
    "off 1.5x+",
    "off 2x+",
)


def _table(
    title: str,
    rows: Sequence[Row],
    key: Callable[[Row], tuple[str, ...]],
    names: Sequence[str],
    order: Callable[[tuple[str, ...]], object] | None = None,
) -> list[str]:
    """One markdown table: per group of ``key`` and metric, the errors."""
    groups: dict[tuple[str, ...], list[Row]] = {}
    for r in rows:
        groups.setdefault((*key(r), r.metric), []).append(r)
    table = markdown_table(
        [*names, "metric", *HEAD],
        "l" * (len(names) + 1) + "r" * len(HEAD),
        ([*g, *_cells(stats(groups[g]))] for g in sorted(groups, key=order or (lambda g: g))),
    )
    return [f"### {title}", "", *table, ""]


def peer_section(rows: list[Row], peer: Path) -> list[str]:
    """Errors side by side with another estimator's predictions of the same rows (a
    CSV of ``id, status, aic_ttft_ms, aic_tpot_ms``, as
    ``tests/data/make_aiconfigurator_sample.py`` writes it), on the rows both price."""
    try:
        with peer.open() as f:
            asked = {r["id"]: r for r in csv.DictReader(f)}
    except (OSError, KeyError, csv.Error) as exc:
        raise ShardlabError(
            f"peer predictions {str(peer)!r}: cannot read it ({exc})",
            field="peer",
            fix="give a CSV of id, status, aic_ttft_ms, aic_tpot_ms",
        ) from None
    theirs = {k: r for k, r in asked.items() if r.get("status") == "ok"}
    both: dict[tuple[str, str], list[tuple[Row, float]]] = {}
    for r in rows:
        m = r.measurement
        if m is None or m.mode != "agg" or r.id not in theirs:
            continue
        value = float(theirs[r.id][f"aic_{r.metric}"])
        both.setdefault((m.protocol, r.metric), []).append((r, value))
    lines = [
        "## Against AIConfigurator's own estimates",
        "",
        f"AIConfigurator 0.12.0's `cli_estimate` of the same rows (`{peer}`); on the rows both "
        "price:",
        "",
    ]
    body: list[list[str]] = []
    for (protocol, metric), pairs in sorted(both.items()):
        ours = stats([r for r, _ in pairs])
        ratio = np.array([v / r.measured for r, v in pairs])
        off = np.maximum(ratio, 1 / ratio)
        body.append(
            [
                protocol,
                metric,
                f"{len(pairs):,}",
                f"{ours['median_abs_error']:.1%}",
                f"{float(np.median(np.abs(ratio - 1))):.1%}",
                f"{ours['median_ratio']:.2f}",
                f"{float(np.median(ratio)):.2f}",
                f"{ours['beyond_1_5x']:.0%}",
                f"{float(np.mean(off >= 1.5)):.0%}",
            ]
        )
    head = ["protocol", "metric", "rows", "shardlab median \\|error\\|", "its median \\|error\\|"]
    head += ["shardlab median ratio", "its median ratio", "shardlab off 1.5x+", "its off 1.5x+"]
    lines += markdown_table(head, "ll" + "r" * 7, body)
    ours = {r.id for r in rows if r.measurement and r.measurement.mode == "agg"}
    compared = {r.id for pairs in both.values() for r, _ in pairs}
    lines += [
        "",
        f"Of the {len(ours):,} aggregated setups above, {len(ours & set(asked)):,} were asked "
        f"of it (the selection in `{peer.name}`); it priced {len(compared):,} of them and "
        f"failed on {len(ours & set(asked)) - len(compared):,} (its errors in the CSV).",
        "",
    ]
    return lines


def write_serving_report(
    rows: list[Row],
    measured: MeasurementSet,
    command: str,
    *,
    md_path: Path | None = None,
    csv_path: Path | None = None,
    extra: Iterable[str] = (),
    sections: Iterable[str] = (),
) -> dict[str, dict[str, float]]:
    """Write the markdown report to ``md_path`` and the per-row CSV to ``csv_path``, each
    if given; return the summary per (protocol, mode, metric). ``sections``: more
    markdown lines after the errors."""
    summary = _summary(rows)
    setups = len({(r.id) for r in rows})
    reasons = Counter(_reason(x.reason) for x in measured.refused)
    lines = [
        "# Predicted vs measured serving",
        "",
        f"Produced by `{command}` from `{measured.source}`; do not edit by hand."
        + (
            ""
            if csv_path is None
            else f" One line per row, refused ones included, in `{csv_path.name}`."
        ),
        "",
        f"- {setups:,} measured setups predicted ({len(rows):,} numbers: TTFT and TPOT each); "
        f"{len(measured.refused):,} refused; {measured.duplicates:,} repeated another row's "
        "setup and measurement and are counted once.",
        "- TTFT and TPOT are means over the benchmark's requests; TPOT excludes the first "
        "token: (end-to-end - TTFT) / (output - 1).",
        *extra,
        "",
        *_errors(rows),
        *_rate_section(rows),
        *sections,
        "## The rows furthest off",
        "",
    ]
    worst = sorted(rows, key=lambda r: -abs(math.log(r.ratio)))[:20]
    lines += markdown_table(
        ["id", "metric", "measured", "predicted", "ratio", "setup", "note"],
        "llrrrll",
        (
            [
                r.id,
                r.metric,
                f"{r.measured:,.1f}",
                f"{r.predicted:,.1f}",
                f"{r.ratio:.2f}",
                r.description,
                r.note,
            ]
            for r in worst
        ),
    )
    lines += ["", "## Refused rows", ""]
    lines += markdown_table(
        ["reason", "rows"], "lr", ([reason, f"{n:,}"] for reason, n in reasons.most_common())
    )
    write_output(md_path, "\n".join(lines) + "\n")
    if csv_path is not None:
        write_output(csv_path, _csv(rows, measured))
    return summary


def _summary(rows: list[Row]) -> dict[str, dict[str, float]]:
    """The errors per (protocol, mode, metric)."""
    by: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        m = r.measurement
        assert m is not None
        by.setdefault((m.protocol, m.mode, r.metric), []).append(r)
    return {f"{p}/{mode}/{metric}": stats(part) for (p, mode, metric), part in sorted(by.items())}


def _errors(rows: list[Row]) -> list[str]:
    """The report's section of errors: by protocol and mode, by clients per rank, and
    by GPU, engine and model family."""
    agg = [r for r in rows if r.measurement and r.measurement.mode == "agg"]
    return [
        "## Errors",
        "",
        *_table(
            "By source protocol and serving mode",
            rows,
            lambda r: (r.measurement.protocol, r.measurement.mode),  # type: ignore[union-attr]
            ("protocol", "mode"),
        ),
        *_table(
            "By clients per attention-DP rank (aggregated rows)",
            agg,
            lambda r: (r.measurement.protocol, band(r.measurement.requests_per_rank)),  # type: ignore[union-attr]
            ("protocol", "clients per rank"),
            order=lambda g: (g[0], _band_order(g[1]), g[2]),
        ),
        *_table(
            "By GPU, engine and model family (aggregated rows)",
            agg,
            lambda r: (r.measurement.gpu, r.measurement.engine or "", r.measurement.family),  # type: ignore[union-attr]
            ("GPU", "engine", "family"),
        ),
    ]


def rate_rows(rows: Sequence[Row]) -> list[Row]:
    """Each aggregated setup's request rate by Little's law on the closed loop the
    benchmark ran (``N`` clients, ``X = N / (TTFT + (output - 1) * TPOT)``), predicted
    and measured, from its TTFT and TPOT rows: what ``shardlab size`` counts on."""
    by_id: dict[str, dict[str, Row]] = {}
    for r in rows:
        m = r.measurement
        if m is not None and m.mode == "agg" and m.problem is not None:
            by_id.setdefault(r.id, {})[r.metric] = r
    out = []
    for rid, pair in by_id.items():
        if set(pair) != set(METRICS):
            continue
        ttft, tpot = pair["ttft_ms"], pair["tpot_ms"]
        m = ttft.measurement
        assert m is not None and m.problem is not None
        w = m.problem.workload
        clients = w.batch

        def rate(t: float, p: float, clients: int = clients, osl: int = w.output_len) -> float:
            return clients / ((t + (osl - 1) * p) / 1e3)

        out.append(
            dataclasses.replace(
                ttft,
                metric="requests_per_s",
                unit="requests/s",
                predicted=rate(ttft.predicted, tpot.predicted),
                measured=rate(ttft.measured, tpot.measured),
                id=rid,
            )
        )
    return out


def _rate_section(rows: Sequence[Row]) -> list[str]:
    """Requests/s by Little's law: the sizing's arrival model against the benchmarks'
    closed loops; the protocol the engine constants were fitted on apart from the one
    they were not."""
    rates = rate_rows(rows)
    if not rates:
        return []
    return [
        "## Requests/s by Little's law (what `shardlab size` sizes with)",
        "",
        "A benchmark's closed loop of N clients completes N / (TTFT + (output - 1) x TPOT) "
        "requests/s; predicted from the predicted latencies, measured from the measured "
        "ones, at the measured N (aggregated rows). The engine constants were fitted on the "
        "inferencex rows (in-sample; `results/serving/fit.md` holds each family and GPU "
        "out); the gap-analysis rows were not used by that fit (held out).",
        "",
        *_table(
            "By source protocol",
            rates,
            lambda r: (r.measurement.protocol,),  # type: ignore[union-attr]
            ("protocol",),
        ),
        *_table(
            "By protocol and model family",
            rates,
            lambda r: (r.measurement.protocol, r.measurement.family),  # type: ignore[union-attr]
            ("protocol", "family"),
        ),
    ]


def _band_order(label: str) -> int:
    labels = [band(lo) for lo, _ in BANDS]
    return labels.index(label) if label in labels else len(BANDS)


def _reason(text: str) -> str:
    """A refusal's reason without what differs from row to row (quoted names and
    numbers), to count rows refused for the same reason."""
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'", "'…'", text))


def _csv(rows: list[Row], measured: MeasurementSet) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        ["id", "metric", "status", "measured", "predicted", "ratio", "gpu", "engine", "family",
         "mode", "protocol", "clients_per_rank", "setup", "note"]
    )  # fmt: skip
    for r in rows:
        m = r.measurement
        assert m is not None
        w.writerow(
            [r.id, r.metric, "predicted", f"{r.measured:.4f}", f"{r.predicted:.4f}",
             f"{r.ratio:.4f}", m.gpu, m.engine or "", m.family, m.mode, m.protocol,
             m.requests_per_rank or "", r.description, r.note]
        )  # fmt: skip
    for x in measured.refused:
        w.writerow([x.id, "", "refused", "", "", "", "", "", "", "", "", "", "", x.reason])
    return buf.getvalue()


# The goals for a GPU held out of the fit: mean |error| of each metric.
HELD_OUT_GOALS = {"ttft_ms": 0.25, "tpot_ms": 0.20}


def _abs_errors(rows: Sequence[Row]) -> np.ndarray:
    return np.abs(np.array([r.ratio for r in rows], dtype=float) - 1)


def held_out_section(in_sample: Sequence[Row], held_out: Mapping[str, Sequence[Row]]) -> list[str]:
    """Each row's error under the shipped engine costs (in-sample: fitted on every
    GPU's and family's rows) beside its error under costs fitted without its group,
    per grouping of ``held_out`` (``gpu`` or ``family``, rows in the order of
    ``in_sample``): by group and metric against :data:`HELD_OUT_GOALS`, then by group,
    engine, mode and metric."""
    from shardlab.validation.calibrate import GROUPINGS

    lines: list[str] = []
    for grouping, rows in held_out.items():
        label = GROUPINGS[grouping]
        lines += [
            f"## Each {grouping} held out",
            "",
            "*In-sample*: predicted with the engine costs shardlab ships, fitted (`shardlab "
            "calibrate --engines`, `results/serving/fit.md`) on the aggregated InferenceX rows "
            f"of every {grouping}, this one's included. *Held out*: the same fit without the "
            f"row's {grouping} (`shardlab.validation.held_out`), so nothing fitted saw it. "
            "Only the engines' fixed costs (per request, per iteration) are fitted; kernel "
            "times are each GPU's own measured tables. Disaggregated and gap-analysis rows are "
            "never in the fit: their in-sample and held-out errors differ only by the fitted "
            "costs. Errors are |predicted / measured - 1|; the goals are on the mean.",
            "",
        ]
        body = []
        by_metric = _paired(in_sample, rows, lambda r, f=label: (f(r.measurement), r.metric))
        for (group, metric), pair in by_metric:
            goal = HELD_OUT_GOALS.get(metric)
            mean = float(np.mean(_abs_errors([h for _, h in pair])))
            verdict = "-" if goal is None else f"{goal:.0%}: {'met' if mean <= goal else 'missed'}"
            body.append([group, metric, *_pair_cells(pair), verdict])
        lines += markdown_table(
            [grouping, "metric", *PAIR_HEAD, "goal (mean)"], "ll" + "r" * len(PAIR_HEAD) + "l", body
        )
        lines += [
            "",
            f"### By {grouping}, engine, mode, protocol and span",
            "",
            "*Span*: where one instance's GPUs sit (a disaggregated row's decode instance, "
            "an aggregated row's replica): in one host, over hosts of one NVLink domain "
            "(GB200 and GB300 trays of 4 in a 72-GPU domain), or over domains.",
            "",
        ]

        def key(r: Row, f: Callable[[Measurement], str] = label) -> tuple[str, ...]:
            m = r.measurement
            assert m is not None
            return (f(m), m.engine or "", m.mode, m.protocol, _span(m), r.metric)

        lines += markdown_table(
            [grouping, "engine", "mode", "protocol", "span", "metric", *PAIR_HEAD],
            "llllll" + "r" * len(PAIR_HEAD),
            ([*g, *_pair_cells(pair)] for g, pair in _paired(in_sample, rows, key)),
        )
        lines.append("")
    return lines


def _span(m: Measurement) -> str:
    """Where one instance of a row sits: one host, hosts of one domain, or domains."""
    degrees = m.disagg.decode.degrees if m.disagg is not None else m.degrees
    if degrees is None:
        return "-"
    gpus = degrees.num_gpus
    if gpus <= m.cluster.gpus_per_node:
        return "one host"
    return "one domain" if gpus <= m.cluster.gpus_per_domain else "domains"


PAIR_HEAD = (
    "rows",
    "in-sample mean \\|error\\|",
    "in-sample median \\|error\\|",
    "held-out mean \\|error\\|",
    "held-out median \\|error\\|",
    "held-out median predicted/measured",
)


def _paired(
    in_sample: Sequence[Row],
    held_out: Sequence[Row],
    key: Callable[[Row], tuple[str, ...]],
) -> list[tuple[tuple[str, ...], list[tuple[Row, Row]]]]:
    """The rows' (in-sample, held-out) pairs grouped by ``key``, groups sorted."""
    groups: dict[tuple[str, ...], list[tuple[Row, Row]]] = {}
    for a, b in zip(in_sample, held_out, strict=True):
        if (a.id, a.metric) != (b.id, b.metric):
            raise ValueError(f"held-out rows out of order: {a.id} {a.metric} vs {b.id} {b.metric}")
        groups.setdefault(key(a), []).append((a, b))
    return sorted(groups.items())


def _pair_cells(pair: Sequence[tuple[Row, Row]]) -> list[str]:
    ins, out = _abs_errors([a for a, _ in pair]), _abs_errors([b for _, b in pair])
    ratio = np.array([b.ratio for _, b in pair], dtype=float)
    return [
        f"{len(pair):,}",
        f"{float(np.mean(ins)):.1%}",
        f"{float(np.median(ins)):.1%}",
        f"{float(np.mean(out)):.1%}",
        f"{float(np.median(out)):.1%}",
        f"{float(np.median(ratio)):.2f}",
    ]


def held_out_csv(in_sample: Sequence[Row], held_out: Mapping[str, Sequence[Row]]) -> str:
    """One line per row and grouping: measured, predicted in-sample and held out."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        ["id", "metric", "held_out", "measured", "in_sample", "held_out_predicted", "gpu",
         "engine", "family", "mode", "protocol", "setup"]
    )  # fmt: skip
    for grouping, rows in held_out.items():
        for a, b in zip(in_sample, rows, strict=True):
            m = a.measurement
            assert m is not None
            w.writerow(
                [a.id, a.metric, grouping, f"{a.measured:.4f}", f"{a.predicted:.4f}",
                 f"{b.predicted:.4f}", m.gpu, m.engine or "", m.family, m.mode, m.protocol,
                 a.description]
            )  # fmt: skip
    return buf.getvalue()
