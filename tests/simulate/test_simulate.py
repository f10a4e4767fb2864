"""The request-level simulator (shardlab.simulate): its prices are the cost model's,
its steady state is the analytic forms', and its runs keep the books every run must
keep (each request served once, in order, every token counted)."""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import pytest

from shardlab import Degrees, Problem, ShardlabError
from shardlab.costmodel import IterationCosts, evaluate, serving_costs
from shardlab.problems.disagg import DisaggPlan
from shardlab.problems.traces import read_trace
from shardlab.problems.traffic import Arrivals, Lengths, closed_loop, synthetic_traffic
from shardlab.simulate import Deployment, Pool, Slo, price, simulate_priced
from shardlab.simulate.pricing import Pricer
from shardlab.simulate.requests import check_statistic
from tests.conftest import DATA_DIR

AZURE = DATA_DIR / "traces" / "AzureLLMInferenceTrace_conv.csv.gz"
# (model, cluster, degrees)
PLANS = {
    "8b-tp1x2": ("llama-3.1-8b", "h100x2", Degrees(replicas=2, tp=1)),
    "70b-tp4-pp2": ("llama-3.1-70b", "h100x8", Degrees(tp=4, pp=2, etp=4)),
    "mixtral-ep4": ("mixtral-8x7b", "h100x8", Degrees(replicas=2, tp=4, ep=4, etp=1)),
}
FIXED = Lengths(kind="fixed", input_len=1024, output_len=256)


@cache
def problem_plan(name: str, engine: str, phase: str = "request", batch: int = 0):
    model, cluster, degrees = PLANS[name]
    problem = Problem.build(model, cluster, "chat", engine=engine)
    if batch:
        w = dataclasses.replace(problem.workload, phase=phase, batch=batch)
        problem = dataclasses.replace(problem, workload=w)
    return problem, problem.space.megatron_plan(degrees)


@cache
def priced(name: str, engine: str, role: str = "agg", batch: int = 0):
    phase = "decode" if role == "decode" else "request"
    problem, plan = problem_plan(name, engine, phase, batch)
    deployment = Deployment(pools=(Pool(role=role, problem=problem, plan=plan),))  # type: ignore[arg-type]
    traffic = closed_loop(clients=1, prompts_per_client=1, lengths=FIXED)
    return problem, plan, deployment, price(deployment, traffic)


def test_the_pricer_reads_the_iteration_costs_number_by_number() -> None:
    """The scalar reads the event loop makes are IterationCosts' own, nodes and
    interpolation alike."""
    _, _, _, (pc,) = priced("8b-tp1x2", "vllm")
    costs = pc.costs
    p = Pricer(costs)
    rng = np.random.default_rng(0)
    for _ in range(200):
        c = int(rng.integers(1, costs.max_requests + 1))
        ctx = float(rng.uniform(10, 40_000))
        tokens = float(rng.integers(1, 9000))
        done = float(rng.integers(0, 9000))
        assert p.decode(c, ctx) == pytest.approx(float(costs.decode(c, ctx)), rel=1e-12)
        assert p.prompt(tokens, done) == pytest.approx(
            float(costs.prompt(tokens, done)), rel=1e-12, abs=1e-15
        )
        assert p.mixed(c, ctx, tokens) == pytest.approx(
            float(costs.iteration(c, ctx, tokens)), rel=1e-12
        )


