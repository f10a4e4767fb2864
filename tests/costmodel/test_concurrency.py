"""The plan chooses its concurrency (requests per attention-DP rank, the engine's max
batch size): exact against enumeration over (plan, concurrency), never below the
fixed-batch optimum, carried by plans, honoured by evaluation."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from shardlab import Problem, ShardlabError
from shardlab.cli import app
from shardlab.costmodel import evaluate, evaluate_batch
from shardlab.costmodel.decompose import integer_tables, price
from shardlab.costmodel.tables import degree_tables
from shardlab.problems.plan import Plan
from shardlab.solvers import Budget, solve
from shardlab.solvers.cpsat import ROUNDING
from shardlab.solvers.exhaustive import enumerate_codes

# Small spaces (69,998 plans) where the KV cache or an SLO decides the concurrency.
SMALL = {
    "kv-bound": dict(model="qwen3-32b", cluster="h100x2", workload="chat", batch=24),
    "slo-bound": dict(
        model="llama-3.1-8b", cluster="h100x2", workload="chat", batch=24, tpot_ms=9.0
    ),
}


def every_plan(problem: Problem) -> np.ndarray:
    space = problem.space
    return np.concatenate(
        [c for d in range(space.num_degree_tuples) for c in enumerate_codes(space, d)]
    )


def offered(problem: Problem, codes: np.ndarray) -> np.ndarray:
    """Most requests per dp rank each row's degree tuple is offered."""
    tuples = problem.space.degree_tuples
    tops = [degree_tables(problem, d).request_range.max_requests_per_rank for d in tuples]
    return np.asarray(tops)[codes[:, 0]]


def best_over_plan_and_c(problem: Problem, codes: np.ndarray) -> np.ndarray:
    """Per row: the best feasible objective over every concurrency, by enumeration."""
    top = offered(problem, codes)
    best = np.full(len(codes), -np.inf)
    for c in range(1, int(top.max()) + 1):
        rows = np.flatnonzero(top >= c)
        m = evaluate_batch(problem, codes[rows], requests_per_rank=np.full(len(rows), c))
        best[rows] = np.maximum(best[rows], np.where(m.feasible, m.objective, -np.inf))
    return best


