"""Benchmarks (pytest-benchmark): speed next to solution quality, never asserted as
wall-clock limits. ``pytest --benchmark-enable -m slow tests/test_benchmarks.py`` times
them; by default each runs once as a functional check."""

from __future__ import annotations

from functools import cache

import pytest

from shardlab.compare import quality
from shardlab.costmodel import evaluate_batch
from shardlab.problems.suite import get_instance, get_suite
from shardlab.solvers import Budget, available_solvers, solve

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
