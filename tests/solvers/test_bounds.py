"""CP-SAT's subproblem bounds are bounds: no plan beats its subproblem's bound, and no
discarded subproblem holds a feasible plan (what every proof of optimality rests on)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab.costmodel import degree_tables, integer_tables, judge, price
from shardlab.problems.space import balanced_boundaries, max_shift
from shardlab.problems.suite import get_instance
from shardlab.solvers.cpsat.bounds import _stage_floor, subproblems

# pipelines of one and two layer kinds, dense and MoE, SLO-bound and not, prefill-heavy
CASES = [
    "llama70b-h100x4-chat",
    "llama8b-h100x4-latency",
    "mixtral8x7b-h100x4-chat",
    "gptoss-h100x4-interactive",
    "llama70b-h200x4-prefill",
]
RELATIVE = 1e-9


@pytest.mark.parametrize("name", CASES)
def test_no_sampled_plan_beats_its_subproblems_bound(name: str) -> None:
    problem = get_instance(name).problem()
    space = problem.space
    subs, _ = subproblems(problem)
    bound = {(s.degree_index, s.requests_per_rank): s.bound for s in subs}
    rng = np.random.default_rng(0)
    checked = pipelined = 0
    for code in space.sample(300, seed=1):
        plan = space.decode(code)
        d = plan.degrees
        di = int(code[0])
        r = degree_tables(problem, d).request_range
        top = r.max_requests_per_rank
        for c in {1, top, int(rng.integers(1, top + 1))} if r.inflight else {top}:
            at = dataclasses.replace(plan, requests_per_rank=c)
            cost = price(problem, integer_tables(problem, d, c), at)
            verdict = judge(problem, cost.latencies, np.array([cost.fits]))
            if not verdict.feasible[0]:
                continue
            # a feasible plan lies in a subproblem that was kept, below its bound
            assert (di, c) in bound, (d, c)
            objective = float(verdict.objective[0])
            assert objective <= bound[(di, c)] + RELATIVE * abs(bound[(di, c)]), (d, c)
            checked += 1
            pipelined += d.pp > 1
    assert checked >= 50 and pipelined >= 10, (checked, pipelined)


def _floor_by_enumeration(layer_low, first_low, last_low, sends, pp):
    n_steps, n_layers, n_c = layer_low.shape
    shift = max_shift(n_layers, pp)
    ranges = [range(b - shift, b + shift + 1) for b in balanced_boundaries(n_layers, pp)]
    best = np.full((n_steps, n_c), np.inf)
    for cuts in itertools.product(*ranges):
        edges = [0, *cuts, n_layers]
        if any(a >= b for a, b in itertools.pairwise(edges)):
            continue
        slowest = np.zeros((n_steps, n_c))
        for s in range(pp):
            t = layer_low[:, edges[s] : edges[s + 1]].sum(axis=1)
            t = t + (first_low if s == 0 else 0) + (last_low if s == pp - 1 else 0)
            t = t + (sends[:, s] if s < pp - 1 else 0)
            slowest = np.maximum(slowest, t)
        best = np.minimum(best, slowest)
    return best


@settings(max_examples=60, deadline=None)
@given(
    pp=st.integers(2, 4),
    n_layers=st.integers(4, 24),
    seed=st.integers(0, 2**31),
)
def test_stage_floor_is_the_least_slowest_stage_over_the_partitions(
    pp: int, n_layers: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    steps, n_c = 2, 3
    layer_low = rng.integers(0, 100, (steps, n_layers, n_c)).astype(float)
    first, last = rng.integers(0, 300, (2, steps, n_c)).astype(float)
    sends = rng.integers(0, 20, (steps, pp - 1, n_c)).astype(float)
    got = _stage_floor(layer_low, first, last, sends, pp)
    np.testing.assert_array_equal(got, _floor_by_enumeration(layer_low, first, last, sends, pp))
