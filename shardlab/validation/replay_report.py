"""The simulator against measured statistics: each statistic apart (mean, median, p90,
p99), beside the analytic model's mean of the same metric, in sets of costs (the
shipped ones, and fits that did not see the rows' family or GPU), and the issue's
goals on the held-out sets."""

from __future__ import annotations

import csv
import io
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence

from shardlab.files import markdown_table
from shardlab.validation.protocol import percentile_of
from shardlab.validation.replay import Replayed

# (metric, statistic, goal on the median |error| over held-out rows) from the issue
GOALS = (
    ("ttft_ms", "mean", 0.20),
    ("tpot_ms", "mean", 0.15),
    ("ttft_ms", "p90", 0.25),
    ("ttft_ms", "p99", 0.25),
    ("tpot_ms", "p99", 0.20),
)
GROUP_GOAL = 0.35  # any (family, engine) group: mean TTFT median |error|
BIAS_GOAL = 1.15  # DeepSeek-family TPOT: median predicted/measured within this factor


def family(r: Replayed) -> str:
    """The row's model family (the catalog name where the row names none)."""
    return r.measurement.model_family


def _order(stat: str) -> float:
    p = percentile_of(stat)
    return -1.0 if p is None else p


def _stats(pairs: Sequence[tuple[float, float]]) -> dict[str, float]:
    """Median |error|, median ratio and share within 25% of (predicted, measured)."""
    ratios = [p / m for p, m in pairs]
    errors = [abs(r - 1.0) for r in ratios]
    return {
        "rows": len(pairs),
        "median_abs_error": statistics.median(errors),
        "median_ratio": statistics.median(ratios),
        "within_25": sum(e <= 0.25 for e in errors) / len(errors),
    }


def _simulated(rows: Sequence[Replayed]) -> list[tuple[float, float]]:
    return [(r.simulated, r.measurement.value) for r in rows if r.simulated is not None]


def _analytic(rows: Sequence[Replayed]) -> list[tuple[float, float]]:
    return [(r.analytic_mean, r.measurement.value) for r in rows if r.analytic_mean]


def by_statistic(rows: Sequence[Replayed]) -> dict[tuple[str, str], dict[str, dict[str, float]]]:
    """Per (metric, statistic): the simulator's errors and the analytic mean's."""
    groups: dict[tuple[str, str], list[Replayed]] = defaultdict(list)
    for r in rows:
        groups[(r.measurement.metric, r.measurement.statistic)].append(r)
    out = {}
    for key in sorted(groups, key=lambda k: (k[0], _order(k[1]))):
        sim, ana = _simulated(groups[key]), _analytic(groups[key])
        out[key] = {"simulated": _stats(sim) if sim else {}, "analytic": _stats(ana) if ana else {}}
    return out


def _cells(s: Mapping[str, float]) -> list[str]:
    if not s:
        return ["0", "-", "-", "-"]
    return [
        f"{s['rows']:,}",
        f"{s['median_abs_error']:.1%}",
        f"{s['median_ratio']:.2f}",
        f"{s['within_25']:.0%}",
    ]


def statistic_table(sets: Mapping[str, Sequence[Replayed]]) -> list[str]:
    head = ["costs", "metric", "statistic", "rows", "simulated: median |error|",
            "median simulated/measured", "within 25%", "analytic mean: rows",
            "median |mean/measured - 1|", "median mean/measured"]  # fmt: skip
    body = []
    for name, rows in sets.items():
        for (metric, stat), s in by_statistic(rows).items():
            a = _cells(s["analytic"])
            body.append([name, metric, stat, *_cells(s["simulated"]), a[0], a[1], a[2]])
    return markdown_table(head, "lllrrrrrrr", body)


def group_table(rows: Sequence[Replayed], key: Callable[[Replayed], tuple[str, ...]],
                names: Sequence[str]) -> list[str]:  # fmt: skip
    """The simulator's errors per group (``key``) and statistic."""
    groups: dict[tuple, list[Replayed]] = defaultdict(list)
    for r in rows:
        groups[(*key(r), r.measurement.metric, r.measurement.statistic)].append(r)
    body = []
    for k in sorted(groups, key=lambda k: (*k[:-1], _order(k[-1]))):
        sim = _simulated(groups[k])
        if sim:
            body.append([*k, *_cells(_stats(sim))])
    head = [*names, "metric", "statistic", "rows", "median |error|", "median ratio", "within 25%"]
    return markdown_table(head, "l" * (len(names) + 2) + "rrrr", body)


def goals(rows: Sequence[Replayed], family_engine: bool = True) -> list[str]:
    """The issue's goals on ``rows`` (held out from every fit): met, or by how much not."""
    stats = by_statistic(rows)
    body = []
    for metric, stat, goal in GOALS:
        s = stats.get((metric, stat), {}).get("simulated")
        if not s:
            body.append([f"{stat} {metric}, median error", f"<= {goal:.0%}", "no rows", "-"])
            continue
        got = s["median_abs_error"]
        verdict = "met" if got <= goal else f"missed by {got - goal:.1%}"
        body.append([f"{stat} {metric}, median error", f"<= {goal:.0%}", f"{got:.1%}", verdict])
    if family_engine:
        groups: dict[tuple[str, str], list[Replayed]] = defaultdict(list)
        for r in rows:
            m = r.measurement
            if m.metric == "ttft_ms" and m.statistic == "mean":
                groups[(family(r), r.engine)].append(r)
        for (name, engine), g in sorted(groups.items()):
            sim = _simulated(g)
            if not sim:
                continue
            got = _stats(sim)["median_abs_error"]
            verdict = "met" if got <= GROUP_GOAL else f"missed by {got - GROUP_GOAL:.1%}"
            body.append([f"({name}, {engine}) mean TTFT", f"<= {GROUP_GOAL:.0%}",
                         f"{got:.1%} ({len(sim)} rows)", verdict])  # fmt: skip
    deepseek = [r for r in rows if family(r).startswith("deepseek")
                and r.measurement.metric == "tpot_ms"]  # fmt: skip
    for stat in sorted({r.measurement.statistic for r in deepseek}, key=_order):
        sim = _simulated([r for r in deepseek if r.measurement.statistic == stat])
        bias = _stats(sim)["median_ratio"]
        ok = 1 / BIAS_GOAL <= bias <= BIAS_GOAL
        body.append([f"DeepSeek {stat} TPOT bias", f"within x{BIAS_GOAL}", f"x{bias:.2f}",
                     "met" if ok else "missed"])  # fmt: skip
    return markdown_table(["what", "goal", "got", ""], "llrl", body)


def refusals(rows: Sequence[Replayed]) -> list[str]:
    counts = Counter(r.note.split("not simulated: ", 1)[-1][:120] for r in rows
                     if r.simulated is None)  # fmt: skip
    return [f"- {n:,} rows: {reason}" for reason, n in counts.most_common()]


def rows_csv(rows: Sequence[Replayed]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["id", "gpu", "engine", "mode", "family", "load", "metric", "statistic",
                "measured", "simulated", "analytic_mean", "note"])  # fmt: skip
    for r in rows:
        m = r.measurement
        w.writerow([
            m.id, m.gpu, r.engine, "disagg" if m.disagg is not None else "agg",
            family(r), m.load_label(), m.metric, m.statistic, f"{m.value:.4g}",
            "" if r.simulated is None else f"{r.simulated:.4g}",
            "" if r.analytic_mean is None else f"{r.analytic_mean:.4g}", r.note,
        ])  # fmt: skip
    return buf.getvalue()
