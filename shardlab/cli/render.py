"""How plans and their metrics look on a terminal and in JSON."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, TextColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from shardlab.costmodel import Metrics, silicon
from shardlab.problems.calibration import shipped_for, shipped_name
from shardlab.problems.operators import HEAD_OPS, layer_ops
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem

if TYPE_CHECKING:
    from shardlab.costmodel import DisaggMetrics
    from shardlab.problems.disagg import DisaggPlan
    from shardlab.solvers.evaluator import Progress
    from shardlab.solvers.front import FrontPoint

# Wide enough for the tables when piped; a terminal uses its own width.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


# Seconds between two progress lines when stdout or stderr is not a terminal (a log).
PLAIN_PROGRESS_S = 5.0


def progress_line(method: str, p: Progress | None, used: float, seconds: float | None) -> str:
    """One line of progress: time used of the time allowed (or evaluations), the phase
    and the best objective so far."""
    evals = 0 if p is None else p.evals
    limit = None if p is None else p.max_evals
    count = f"{evals:,}/{limit:,} evals" if limit else f"{evals:,} evals"
    head = f"{used:.0f}/{seconds:g} s, {count}" if seconds else f"{count}, {used:.0f} s"
    phase = "starting" if p is None else p.phase
    best = "-" if p is None or p.best is None else f"{p.best:,.1f}"
    return f"{method}: {head}, {phase}, best {best}"


@contextmanager
def solve_progress(
    method: str, max_evals: int | None, seconds: float | None, started: float | None = None
) -> Iterator[Callable[[Progress], None]]:
    """Progress on stderr; yields the callback a solver reports to.

    On a terminal a live bar, over the time allowed when there is a time limit (with
    the phase the run is in) and over the evaluations otherwise, filled when the run
    ends (an exact solver that proves its optimum in a tenth of its time limit is
    done, not at 10%); when stdout or stderr is not a terminal, one line every few
    seconds.
    """
    live = sys.stdout.isatty() and sys.stderr.isatty()
    latest: list[Progress | None] = [None]

    def callback(p: Progress) -> None:
        latest[0] = p  # called from the solver's threads: only the display reads it

    total = float(seconds) if seconds else (float(max_evals) if max_evals else None)

    def read(used: float) -> tuple[float, float | None, str]:
        p = latest[0]
        done = used if seconds else (p.evals if p is not None else 0)
        return done, total, progress_line(method, p, used, seconds).split(": ", 1)[1]

    with _display(method, read, live=live, plain=not live, started=started):
        yield callback


@contextmanager
def task_progress(
    label: str,
    total: float | None = None,
    *,
    unit: str = "done",
    seconds: float | None = None,
    started: float | None = None,
) -> Iterator[Callable[..., None]]:
    """A bar on stderr for a command that may run for long (size, compare, validate,
    calibrate, train-policy), shown only when stderr is a terminal: a log or a pipe
    gets nothing. Yields ``report(done, what, total=None)``: ``done`` steps of
    ``total`` (given here or learnt later; None: steps counted, no bar; ``unit``
    names them) and what is being done. With ``seconds`` (a time limit, counted from
    ``started``) the bar fills over the time allowed instead.
    """
    state: dict[str, Any] = {"done": 0.0, "what": "starting", "total": total}

    def report(done: float, what: str, total: float | None = None) -> None:
        # called from the work's threads: only the display reads it
        state.update(done=done, what=what, **({"total": total} if total else {}))

    def read(used: float) -> tuple[float, float | None, str]:
        done, what, steps = state["done"], state["what"], state["total"]
        clock = f"{used:.0f}/{seconds:g} s" if seconds else f"{used:.0f} s"
        count = f"{done:,.0f}/{steps:,.0f} {unit}" if steps else f"{done:,.0f} {unit}"
        if seconds:
            return used, float(seconds), f"{clock}, {count}, {what}"
        return done, (float(steps) if steps else None), f"{clock}, {count}, {what}"

    with _display(label, read, live=sys.stderr.isatty(), plain=False, started=started):
        yield report


@contextmanager
def _display(
    label: str,
    read: Callable[[float], tuple[float, float | None, str]],
    *,
    live: bool,
    plain: bool,
    started: float | None,
) -> Iterator[None]:
    """The display behind every progress bar: ``read(seconds used)`` gives (steps done,
    steps in all or None, line). ``live``: a rich bar on stderr, filled when the work
    ends; ``plain``: one line every few seconds instead; neither: nothing. A thread
    redraws it, so work that reports nothing for a while (an exact solver's
    enumeration) still shows the time pass."""
    if not (live or plain):
        yield
        return
    start = time.perf_counter() if started is None else started
    stop = threading.Event()
    with ExitStack() as stack:
        if live:
            bar = stack.enter_context(
                RichProgress(
                    TextColumn(f"[bold]{label}[/]"),
                    BarColumn(),
                    TextColumn("{task.fields[line]}"),
                    console=err,
                    transient=False,
                )
            )
            task = bar.add_task(label, total=read(0.0)[1], line="")

        def draw() -> None:
            while not stop.wait(0.2 if live else PLAIN_PROGRESS_S):
                done, total, line = read(time.perf_counter() - start)
                if live:
                    bar.update(task, completed=done, total=total, line=line)
                else:
                    err.print(f"{label}: {line}", soft_wrap=True)

        thread = threading.Thread(target=draw, name="progress", daemon=True)
        thread.start()
        try:
            yield
        except BaseException:
            stop.set()
            thread.join()
            if live:
                bar.remove_task(task)  # a failed run leaves no bar behind
            raise
        stop.set()
        thread.join()
        if live:
            _, total, line = read(time.perf_counter() - start)
            bar.update(task, completed=total or 1.0, total=total or 1.0, line=f"{line}, done")


def fact_text(key: str, value: object) -> str:
    """A solver's fact as printed: seconds to the hundredth, a gap in percent, other
    numbers to two decimals (small ones to four significant digits)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if key == "gap":
        return f"{value:.2%}"
    if key == "seconds" or key.endswith("_s"):
        return f"{value:,.2f}"
    return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.4g}"


