"""The layers' shortest path (one stage) is the subproblem's optimum when it fits."""

from __future__ import annotations

import numpy as np
import pytest

from shardlab import Problem
from shardlab.costmodel.decompose import integer_tables, price
from shardlab.solvers.cpsat import SubproblemModel, chain_weights, valid_options
from shardlab.solvers.cpsat.chain import chain_plan


def _subproblem(model: str, degrees: str, requests_per_rank: int):
    p = Problem.build(model, "h100x4", "chat", tie="layer", batch=256)
    di = next(i for i, d in enumerate(p.space.degree_tuples) if d.short() == degrees)
    return p, di, p.space.degree_tuples[di]


@pytest.mark.parametrize(
    "model,degrees,requests_per_rank",
    [
        ("llama-3.1-8b", "replicas=1 pp=1 tp=4 dp_attn=1 ep=1 etp=4", 64),
        ("llama-3.1-8b", "replicas=2 pp=1 tp=2 dp_attn=1 ep=1 etp=2", 128),
    ],
)
def test_one_stage_shortest_path_is_the_cp_sat_optimum(
    model: str, degrees: str, requests_per_rank: int
):
    p, di, d = _subproblem(model, degrees, requests_per_rank)
    t = integer_tables(p, d, requests_per_rank)
    weights, const = chain_weights(p, d, requests_per_rank)
    found = chain_plan(p, t, weights, valid_options(p.space, di), requests_per_rank)
    assert found is not None
    plan, time_ns = found
    assert plan.degrees == d and plan.stage_layers == (p.model.num_layers,)
    assert plan.requests_per_rank == requests_per_rank
    p.space.encode(plan)  # a plan of the space: every option valid under its degrees
    cost = price(p, t, plan)
    # the time it reports is its plan's weighted time on the same tables
    steps = cost.stage_ns.sum(axis=1)
    assert time_ns == pytest.approx(float(np.dot(weights, steps)), rel=1e-12, abs=1)
    assert cost.fits
    exact = SubproblemModel(p, di, requests_per_rank).solve(120, 2, 0, lambda _: None)
    assert exact.status == "optimal" and exact.time_ns is not None
    assert time_ns + const == pytest.approx(exact.time_ns, rel=1e-9)
