"""Speed measurements whose tables go to ``results/`` (``shardlab bench``).

Timings are wall-clock on the machine that runs them, single-threaded numpy, the best
of a few repeats (the least disturbed by other load); they are measurements, never
test assertions.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from shardlab.costmodel import assemble, evaluate, evaluate_batch, forget_tables, units_of_codes
from shardlab.files import markdown_table
from shardlab.problems.problem import Problem
from shardlab.problems.suite import get_instance

if TYPE_CHECKING:
    from shardlab.sizing.size import Sizer

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
    points_per_plan: float  # (plan, concurrency) points each plan is priced at
    warm_points_s: float  # those points per second in the warm call
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
    points = _points(problem, codes)
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
        points_per_plan=points / len(codes),
        warm_points_s=points / warm,
        first_plans_s=len(codes) / first,
        batch64_plans_s=batches.shape[0] * 64 / b64,
        single_ms=one / len(singles) * 1e3,
        metrics_ms=plain / len(decoded) * 1e3,
        scalar_ms=scalar / len(decoded) * 1e3,
    )


def _points(problem: Problem, codes: np.ndarray) -> int:
    """The (plan, concurrency) points the evaluator prices for ``codes``: in flight,
    each plan at every concurrency its KV cache and offer allow that can differ (a
    micro-batch size stands for the requests sharing it), static its one batch."""
    units = units_of_codes(problem, codes)
    parts = np.array_split(np.arange(len(codes)), max(1, len(codes) // 2_000))
    return sum(len(assemble(problem, units.take(rows)).curves["plan"]) for rows in parts)


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
        "one call). *warm*: 20,000 plans in one call with the tables built; *points*: "
        "the (plan, concurrency) pairs that call prices (in flight every concurrency a "
        "plan can run that changes its times; static, the batch), per plan and per "
        "second; *first*: the "
        "same call building every table; *batch 64*: 100 batches of 64 (what anneal, "
        "genetic and RL send); *one plan*: a single row through `evaluate_batch`; "
        "*metrics*: `evaluate(breakdown=False)`, one plan's metrics; *evaluate()*: one "
        "plan with its per-operator breakdown.",
        "",
    ]
    head = ["instance", "degree tuples", "warm plans/s", "points per plan", "warm points/s"]
    head += ["first plans/s", "batch 64 plans/s", "one plan ms", "metrics ms", "evaluate() ms"]
    lines += markdown_table(
        head,
        "l" + "r" * 9,
        (
            [r.instance, r.degree_tuples, f"{r.warm_plans_s:,.0f}", f"{r.points_per_plan:,.1f}",
             f"{r.warm_points_s:,.0f}", f"{r.first_plans_s:,.0f}", f"{r.batch64_plans_s:,.0f}",
             f"{r.single_ms:.2f}", f"{r.metrics_ms:.2f}", f"{r.scalar_ms:.2f}"]
            for r in rows
        ),
    )  # fmt: skip
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
        model=model, cluster=cluster, tie=tie, batch=batch, layers=problem.model.num_layers,
        degree_tuples=len(problem.space.degree_tuples), subproblems=r.facts.get("subproblems"),
        status=r.status, seconds=wall,
        throughput_tok_s=r.metrics.throughput_tok_s if r.metrics is not None else None,
        degrees=r.plan.degrees.short() if r.plan is not None else None,
        cpsat_solves=int(r.facts.get("solves") or 0),
        by_shortest_path=int(r.facts.get("by_shortest_path") or 0),
        by_memory_bound=int(r.facts.get("by_memory_bound") or 0),
    )  # fmt: skip


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
    ]
    head = ["model", "cluster", "offered", "tie", "layers", "degree tuples", "subproblems"]
    head += ["status", "seconds", "tok/s", "degrees", "CP-SAT solves", "shortest path"]
    head.append("memory bound")
    lines += markdown_table(
        head,
        "llrlrrrlrrlrrr",
        (
            [r.model, r.cluster, f"{r.batch:,}", r.tie, r.layers, r.degree_tuples,
             r.subproblems if r.subproblems is not None else "-", r.status, f"{r.seconds:.1f}",
             f"{r.throughput_tok_s:,.0f}" if r.throughput_tok_s is not None else "-",
             r.degrees or "-", r.cpsat_solves, r.by_shortest_path, r.by_memory_bound]
            for r in rows
        ),
    )  # fmt: skip
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, kw_only=True)
class SizingSpeed:
    model: str
    rate: float | None  # None: one cluster solved (SizingRun.cluster)
    gpus: str  # the GPU types, and the engine
    slos: str  # as the workload states them (a percentile: simulated)
    traffic: str
    seconds: float
    solves: int
    answer: str
    answer_gpus: int | None
    simulated: str = ""  # percentile SLOs: the answer simulated whole at the rate


@dataclass(frozen=True, kw_only=True)
class SizingRun:
    model: str
    rate: float | None  # None: the trace's own
    percentile: float | None = None  # None: the SLOs on the mean
    ttft_ms: float = 2000
    tpot_ms: float = 50
    trace: str | None = None  # "conv": the Azure conversation hour (None: Poisson, 1024/256)
    gpus: tuple[str, ...] = ("h100", "h200", "b200")
    engine: str = "trtllm"
    priced: bool = False  # at the catalog's example prices (shardlab.sizing.catalog)
    cluster: str | None = None  # instead: `shardlab solve --method cpsat` of it, free space


# Issue 36's goals: 1k/256 traffic, TTFT <= 2 s, TPOT <= 50 ms, trtllm's space, over
# H100, H200 and B200, agg and disagg, up to 256 GPUs; issue 51's: the refusal of a rate
# no deployment of 256 GPUs serves (30 s; more than 20 minutes by solves alone), the
# same SLOs at p90 under Poisson arrivals (30 s, 120 s), the Azure conversation trace at
# its own rate with p99 TTFT <= 3 s and TPOT <= 100 ms (60 s).
SIZING_RUNS = (
    SizingRun(model="deepseek-v3", rate=50.0),
    SizingRun(model="llama-3.1-70b", rate=20.0),
    SizingRun(model="llama-3.1-70b", rate=2000.0),
    SizingRun(model="llama-3.1-70b", rate=20.0, percentile=90),
    SizingRun(model="deepseek-v3", rate=50.0, percentile=90),
    SizingRun(
        model="llama-3.1-70b", rate=None, percentile=99, ttft_ms=3000, tpot_ms=100,
        trace="conv",
    ),
    # issue 52's: one GB200 NVL72 domain solved exactly (30 s); DeepSeek-V3 over the
    # rack-scale, Blackwell Ultra and AMD GPUs with prices (120 s); Llama-3.1-70B over
    # the inference cards (30 s), on an engine that runs on AMD
    SizingRun(model="deepseek-v3", rate=None, cluster="gb200x72"),
    SizingRun(
        model="deepseek-v3", rate=50.0, engine="sglang", priced=True,
        gpus=("h100", "h200", "b200", "b300", "gb200", "gb300", "mi355x"),
    ),
    SizingRun(
        model="llama-3.1-70b", rate=20.0, engine="sglang", priced=True,
        gpus=("l40s", "l4", "a100", "h100"),
    ),
)  # fmt: skip


def sizing_speed(run: SizingRun) -> SizingSpeed:
    """Wall seconds of one ``shardlab size`` from nothing solved to the proven answer."""
    from shardlab.problems.cluster import builtin_accelerators
    from shardlab.problems.traces import read_trace
    from shardlab.sizing.catalog import example_prices
    from shardlab.sizing.size import DEFAULT_MAX_GPUS, Sizer, sizing_cluster

    if run.cluster is not None:
        return _solve_run(run)
    accs = {g: builtin_accelerators()[g] for g in run.gpus}
    start = time.perf_counter()
    trace = None if run.trace is None else read_trace(AZURE_CONV)
    rate = run.rate if trace is None else (run.rate or trace.rate)
    assert rate is not None
    lengths = (1024, 256) if trace is None else (
        round(float(trace.input_len.mean())), round(float(trace.output_len.mean()))
    )  # fmt: skip
    problem = Problem.build(
        run.model,
        sizing_cluster(accs, DEFAULT_MAX_GPUS),
        "chat",
        engine=run.engine,
        space_kind="engine",
        input_len=lengths[0],
        output_len=lengths[1],
        ttft_ms=run.ttft_ms,
        tpot_ms=run.tpot_ms,
        slo_percentile=run.percentile,
        rate=rate,
    )
    prices = example_prices(run.gpus) if run.priced else None
    sizer = Sizer(problem, accs, prices=prices, serving="best", traffic=trace)
    sized = sizer.size(rate)
    best = sized.best
    seconds = time.perf_counter() - start
    at = "" if run.percentile is None else f"p{run.percentile:g} "
    return SizingSpeed(
        model=run.model,
        rate=rate,
        gpus=f"{','.join(run.gpus)} ({run.engine}{', example prices' if prices else ''})",
        slos=f"{at}TTFT <= {run.ttft_ms:g} ms, {at}TPOT <= {run.tpot_ms:g} ms",
        traffic=f"Azure conv, {lengths[0]}/{lengths[1]}" if trace else "Poisson, 1024/256",
        seconds=seconds,
        solves=sizer.caps.solves,
        answer=(best.label() + (f", ${best.cost:,.2f}/h" if prices else ""))
        if best
        else _refusal(sizer, rate),
        answer_gpus=best.gpus if best else None,
        simulated=", ".join(
            f"{k.removesuffix('_ms').upper()} {v:,.0f} ms"
            for k, v in (sized.simulated or {}).items()
        ),
    )


def _solve_run(run: SizingRun) -> SizingSpeed:
    """``shardlab solve --method cpsat`` of the run's one cluster in a fresh process."""
    args = ("--model", run.model, "--cluster", run.cluster, *_NEXT, "--space", "free")
    wall, status, objective, solves = solve_speed(args)  # type: ignore[arg-type]
    return SizingSpeed(
        model=run.model, rate=None, gpus=f"{run.cluster} (trtllm, free space)",
        slos=f"TTFT <= {run.ttft_ms:g} ms, TPOT <= {run.tpot_ms:g} ms",
        traffic="8,192 offered, 1024/256", seconds=wall, solves=solves or 0,
        answer=f"`shardlab solve --method cpsat {' '.join(args)}`: {status}, {objective or 0:,.0f} "
        "tok/s", answer_gpus=int(run.cluster.rsplit("x", 1)[1]),  # type: ignore[union-attr]
    )  # fmt: skip


