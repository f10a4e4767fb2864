"""Figures written next to results: the Pareto front of a solve, a sizing curve, a
simulated run's latency CDFs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardlab.files import replacing
from shardlab.problems.problem import Problem
from shardlab.solvers.front import FrontPoint

if TYPE_CHECKING:
    from shardlab.simulate import Simulation
    from shardlab.sizing.size import Sizer, Sizing

AXIS_LABEL = {"tpot_ms": "TPOT (ms)", "ttft_ms": "TTFT (ms)"}


def _label(p: FrontPoint) -> str:
    d = p.plan.degrees
    return f"x{d.replicas} pp{d.pp} tp{d.tp} dp{d.dp_attn}" + (f" ep{d.ep}" if d.ep > 1 else "")


def plot_front(
    path: str | Path,
    problem: Problem,
    front: tuple[FrontPoint, ...],
    megatron: tuple[FrontPoint, ...],
    *,
    title: str,
) -> None:
    """Throughput per GPU against each latency axis (one panel per axis), the front's
    points joined in order and the Megatron rule's plans marked; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = problem.workload.latency_axes
    fig, panels = plt.subplots(1, len(axes), figsize=(6 * len(axes), 4.2), squeeze=False)
    for ax, axis in zip(panels[0], axes, strict=True):
        pts = sorted(front, key=lambda p: getattr(p.metrics, axis))
        ax.plot(
            [getattr(p.metrics, axis) for p in pts],
            [p.metrics.throughput_tok_s_per_gpu for p in pts],
            "o-",
            label="front",
        )
        for p in pts:
            ax.annotate(
                f"{_label(p)} b{p.batch}",
                (getattr(p.metrics, axis), p.metrics.throughput_tok_s_per_gpu),
                fontsize=6,
                xytext=(3, -8),
                textcoords="offset points",
            )
        if megatron:
            ax.plot(
                [getattr(p.metrics, axis) for p in megatron],
                [p.metrics.throughput_tok_s_per_gpu for p in megatron],
                "x",
                color="tab:red",
                markersize=8,
                label="megatron plan",
            )
        ax.set_xscale("log")
        ax.set_xlabel(AXIS_LABEL.get(axis, axis))
        ax.set_ylabel("throughput per GPU (tok/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    _save(fig, path)


def plot_sizing(path: str | Path, sizer: Sizer, results: Sequence[Sizing]) -> None:
    """Cost (or GPUs) per rate: one line per GPU type alone and the cheapest mix,
    rates no deployment serves left out; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.2))
    rates = [s.rate for s in results]
    for g in sizer.accelerators:
        costs = [s.by_gpu[g].cost if s.by_gpu.get(g) else float("nan") for s in results]
        ax.plot(rates, costs, "o-", label=f"{g} only")
    best = [s.best.cost if s.best else float("nan") for s in results]
    ax.plot(rates, best, "k--", marker="s", label="cheapest (any mix, agg or disagg)")
    for s in results:
        if s.best is not None:
            ax.annotate(
                s.best.label(), (s.rate, s.best.cost), fontsize=6, xytext=(3, -9),
                textcoords="offset points",
            )  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(rates, [f"{r:g}" for r in rates])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("requests/s")
    ax.set_ylabel("$/hour" if sizer.priced else "GPUs")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    w = sizer.problem.workload
    slo = ", ".join(
        f"{n} <= {v:g} ms" for n, v in (("TTFT", w.ttft_ms), ("TPOT", w.tpot_ms)) if v is not None
    )
    ax.set_title(
        f"{sizer.problem.model.name}, {w.input_len}/{w.output_len}, {slo}; "
        f"{sizer.problem.engine}, serving {sizer.serving}",
        fontsize=9,
    )
    _save(fig, path)


def _save(fig: Any, path: str | Path) -> None:
    """Write ``fig`` as a PNG atomically, and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        with replacing(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
    finally:
        plt.close(fig)


def plot_simulation(path: str | Path, sim: Simulation, title: str) -> None:
    """Latency CDFs of a simulated run (TTFT, TPOT, end-to-end) and the requests in the
    system over time, waiting for their first token and in all."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, (name, values) in zip(
        axes,
        (("TTFT", sim.ttft_s), ("TPOT", sim.tpot_s), ("end-to-end", sim.e2e_s)),
        strict=False,
    ):
        v = np.sort(values * 1e3)
        ax.plot(v, np.arange(1, len(v) + 1) / len(v), lw=1.4)
        for q, style in ((0.5, ":"), (0.9, "--"), (0.99, "-.")):
            ax.axhline(q, color="grey", lw=0.6, ls=style)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("share of requests")
        ax.grid(alpha=0.3)
    span = float(np.nanmax(sim.finish_s))
    times = np.linspace(0.0, span, 2000)
    in_system, waiting = sim.in_system(times)
    ax = axes[3]
    ax.plot(times, in_system, lw=0.8, label="in the system")
    ax.plot(times, waiting, lw=0.8, label="before their first token")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    _save(fig, path)
