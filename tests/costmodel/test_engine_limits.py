"""The serving engines' limits and fixed costs (shardlab.costmodel.engines)."""

from __future__ import annotations

import pytest

from shardlab import Problem
from shardlab.costmodel.engines import (
    engine_limits,
    serving_constants,
    serving_costs,
    sglang_static,
)

GIB = 1 << 30


def problem(engine: str, cluster: str = "h100x8", **kw) -> Problem:
    return Problem.build("llama-3.1-8b", cluster, "chat", engine=engine, timing="roofline", **kw)


def test_vllm_defaults_follow_the_gpu() -> None:
    large = engine_limits(problem("vllm"), 1, 1, 1)
    small = engine_limits(problem("vllm", "a100x8"), 1, 1, 1)
    assert (large.max_batch, large.max_tokens) == (1024, 8192)
    assert (small.max_batch, small.max_tokens) == (256, 2048)
    # everything fits in 92% of memory
    assert large.weight_scale == large.reserve_scale == large.kv_scale == pytest.approx(1 / 0.92)


def test_trtllm_gives_the_kv_cache_ninety_percent_of_what_is_free() -> None:
    e = engine_limits(problem("trtllm"), 2, 1, 1)
    assert (e.max_batch, e.max_tokens) == (2048, 8192)
    assert (e.weight_scale, e.reserve_scale) == (1.0, 1.0)
    assert e.kv_scale == pytest.approx(1 / 0.9)


def test_sglang_splits_its_chunk_over_attention_dp_ranks() -> None:
    one = engine_limits(problem("sglang"), 2, 1, 1)
    four = engine_limits(problem("sglang"), 2, 1, 4)
    assert one.max_tokens == 8192  # 80 GB: below 160 GiB
    assert four.max_tokens == 8192 // 4
    assert one.reserve_scale == 0.0  # its static fraction leaves the reserve out


def test_sglang_static_fraction_shrinks_as_the_reserve_grows() -> None:
    hbm = 80e9
    base = sglang_static(hbm, 1, 1, 8192, 256)
    assert 0 < base < 1
    assert sglang_static(hbm, 8, 4, 8192, 256) < base  # more GPUs a rank: more reserve
    assert sglang_static(2 * hbm, 1, 1, 8192, 256) > base  # the same reserve of more HBM


def test_the_problems_own_limits_override_the_engines() -> None:
    e = engine_limits(problem("vllm", max_batch=7, max_tokens=333), 1, 1, 1)
    assert (e.max_batch, e.max_tokens) == (7, 333)


@pytest.mark.parametrize("engine", ["trtllm", "vllm", "sglang"])
def test_serving_costs_are_the_shipped_constants(engine: str) -> None:
    c = serving_costs(problem(engine))
    shipped = serving_constants()[engine]
    assert c.request_ns == round(shipped["request_ms"] * 1e6)
    assert c.iteration_ns == round(shipped["iteration_ms"] * 1e6)
    assert c.prefill_first == (engine == "sglang")  # SGLang prefills new prompts alone