def _refusal(sizer: Sizer, rate: float) -> str:
    """Why no deployment serves ``rate``, as ``shardlab size`` says it (the reach is
    bounded already: no solve)."""
    return f"none: {sizer.why_unserved(rate).message.split(': ', 1)[1]}"


def sizing_markdown(command: str, rows: list[SizingSpeed]) -> str:
    lines = [
        "# Time to a proven sizing",
        "",
        f"Produced by `{command}`; numbers are written by the code, never by hand. "
        f"Machine: {machine()}. The engine's launchable space, silicon timing (roofline on "
        "GPUs without measured kernels), serving agg or disagg, up to 256 GPUs, fewest GPUs "
        "or, with prices, least $/hour; from nothing solved to the proven answer "
        "(instance capacities solved by CP-SAT, the rest pruned by bounds; a rate past what "
        "every instance shape's CP-SAT bounds reach is refused before any solve). SLOs at a "
        "percentile: each instance's capacity bisected over rate in the simulator, the "
        "answer simulated whole at the rate (its percentiles in the last column). A row "
        "without a rate is one cluster solved by `shardlab solve` in a fresh process.",
        "",
    ]
    lines += markdown_table(
        ["model", "GPU types", "requests/s", "traffic", "SLOs", "seconds", "CP-SAT solves",
         "answer", "GPUs", "simulated"],
        "llrllrrlrl",
        (
            [r.model, r.gpus, "-" if r.rate is None else f"{r.rate:.3g}", r.traffic, r.slos,
             f"{r.seconds:.1f}", r.solves,
             r.answer, r.answer_gpus if r.answer_gpus is not None else "-", r.simulated or "-"]
            for r in rows
        ),
    )  # fmt: skip
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, kw_only=True)
class SolveSpeed:
    label: str
    args: tuple[str, ...]
    seconds: float  # wall clock of the whole command, Python's start included
    status: str
    objective: float | None
    solves: int | None
    base_seconds: float | None = None  # the same command with the baseline's code
    base_status: str | None = None
    base_objective: float | None = None


