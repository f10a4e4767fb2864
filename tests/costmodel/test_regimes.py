"""Serving regimes: from step times to TTFT, TPOT, latency and throughput
(shardlab.costmodel.regimes)."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest

from shardlab import Degrees, Problem
from shardlab.costmodel.decompose import integer_tables, price, requests_per_rank
from shardlab.costmodel.engines import ServingCosts, engine_limits, serving_costs
from shardlab.costmodel.modes import ARRAYS, ARRAYS_NS, EXACT, Arith
from shardlab.costmodel.pricing import evaluate
from shardlab.costmodel.regimes import (
    DegreeArrays,
    Latencies,
    basic_times,
    clients_per_rank,
    forms,
    judge,
    latencies,
)
from shardlab.costmodel.steps import steps_of


def build(**workload) -> Problem:
    return Problem.build("llama-3.1-8b", "h100x8", "chat", timing="roofline", **workload)


def one(**d: int) -> DegreeArrays:
    full = {"pp": 1, "replicas": 1, "dp_attn": 1, "tp": 1, **d}
    return DegreeArrays(**{k: np.array([v]) for k, v in full.items()})


def test_a_static_request_is_its_prefill_then_its_decode_rounds() -> None:
    problem = build(schedule="static", batch=16, input_len=512, output_len=64)
    steps = steps_of(problem.workload)
    assert [s.kind for s in steps] == ["prefill", "decode"]
    sums, maxes = [np.array([0.3]), np.array([0.010])], [np.array([0.2]), np.array([0.006])]
    t = latencies(problem, one(pp=2), steps, 16, np.array([16]), sums, maxes, np.array([8192]))
    i = serving_costs(problem).iteration_ns * 1e-9
    prompt = 0.3 + (2 - 1) * 0.2  # two micro-batches through two stages: fill and drain
    round_ = max(0.010, 2 * 0.006)  # a steady round: the busiest stage, twice
    assert t.ttft_s[0] == pytest.approx(prompt + i)
    assert t.tpot_s[0] == pytest.approx(round_ + i)
    assert t.latency_s[0] == pytest.approx(prompt + i + 63 * (round_ + i))
    assert t.throughput[0] == pytest.approx(16 * 64 / t.latency_s[0])
    assert t.requests_in_flight[0] == 16


def test_static_prefill_and_decode_phases() -> None:
    prefill = build(schedule="static", phase="prefill", batch=8, input_len=256)
    s = [np.array([0.05])]
    t = latencies(prefill, one(), steps_of(prefill.workload), 8, np.array([8]), s, s, np.array([1]))
    i = serving_costs(prefill).iteration_ns * 1e-9
    assert t.ttft_s[0] == pytest.approx(0.05 + i)
    assert t.throughput[0] == pytest.approx(8 * 256 / (0.05 + i))
    decode = build(schedule="static", phase="decode", batch=8)
    t = latencies(decode, one(), steps_of(decode.workload), 8, np.array([8]), s, s, np.array([1]))
    assert t.tpot_s[0] == pytest.approx(0.05 + i)
    assert t.throughput[0] == pytest.approx(8 / (0.05 + i))


def closed_loop(problem: Problem, running: int, clients: int, costs: ServingCosts | None = None):
    kinds = [s.kind for s in steps_of(problem.workload)]
    return forms(problem, kinds, running, clients, 8192, 0, arith=EXACT, costs=costs)


def test_exact_and_array_forms_are_the_same_regime() -> None:
    problem = build(input_len=1000, output_len=200, prompts_per_client=10)
    kinds = [s.kind for s in steps_of(problem.workload)]
    running, clients = np.array([1, 7, 32, 32]), np.array([1, 7, 32, 64])
    arrays = forms(problem, kinds, running, clients, np.array([8192] * 4), 0.0, arith=ARRAYS_NS)
    for k in range(4):
        exact = closed_loop(problem, int(running[k]), int(clients[k]))
        for name in ("ttft", "tpot", "latency", "rate"):
            fe, fa = getattr(exact, name), getattr(arrays, name)
            for part in ("round", "prompt", "const"):
                assert float(getattr(fe, part)) == pytest.approx(
                    float(np.broadcast_to(getattr(fa, part), (4,))[k]), rel=1e-12
                ), (name, part, k)
        assert isinstance(exact.ttft.round, Fraction)


@pytest.mark.parametrize("mode", [ARRAYS, ARRAYS_NS])
def test_the_array_modes_compute_what_the_exact_mode_does(mode: Arith) -> None:
    # each operation of the strategy, element by element, against its exact counterpart
    rng = np.random.default_rng(0)
    a, b, c = (rng.integers(1, 40, size=200) for _ in range(3))
    lo, hi = np.minimum(b, c), np.maximum(b, c)
    exact = {
        "ratio": [EXACT.ratio(int(x), int(y)) for x, y in zip(a, b, strict=True)],
        "minimum": [EXACT.minimum(int(x), int(y)) for x, y in zip(a, b, strict=True)],
        "maximum": [EXACT.maximum(int(x), int(y)) for x, y in zip(a, b, strict=True)],
        "clip": [EXACT.clip(int(x), int(p), int(q)) for x, p, q in zip(a, lo, hi, strict=True)],
    }
    arrays = {
        "ratio": mode.ratio(a, b),
        "minimum": mode.minimum(a, b),
        "maximum": mode.maximum(a, b),
        "clip": mode.clip(a, lo, hi),
    }
    for name, want in exact.items():
        np.testing.assert_allclose(arrays[name], [float(x) for x in want], rtol=1e-15, err_msg=name)
    assert isinstance(exact["ratio"][0], Fraction)
    assert mode.number(Fraction(3, 2)) == 1.5 and EXACT.number(Fraction(3, 2)) == Fraction(3, 2)
    assert np.array_equal(mode.zeros(a), np.zeros(200)) and EXACT.zeros(7) == 0


def test_ttft_grows_with_clients_waiting_for_a_slot() -> None:
    problem = build(input_len=1000, output_len=200)
    alone = closed_loop(problem, 16, 16).ttft
    waiting = closed_loop(problem, 16, 32).ttft  # half of them wait for a running one
    assert waiting.round > alone.round and waiting.prompt > alone.prompt
    # each waiting request sits through a whole request of the one it replaces
    assert waiting.round - alone.round == 1 * (Fraction(3, 2) + 200 - 1)


def test_an_engine_that_prefills_alone_waits_fewer_rounds() -> None:
    problem = build(input_len=1000, output_len=200)
    costs = serving_costs(problem)
    mixed = closed_loop(problem, 16, 16, dataclasses.replace(costs, prefill_first=False))
    alone = closed_loop(problem, 16, 16, dataclasses.replace(costs, prefill_first=True))
    assert alone.ttft.round < mixed.ttft.round
    assert alone.ttft.prompt == mixed.ttft.prompt
    assert alone.tpot == mixed.tpot  # the round itself is the same


def test_tpot_is_the_round_and_latency_adds_the_output() -> None:
    problem = build(input_len=1000, output_len=200)
    f = closed_loop(problem, 16, 16)
    assert (f.tpot.round, f.tpot.prompt, f.tpot.const) == (1, 0, 0)
    assert f.latency.round == f.ttft.round + 199
    assert f.rate == f.tpot and f.time("throughput") == f.rate and f.time("latency") == f.latency


@pytest.mark.parametrize("engine", ["trtllm", "sglang"])
def test_in_flight_tpot_is_the_decode_round_and_its_share_of_whole_prompts(engine: str) -> None:
    """A MoE model's TPOT in flight: the decode phase's round plus ``c / output`` of a
    prompt alone. Spread as ``input / output`` tokens a request over every round, a
    prompt's tokens were priced at a small batch's cost per token (a MoE layer reads
    most of its experts for 40 tokens), and the round came out 1.8x this (25.3 ms
    against 13.9 ms on TensorRT-LLM's H200 tables)."""
    problem = Problem.build(
        "deepseek-v3", "h200x8", "chat", engine=engine, input_len=8192, output_len=1024
    )
    plan = dataclasses.replace(
        problem.space.megatron_plan(Degrees(tp=8, etp=8)), requests_per_rank=4
    )
    w = problem.workload
    decode = dataclasses.replace(w, phase="decode", clients=None, ttft_ms=None, tpot_ms=None)
    alone = dataclasses.replace(
        w, phase="prefill", schedule="static", batch=1, output_len=1, clients=None,
        ttft_ms=None, tpot_ms=None,
    )  # fmt: skip
    r = evaluate(dataclasses.replace(problem, workload=decode), plan).tpot_ms
    unfixed = dataclasses.replace(plan, requests_per_rank=None)
    s = evaluate(dataclasses.replace(problem, workload=alone), unfixed).ttft_ms
    s -= serving_costs(problem).iteration_ns * 1e-6  # a prompt alone, without the iteration
    assert evaluate(problem, plan).tpot_ms == pytest.approx(r + 4 / 1024 * s, rel=1e-9)


def test_clients_per_rank() -> None:
    d = Degrees(replicas=2, tp=2, dp_attn=2, etp=4)
    assert clients_per_rank(build(), d, 17) == 17  # no closed loop: the requests run
    assert clients_per_rank(build(clients=100), d, 17) == 25  # ceil(100 / 4)


def test_judge_flags_each_slo_and_ranks_by_the_objective() -> None:
    problem = build(ttft_ms=500.0, tpot_ms=20.0, objective="throughput_per_gpu")
    t = Latencies(
        ttft_s=np.array([0.4, 0.6, 0.4]),
        tpot_s=np.array([0.010, 0.010, 0.030]),
        latency_s=np.array([3.0, 3.0, 7.0]),
        throughput=np.array([800.0, 800.0, 800.0]),
        requests_in_flight=np.array([8.0, 8.0, 8.0]),
    )
    j = judge(problem, t, np.array([True, True, False]))
    assert j.ttft_violation.tolist() == [False, True, False]
    assert j.tpot_violation.tolist() == [False, False, True]
    assert j.feasible.tolist() == [True, False, False]
    np.testing.assert_allclose(j.objective, 800.0 / 8)
    latency = judge(build(objective="latency"), t, np.array([True] * 3))
    np.testing.assert_allclose(latency.objective, [-3000.0, -3000.0, -7000.0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_forms_give_the_scalar_evaluators_metrics(seed: int) -> None:
    # the per-step stage times of a plan, through forms and basic_times by hand
    problem = build(input_len=1000, output_len=200, batch=64)
    plan = problem.space.decode(problem.space.sample(1, seed=seed)[0])
    m = evaluate(problem, plan, breakdown=False)
    c = requests_per_rank(problem, plan)
    cost = price(problem, integer_tables(problem, plan.degrees, c), plan)
    seconds = cost.stage_ns / 1e9
    d = plan.degrees
    kinds = [s.kind for s in steps_of(problem.workload)]
    budget = engine_limits(problem, d.tp, d.pp, d.dp_attn).max_tokens
    f = forms(problem, kinds, np.array([c]), clients_per_rank(problem, d, np.array([c])),
              np.array([budget]), np.zeros(1), arith=ARRAYS)  # fmt: skip
    rnd, prompt = basic_times(
        f, np.minimum(d.pp, c), list(seconds.sum(axis=1)), list(seconds.max(axis=1)), np.maximum
    )
    (tpot,) = np.ravel(f.tpot.at(rnd, prompt))
    (ttft,) = np.ravel(f.ttft.at(rnd, prompt))
    assert tpot * 1e3 == pytest.approx(m.tpot_ms, rel=1e-4)
    assert ttft * 1e3 == pytest.approx(m.ttft_ms, rel=1e-4)
    assert ttft > tpot > 0