DECODE_CASES = [
    pytest.param("8b-tp1x2", "vllm", id="8b-vllm"),
    pytest.param("70b-tp4-pp2", "trtllm", id="70b-pp2-trtllm", marks=pytest.mark.slow),
    pytest.param("mixtral-ep4", "sglang", id="mixtral-sglang", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("name", "engine"), DECODE_CASES)
def test_the_steady_state_equals_the_analytic_forms(name: str, engine: str) -> None:
    """Where the forms are exact -- a steady state of ``c`` requests per rank decoding
    at fixed lengths, prompts cached -- the simulator's mean TPOT and throughput equal
    the forms' within 2% (the decode round R + i at the mean context; throughput c
    ranks / TPOT)."""
    degrees = PLANS[name][2]
    ranks = degrees.replicas * degrees.dp_attn
    problem, plan, deployment, pcs = priced(name, engine, "decode", 64 * ranks)
    # the same engine costs as the forms' (the simulator's own are fitted apart)
    c = serving_costs(problem)
    pcs = tuple(
        dataclasses.replace(
            pc, costs=pc.costs.with_engine_costs(c.request_ns * 1e-9, c.iteration_ns * 1e-9)
        )
        for pc in pcs
    )
    m = evaluate(problem, plan)
    c = m.requests_per_rank
    traffic = closed_loop(clients=c * ranks, prompts_per_client=4, lengths=FIXED)
    s = simulate_priced(deployment, pcs, traffic).summary()
    assert s.latencies["tpot_ms"]["mean"] == pytest.approx(m.tpot_ms, rel=0.02)
    assert s.output_tok_s == pytest.approx(m.throughput_tok_s, rel=0.02)
    # a steady state: every request decoded beside the same c - 1 others
    assert s.latencies["tpot_ms"]["p99"] == pytest.approx(m.tpot_ms, rel=0.02)


def _check_books(sim, traffic) -> None:
    a, f, e = sim.arrival_s, sim.first_s, sim.finish_s
    assert not np.isnan(a).any() and not np.isnan(f).any() and not np.isnan(e).any()
    assert (a <= f + 1e-12).all() and (f <= e + 1e-12).all()
    one = traffic.output_len == 1
    assert np.allclose(f[one], e[one])


@pytest.mark.parametrize("engine", ["vllm", "trtllm", "sglang"])
def test_a_trace_is_served_whole_and_in_order(engine: str) -> None:
    """Every request of the Azure trace's first 2,000 arrives at its time, gets its
    first token after it and finishes after that; without preemption every output
    token but the first is one inter-token gap."""
    _, _, deployment, pcs = priced("8b-tp1x2", engine)
    trace = read_trace(AZURE)
    head = dataclasses.replace(
        trace,
        input_len=trace.input_len[:2000],
        output_len=trace.output_len[:2000],
        arrival_s=trace.arrival_s[:2000],
    )
    sim = simulate_priced(deployment, pcs, head)
    _check_books(sim, head)
    assert np.allclose(sim.arrival_s, head.arrival_s - head.arrival_s[0])
    assert sim.preemptions == 0
    assert sim.itl_n.sum() == (head.output_len - 1).sum()
    # two ranks behind the least-outstanding router: both serve
    assert set(np.unique(sim.rank)) == {0, 1}


def test_same_seed_same_run_and_the_router_matters() -> None:
    _, _, deployment, pcs = priced("8b-tp1x2", "vllm")
    traffic = synthetic_traffic(
        requests=3000, lengths=Lengths(kind="uniform", input_len=2048, output_len=256,
                                       range_ratio=0.5),
        arrivals=Arrivals(kind="gamma", rate=20.0, cv=3.0), seed=1,
    )  # fmt: skip
    one = simulate_priced(deployment, pcs, traffic, seed=3)
    two = simulate_priced(deployment, pcs, traffic, seed=3)
    assert np.array_equal(one.first_s, two.first_s) and np.array_equal(one.finish_s, two.finish_s)
    rr = simulate_priced(deployment, pcs, traffic, router="round-robin", seed=3)
    assert not np.array_equal(rr.rank, one.rank)
    # round robin alternates whatever the load
    assert np.array_equal(rr.rank[1:], 1 - rr.rank[:-1])


def test_more_load_means_longer_tails() -> None:
    """The same requests at a higher rate wait longer: p99 TTFT grows with the rate,
    and a rate past capacity queues without bound."""
    _, _, deployment, pcs = priced("8b-tp1x2", "vllm")
    base = synthetic_traffic(
        requests=4000, lengths=Lengths(kind="fixed", input_len=2000, output_len=200),
        arrivals=Arrivals(kind="poisson", rate=1.0), seed=0,
    )  # fmt: skip
    p99 = [
        simulate_priced(deployment, pcs, base.at_rate(r)).summary().latencies["ttft_ms"]["p99"]
        for r in (5.0, 40.0, 200.0)
    ]
    assert p99[0] < p99[1] < p99[2]
    assert p99[2] > 10 * p99[0]


def test_a_full_cache_preempts_on_vllm_and_never_on_trtllm() -> None:
    """Long outputs on a rank whose cache holds few of them: vLLM admits by the prompt
    and preempts when decoding runs out of blocks; TensorRT-LLM's no-evict policy
    reserves each output up front and never does. Both serve everything."""
    traffic = closed_loop(
        clients=400, prompts_per_client=1,
        lengths=Lengths(kind="fixed", input_len=512, output_len=8000),
    )  # fmt: skip
    runs = {}
    for engine in ("vllm", "trtllm"):
        _, _, deployment, pcs = priced("8b-tp1x2", engine)
        runs[engine] = simulate_priced(deployment, pcs, traffic)
        _check_books(runs[engine], traffic)
    assert runs["vllm"].preemptions > 0
    assert runs["trtllm"].preemptions == 0


def test_a_disaggregated_deployment_hands_each_cache_over() -> None:
    problem, _ = problem_plan("8b-tp1x2", "vllm")
    single = Problem.build("llama-3.1-8b", "h100x1", "chat", engine="vllm")
    one = single.space.megatron_plan(Degrees(tp=1))
    dplan = DisaggPlan(prefill=one, prefill_instances=1, decode=one, decode_instances=1)
    deployment = Deployment.of_disagg(problem, dplan)
    traffic = synthetic_traffic(
        requests=200, lengths=FIXED, arrivals=Arrivals(kind="poisson", rate=0.02), seed=0
    )  # one request at a time: nothing in the way
    pcs = price(deployment, traffic)
    sim = simulate_priced(deployment, pcs, traffic)
    _check_books(sim, traffic)
    pre = next(pc for pc in pcs if pc.pool.role == "prefill")
    handoff = pre.handoff_fixed_s + pre.handoff_token_s * 1024
    assert handoff > 0
    # a prompt alone: its prefill, then the handoff, then its decode rank's first step
    alone = float(pre.costs.prompt(1024, 0)) + pre.costs.iteration_s
    assert sim.summary().latencies["ttft_ms"]["median"] == pytest.approx(
        (alone + handoff + pre.costs.request_s) * 1e3, rel=0.01
    )
    # decoded on the decode pool's rank only
    assert set(np.unique(sim.rank)) == {1}


def test_slo_attainment_and_goodput() -> None:
    _, _, deployment, pcs = priced("8b-tp1x2", "vllm")
    traffic = synthetic_traffic(
        requests=2000, lengths=FIXED, arrivals=Arrivals(kind="poisson", rate=30.0), seed=0
    )
    sim = simulate_priced(deployment, pcs, traffic)
    median = sim.latency("ttft_ms", "median")
    s = sim.summary(Slo(ttft_ms=median))
    assert s.attainment["ttft_ms"] == pytest.approx(0.5, abs=0.01)
    assert s.goodput == pytest.approx(s.request_rate * s.attainment["all"])


@pytest.mark.parametrize("bad", ["p0", "p100", "p-5", "q90", "p"])
def test_a_percentile_outside_0_100_is_refused(bad: str) -> None:
    with pytest.raises(ShardlabError, match="statistic"):
        check_statistic(bad)


def test_a_request_longer_than_the_cache_is_refused() -> None:
    _, _, deployment, pcs = priced("8b-tp1x2", "vllm")
    kv = pcs[0].costs.kv_tokens
    traffic = closed_loop(
        clients=1, prompts_per_client=1,
        lengths=Lengths(kind="fixed", input_len=kv, output_len=10),
    )  # fmt: skip
    with pytest.raises(ShardlabError, match="does not fit"):
        simulate_priced(deployment, pcs, traffic)


def test_the_kv_capacity_is_the_evaluators() -> None:
    """A rank holds the requests the evaluator says fit, at the workload's length."""
    problem, plan = problem_plan("8b-tp1x2", "vllm")
    w = problem.workload
    cap = IterationCosts.kv_capacity(problem, plan)
    m = evaluate(problem, plan)
    assert cap >= m.requests_per_rank * (w.input_len + w.output_len)
    assert cap // (w.input_len + w.output_len) >= m.capacity_per_rank


def test_tables_priced_for_a_closed_loops_clients_give_the_same_run() -> None:
    """Priced only up to the loop's clients (a table's time grows with its requests),
    the run is the one the whole tables give; a loop with more clients than the
    tables were priced for is refused rather than run at fewer."""
    _, _, deployment, whole = priced("8b-tp1x2", "vllm")
    traffic = closed_loop(clients=12, prompts_per_client=3, lengths=FIXED)
    few = price(deployment, traffic, most=traffic.most_in_system)
    assert few[0].costs.max_requests == 12 < whole[0].costs.max_requests
    a = simulate_priced(deployment, whole, traffic, seed=3)
    b = simulate_priced(deployment, few, traffic, seed=3)
    assert np.array_equal(a.first_s, b.first_s) and np.array_equal(a.finish_s, b.finish_s)
    more = closed_loop(clients=13, prompts_per_client=1, lengths=FIXED)
    with pytest.raises(ShardlabError, match="priced for at most 12 requests"):
        simulate_priced(deployment, few, more)
    rate = synthetic_traffic(
        lengths=FIXED, arrivals=Arrivals(kind="poisson", rate=5.0), requests=20
    )
    with pytest.raises(ShardlabError, match="priced for at most 12 requests"):
        simulate_priced(deployment, few, rate)