# Where users start (issue 37): the README's main job, then the searches a new user
# runs next, trtllm, 8,192 offered, 1024/256, TTFT <= 2 s, TPOT <= 50 ms; and the
# Learning to Shard scale.
_NEXT = ("--engine", "trtllm", "--batch", "8192", "--input-len", "1024", "--output-len", "256")
_NEXT += ("--ttft-ms", "2000", "--tpot-ms", "50")
_MOE = ("--model", "moe-1.6t", "--cluster", "h100x2048", "--batch", "4096")
SOLVE_RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the README's main job", ()),
    *(
        (
            f"{label}, {space} space",
            ("--model", model, "--cluster", cluster, *_NEXT, "--space", space),
        )
        for label, model, cluster in (
            ("Llama-3.1-70B, 8 H100", "llama-3.1-70b", "h100x8"),
            ("Qwen3-235B, 16 H200", "qwen3-235b-a22b", "h200x16"),
            ("DeepSeek-V3, 16 H200", "deepseek-v3", "h200x16"),
            ("DeepSeek-V3, 64 H100", "deepseek-v3", "h100x64"),
        )
        for space in ("engine", "free")
    ),
    ("moe-1.6t, 2,048 H100, 4,096 offered", _MOE),
)


def solve_speed(
    args: tuple[str, ...], code: str | None = None
) -> tuple[float, str, float | None, int | None]:
    """Wall seconds, status, objective and CP-SAT solves of ``shardlab solve --method
    cpsat ARGS`` in a fresh process, as a user runs it; ``code``: the source tree to
    run instead of the installed one (a checkout of another commit)."""
    # `python -m` puts its working directory first on the path: run in the tree itself
    tree = code if code is not None else str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": tree}
    command = [sys.executable, "-m", "shardlab", "solve", "--method", "cpsat", *args]
    start = time.perf_counter()
    done = subprocess.run(
        [*command, "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        check=False,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return wall, f"exit {done.returncode}", None, None
    answer = json.loads(done.stdout)
    metrics = answer.get("metrics") or {}
    solves = (answer.get("facts") or {}).get("solves")
    return wall, answer["status"], metrics.get("objective"), solves


def tree_label(tree: str) -> str:
    """``tree`` and the commit checked out there, when it is a git checkout."""
    done = subprocess.run(
        ["git", "-C", tree, "log", "-1", "--format=%h %s"],
        capture_output=True,
        text=True,
        check=False,
    )
    return f"{tree} (commit {done.stdout.strip()})" if done.returncode == 0 else tree


def solves_markdown(command: str, rows: list[SolveSpeed], baseline: str | None) -> str:
    side = baseline is not None
    lines = [
        "# Time to the proven optimum where users start",
        "",
        f"Produced by `{command}`; numbers are written by the code, never by hand. "
        f"Machine: {machine()}. Each row is `shardlab solve --method cpsat ARGS` in a "
        "fresh process, wall clock from Python's start to the printed plan (install "
        "excluded), as a new user runs it; one run each, so other load on the machine "
        "shows in it."
        + (
            f" *before*: the same command run on the code at {baseline} in the same "
            "session, one after the other."
            if side
            else ""
        ),
        "",
    ]
    head = ["problem", "arguments", "seconds", "status", "objective", "CP-SAT solves"]
    align = "llrlrr"
    if side:
        head += ["before s", "before status", "before objective", "speed-up"]
        align += "rlrr"
    body: list[list[object]] = []
    for r in rows:
        line: list[object] = [
            r.label,
            f"`{' '.join(r.args) or '(none)'}`",
            f"{r.seconds:.1f}",
            r.status,
        ]
        line.append(f"{r.objective:,.2f}" if r.objective is not None else "-")
        line.append(r.solves if r.solves is not None else "-")
        if side:
            line.append(f"{r.base_seconds:.1f}" if r.base_seconds is not None else "-")
            line.append(r.base_status or "-")
            line.append(f"{r.base_objective:,.2f}" if r.base_objective is not None else "-")
            line.append(f"{r.base_seconds / r.seconds:.1f}x" if r.base_seconds else "-")
        body.append(line)
    lines += markdown_table(head, align, body)
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, kw_only=True)
class SimulateSpeed:
    label: str
    requests: int
    ranks: int
    price_s: float  # the pools' iteration tables, built once per plan
    run_s: float  # the run itself: best of the repeats
    cpu_s: float  # its process CPU time (one thread)
    mean_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float


# The goals: the one-hour Azure conversation trace on one Llama-3.1-70B plan
# (<= 1 s) and 10,000 closed-loop requests (<= 0.5 s), both on vLLM.
SIMULATE_PLAN = ("llama-3.1-70b", "h100x8", "vllm")
AZURE_CONV = Path(__file__).parents[1] / "tests/data/traces/AzureLLMInferenceTrace_conv.csv.gz"


def simulate_speed(repeats: int = 3) -> list[SimulateSpeed]:
    """Seconds of the simulator's runs (the pricing apart), best of ``repeats``."""
    from shardlab.errors import ShardlabError
    from shardlab.problems.plan import Degrees
    from shardlab.problems.traces import read_trace
    from shardlab.problems.traffic import Lengths, closed_loop
    from shardlab.simulate import Deployment, price, simulate_priced

    if not AZURE_CONV.is_file():
        raise ShardlabError(
            f"{AZURE_CONV}: the Azure trace is not here", fix="run from a shardlab checkout"
        )
    model, cluster, engine = SIMULATE_PLAN
    problem = Problem.build(model, cluster, "chat", engine=engine)
    plan = problem.space.megatron_plan(Degrees(replicas=2, tp=4, etp=4))
    runs = (
        ("Azure conversation hour (trace arrivals)", read_trace(AZURE_CONV)),
        (
            "closed loop: 256 clients x 40 prompts, 1024/256 x U[0.8, 1]",
            closed_loop(
                clients=256,
                prompts_per_client=40,
                lengths=Lengths(kind="uniform", input_len=1024, output_len=256, range_ratio=0.8),
            ),
        ),
    )
    rows = []
    for label, traffic in runs:
        deployment = Deployment.of_plan(problem, plan)
        t0 = time.perf_counter()
        priced = price(deployment, traffic)
        price_s = time.perf_counter() - t0
        best, cpu = float("inf"), float("inf")
        for _ in range(repeats):
            c0 = time.process_time()
            sim = simulate_priced(deployment, priced, traffic)
            cpu = min(cpu, time.process_time() - c0)
            best = min(best, sim.wall_s)
        s = sim.summary()
        rows.append(
            SimulateSpeed(
                label=f"{label}, {model} {plan.degrees.short()} on {cluster}, {engine}",
                requests=traffic.requests,
                ranks=deployment.pools[0].ranks,
                price_s=price_s,
                run_s=best,
                cpu_s=cpu,
                mean_ttft_ms=s.latencies["ttft_ms"]["mean"],
                p99_ttft_ms=s.latencies["ttft_ms"]["p99"],
                mean_tpot_ms=s.latencies["tpot_ms"]["mean"],
            )
        )
    return rows


def simulate_markdown(command: str, rows: list[SimulateSpeed], repeats: int) -> str:
    lines = [
        "# Simulator speed",
        "",
        f"Produced by `{command}`; numbers are written by the code, never by hand. "
        f"Machine: {machine()}. Best of {repeats} runs, one thread; *price*: the plan's "
        "iteration tables (`shardlab.simulate.price`, once per plan and traffic); *run*: "
        "the event loop over every request; *CPU*: the run's process time.",
        "",
    ]
    lines += markdown_table(
        ["run", "requests", "ranks", "price s", "run s", "CPU s", "mean TTFT ms",
         "p99 TTFT ms", "mean TPOT ms"],
        "lrrrrrrrr",
        (
            [r.label, f"{r.requests:,}", r.ranks, f"{r.price_s:.2f}", f"{r.run_s:.3f}",
             f"{r.cpu_s:.3f}", f"{r.mean_ttft_ms:,.1f}", f"{r.p99_ttft_ms:,.1f}",
             f"{r.mean_tpot_ms:.2f}"]
            for r in rows
        ),
    )  # fmt: skip
    return "\n".join(lines) + "\n"
