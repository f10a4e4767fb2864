"""Speed measurements whose tables go to ``results/`` (``shardlab bench``).

Timings are wall-clock on the machine that runs them, single-threaded numpy, the best
of a few repeats (the least disturbed by other load); they are measurements, never
test assertions.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardlab.costmodel import evaluate, evaluate_batch, forget_tables
from shardlab.problems.problem import Problem
from shardlab.problems.suite import get_instance

# DeepSeek-V3 on 64 H100 (options tied, and per layer), a 1.6T MoE on 256 H100, a
# static prefill: free concurrency (in flight) and a fixed batch.
EVALUATOR_INSTANCES = (
    "deepseek-v3-h100x64-chat",
    "deepseek-v3-h100x64-chat-layer",
    "moe1.6t-h100x256-chat",
    "llama405b-h100x32-prefill",
)


@dataclass(frozen=True, kw_only=True)
class EvaluatorSpeed:
    instance: str
    degree_tuples: int
    warm_plans_s: float  # 20,000 random plans in one call, tables built
    first_plans_s: float  # the same call with every table still to build
    batch64_plans_s: float  # batches of 64, as anneal, genetic and RL send them
    single_ms: float  # one plan through evaluate_batch (a solver's single plan)
    metrics_ms: float  # evaluate(breakdown=False): one plan's Metrics
    scalar_ms: float  # evaluate(): one plan with its per-operator breakdown


def _best(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def evaluator_speed(name: str, *, plans: int = 20_000, repeats: int = 3) -> EvaluatorSpeed:
    problem: Problem = get_instance(name).problem()
    codes = problem.space.sample(plans, seed=0)
    forget_tables()
    t0 = time.perf_counter()
    evaluate_batch(problem, codes)
    first = time.perf_counter() - t0
    warm = _best(lambda: evaluate_batch(problem, codes), repeats)
    batches = codes[: 64 * 100].reshape(-1, 64, codes.shape[1])
    b64 = _best(lambda: [evaluate_batch(problem, b) for b in batches], repeats)
    singles = codes[:100]
    one = _best(lambda: [evaluate_batch(problem, c[None]) for c in singles], repeats)
    decoded = [problem.space.decode(c) for c in singles]
    plain = _best(lambda: [evaluate(problem, p, breakdown=False) for p in decoded], repeats)
    scalar = _best(lambda: [evaluate(problem, p) for p in decoded], repeats)
    return EvaluatorSpeed(
        instance=name,
        degree_tuples=len(problem.space.degree_tuples),
        warm_plans_s=len(codes) / warm,
        first_plans_s=len(codes) / first,
        batch64_plans_s=batches.shape[0] * 64 / b64,
        single_ms=one / len(singles) * 1e3,
        metrics_ms=plain / len(decoded) * 1e3,
        scalar_ms=scalar / len(decoded) * 1e3,
    )


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} cores, numpy {np.__version__}"


def evaluator_markdown(command: str, rows: list[EvaluatorSpeed], repeats: int) -> str:
    lines = [
        "# Evaluator speed",
        "",
        f"Produced by `{command}`; numbers are written by the code, never by hand. "
        f"Machine: {machine()}. Best of {repeats} repeats, one thread.",
        "",
        "Plans are random samples of each instance's space (every degree tuple mixed in "
        "one call). *warm*: 20,000 plans in one call with the tables built; *first*: the "
        "same call building every table; *batch 64*: 100 batches of 64 (what anneal, "
        "genetic and RL send); *one plan*: a single row through `evaluate_batch`; "
        "*metrics*: `evaluate(breakdown=False)`, one plan's metrics; *evaluate()*: one "
        "plan with its per-operator breakdown.",
        "",
        "| instance | degree tuples | warm plans/s | first plans/s | batch 64 plans/s "
        "| one plan ms | metrics ms | evaluate() ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.instance} | {r.degree_tuples} | {r.warm_plans_s:,.0f} | "
            f"{r.first_plans_s:,.0f} | {r.batch64_plans_s:,.0f} | {r.single_ms:.2f} | "
            f"{r.metrics_ms:.2f} | {r.scalar_ms:.2f} |"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, kw_only=True)
class ExactSpeed:
    model: str
    cluster: str
    tie: str
    batch: int
    layers: int
    degree_tuples: int
    subproblems: int | None
    status: str
    seconds: float  # wall clock to the end of the run (the proof, when optimal)
    throughput_tok_s: float | None
    degrees: str | None
    cpsat_solves: int
    by_shortest_path: int
    by_memory_bound: int


# moe-1.6t (the Learning to Shard scale) on 256 to 2,048 H100 with 4,096 requests offered
# (the suite's moe1.6t instance), options tied; options per layer on models of 32 to 126
# layers (chat's 256 offered, as the suite's deepseek-v3-h100x64-chat-layer).
EXACT_RUNS = (
    *(("moe-1.6t", f"h100x{g}", "kind", 4096) for g in (256, 512, 1024, 2048)),
    ("moe-1.6t", "h100x512", "layer", 4096),
    ("deepseek-v3", "h100x64", "kind", 256),
    ("llama-3.1-8b", "h100x8", "layer", 256),
    ("deepseek-v3", "h100x64", "layer", 256),
    ("llama-3.1-70b", "h100x16", "layer", 256),
    ("llama-3.1-405b", "h100x32", "layer", 256),
)


def exact_speed(model: str, cluster: str, tie: str, batch: int, seconds: float) -> ExactSpeed:
    from shardlab.solvers import Budget, solve

    problem = Problem.build(model, cluster, "chat", tie=tie, batch=batch)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    r = solve(problem, "cpsat", budget=Budget(max_evals=None, seconds=seconds))
    wall = time.perf_counter() - t0
    return ExactSpeed(
        model=model,
        cluster=cluster,
        tie=tie,
        batch=batch,
        layers=problem.model.num_layers,
        degree_tuples=len(problem.space.degree_tuples),
        subproblems=r.facts.get("subproblems"),
        status=r.status,
        seconds=wall,
        throughput_tok_s=r.metrics.throughput_tok_s if r.metrics is not None else None,
        degrees=r.plan.degrees.short() if r.plan is not None else None,
        cpsat_solves=int(r.facts.get("solves") or 0),
        by_shortest_path=int(r.facts.get("by_shortest_path") or 0),
        by_memory_bound=int(r.facts.get("by_memory_bound") or 0),
    )


def exact_markdown(command: str, rows: list[ExactSpeed], seconds: float) -> str:
    lines = [
        "# CP-SAT time to the proven optimum",
        "",
        f"Produced by `{command}`; numbers are written by the code, never by hand. "
        f"Machine: {machine()}. Chat workload (*offered*: its requests; the plan chooses "
        f"its concurrency), silicon timing, a {seconds:g} s limit per run. *tie*: options "
        "tied per layer kind, or chosen per layer; *subproblems*: (degrees, requests) "
        "pairs bounded; *CP-SAT solves*: models built and solved (the rest pruned by "
        "their bounds); *shortest path*: subproblems with options per layer solved by "
        "the layers' dynamic program instead; *memory bound*: subproblems with options "
        "per layer whose fastest plan does not fit, pruned by the bound on the plans "
        "that do.",
        "",
        "| model | cluster | offered | tie | layers | degree tuples | subproblems | status "
        "| seconds | tok/s | degrees | CP-SAT solves | shortest path | memory bound |",
        "|---|---|---:|---|---:|---:|---:|---|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        thr = f"{r.throughput_tok_s:,.0f}" if r.throughput_tok_s is not None else "-"
        lines.append(
            f"| {r.model} | {r.cluster} | {r.batch:,} | {r.tie} | {r.layers} | "
            f"{r.degree_tuples} | "
            f"{r.subproblems if r.subproblems is not None else '-'} | {r.status} | "
            f"{r.seconds:.1f} | {thr} | {r.degrees or '-'} | {r.cpsat_solves} | "
            f"{r.by_shortest_path} | {r.by_memory_bound} |"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, kw_only=True)
class SizingSpeed:
    model: str
    rate: float
    gpus: str
    seconds: float
    solves: int
    answer: str
    answer_gpus: int | None


# Issue 36's goals: 1k/256 traffic, TTFT <= 2 s, TPOT <= 50 ms, trtllm's space, over
# H100, H200 and B200, agg and disagg, up to 256 GPUs.
SIZING_RUNS = (("deepseek-v3", 50.0), ("llama-3.1-70b", 20.0))
SIZING_GPUS = ("h100", "h200", "b200")


def sizing_speed(model: str, rate: float) -> SizingSpeed:
    """Wall seconds of one ``shardlab size`` from nothing solved to the proven answer."""
    from shardlab.problems.cluster import builtin_accelerators
    from shardlab.sizing.size import DEFAULT_MAX_GPUS, Sizer, sizing_cluster

    accs = {g: builtin_accelerators()[g] for g in SIZING_GPUS}
    start = time.perf_counter()
    problem = Problem.build(
        model,
        sizing_cluster(accs, DEFAULT_MAX_GPUS),
        "chat",
        engine="trtllm",
        space_kind="engine",
        input_len=1024,
        output_len=256,
        ttft_ms=2000,
        tpot_ms=50,
        rate=rate,
    )
    sizer = Sizer(problem, accs, serving="best")
    best = sizer.size(rate).best
    return SizingSpeed(
        model=model,
        rate=rate,
        gpus=",".join(SIZING_GPUS),
        seconds=time.perf_counter() - start,
        solves=sizer.caps.solves,
        answer=best.label() if best else "none",
        answer_gpus=best.gpus if best else None,
    )


def sizing_markdown(command: str, rows: list[SizingSpeed]) -> str:
    lines = [
        "# Time to a proven sizing",
        "",
        f"Produced by `{command}`; numbers are written by the code, never by hand. "
        f"Machine: {machine()}. 1024/256 tokens, TTFT <= 2000 ms, TPOT <= 50 ms, trtllm's "
        "launchable space, silicon timing, serving agg or disagg, up to 256 GPUs, fewest "
        "GPUs; from nothing solved to the proven answer (every instance capacity a CP-SAT "
        "solve, the rest pruned by bounds).",
        "",
        "| model | requests/s | GPU types | seconds | CP-SAT solves | answer | GPUs |",
        "|---|---:|---|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.rate:g} | {r.gpus} | {r.seconds:.1f} | {r.solves} | "
            f"{r.answer} | {r.answer_gpus if r.answer_gpus is not None else '-'} |"
        )
    return "\n".join(lines) + "\n"