def problem_json(problem: Problem) -> dict:
    return {
        "model": problem.model.name,
        "cluster": problem.cluster.name,
        "workload": asdict(problem.workload),
        "tie": problem.tie,
        "timing": problem.timing,
        "engine": problem.engine,
    }


def timing_source(accelerator_key: str) -> str:
    """What times an accelerator's kernels by default, as ``shardlab clusters`` lists it."""
    if silicon.covers(accelerator_key):
        return "silicon"
    cal = shipped_for(accelerator_key)
    return "roofline" if cal is None else f"roofline-calibrated ({shipped_name(cal)})"


def timing_label(problem: Problem) -> str:
    """How a problem's kernels are timed, as every output states it."""
    acc = problem.cluster.accelerator.key
    cal = problem.calibration
    fit = None if cal is None else shipped_name(cal)
    if problem.timing == "silicon" and silicon.covers(acc):
        label = f"silicon timing ({problem.engine} measurements)"
    elif fit is not None:
        # a shipped fit stands in for measured kernels: say which, and that it is not them
        return (
            f"roofline-calibrated timing (no measured kernels of {acc}: the roofline with "
            f"efficiencies fitted to public measured runs, calibration {fit})"
        )
    elif problem.timing == "silicon":
        label = f"roofline timing (no measured kernels of {acc})"
    else:
        label = "roofline timing"
    return label + (", calibrated" if cal is not None else "")


def problem_line(problem: Problem) -> str:
    """The headline of an output: the problem, its workload and how it is timed."""
    line = f"[bold]{problem.name}[/]: {problem.workload.describe()}; {timing_label(problem)}"
    if problem.space_kind == "engine":
        line += f"; plans {problem.engine} can launch"
    return line


def plan_json(problem: Problem, plan: Plan | DisaggPlan) -> dict:
    """A plan as the JSON ``launch`` reads: with the engine and GPU it was priced for."""
    return plan.to_dict(
        problem.model,
        cluster=problem.cluster.name,
        engine=problem.engine,
        accelerator=problem.cluster.accelerator.key,
    )


def print_plan(problem: Problem, plan: Plan) -> None:
    out.print(f"[bold]plan[/] {plan.degrees.short()}  stages {list(plan.stage_layers)}")
    if plan.requests_per_rank is not None:
        out.print(
            f"  concurrency {plan.requests_per_rank} requests per attention-DP rank "
            "(the engine's max batch size)"
        )
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
        f"GPU, {m.num_gpus} GPUs, {m.requests_in_flight} requests in flight: "
        f"{m.requests_per_rank} per attention-DP rank, of at most {m.capacity_per_rank} "
        "its offer and KV cache allow)"
    )
    out.print(
        f"  TTFT {m.ttft_ms:,.1f} ms   TPOT {m.tpot_ms:,.2f} ms   latency {m.latency_ms:,.0f} ms"
    )
    shares = " + ".join(
        f"{MEMORY_SHARES.get(s.name, s.name)} {s.gb:,.2f}" + (f" ({s.note})" if s.note else "")
        for s in m.memory_shares
    )
    out.print(
        f"  memory {m.memory_gb_per_gpu:,.2f} of {m.hbm_gb:g} GB per GPU = {shares}",
        markup=False,
        soft_wrap=True,
    )


