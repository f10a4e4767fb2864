"""A comparison's results: the summary per instance and method, and its files."""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardlab.compare.journal import is_whole_run
from shardlab.compare.runs import DISAGG_OPTIMUM, FREE_OPTIMUM
from shardlab.errors import ShardlabError
from shardlab.files import make_dir, markdown_table, replacing
from shardlab.solvers.base import quality


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (instance, method): means over seeds and the ratios."""
    best: dict[str, float] = {}
    proven: dict[str, float] = {}
    for r in results:
        if r["objective"] is None:
            continue
        best[r["instance"]] = max(best.get(r["instance"], -math.inf), r["objective"])
        if r["method"] in ("cpsat", FREE_OPTIMUM, DISAGG_OPTIMUM) and r["status"] == "optimal":
            proven[r["instance"]] = max(proven.get(r["instance"], -math.inf), r["objective"])
    best.update(proven)
    megatron = {r["instance"]: r["objective"] for r in results if r["method"] == "megatron"}
    rows = []
    keys = dict.fromkeys((r["instance"], r["method"], r.get("budget")) for r in results)
    for inst, method, budget in keys:
        runs = [
            r
            for r in results
            if r["instance"] == inst and r["method"] == method and r.get("budget") == budget
        ]
        b = best.get(inst, math.nan)
        qualities = [quality(r["objective"], b) for r in runs]
        reach = [_evals_to(r, b, 0.99) for r in runs]
        throughputs = [r["throughput_tok_s"] for r in runs if r["throughput_tok_s"] is not None]
        walls = [r["wall_s"] for r in runs if r["wall_s"] is not None]
        mega = megatron.get(inst)
        rows.append(
            {
                "instance": inst,
                "method": method,
                "budget": budget,
                "runs": len(runs),
                "feasible_runs": sum(r["objective"] is not None for r in runs),
                "throughput_tok_s": statistics.mean(throughputs)
                if len(throughputs) == len(runs)
                else None,
                "ratio_to_best": statistics.mean(qualities),
                "min_ratio_to_best": min(qualities),
                "ratio_to_megatron": statistics.mean(quality(r["objective"], mega) for r in runs)
                if mega is not None
                else None,
                "evals_to_99pct": statistics.median(reach) if None not in reach else None,
                "wall_s": statistics.mean(walls) if len(walls) == len(runs) else None,
                "best_known": b,
                "best_is_proven": inst in proven,
            }
        )
    return rows


def _evals_to(run: dict[str, Any], best: float, level: float) -> int | None:
    for evals, _, value in run["history"]:
        if quality(value, best) >= level:
            return int(evals)
    return None


def write_results(
    out_dir: Path,
    name: str,
    command: str,
    results: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    timing: str = "",
    anchor: list[dict[str, str]] | None = None,
) -> None:
    """Write the four files atomically (each to a temporary name, then renamed);
    ``timing`` says how the cost model timed the kernels; ``anchor``: AIConfigurator's
    agg-versus-disagg choices, beside a comparison of serving modes."""
    make_dir(out_dir)

    def atomic(path: Path, write: Callable[[Path], None]) -> None:
        with replacing(path) as tmp:
            write(tmp)

    atomic(
        out_dir / "results.json",
        lambda p: p.write_text(
            json.dumps(
                {"name": name, "command": command, "runs": results, "summary": rows}, indent=2
            )
        ),
    )

    def write_csv(p: Path) -> None:
        fields = [
            "instance",
            "method",
            "seed",
            "status",
            "objective",
            "throughput_tok_s",
            "n_evals",
            "wall_s",
            "message",
        ]
        with p.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
            w.writeheader()
            w.writerows(results)

    atomic(out_dir / "results.csv", write_csv)
    atomic(
        out_dir / "summary.md",
        lambda p: p.write_text(summary_markdown(name, command, rows, timing, results, anchor)),
    )
    atomic(out_dir / "convergence.png", lambda p: plot_convergence(p, results, rows))


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def summary_markdown(
    name: str,
    command: str,
    rows: list[dict[str, Any]],
    timing: str = "",
    results: list[dict[str, Any]] | None = None,
    anchor: list[dict[str, str]] | None = None,
) -> str:
    lines = [
        f"# Comparison `{name}`",
        "",
        f"Produced by `{command}`; numbers are written by the code, never by hand."
        + (f" Kernels: {timing}." if timing else ""),
        "",
        "Ratio to best: objective over the best known plan of the instance (the CP-SAT",
        "optimum where proven, marked *), mean over seeds. Evals to 99%: median number of",
        "distinct plans evaluated before reaching 99% of the best known.",
        "",
    ]
    budgets = sorted({r["budget"] for r in rows if r.get("budget") is not None})
    budget = ["budget"] if budgets else []
    head = ["instance", "method", *budget, "throughput tok/s", "ratio to best", "worst seed"]
    head += ["ratio to megatron", "evals to 99%", "wall s"]
    lines += markdown_table(
        head,
        "ll" + "r" * (len(head) - 2),
        (
            [
                r["instance"] + ("*" if r["best_is_proven"] else ""),
                r["method"],
                *([_fmt(r.get("budget"), ",")] if budgets else []),
                _fmt(r["throughput_tok_s"], ",.0f"),
                _fmt(r["ratio_to_best"], ".3f"),
                _fmt(r["min_ratio_to_best"], ".3f"),
                _fmt(r["ratio_to_megatron"], ".3f"),
                _fmt(r["evals_to_99pct"], ","),
                _fmt(r["wall_s"], ".1f"),
            ]
            for r in rows
        ),
    )
    if budgets:
        lines += ["", *budget_table(rows, budgets)]
    if any(r["method"] == FREE_OPTIMUM for r in rows):
        lines += [
            "",
            "## Against the free optimum",
            "",
            "Each entry as a fraction of CP-SAT's optimum over the free space (every",
            "per-operator sharding) under the same engine's kernels and memory budget.",
            "",
            *engine_table(rows),
        ]
    if results is not None and any(r["method"] == DISAGG_OPTIMUM for r in results):
        lines += ["", *serving_table(results, anchor)]
    return "\n".join(lines) + "\n"


def serving_table(
    results: list[dict[str, Any]], anchor: list[dict[str, str]] | None = None
) -> list[str]:
    """Per instance, CP-SAT's aggregated and disaggregated optima side by side (tokens/s
    per GPU of the cluster, the plans), and AIConfigurator's choice on the same problem
    when ``anchor`` holds it (rows of tests/data/aiconfigurator_disagg.csv)."""
    from shardlab.problems.suite import get_instance

    by = {(r["instance"], r["method"]): r for r in results if r.get("budget") is None}
    aic = {row["instance"]: row for row in anchor or ()}
    lines = [
        "## Aggregated or disaggregated",
        "",
        "CP-SAT's optimum of each mode under the same SLOs, tokens/s per GPU of the",
        "cluster (output tokens). Aggregated: one pool of replicas; disaggregated: x",
        "prefill instances and y decode instances (`xP(GPUs) + yD(GPUs)`), the KV handoff",
        "priced." + (" AIConfigurator: its `cli default` on the same problem." if aic else ""),
        "",
    ]
    head = ["instance", "agg tok/s/GPU", "agg plan", "disagg tok/s/GPU", "disagg plan"]
    head.append("disagg / agg")
    align = "lrlrlr"
    if aic:
        head += ["AIConfigurator agg", "disagg", "its xPyD", "it chose"]
        align += "rrll"
    cells: list[list[str]] = []
    for inst in dict.fromkeys(r["instance"] for r in results):
        agg, dis = by.get((inst, "cpsat")), by.get((inst, DISAGG_OPTIMUM))
        if agg is None or dis is None:
            continue
        gpus = get_instance(inst.split("/")[0]).problem().cluster.num_gpus
        a = agg["throughput_tok_s"] / gpus if agg["throughput_tok_s"] else None
        d = dis["throughput_tok_s"] / gpus if dis["throughput_tok_s"] else None
        plan = agg.get("plan") or {}
        degrees = plan.get("degrees") or {}
        agg_plan = " ".join(f"{k} {v}" for k, v in degrees.items() if v != 1) or "-"
        line = [inst, _fmt(a, ",.1f"), agg_plan, _fmt(d, ",.1f")]
        line.append((dis.get("facts") or {}).get("label") or "-")
        line.append(_fmt(d / a if a and d else None, ".3f"))
        row = aic.get(inst)
        if aic:
            if row is None:
                line += ["-"] * 4
            else:
                line += [
                    _fmt(_float(row["agg_tok_s_gpu"]), ",.1f"),
                    _fmt(_float(row["disagg_tok_s_gpu"]), ",.1f"),
                    row["disagg_config"] or "-",
                    row["chosen"],
                ]
        cells.append(line)
    return lines + markdown_table(head, align, cells)


def _float(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def engine_table(rows: list[dict[str, Any]]) -> list[str]:
    """Per instance and engine, every method as a fraction of the free optimum (CP-SAT
    over the free space): the engine optimum (CP-SAT over the engine's space), the
    baselines; and the geometric mean of free over engine optimum."""
    by = {(r["instance"], r["method"]): r for r in rows if r.get("budget") is None}
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != FREE_OPTIMUM]
    insts = list(dict.fromkeys(r["instance"] for r in rows))
    head = ["instance", "engine", "free optimum tok/s"] + [
        "engine optimum" if m == "cpsat" else m for m in methods
    ]
    body: list[list[str]] = []
    gains = []
    for inst in insts:
        free = by.get((inst, FREE_OPTIMUM))
        if free is None:
            continue
        name, _, engine = inst.rpartition("/")
        cells = [name or inst, engine or "-", _fmt(free["throughput_tok_s"], ",.0f")]
        cells += [
            _fmt(by[(inst, m)]["ratio_to_best"], ".3f") if (inst, m) in by else "-" for m in methods
        ]
        body.append(cells)
        eng = by.get((inst, "cpsat"))
        if eng and eng["ratio_to_best"] > 0 and free["best_is_proven"]:
            gains.append(1 / eng["ratio_to_best"])
    lines = markdown_table(head, "ll" + "r" * (len(head) - 2), body)
    if gains:
        geo = math.exp(sum(math.log(g) for g in gains) / len(gains))
        lines += [
            "",
            f"Free optimum over engine optimum: geometric mean {geo:.3f} over {len(gains)} "
            f"instance-engine pairs (min {min(gains):.3f}, max {max(gains):.3f}).",
        ]
    return lines


def budget_table(rows: list[dict[str, Any]], budgets: list[int]) -> list[str]:
    """Ratio to best (mean over seeds; worst seed in brackets) per instance, method and
    budget, one column per method and budget; the exact method and the baseline once."""
    methods = list(dict.fromkeys(r["method"] for r in rows if r.get("budget") is not None))
    fixed = list(dict.fromkeys(r["method"] for r in rows if r.get("budget") is None))
    cols = [(m, b) for m in methods for b in budgets]
    head = ["instance", *fixed, *(f"{m} @{b:,}" for m, b in cols)]
    by = {(r["instance"], r["method"], r.get("budget")): r for r in rows}
    body: list[list[str]] = []
    for inst in dict.fromkeys(r["instance"] for r in rows):
        cells = [inst]
        for key in [(inst, m, None) for m in fixed] + [(inst, m, b) for m, b in cols]:
            r = by.get(key)
            cells.append(
                "-"
                if r is None
                else f"{_fmt(r['ratio_to_best'], '.3f')} ({_fmt(r['min_ratio_to_best'], '.3f')})"
            )
        body.append(cells)
    lines = ["Ratio to best by budget: mean over seeds (worst seed).", ""]
    return lines + markdown_table(head, "l" + "r" * (len(head) - 1), body)


def plot_convergence(path: Path, results: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = {r["instance"]: r["best_known"] for r in rows}
    results = [r for r in results if is_whole_run(r)]  # one curve per run
    instances = list(dict.fromkeys(r["instance"] for r in results))
    methods = list(dict.fromkeys(r["method"] for r in results))
    cols = min(3, len(instances))
    nrows = math.ceil(len(instances) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.4 * nrows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, inst in zip(axes.flat, instances, strict=False):
        runs_here = [r for r in results if r["instance"] == inst]
        # Every run is drawn to the panel's last evaluation, so a method that stopped
        # early (CP-SAT, the one-plan Megatron baseline) shows where it ended.
        right = max([2, *(r["n_evals"] for r in runs_here)])
        for mi, method in enumerate(methods):
            # one legend entry per method: its runs (seeds, and budgets of methods run
            # once per budget) share its colour
            labelled = False
            for run in (r for r in runs_here if r["method"] == method):
                pts = [(e, quality(v, best[inst])) for e, _, v in run["history"]]
                if not pts:
                    continue
                ax.step(
                    [p[0] for p in pts] + [right],
                    [p[1] for p in pts] + [pts[-1][1]],
                    where="post",
                    color=colors[mi % len(colors)],
                    alpha=0.8,
                    linestyle="--" if method == "megatron" else "-",
                    label=None if labelled else method,
                )
                labelled = True
        ax.set_xscale("log")
        ax.set_title(inst, fontsize=9)
        ax.set_xlabel("evaluations")
        ax.set_ylabel("best / best known")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(instances) :]:
        ax.axis("off")
    entries: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    fig.tight_layout()
    # below the panels, and the figure grown to hold it (not drawn over the axes' labels)
    legend = fig.legend(
        list(entries.values()),
        list(entries),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(len(entries), 6),
    )
    fig.savefig(path, format="png", dpi=90, bbox_inches="tight", bbox_extra_artists=(legend,))
    plt.close(fig)


ANCHOR_FIELDS = ("instance", "chosen", "agg_tok_s_gpu", "disagg_tok_s_gpu", "disagg_config")


def read_anchor(path: str) -> list[dict[str, str]]:
    """AIConfigurator's agg-versus-disagg choices (tests/data/aiconfigurator_disagg.csv)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ShardlabError(
            f"{path}: cannot read AIConfigurator's choices ({exc})", field="aiconfigurator"
        ) from None
    rows = list(csv.DictReader(text.splitlines()))
    missing = [f for f in ANCHOR_FIELDS if rows and f not in rows[0]]
    if not rows or missing:
        raise ShardlabError(
            f"{path}: not a CSV of tests/data/make_aiconfigurator_disagg.py "
            f"(missing {', '.join(missing) or 'rows'})",
            field="aiconfigurator",
        )
    return rows
