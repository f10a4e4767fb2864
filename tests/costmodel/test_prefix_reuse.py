"""Prefix reuse in the analytic forms: a prompt's cached prefix is not prefilled, its
KV cache is kept (shardlab.costmodel.steps.prefill_tokens)."""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab import Degrees, Problem, ShardlabError
from shardlab.costmodel import IterationCosts, evaluate, evaluate_batch
from shardlab.costmodel.decompose import integer_tables, price, requests_per_rank
from shardlab.costmodel.steps import causal_pairs, prefill_tokens, round_tokens, steps_of
from shardlab.problems.model import FULL, AttentionSpan
from shardlab.problems.workload import get_workload

CASES = {
    "llama70-chat": ("llama-3.1-70b", "h100x8", "chat", {}),
    "ds-chat": ("deepseek-v3", "h100x64", "chat", {}),
    "qwen-long-fp8": ("qwen3-235b-a22b", "h200x16", "long-context", {"kv_dtype": "fp8"}),
    "llama70-static": ("llama-3.1-70b", "h100x16", "batch-offline", {}),
    "kimi-prefill-pool": ("kimi-k2", "h200x16", "chat", {"phase": "prefill", "batch": 64}),
    "oss-sglang": ("gpt-oss-120b", "b200x8", "interactive", {"engine": "sglang"}),
}


@cache
def _built(key: str, timing: str) -> Problem:
    m, c, w, over = CASES[key]
    over = dict(over)
    engine = over.pop("engine", "trtllm")
    return Problem.build(m, c, w, timing=timing, engine=engine, **over)


def problem_of(key: str, reuse: float = 0.0, timing: str = "roofline") -> Problem:
    base = _built(key, timing)
    return dataclasses.replace(
        base, workload=dataclasses.replace(base.workload, prefix_reuse=reuse)
    )


def test_a_prefill_computes_the_prompt_past_its_cached_prefix() -> None:
    w = get_workload("chat").with_overrides(input_len=1000, output_len=200, prefix_reuse=0.25)
    assert prefill_tokens(w) == 750
    decode, first = steps_of(w)
    assert first.tokens == first.prompt_tokens == 750 and first.cached == 250
    assert first.input_len == 1000  # its decode context and KV keep the whole prompt
    assert decode.decode_context(FULL) == steps_of(w.with_overrides(prefix_reuse=0.0))[
        0
    ].decode_context(FULL)
    # the 750 new tokens attend to all before them: pairs 251..1000
    assert first.pairs(FULL)[1] == sum(range(251, 1001))
    window = AttentionSpan(kind="sliding", tokens=128)
    assert first.pairs(window)[1] == causal_pairs(1000, window) - causal_pairs(250, window)
    assert first.kv_read(FULL) == 250 and first.kv_read(window) == 128
    # the engine's budget holds each request's share of what it computes
    assert round_tokens(w) == pytest.approx(1 + 750 / 200)
    # an engine computes a prompt's last token however much is cached
    assert prefill_tokens(w.with_overrides(input_len=10, prefix_reuse=0.99)) == 1


@pytest.mark.parametrize("bad", [1.0, -0.01, float("nan"), True])
def test_a_reuse_outside_0_1_is_refused(bad: float) -> None:
    with pytest.raises(ShardlabError, match="prefix_reuse") as exc:
        get_workload("chat").with_overrides(prefix_reuse=bad)
    assert exc.value.field == "workload.prefix_reuse"


def test_reuse_shortens_ttft_and_keeps_memory() -> None:
    plain = problem_of("llama70-chat")
    plan = dataclasses.replace(
        plain.space.megatron_plan(Degrees(tp=8, etp=8)), requests_per_rank=64
    )
    half = problem_of("llama70-chat", 0.5)
    a, b = evaluate(plain, plan), evaluate(half, plan)
    assert b.ttft_ms < 0.8 * a.ttft_ms and b.tpot_ms < a.tpot_ms
    assert b.kv_cache_gb == a.kv_cache_gb
    assert "prefix reuse 50%" in half.workload.describe()


def test_the_simulators_iterations_price_whole_prompts() -> None:
    """The simulator finds prefixes itself: its iteration tables ignore the workload's
    reuse."""
    plain = problem_of("llama70-chat")
    plan = plain.space.megatron_plan(Degrees(tp=8, etp=8))
    a = IterationCosts.of(plain, plan, max_requests=8)
    b = IterationCosts.of(problem_of("llama70-chat", 0.5), plan, max_requests=8)
    for name in ("decode_s", "mixed_s", "prompt_s", "ratios", "contexts"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.kv_tokens == b.kv_tokens


@pytest.mark.parametrize(
    ("key", "timing"),
    [*((key, "roofline") for key in CASES), ("llama70-chat", "silicon"), ("ds-chat", "silicon")],
)
@settings(max_examples=5, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    low=st.floats(0.0, 0.95),
    more=st.floats(0.0, 0.95),
    requests=st.integers(1, 256),
)
def test_more_reuse_never_lowers_throughput_nor_raises_ttft(
    key: str, timing: str, seed: int, low: float, more: float, requests: int
) -> None:
    high = low + (0.95 - low) * more
    # measured kernels are not monotone in their token count (bumps of up to 2% in the
    # GEMMs: shardlab.costmodel.iterations): a few tokens fewer may time a little longer
    tol = 1e-12 if timing == "roofline" else 1e-2
    base, reused = problem_of(key, low, timing), problem_of(key, high, timing)
    codes = base.space.sample(8, seed=seed)
    best = evaluate_batch(base, codes)
    assert np.all(
        evaluate_batch(reused, codes).throughput_tok_s >= best.throughput_tok_s * (1 - tol)
    )
    if base.workload.schedule != "inflight":
        return
    # at one concurrency (the best may be another): within what the workload offers
    rpr = np.minimum(requests, best.requests_per_rank)
    a = evaluate_batch(base, codes, requests_per_rank=rpr)
    b = evaluate_batch(reused, codes, requests_per_rank=rpr)
    assert np.all(b.throughput_tok_s >= a.throughput_tok_s * (1 - tol))
    assert np.all(b.ttft_ms <= a.ttft_ms * (1 + tol))
    assert np.all(b.tpot_ms <= a.tpot_ms * (1 + tol))
    # the cache keeps whole prompts (activations hold the tokens a step computes, and
    # the requests the engine's budget takes: they may move either way)
    assert np.array_equal(b.kv_cache_gb, a.kv_cache_gb)


@pytest.mark.parametrize("key", ["llama70-chat", "ds-chat", "kimi-prefill-pool"])
def test_scalar_batched_and_cpsat_tables_agree_under_reuse(key: str) -> None:
    """Exact search prices reuse as the evaluators do (its integer tables come from the
    same steps)."""
    problem = problem_of(key, 0.6)
    codes = problem.space.sample(6, seed=3)
    batch = evaluate_batch(problem, codes)
    for i, row in enumerate(codes):
        plan = problem.space.decode(row)
        m = evaluate(problem, plan)
        assert m.ttft_ms == pytest.approx(batch.ttft_ms[i], rel=1e-9)
        tables = integer_tables(problem, plan.degrees, requests_per_rank(problem, plan))
        cost = price(problem, tables, plan)
        assert cost.latencies.throughput[0] == pytest.approx(m.throughput_tok_s, rel=1e-4)
        assert cost.latencies.ttft_s[0] * 1e3 == pytest.approx(m.ttft_ms, rel=1e-4, abs=1e-6)
        assert cost.latencies.tpot_s[0] * 1e3 == pytest.approx(m.tpot_ms, rel=1e-4, abs=1e-6)