MEMORY_SHARES = {
    "kv_cache": "KV cache",
    "runtime_reserve": "runtime reserve",
    "left_free": "left free",
    "engine_reserve": "engine reserve",
}


def print_disagg(
    problem: Problem, plan: DisaggPlan, m: DisaggMetrics, *, top: int | None = None
) -> None:
    """Both pools of a disaggregated plan (each instance's plan and metrics, with its
    breakdown when ``top`` is given) and what they serve together."""
    from shardlab.costmodel import pool_problems

    pools = dict(zip(("prefill", "decode"), pool_problems(problem, plan), strict=True))
    for name, metrics in (("prefill", m.prefill), ("decode", m.decode)):
        n, g = getattr(plan, f"{name}_instances"), plan.gpus(name)
        pool = pools[name]
        out.print(
            f"[bold]{name} pool[/]: {n} instance(s) of {g} GPU(s), each offered "
            f"{pool.workload.batch:,} requests; one instance:"
        )
        print_plan(pool, getattr(plan, name))
        print_metrics(metrics)
        if top is not None:
            print_breakdown(metrics, top=top)
    state = "[green]feasible[/]" if m.feasible else f"[red]infeasible: {', '.join(m.violations)}[/]"
    out.print(f"[bold]disaggregated[/] {plan.label()}: {state}")
    out.print(
        f"  throughput {m.throughput_tok_s:,.0f} tok/s ({m.throughput_tok_s_per_gpu:,.1f} per "
        f"GPU of {m.num_gpus}; {m.gpus_used} used), {m.request_rate:,.2f} requests/s: prefill "
        f"pool {m.prefill_rate:,.2f}/s, decode pool {m.decode_rate:,.2f}/s, the {m.bottleneck} "
        "pool sets the pace"
    )
    handoff = pools["prefill"].handoff
    assert handoff is not None
    out.print(
        f"  TTFT {m.ttft_ms:,.1f} ms (of which the KV handoff {m.handoff_ms:,.1f} ms: "
        f"{handoff.describe()})   TPOT {m.tpot_ms:,.2f} ms",
        markup=False,
    )


def print_breakdown(m: Metrics, *, top: int) -> None:
    steps = dict.fromkeys(b.step for b in m.breakdown)
    for step in steps:
        rows = sorted((b for b in m.breakdown if b.step == step), key=lambda b: -b.time_ms)
        total = sum(b.time_ms for b in rows)
        table = Table(title=f"{step} step: one micro-batch through the replica, {total:,.2f} ms")
        columns = ("operator", "option", "layers", "ms", "share", "compute", "memory", "comm")
        for col in (*columns, "timing"):
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
                b.timing,
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
    """The front, by the first latency axis, each point's requests in flight (and per
    attention-DP rank) and degrees; and the Megatron rule's plans."""
    axes = problem.workload.latency_axes
    for title, points in (("Pareto front", front), ("Megatron plan per batch", megatron)):
        if not points:
            continue
        table = Table(title=title)
        for col in (
            "in flight",
            "per rank",
            "tok/s per GPU",
            *(a.removesuffix("_ms").upper() + " ms" for a in axes),
        ):
            table.add_column(col, justify="right")
        table.add_column("degrees")
        for p in points:
            table.add_row(
                str(p.metrics.requests_in_flight),
                str(p.metrics.requests_per_rank),
                f"{p.metrics.throughput_tok_s_per_gpu:,.1f}",
                *(f"{getattr(p.metrics, a):,.2f}" for a in axes),
                p.plan.degrees.short(),
            )
        out.print(table)


def print_pairs(
    problem: Problem, pairs: tuple[tuple[int, int, int, int, float, float], ...]
) -> None:
    """Why this pair of pools: the pairs evaluated, best first, in tokens/s."""
    o = problem.workload.output_len
    table = Table(title="pairs of pools evaluated (the rest pruned by their bounds), tok/s")
    for col in ("prefill", "decode", "GPUs", "bound", "value"):
        table.add_column(col, justify="left" if col in ("prefill", "decode") else "right")
    for gp, x, gd, y, bound, value in sorted(pairs, key=lambda r: -r[5])[:8]:
        table.add_row(
            f"{x} x {gp} GPUs", f"{y} x {gd} GPUs", str(x * gp + y * gd),
            f"{bound * o:,.0f}", f"{value * o:,.0f}",
        )  # fmt: skip
    out.print(table)


