from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab import Degrees, Problem
from shardlab.costmodel import evaluate, evaluate_batch
from shardlab.costmodel.decompose import integer_tables, price, requests_per_rank
from shardlab.costmodel.engines import engine_limits
from shardlab.costmodel.tables import degree_tables
from shardlab.problems.cluster import Cluster

CASES = {
    "ds-chat-kind": ("deepseek-v3", "h100x64", "chat", "kind", {}),
    "ds-prefill-layer": ("deepseek-v3", "h100x32", "prefill", "layer", {}),
    "llama70-offline": ("llama-3.1-70b", "h100x16", "batch-offline", "kind", {}),
    "llama8-decode-layer": ("llama-3.1-8b", "a100x8", "decode", "layer", {}),
    "oss-interactive": ("gpt-oss-120b", "b200x8", "interactive", "kind", {}),
    "qwen-long": ("qwen3-235b-a22b", "h200x16", "long-context", "kind", {"kv_dtype": "fp8"}),
    "mixtral-latency": ("mixtral-8x7b", "h100x8", "latency", "layer", {}),
    "kimi-inflight-prefill": (
        "kimi-k2",
        "h200x16",
        "chat",
        "kind",
        {"phase": "prefill", "batch": 64},
    ),
    # Per-layer mixers and speculative decoding go through the same three paths.
    "ds32-mtp-chat": (
        "deepseek-v3.2",
        "h200x16",
        "chat",
        "kind",
        {"draft_tokens": 2, "acceptance": 0.8},
    ),
    "qwen-next-long": ("qwen3-next-80b-a3b", "h100x8", "long-context", "kind", {}),
    "gemma4-static-layer": ("gemma-4-26b-a4b", "h100x8", "batch-offline", "layer", {}),
}
# The same problems with measured kernel times: the decomposition must hold for both.
SILICON = [f"{key}-silicon" for key in CASES]


@cache
def problem_of(key: str) -> Problem:
    """``CASES[key]`` with roofline kernels, or with measured ones (``KEY-silicon``);
    built when a test first asks (once per worker), not as each worker collects."""
    if key.endswith("-silicon"):
        return dataclasses.replace(problem_of(key.removesuffix("-silicon")), timing="silicon")
    m, c, w, tie, over = CASES[key]
    return Problem.build(m, c, w, tie=tie, timing="roofline", **over)


@pytest.mark.parametrize("key", [*CASES, *SILICON])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_scalar_batched_and_tables_agree(key: str, seed: int) -> None:
    problem = problem_of(key)
    space = problem.space
    codes = space.sample(8, seed=seed)
    batch = evaluate_batch(problem, codes)
    for i, row in enumerate(codes):
        plan = space.decode(row)
        m = evaluate(problem, plan)
        for name in ("objective", "ttft_ms", "tpot_ms", "throughput_tok_s", "memory_gb_per_gpu"):
            assert getattr(m, name) == pytest.approx(getattr(batch, name)[i], rel=1e-9, abs=1e-12)
        assert m.feasible == bool(batch.feasible[i])
        assert m.requests_in_flight == int(batch.requests_in_flight[i])
        # Integer tables: nanoseconds and bytes, rounded per entry (see decompose.py).
        tables = integer_tables(problem, plan.degrees, requests_per_rank(problem, plan))
        cost = price(problem, tables, plan)
        assert cost.latencies.throughput[0] == pytest.approx(m.throughput_tok_s, rel=1e-4)
        assert cost.latencies.tpot_s[0] * 1e3 == pytest.approx(m.tpot_ms, rel=1e-4, abs=1e-6)
        assert cost.latencies.ttft_s[0] * 1e3 == pytest.approx(m.ttft_ms, rel=1e-4, abs=1e-6)
        assert cost.stage_bytes.max() / 1e9 == pytest.approx(m.memory_gb_per_gpu, rel=1e-9)
        assert cost.fits == ("memory" not in m.violations)


@pytest.mark.parametrize("key", ["ds-chat-kind", "llama70-offline", "qwen-long"])
def test_silicon_times_the_kernels_it_has_measurements_of(key: str) -> None:
    """GEMMs, attention and experts are measured on a covered accelerator; norms stay
    with the roofline; and the measured plan differs from the roofline's."""
    problem = problem_of(f"{key}-silicon")
    plan = problem.space.megatron_plan(problem.space.degree_tuples[-1])
    m = evaluate(problem, plan)
    timing = {b.name.split(".")[1]: b.timing for b in m.breakdown}
    assert timing["qkv_proj"] == timing["attention"] == timing["o_proj"] == "silicon"
    assert timing["attn_norm"] == "roofline"
    if problem.model.is_moe:
        assert timing["experts"] == "silicon"
    assert m.tpot_ms != evaluate(problem_of(key), plan).tpot_ms


