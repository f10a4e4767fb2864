"""Benchmarks (pytest-benchmark): speed next to solution quality, never asserted as
wall-clock limits. ``pytest -n 0 --benchmark-enable -m slow tests/test_benchmarks.py`` times
them; by default each runs once as a functional check."""

from __future__ import annotations

from functools import cache

import pytest

from shardlab import Problem
from shardlab.costmodel import evaluate, evaluate_batch
from shardlab.problems.suite import get_instance, get_suite
from shardlab.solvers import Budget, available_solvers, solve
from shardlab.solvers.base import quality

BENCH_INSTANCES = ["llama70b-h100x4-chat", "deepseek-v3-h100x64-chat"]


@cache
def optimum(name: str) -> float:
    r = solve(get_instance(name).problem(), "cpsat", budget=Budget(max_evals=None, seconds=600))
    assert r.status == "optimal"
    return r.metrics.objective


def test_bench_evaluate_batch(benchmark) -> None:
    """DeepSeek-V3 on 64 H100, chat, options tied per layer kind: plans per second."""
    problem = get_instance("deepseek-v3-h100x64-chat").problem()
    codes = problem.space.sample(20_000, seed=0)
    evaluate_batch(problem, codes)  # build the tables once, as a search does
    result = benchmark(evaluate_batch, problem, codes)
    assert len(result) == len(codes)
    stats = benchmark.stats
    if stats is not None:
        benchmark.extra_info["plans_per_second"] = len(codes) / stats["min"]


def test_bench_evaluate_batches_of_64(benchmark) -> None:
    """What anneal, genetic and RL send: 64 plans per call, tables built."""
    problem = get_instance("deepseek-v3-h100x64-chat").problem()
    batches = problem.space.sample(64 * 20, seed=1).reshape(20, 64, -1)
    for b in batches:
        evaluate_batch(problem, b)
    result = benchmark(lambda: [evaluate_batch(problem, b) for b in batches])
    assert len(result) == len(batches)
    stats = benchmark.stats
    if stats is not None:
        benchmark.extra_info["plans_per_second"] = batches.size // batches.shape[2] / stats["min"]


def test_bench_evaluate_one_plan(benchmark) -> None:
    """``evaluate``: one plan with its per-operator breakdown."""
    problem = get_instance("deepseek-v3-h100x64-chat").problem()
    plan = problem.space.decode(problem.space.sample(1, seed=2)[0])
    evaluate(problem, plan)
    metrics = benchmark(evaluate, problem, plan)
    assert metrics.breakdown


@pytest.mark.slow
@pytest.mark.parametrize("gpus", [256, 512, 1024, 2048])
def test_bench_cpsat_at_scale(benchmark, gpus: int) -> None:
    """moe-1.6t, options tied, to the proven optimum (minutes: benchmarks only)."""
    if benchmark.disabled:
        pytest.skip("times CP-SAT up to 2,048 GPUs: run with --benchmark-enable")
    problem = Problem.build("moe-1.6t", f"h100x{gpus}", "chat", batch=4096)
    result = benchmark.pedantic(
        solve,
        args=(problem, "cpsat"),
        kwargs={"budget": Budget(max_evals=None, seconds=600)},
        rounds=1,
    )
    benchmark.extra_info["status"] = result.status
    assert result.status == "optimal"


@pytest.mark.slow
@pytest.mark.parametrize("name", BENCH_INSTANCES)
@pytest.mark.parametrize("method", [m for m in available_solvers() if m != "exhaustive"])
def test_bench_solver(benchmark, method: str, name: str) -> None:
    problem = get_instance(name).problem()
    # 1,000 evaluations or 30 s, whichever comes first (Optuna's TPE is the slow one)
    budget = Budget(max_evals=1000, seconds=30)
    result = benchmark.pedantic(
        solve, args=(problem, method), kwargs={"budget": budget, "seed": 0}, rounds=1
    )
    assert result.status in ("optimal", "feasible")
    best = optimum(name)
    benchmark.extra_info.update(
        {
            "throughput_tok_s": result.metrics.throughput_tok_s,
            "ratio_to_optimum": quality(result.metrics.objective, best),
            "n_evals": result.n_evals,
            "status": result.status,
        }
    )
    assert result.metrics.objective <= best + 1e-4 * abs(best)


