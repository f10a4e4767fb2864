"""Load as a rate: CP-SAT's request_rate optimum is exact, and a plan run at a rate
settles where every lower load meets the SLOs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab.costmodel import evaluate, evaluate_batch
from shardlab.costmodel.rate import fit_rate, little_rate, prefix_capacity
from shardlab.errors import ShardlabError
from shardlab.problems.problem import Problem
from shardlab.problems.suite import get_instance
from shardlab.solvers import Budget, solve

ROUNDING = 1e-4  # the tables' rounding (shardlab.costmodel.decompose)


def _at_rate_objective(name: str) -> Problem:
    problem = get_instance(name).problem()
    w = problem.workload
    return dataclasses.replace(
        problem,
        workload=dataclasses.replace(
            w, objective="request_rate", ttft_ms=w.ttft_ms or 2000, tpot_ms=w.tpot_ms or 50
        ),
    )


@pytest.mark.parametrize(
    "name",
    [
        "llama8b-h100x2-chat",
        "gptoss-h100x4-interactive",
        pytest.param("llama70b-h100x4-chat", marks=pytest.mark.slow),
        pytest.param("mixtral8x7b-h100x4-chat", marks=pytest.mark.slow),
    ],
)
def test_request_rate_optimum_equals_exhaustive(name: str) -> None:
    problem = _at_rate_objective(name)
    exact = solve(problem, "cpsat", budget=Budget(max_evals=None, seconds=300), baseline=False)
    truth = solve(problem, "exhaustive", budget=Budget(max_evals=None), baseline=False)
    assert exact.status == truth.status == "optimal"
    assert exact.metrics.objective == pytest.approx(truth.metrics.objective, rel=ROUNDING)
    m = exact.metrics
    assert m.objective == pytest.approx(m.requests_in_flight / (m.latency_ms / 1e3))


RATE_PROBLEM = Problem.build(
    "llama-3.1-70b",
    "h200x2",
    "chat",
    engine="trtllm",
    space_kind="engine",
    input_len=1024,
    output_len=256,
    ttft_ms=2000,
    tpot_ms=50,
    rate=1.0,
)


@pytest.fixture(scope="module")
def capacity_plan():
    problem = dataclasses.replace(
        RATE_PROBLEM, workload=dataclasses.replace(RATE_PROBLEM.workload, rate=None)
    )
    s = solve(problem, "cpsat", budget=Budget.exact(), baseline=False)
    assert s.status == "optimal"
    return problem, s.plan


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(fraction=st.floats(0.01, 1.0))
def test_a_rate_settles_where_every_lower_load_meets_the_slos(capacity_plan, fraction) -> None:
    problem, plan = capacity_plan
    top = evaluate(problem, plan, breakdown=False).requests_per_rank
    capacity, last = prefix_capacity(problem, plan, top, little_rate)
    fit = fit_rate(problem, plan, capacity * fraction)
    c = fit.plan.requests_per_rank
    assert c <= last
    assert fit.metrics.feasible and fit.served >= fit.rate * (1 - 1e-12)
    # the fewest requests in flight that reach the rate: one fewer falls short
    if c > 1:
        lower = evaluate(problem, dataclasses.replace(plan, requests_per_rank=c - 1))
        assert lower.requests_in_flight / (lower.latency_ms / 1e3) < fit.rate
    # every load up to it meets the SLOs
    cs = np.arange(1, c + 1)
    codes = np.repeat(problem.space.encode(plan)[None], len(cs), axis=0)
    assert evaluate_batch(problem, codes, requests_per_rank=cs).feasible.all()


def test_a_rate_past_capacity_is_refused(capacity_plan) -> None:
    problem, plan = capacity_plan
    with pytest.raises(ShardlabError, match="serves at most"):
        fit_rate(problem, plan, 1e4)
