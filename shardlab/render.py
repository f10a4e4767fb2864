"""How plans and their metrics look on a terminal and in JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from shardlab.costmodel import Metrics
from shardlab.problems.operators import HEAD_OPS, layer_ops
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem

if TYPE_CHECKING:
    from shardlab.solvers.evaluator import Progress
    from shardlab.solvers.front import FrontPoint

# Wide enough for the tables when piped; a terminal uses its own width.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


@contextmanager
def solve_progress(
    method: str, max_evals: int | None, seconds: float | None
) -> Iterator[Callable[[Progress], None]]:
    """A progress bar on stderr; yields the callback a solver reports to."""
    columns = [
        TextColumn(f"[bold]{method}[/]"),
        BarColumn(),
        TextColumn(
            "{task.completed:,.0f}/{task.total:,.0f}"
            if max_evals
            else "{task.fields[evals]:,} evals"
        ),
        TextColumn("best {task.fields[best]}"),
        TimeElapsedColumn(),
    ]
    total = float(max_evals) if max_evals else (seconds or None)
    with RichProgress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(method, total=total, evals=0, best="-")

        def callback(p: Progress) -> None:
            done = p.evals if max_evals else p.seconds
            best = f"{p.best:,.1f}" if p.best is not None else "-"
            bar.update(task, completed=done, evals=p.evals, best=best)

        yield callback


def problem_json(problem: Problem) -> dict:
    return {
        "model": problem.model.name,
        "cluster": problem.cluster.name,
        "workload": asdict(problem.workload),
        "tie": problem.tie,
    }


def plan_json(problem: Problem, plan: Plan) -> dict:
    return plan.to_dict(problem.model, cluster=problem.cluster.name)


def print_plan(problem: Problem, plan: Plan) -> None:
    out.print(f"[bold]plan[/] {plan.degrees.short()}  stages {list(plan.stage_layers)}")
    kinds = problem.model.kinds
    table = Table(box=None, pad_edge=False)
    table.add_column("operator")
    for kind in kinds:
        table.add_column(kind)
    rows: dict[str, list[str]] = {}
    for kind in kinds:
        layers = [i for i, k in enumerate(problem.model.layer_kinds) if k == kind]
        for op_i, op in enumerate(layer_ops(problem.model, kind)):
            chosen = {plan.layer_options[i][op_i] for i in layers}
            text = chosen.pop() if len(chosen) == 1 else "per layer"
            rows.setdefault(op.name, [""] * len(kinds))[kinds.index(kind)] = text
    for name, cells in rows.items():
        table.add_row(name, *cells)
    out.print(table)
    ends = ", ".join(f"{op.name}={o}" for op, o in zip(HEAD_OPS, plan.head_options, strict=True))
    out.print(f"  ends: {ends}")


def print_metrics(m: Metrics) -> None:
    if m.feasible:
        out.print("[green]feasible[/]")
    else:
        out.print(f"[red]infeasible: {', '.join(m.violations)}[/]")
    out.print(
        f"  throughput {m.throughput_tok_s:,.0f} tok/s ({m.throughput_tok_s_per_gpu:,.1f} per "
        f"GPU, {m.num_gpus} GPUs, {m.concurrency} requests in flight)"
    )
    out.print(
        f"  TTFT {m.ttft_ms:,.1f} ms   TPOT {m.tpot_ms:,.2f} ms   latency {m.latency_ms:,.0f} ms"
    )
    out.print(
        f"  memory {m.memory_gb_per_gpu:,.1f} of {m.hbm_gb:g} GB per GPU (weights "
        f"{m.weights_gb:,.1f}, KV cache {m.kv_cache_gb:,.1f}, activations "
        f"{m.activations_gb:,.2f})"
    )


def print_breakdown(m: Metrics, *, top: int) -> None:
    steps = dict.fromkeys(b.step for b in m.breakdown)
    for step in steps:
        rows = sorted((b for b in m.breakdown if b.step == step), key=lambda b: -b.time_ms)
        total = sum(b.time_ms for b in rows)
        table = Table(title=f"{step} step: one micro-batch through the replica, {total:,.2f} ms")
        for col in ("operator", "option", "layers", "ms", "share", "compute", "memory", "comm"):
            table.add_column(col, justify="left" if col in ("operator", "option") else "right")
        for b in rows[:top]:
            share = f"{b.time_ms / total:.0%}" if total else "-"
            table.add_row(
                b.name,
                b.option,
                str(b.layers),
                f"{b.time_ms:,.3f}",
                share,
                f"{b.compute_ms:,.3f}",
                f"{b.memory_ms:,.3f}",
                f"{b.comm_ms:,.3f}",
            )
        out.print(table)
    first = next(iter(steps), None)
    rows = sorted(
        (b for b in m.breakdown if b.step == first and b.weight_gb + b.kv_gb + b.act_gb > 0),
        key=lambda b: -(b.weight_gb + b.kv_gb),
    )
    table = Table(title="memory on the fullest GPU (GB)")
    for col in ("operator", "option", "weights", "KV cache", "activations"):
        table.add_column(col, justify="left" if col in ("operator", "option") else "right")
    for b in rows[:top]:
        table.add_row(
            b.name, b.option, f"{b.weight_gb:,.2f}", f"{b.kv_gb:,.2f}", f"{b.act_gb:,.3f}"
        )
    out.print(table)


def print_front(
    problem: Problem, front: Sequence[FrontPoint], megatron: Sequence[FrontPoint]
) -> None:
    """The front, by the first latency axis, each point's batch and degrees; and the
    Megatron rule's plans at the same batches."""
    axes = problem.workload.latency_axes
    for title, points in (("Pareto front", front), ("Megatron plan per batch", megatron)):
        if not points:
            continue
        table = Table(title=title)
        for col in (
            "batch",
            "tok/s per GPU",
            *(a.removesuffix("_ms").upper() + " ms" for a in axes),
        ):
            table.add_column(col, justify="right")
        table.add_column("degrees")
        for p in points:
            table.add_row(
                str(p.batch),
                f"{p.metrics.throughput_tok_s_per_gpu:,.1f}",
                *(f"{getattr(p.metrics, a):,.2f}" for a in axes),
                p.plan.degrees.short(),
            )
        out.print(table)