@pytest.mark.slow
@pytest.mark.parametrize("name", [i.name for i in (*get_suite("small"), *get_suite("medium"))])
def test_bench_cpsat_time_to_optimum(benchmark, name: str) -> None:
    problem = get_instance(name).problem()
    result = benchmark.pedantic(
        solve,
        args=(problem, "cpsat"),
        kwargs={"budget": Budget(max_evals=None, seconds=600)},
        rounds=1,
    )
    benchmark.extra_info.update(
        {
            "status": result.status,
            "subproblems": result.facts.get("subproblems"),
            "solved": result.facts.get("solved"),
            "gap": result.facts.get("gap"),
        }
    )
    assert result.status == "optimal"


# Exhaustive prices its largest space (0.9 M plans) in about 5 s: shorter limits.
# Untimed (CI) only the shortest limit runs: 2 s of ``hard`` is as unfinishable as 30 s.
OVERRUN_CASES = [
    (m, limit) for m in available_solvers() if m != "exhaustive" for limit in (2.0, 5.0, 30.0)
] + [("exhaustive", 1.0), ("exhaustive", 2.0)]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "limit"), OVERRUN_CASES)
def test_bench_time_limit_overrun(
    benchmark, method: str, limit: float, hard: Problem, enumerable: Problem
) -> None:
    """Seconds past the time limit, from the call of ``solve`` (loading the method
    included), on a search no method finishes in time; the budget contract is at most
    max(1 s, 2%). Exhaustive runs on the largest space it accepts."""
    if benchmark.disabled and limit > min(m_limit for m, m_limit in OVERRUN_CASES if m == method):
        # untimed, a longer limit checks nothing the shortest does not
        pytest.skip("the longer limits are timed with --benchmark-enable")
    problem = enumerable if method == "exhaustive" else hard
    budget = Budget(max_evals=None, seconds=limit)
    result = benchmark.pedantic(
        solve, args=(problem, method), kwargs={"budget": budget, "seed": 0}, rounds=1
    )
    stats = benchmark.stats
    wall = stats["max"] if stats is not None else result.wall_s
    benchmark.extra_info.update(
        {
            "limit_s": limit,
            "overrun_s": wall - limit,
            "status": result.status,
            "ran_out_in": result.facts.get("ran_out_in"),
        }
    )
    assert result.status in ("feasible", "unknown") or method == "megatron"


def test_bench_evaluate_one_plan_metrics_only(benchmark) -> None:
    """``evaluate(breakdown=False)``: one plan's metrics, the scalar path solvers use."""
    problem = get_instance("deepseek-v3-h100x64-chat").problem()
    plan = problem.space.decode(problem.space.sample(1, seed=2)[0])
    evaluate(problem, plan, breakdown=False)
    metrics = benchmark(evaluate, problem, plan, breakdown=False)
    assert metrics == evaluate(problem, plan) and not metrics.breakdown


@pytest.mark.slow
def test_bench_simulate_the_azure_hour(benchmark) -> None:
    """The simulator on the one-hour Azure conversation trace (19,366 requests), one
    Llama-3.1-70B plan on vLLM, its iteration tables built: the issue's goal is 1 s on
    one core (`shardlab bench simulate` writes the table)."""
    from shardlab import Degrees
    from shardlab.bench import AZURE_CONV
    from shardlab.problems.traces import read_trace
    from shardlab.simulate import Deployment, price, simulate_priced

    problem = Problem.build("llama-3.1-70b", "h100x8", "chat", engine="vllm")
    plan = problem.space.megatron_plan(Degrees(replicas=2, tp=4, etp=4))
    deployment = Deployment.of_plan(problem, plan)
    traffic = read_trace(AZURE_CONV)
    priced = price(deployment, traffic)
    sim = benchmark(simulate_priced, deployment, priced, traffic)
    assert sim.traffic.requests == 19_366
    benchmark.extra_info["requests_per_second"] = 19_366 / sim.wall_s
