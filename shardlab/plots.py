"""Figures written next to results: the Pareto front of a solve."""

from __future__ import annotations

from pathlib import Path

from shardlab.files import replacing
from shardlab.problems.problem import Problem
from shardlab.solvers.front import FrontPoint

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
    fig.tight_layout()
    try:
        with replacing(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
    finally:
        plt.close(fig)
