"""A prefill pool in the simulator: alone (each request ends as its cache arrives, what
a sizing under a TTFT percentile measures) and on a pipeline (the prompts of one
iteration overlap across the stages)."""

from __future__ import annotations

import dataclasses

import numpy as np

from shardlab.problems.disagg import prefill_problem
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from shardlab.problems.traffic import Arrivals, Lengths, synthetic_traffic
from shardlab.simulate import Deployment, Pool, price, simulate, simulate_priced
from shardlab.simulate.pricing import Pricer


def _prefill(pp: int) -> tuple[Problem, object]:
    base = Problem.build("llama-3.1-8b", "h100x2", "chat", engine="vllm")
    problem = prefill_problem(base, 2, 1, decode_pp=1, decode_tp=2, one_domain=False)
    return problem, problem.space.megatron_plan(Degrees(pp=pp, tp=2 // pp, etp=2 // pp))


def _poisson(rate: float, n: int = 300) -> object:
    return synthetic_traffic(
        requests=n,
        lengths=Lengths(kind="fixed", input_len=1024, output_len=128),
        arrivals=Arrivals(kind="poisson", rate=rate),
        seed=1,
    )


def test_a_prefill_pool_alone_ends_each_request_at_its_handoff() -> None:
    problem, plan = _prefill(1)
    dep = Deployment(pools=(Pool(role="prefill", problem=problem, plan=plan),))
    traffic = _poisson(2.0)
    priced = price(dep, traffic)
    sim = simulate_priced(dep, priced, traffic)
    assert np.all(np.isfinite(sim.first_s)) and np.array_equal(sim.first_s, sim.finish_s)
    pc = priced[0]
    # at least the prompt alone and its cache's trip
    low = pc.costs.prompt(1024.0) + pc.handoff_fixed_s + pc.handoff_token_s * 1024
    assert np.all(sim.first_s - sim.arrival_s >= low - 1e-9)


def test_the_prompts_of_one_iteration_overlap_on_a_pipeline() -> None:
    problem, plan = _prefill(2)
    dep = Deployment(pools=(Pool(role="prefill", problem=problem, plan=plan),))
    pc = price(dep, _poisson(1.0, n=10))[0]
    one = float(pc.costs.prompt(1024.0))
    pipe, flat = Pricer(pc.costs, stages=2), Pricer(pc.costs)
    assert flat.prompts(4 * one, one) == 4 * one
    assert pipe.prompts(one, one) == one  # one prompt: through every stage
    assert pipe.prompts(4 * one, one) == 2 * one  # four: each stage holds half of them


def test_a_pipelined_prefill_pool_keeps_up_with_what_its_stages_compute() -> None:
    """Two stages serve about twice the prompts one prompt at a time would: at a rate
    between the two, the queue stays bounded."""
    problem, plan = _prefill(2)
    dep = Deployment(pools=(Pool(role="prefill", problem=problem, plan=plan),))
    pc = price(dep, _poisson(1.0, n=10))[0]
    serial = 1.0 / (float(pc.costs.prompt(1024.0)) + pc.costs.iteration_s)  # prompts/s
    sim = simulate(dep, _poisson(1.4 * serial, n=600))
    waits = sim.first_s - sim.arrival_s
    # one prompt at a time, the queue grows: the last waits 7x the first (measured)
    assert np.percentile(waits[-100:], 90) < 3 * np.percentile(waits[:100], 90)
    assert dataclasses.replace(plan).degrees.pp == 2