def test_silicon_timing_fills_in_an_accelerator_it_has_no_measurements_of() -> None:
    cluster = problem_of("llama70-offline").cluster
    custom = dataclasses.replace(
        cluster, accelerator=dataclasses.replace(cluster.accelerator, key="my-gpu")
    )
    silicon = dataclasses.replace(problem_of("llama70-offline"), cluster=custom, timing="silicon")
    roofline = dataclasses.replace(silicon, timing="roofline")
    plan = silicon.space.megatron_plan(silicon.space.degree_tuples[0])
    m = evaluate(silicon, plan)
    assert {b.timing for b in m.breakdown} == {"roofline"}
    assert m.tpot_ms == evaluate(roofline, plan).tpot_ms


def _scaled_cluster(cluster: Cluster, factor: float, fields: tuple[str, ...]) -> Cluster:
    acc = dataclasses.replace(
        cluster.accelerator, **{f: getattr(cluster.accelerator, f) * factor for f in fields}
    )
    return dataclasses.replace(cluster, accelerator=acc)


@pytest.mark.parametrize("key", ["ds-chat-kind", "llama70-offline", "oss-interactive"])
@pytest.mark.parametrize(
    "fields", [("nvlink_gbps",), ("net_gbps",), ("hbm_gbps",), ("bf16_tflops", "fp8_tflops")]
)
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), factor=st.floats(1.0, 8.0))
def test_more_bandwidth_or_compute_is_never_slower(
    key: str, fields: tuple[str, ...], seed: int, factor: float
) -> None:
    base = problem_of(key)
    faster = dataclasses.replace(base, cluster=_scaled_cluster(base.cluster, factor, fields))
    codes = base.space.sample(24, seed=seed)
    slow, fast = evaluate_batch(base, codes), evaluate_batch(faster, codes)
    assert np.all(fast.tpot_ms <= slow.tpot_ms * (1 + 1e-12))
    assert np.all(fast.ttft_ms <= slow.ttft_ms * (1 + 1e-12))
    assert np.all(fast.throughput_tok_s >= slow.throughput_tok_s * (1 - 1e-12))


@settings(max_examples=20, deadline=None)
@given(
    batch=st.integers(1, 64),
    input_len=st.integers(16, 8192),
    output_len=st.integers(1, 2048),
    model=st.sampled_from(["llama-3.1-70b", "deepseek-v3", "qwen3-235b-a22b"]),
)
def test_kv_cache_is_linear_in_batch_and_context(
    batch: int, input_len: int, output_len: int, model: str
) -> None:
    def kv(b: int, i: int, o: int) -> float:
        p = Problem.build(model, "h200x64", "batch-offline", batch=b, input_len=i, output_len=o)
        # One replica, no attention data parallel: every request sits on every stage.
        plan = p.space.megatron_plan(
            Degrees(pp=8, tp=8, ep=8, etp=1) if p.model.is_moe else Degrees(pp=8, tp=8, etp=8)
        )
        return evaluate(p, plan).kv_cache_gb

    base = kv(batch, input_len, output_len)
    assert kv(2 * batch, input_len, output_len) == pytest.approx(2 * base, rel=1e-9)
    assert kv(batch, 2 * input_len, 2 * output_len) == pytest.approx(2 * base, rel=1e-9)


def test_weights_shrink_under_column_and_row_sharding_only() -> None:
    problem = problem_of("ds-chat-kind")
    for degrees in problem.space.degree_tuples:
        if degrees.tp == 1:
            continue
        t = degree_tables(problem, degrees)
        for ci, (kind, attn) in enumerate(t.classes):
            for ki, op in enumerate(t.ops[kind]):
                names = op.option_names
                if "replicated" not in names or op.family in ("kv_cache", "residual"):
                    continue
                full = t.op_weight[ci, ki, names.index("replicated")]
                # MLA's down-projections stay whole on every rank (the latent every head
                # reads); the rest of the projection splits.
                whole = 0.0
                if op.name == "qkv_proj":
                    per_value = full / problem.model.qkv_params(attn)
                    whole = problem.model.qkv_unsplit_params(attn) * per_value
                    assert whole > 0
                for split in ("column", "row"):
                    if split in names and op.split_size % degrees.tp == 0:
                        assert t.op_weight[ci, ki, names.index(split)] == pytest.approx(
                            (full - whole) / degrees.tp + whole
                        )
                if "seq_sharded" in names:
                    assert t.op_weight[ci, ki, names.index("seq_sharded")] == full
        break