@pytest.mark.parametrize("case", list(SMALL))
def test_free_concurrency_is_the_enumeration_over_plans_and_concurrencies(case: str) -> None:
    problem = Problem.build(**SMALL[case])
    codes = every_plan(problem)
    assert len(codes) == problem.space.num_plans()
    truth = best_over_plan_and_c(problem, codes)
    assert np.isfinite(truth).any()
    chosen = evaluate_batch(problem, codes)
    # the evaluator's choice is each plan's best concurrency ...
    got = np.where(chosen.feasible, chosen.objective, -np.inf)
    np.testing.assert_allclose(got, truth, rtol=1e-12)
    # ... at a concurrency it names and that re-evaluates to the same point
    some = np.flatnonzero(chosen.feasible)[:: max(1, int(chosen.feasible.sum()) // 50)]
    again = evaluate_batch(problem, codes[some], requests_per_rank=chosen.requests_per_rank[some])
    np.testing.assert_allclose(again.objective, chosen.objective[some], rtol=1e-12)
    # and CP-SAT proves the optimum over (plan, concurrency)
    r = solve(problem, "cpsat", budget=Budget(max_evals=None, seconds=300), seed=0)
    assert r.status == "optimal" and r.plan is not None
    assert r.objective == pytest.approx(truth.max(), rel=ROUNDING)
    assert r.plan.requests_per_rank == r.metrics.requests_per_rank


@pytest.mark.parametrize("batch", [2, 8, 24, 64])
def test_free_optimum_is_at_least_the_fixed_batch_optimum(batch: int) -> None:
    # fixed batch: every plan runs what its KV cache holds of the batch (the engine's
    # default, and what shardlab did before the concurrency was a decision)
    problem = Problem.build("qwen3-32b", "h100x2", "chat", batch=batch, tpot_ms=30.0)
    codes = problem.space.sample(3000, seed=1)
    free = evaluate_batch(problem, codes)
    fill = evaluate_batch(problem, codes, requests_per_rank=np.maximum(free.capacity_per_rank, 1))
    assert (free.capacity_per_rank <= offered(problem, codes)).all()
    free_obj = np.where(free.feasible, free.objective, -np.inf)
    fill_obj = np.where(fill.feasible, fill.objective, -np.inf)
    assert (free_obj >= fill_obj - 1e-12 * np.abs(fill_obj)).all()
    assert (free.feasible | ~fill.feasible).all()  # feasible at the fill: feasible
    r = solve(problem, "cpsat", budget=Budget(max_evals=None, seconds=120), seed=0)
    assert r.status == "optimal"
    assert r.objective >= fill_obj.max() * (1 - ROUNDING)


def test_a_plan_carries_its_concurrency_and_evaluation_honours_it() -> None:
    problem = Problem.build("llama-3.1-8b", "h100x2", "chat", batch=64, tpot_ms=12.0)
    r = solve(problem, "cpsat", budget=Budget(max_evals=None, seconds=120), seed=0)
    assert r.plan is not None and r.metrics is not None
    c = r.plan.requests_per_rank
    assert c == r.metrics.requests_per_rank and 1 <= c <= r.metrics.capacity_per_rank
    text = r.plan.to_json(problem.model)
    assert json.loads(text)["requests_per_rank"] == c
    plan = Plan.from_json(text, problem.model)
    assert plan == r.plan
    assert evaluate(problem, plan).objective == pytest.approx(r.objective)
    fewer = evaluate(problem, dataclasses.replace(plan, requests_per_rank=max(c // 2, 1)))
    assert fewer.requests_per_rank == max(c // 2, 1)
    assert fewer.tpot_ms <= r.metrics.tpot_ms
    assert fewer.throughput_tok_s < r.metrics.throughput_tok_s
    with pytest.raises(ShardlabError, match="more than this workload offers"):
        evaluate(problem, dataclasses.replace(plan, requests_per_rank=10_000))


def test_a_plan_holding_more_requests_than_its_cache_takes_is_out_of_memory() -> None:
    """Long contexts on two GPUs: the KV cache, not the offered load, caps the requests
    per rank, and one more request than it takes is a memory violation."""
    problem = Problem.build("qwen3-32b", "h100x2", "long-context", batch=96)
    row = problem.space.sample(1, seed=0)[0]
    plan = problem.space.decode(row)
    held = evaluate(problem, plan, breakdown=False).capacity_per_rank
    assert held < offered(problem, row[None])[0]  # the cache binds first
    assert evaluate(problem, dataclasses.replace(plan, requests_per_rank=held)).feasible
    over = evaluate(problem, dataclasses.replace(plan, requests_per_rank=held + 1))
    assert "memory" in over.violations and not over.feasible


def test_the_static_schedule_runs_its_batch() -> None:
    problem = Problem.build("llama-3.1-8b", "h100x2", "batch-offline", batch=32)
    plan = problem.space.megatron_plan(problem.space.degree_tuples[0])
    m = evaluate(problem, plan)
    share = degree_tables(problem, plan.degrees).request_range.max_requests_per_rank
    assert m.requests_in_flight == 32 and m.requests_per_rank == share
    r = solve(problem, "random", budget=Budget(max_evals=50), seed=0)
    assert r.plan is not None and r.plan.requests_per_rank is None
    with pytest.raises(ShardlabError, match="static schedule runs its batch"):
        evaluate(problem, dataclasses.replace(plan, requests_per_rank=share + 1))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), which=st.sampled_from(["qwen3-32b", "mixtral-8x7b"]))
def test_the_floor_tables_bound_every_larger_concurrency(seed: int, which: str) -> None:
    # what CP-SAT's bisection relies on: a floor model infeasible at c proves every
    # subproblem from c on infeasible, though the times themselves are not monotone
    problem = Problem.build(which, "h100x4", "chat", batch=64)
    plan = problem.space.decode(problem.space.sample(1, seed=seed)[0])
    top = degree_tables(problem, plan.degrees).request_range.max_requests_per_rank
    cs = np.arange(1, top + 1)
    ttft = np.array(
        [
            price(problem, integer_tables(problem, plan.degrees, c), plan).latencies.ttft_s[0]
            for c in cs
        ]
    )
    tpot = np.array(
        [
            price(problem, integer_tables(problem, plan.degrees, c), plan).latencies.tpot_s[0]
            for c in cs
        ]
    )
    for c in cs[:: max(1, top // 8)]:
        low = price(problem, integer_tables(problem, plan.degrees, int(c), floor=True), plan)
        assert low.latencies.tpot_s[0] <= tpot[c - 1 :].min() + 1e-12
        assert low.latencies.ttft_s[0] <= ttft[c - 1 :].min() + 1e-12
    mem = [
        evaluate(problem, dataclasses.replace(plan, requests_per_rank=int(c))).memory_gb_per_gpu
        for c in cs
    ]
    assert (np.diff(mem) >= 0).all()


def test_evaluate_says_when_it_chose_the_concurrency() -> None:
    runner = CliRunner()
    args = ["evaluate", "-m", "llama-3.1-8b", "-c", "h100x2", "--tp", "2", "--tpot-ms", "12"]
    chosen = runner.invoke(app, args)
    assert chosen.exit_code == 0, chosen.output
    assert "concurrency chosen:" in chosen.output
    fixed = runner.invoke(app, [*args, "--concurrency", "4", "-f", "json"])
    assert fixed.exit_code == 0, fixed.output
    data = json.loads(fixed.output)
    assert data["concurrency_chosen"] is False
    assert data["requests_per_rank"] == 4 and data["plan"]["requests_per_rank"] == 4


# Deep pipelines (micro-batches of several requests), SLOs, a latency objective, a
# bound KV cache: the shapes in which only some concurrencies can be best.
DEEP = {
    "deepseek-64": dict(model="deepseek-v3", cluster="h100x64", workload="chat"),
    "deepseek-slo": dict(
        model="deepseek-v3", cluster="h200x16", workload="chat", ttft_ms=800.0, tpot_ms=60.0
    ),
    "llama-latency": dict(
        model="llama-3.1-70b", cluster="h100x16", workload="chat", objective="latency"
    ),
    "qwen-kv": dict(model="qwen3-32b", cluster="h100x8", workload="long-context", batch=96),
}


@pytest.mark.parametrize("case", list(DEEP))
def test_the_chosen_concurrency_is_the_fewest_requests_of_the_best(case: str) -> None:
    problem = Problem.build(**DEEP[case])
    codes = problem.space.sample(120, seed=3)
    chosen = evaluate_batch(problem, codes)
    top = offered(problem, codes)
    n, c_max = len(codes), int(top.max())
    score = np.full((n, c_max), -np.inf)
    for c in range(1, c_max + 1):
        rows = np.flatnonzero(top >= c)
        m = evaluate_batch(problem, codes[rows], requests_per_rank=np.full(len(rows), c))
        score[rows, c - 1] = np.where(m.feasible, m.objective, -np.inf)
    best = score.max(axis=1)
    has = np.isfinite(best)
    assert has.any()
    got = np.where(chosen.feasible, chosen.objective, -np.inf)
    np.testing.assert_allclose(got[has], best[has], rtol=1e-12)
    assert not chosen.feasible[~has].any()
    near = score >= best[:, None] - 1e-9 * np.abs(best[:, None])
    fewest = near.argmax(axis=1) + 1  # of near-ties the fewest requests
    np.testing.assert_array_equal(chosen.requests_per_rank[has], fewest[has])
    assert (chosen.requests_per_rank[~has] == 1).all()  # nothing feasible: one request