def print_facts(facts: dict[str, object]) -> None:
    """A solver's facts, a line each (its lists and tables are the JSON's)."""
    for key, value in facts.items():
        if not isinstance(value, list | dict):
            out.print(f"  {key}: {fact_text(key, value)}", markup=False)


def comparison_table(label: str, seeds: int, rows: list[dict[str, Any]]) -> Table:
    """A comparison's summary: per instance and method, means over seeds."""
    table = Table(title=f"comparison {label} (means over {seeds} seeds)")
    cols = ("instance", "method", "throughput", "ratio to best", "ratio to megatron")
    for col in (*cols, "evals to 99%", "wall s"):
        table.add_column(col, justify="left" if col in ("instance", "method") else "right")
    for r in rows:
        table.add_row(
            r["instance"] + ("*" if r["best_is_proven"] else ""),
            r["method"] + (f" @{r['budget']:,}" if r.get("budget") else ""),
            f"{r['throughput_tok_s']:,.0f}" if r["throughput_tok_s"] else "-",
            f"{r['ratio_to_best']:.3f}",
            f"{r['ratio_to_megatron']:.3f}" if r["ratio_to_megatron"] is not None else "-",
            f"{r['evals_to_99pct']:,}" if r["evals_to_99pct"] is not None else "-",
            f"{r['wall_s']:.1f}" if r["wall_s"] is not None else "-",
        )
    return table


def validation_table(by_timing: dict[str, list[Any]]) -> Table:
    """Each published measurement against each timing backend's prediction."""
    table = Table(title="cost model vs measurements")
    for col in ("id", "metric", "measured", *(f"{t} ratio" for t in by_timing), "note"):
        table.add_column(col, justify="left" if col in ("id", "metric", "note") else "right")
    for i, r in enumerate(next(iter(by_timing.values()))):
        ratios = [f"{by_timing[t][i].ratio:.2f}" for t in by_timing]
        note = "; ".join(dict.fromkeys(x for t in by_timing if (x := by_timing[t][i].note)))
        table.add_row(r.id, f"{r.metric} ({r.unit})", f"{r.measured:,.1f}", *ratios, note)
    return table


def _runs_on(c: Any) -> str:
    """Which server a node command is, and on which node."""
    at = f"{c.role} instance" if c.role else "replica"
    at += f" {c.replica}, node {c.node}"
    return at + (f" (node rank {c.node_rank} of {c.nodes})" if c.nodes > 1 else "")


def launch_script(problem: Problem, engine: str, spec: Any, *, where: str | None = None) -> str:
    """The launch commands as a bash script: each node's command under a comment saying
    where it runs (run each on its node), the router's, the notes as comments."""
    lines = [
        "#!/usr/bin/env bash",
        f"# {problem.model.name} on {where or problem.cluster.name} with {engine} {spec.version}",
        *(f"# {line}" for line in spec.degree_flags),
    ]
    for c in spec.commands:
        lines += [f"# {_runs_on(c)}: run on that node", c.shell()]
    if spec.router:
        lines += ["# the router", spec.router_shell()]
    lines += [f"# note: {note}" for note in spec.notes]
    return "\n".join(lines) + "\n"


def print_launch(
    problem: Problem, engine: str, spec: Any, *, where: str | None = None, inline: bool = True
) -> None:
    """An engine's launch commands, one per node of each replica or instance, then the
    router's and the notes (``where``: what it runs on, if not the problem's cluster).
    The plan's degrees and the engine's flags for them come first; with ``inline``, the
    config files a command reads are written by the lines before it, once per node."""
    out.print(
        f"{problem.model.name} on {where or problem.cluster.name} with {engine} {spec.version}"
        + (f" ({', '.join(spec.features)})" if spec.features else ""),
        markup=False,
    )
    for line in spec.degree_flags:
        out.print(line, markup=False, soft_wrap=True)
    given: set[int] = set()
    for c in spec.commands:
        out.print(f"# {_runs_on(c)}", markup=False)
        if inline and c.node not in given and (docs := spec.heredocs(c)):
            out.print("# the config file it reads, written on this node", markup=False)
            for doc in docs:
                out.print(doc, markup=False, highlight=False, soft_wrap=True)
            given.add(c.node)
        out.print(c.shell(), markup=False, soft_wrap=True)
    if spec.router:
        out.print("# the router", markup=False)
        out.print(spec.router_shell(), markup=False, soft_wrap=True)
    for note in spec.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)