def test_plan_that_does_not_fit_is_infeasible_with_memory_named() -> None:
    p = Problem.build("llama-3.1-405b", "h100x16", "chat")
    m = evaluate(p, p.space.megatron_plan(Degrees(replicas=2, tp=8, etp=8)))
    assert not m.feasible and "memory" in m.violations
    assert m.memory_gb_per_gpu > m.hbm_gb
    ok = evaluate(p, p.space.megatron_plan(Degrees(pp=2, tp=8, etp=8)))
    assert ok.feasible, ok.violations


def test_slo_violations_are_named() -> None:
    p = Problem.build("llama-3.1-70b", "h100x8", "chat", tpot_ms=1.0, ttft_ms=1.0)
    m = evaluate(p, p.space.megatron_plan(Degrees(tp=8, etp=8)))
    assert set(m.violations) == {"ttft_slo", "tpot_slo"}
    assert not m.feasible


def test_breakdown_adds_up_to_the_step() -> None:
    # Static batch-1 decode on one stage: the step is one pass through the ops.
    p = Problem.build("deepseek-v3", "h200x64", "latency")  # fits on 8 H200
    plan = p.space.megatron_plan(Degrees(replicas=8, tp=8, ep=8, etp=1))
    m = evaluate(p, plan)
    decode = sum(b.time_ms for b in m.breakdown if b.step == "decode")
    prefill = sum(b.time_ms for b in m.breakdown if b.step == "prefill")
    assert decode == pytest.approx(m.tpot_ms, rel=1e-9)
    assert prefill == pytest.approx(m.ttft_ms, rel=1e-9)
    weights = sum(b.weight_gb for b in m.breakdown if b.step == "prefill")
    assert weights == pytest.approx(m.weights_gb, rel=1e-9)


def test_known_physics() -> None:
    # Batch-1 decode is weight-streaming: Llama-70B bf16 over 8 H100 ~ 141 GB / (8 x
    # 3.35 TB/s x 0.78) = 6.7 ms of HBM time, plus 160 all-reduces and kernels.
    p = Problem.build("llama-3.1-70b", "h100x8", "latency")
    m = evaluate(p, p.space.megatron_plan(Degrees(tp=8, etp=8)))
    assert 6.7 < m.tpot_ms < 15
    # MLA keeps the latent cache on every tensor-parallel rank; attention DP splits it.
    ds = Problem.build("deepseek-v3", "h200x16", "long-context", batch=4096)
    tp = evaluate(ds, ds.space.megatron_plan(Degrees(tp=16, ep=16, etp=1)))
    dp = evaluate(ds, ds.space.megatron_plan(Degrees(tp=1, dp_attn=16, ep=16, etp=1)))
    assert tp.requests_in_flight < dp.requests_in_flight


# -- the serving engine's limits ------------------------------------------------------


def _kv_bound() -> Problem:
    # more requests offered than the KV cache holds: the engine's budget decides
    return Problem.build("llama-3.1-70b", "h100x4", "chat", batch=4096)


@pytest.mark.parametrize("engine", ["trtllm", "vllm", "sglang"])
def test_engine_budget_bounds_memory_and_concurrency(engine: str) -> None:
    problem = dataclasses.replace(_kv_bound(), engine=engine)
    plan = problem.space.megatron_plan(Degrees(tp=4, etp=4))
    m = evaluate(problem, plan)
    assert m.feasible and m.memory_gb_per_gpu <= m.hbm_gb
    limits = engine_limits(problem, 4, 1, 1)
    assert m.requests_in_flight <= limits.max_batch
    # the KV cache gets only the engine's share: the bytes themselves stay below HBM
    assert m.weights_gb + m.kv_cache_gb + m.activations_gb < m.memory_gb_per_gpu
    capped = evaluate(dataclasses.replace(problem, max_batch=64), plan)
    assert capped.requests_in_flight == 64 and capped.tpot_ms < m.tpot_ms


def test_engines_budget_memory_differently() -> None:
    plan = _kv_bound().space.megatron_plan(Degrees(tp=4, etp=4))
    held = {
        e: evaluate(dataclasses.replace(_kv_bound(), engine=e), plan).requests_in_flight
        for e in ("trtllm", "vllm", "sglang")
    }
    assert len(set(held.values())) == 3, held


def test_max_tokens_caps_the_requests_of_a_round() -> None:
    problem = dataclasses.replace(_kv_bound(), max_tokens=1000)
    plan = problem.space.megatron_plan(Degrees(tp=4, etp=4))
    # a chat round brings 1 + 1024/256 = 5 tokens per request
    assert evaluate(problem, plan).requests_in_flight == 200


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_plans_priced_together_or_alone_agree(data: st.DataObject) -> None:
    # one pass prices every degree tuple at once: a plan's metrics cannot depend on
    # which plans share its batch, nor on their order
    key = data.draw(st.sampled_from(["ds-chat-kind", "ds-prefill-layer", "ds32-mtp-chat"]))
    problem = problem_of(key + data.draw(st.sampled_from(["", "-silicon"])))
    codes = problem.space.sample(40, seed=data.draw(st.integers(0, 1000)))
    whole = evaluate_batch(problem, codes)
    order = data.draw(st.permutations(range(len(codes))))
    part = np.array(order[: data.draw(st.integers(1, len(codes)))])
    some = evaluate_batch(problem, codes[part])
    for name in whole.__dataclass_fields__:
        np.testing.assert_allclose(getattr(some, name), getattr(whole, name)[part], rtol=1e-12)
    alone = evaluate_batch(problem, codes[part[:1]])
    assert alone.objective[0] == pytest.approx(whole.objective[part[0]], rel=1e-12)


@pytest.mark.parametrize("key", ["ds-chat-kind", "ds-prefill-layer", "gemma4-static-layer"])
def test_pricing_in_pieces_prices_the_same(key: str, monkeypatch) -> None:
    # how plans are split into passes, widths and chunks is bookkeeping: each plan's
    # sums are its own, so pricing one plan at a time at powers of two gives the same bits
    from shardlab.costmodel import stage_sums

    problem = problem_of(key)
    codes = problem.space.sample(150, seed=5)
    whole = evaluate_batch(problem, codes)
    monkeypatch.setattr(stage_sums, "GATHER_CHUNK", 1)
    monkeypatch.setattr(stage_sums, "FEW_PLANS", 0)
    pieces = evaluate_batch(problem, codes)
    for name in whole.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(pieces, name), getattr(whole, name), err_msg=name)
    # and no plans, no pieces
    assert len(evaluate_batch(problem, codes[:0])) == 0


def test_pricing_survives_its_tables_being_dropped() -> None:
    # the stack of a problem's tables is a bounded cache: a long run that prices more
    # problems than it keeps rebuilds it, and what was cached about the space still holds
    from shardlab.costmodel.stack import stack_of

    problem = problem_of("ds-chat-kind")
    codes = problem.space.sample(30, seed=4)
    before = evaluate_batch(problem, codes)
    stack_of.cache_clear()
    again = evaluate_batch(problem, codes[::-1])
    np.testing.assert_allclose(again.objective[::-1], before.objective, rtol=1e-12)


def test_metrics_without_the_breakdown_are_the_same_metrics() -> None:
    from shardlab.problems.suite import get_instance

    for name in ("deepseek-v3-h100x64-chat", "llama405b-h100x32-prefill"):
        problem = get_instance(name).problem()
        for code in problem.space.sample(20, seed=3):
            plan = problem.space.decode(code)
            full, plain = evaluate(problem, plan), evaluate(problem, plan, breakdown=False)
            assert full.breakdown and not plain.breakdown
            assert dataclasses.asdict(plain) == {**dataclasses.asdict(full), "breakdown": ()}


@given(
    seed=st.integers(0, 2**31 - 1),
    hbm=st.sampled_from([1e3, 8e10, 1.41e11]),
    stages=st.integers(1, 6),
)
@settings(max_examples=200, deadline=None)
def test_capacity_is_the_most_requests_that_fit(seed: int, hbm: float, stages: int) -> None:
    """The closed-form window finds what checking every concurrency finds: the largest
    c <= top whose memory (as summed everywhere: base + kv_full c + kv_split ceil(c /
    tp)) fits on every stage; 0 when none does."""
    from shardlab.costmodel.arithmetic import NO_STAGE, _capacity

    rng = np.random.default_rng(seed)
    n = 16
    tp = rng.choice([1, 2, 4, 8, 72], n)
    base = rng.uniform(0.0, 1.05, (n, stages)) * hbm
    base[rng.random((n, stages)) < 0.2] = NO_STAGE  # stages a plan does not have
    scale = hbm / rng.choice([1, 10, 1000, 100_000], (n, 1))
    kv_full = np.where(rng.random((n, stages)) < 0.3, 0.0, rng.uniform(0, 1, (n, stages)) * scale)
    kv_split = np.where(rng.random((n, stages)) < 0.3, 0.0, rng.uniform(0, 1, (n, stages)) * scale)
    top = rng.integers(0, 3000, n)
    got = _capacity(base, kv_full, kv_split, tp, hbm, top)
    for i in range(n):
        c = np.arange(1, top[i] + 1)
        mem = base[i] + kv_full[i] * c[:, None] + kv_split[i] * (-(-c[:, None] // tp[i]))
        fits = c[(mem <= hbm).all(axis=1)]
        assert got[i] == (fits.max() if len(fits) else 0), i
