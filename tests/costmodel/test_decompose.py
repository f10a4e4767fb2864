"""A plan's cost as integer tables, for exact search (shardlab.costmodel.decompose)."""

from __future__ import annotations

import numpy as np
import pytest

from shardlab import Degrees, Problem
from shardlab.costmodel.decompose import (
    integer_tables,
    kv_bytes,
    price,
    requests_per_rank,
    time_ns,
)
from shardlab.costmodel.pricing import evaluate
from shardlab.costmodel.tables import degree_tables
from shardlab.problems.operators import HEAD_OPS, LAST_STAGE_HEADS, Head

PROBLEM = Problem.build(
    "llama-3.1-8b", "h100x8", "chat", timing="roofline", input_len=1000, output_len=200
)
D = Degrees(replicas=2, pp=2, tp=2, etp=2)


def test_head_names_each_head_row_in_order() -> None:
    # every table's head rows, and a plan's head options, follow HEAD_OPS
    assert [h.name.lower() for h in Head] == [op.name for op in HEAD_OPS]
    assert [int(h) for h in Head] == list(range(len(HEAD_OPS)))
    assert (Head.EMBEDDING, *LAST_STAGE_HEADS) == tuple(Head)


def test_entries_are_the_tables_in_whole_nanoseconds() -> None:
    t = degree_tables(PROBLEM, D)
    tables = integer_tables(PROBLEM, D, 5)
    b = int(t.request_range.b_of(5, D.pp))  # 5 requests in 2 micro-batches: 3 a micro-batch
    assert b == 3
    for si, step in enumerate(t.steps):
        col = 0 if step.single else t.b_index(b)
        expected = np.rint(t.op_time[si][..., col] * 1e9).astype(np.int64)
        np.testing.assert_array_equal(tables.op_ns[si], expected)
        np.testing.assert_array_equal(
            tables.p2p_ns[si], np.rint(t.p2p[si][..., col] * 1e9).astype(np.int64)
        )
    assert tables.op_ns.dtype == np.int64 and tables.requests_per_rank == 5


def test_floors_bound_every_larger_concurrency_from_below() -> None:
    requests_per_rank = np.arange(1, 40)
    exact = time_ns(PROBLEM, D, requests_per_rank)
    floor = time_ns(PROBLEM, D, requests_per_rank, floor=True)
    for name, table in exact.items():
        lo = floor[name]
        assert (lo <= table).all(), name
        assert (np.diff(lo, axis=-1) >= 0).all(), name  # nondecreasing in the requests
        # the floor at c is no more than the exact entry at c or any larger c
        suffix_min = np.minimum.accumulate(table[..., ::-1], axis=-1)[..., ::-1]
        assert (lo <= suffix_min).all(), name


def test_kv_bytes_grow_with_the_requests_a_gpu_holds() -> None:
    one, ten = kv_bytes(PROBLEM, D, np.array([1])), kv_bytes(PROBLEM, D, np.array([10]))
    assert (ten >= one).all() and ten.sum() > 0
    # replicated caches grow linearly; caches split over tp by ceil(c / tp)
    t = degree_tables(PROBLEM, D)
    split = t.op_kv_split
    np.testing.assert_allclose(ten[~split], 10 * one[~split], rtol=0, atol=10)
    np.testing.assert_allclose(ten[split], 5 * one[split], rtol=0, atol=5)


def test_requests_outside_the_range_are_refused() -> None:
    top = degree_tables(PROBLEM, D).request_range.max_requests_per_rank
    with pytest.raises(ValueError, match="outside"):
        integer_tables(PROBLEM, D, 0)
    with pytest.raises(ValueError, match="outside"):
        integer_tables(PROBLEM, D, top + 1)
    static = Problem.build("llama-3.1-8b", "h100x8", "chat", timing="roofline", schedule="static")
    full = degree_tables(static, D).request_range.max_requests_per_rank
    integer_tables(static, D, full)
    with pytest.raises(ValueError, match="outside"):
        integer_tables(static, D, full - 1)  # a static batch runs whole


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_priced_plan_is_the_evaluated_plan(seed: int) -> None:
    plan = PROBLEM.space.decode(PROBLEM.space.sample(1, seed=seed)[0])
    m = evaluate(PROBLEM, plan, breakdown=False)
    c = requests_per_rank(PROBLEM, plan)
    assert c == m.requests_per_rank
    cost = price(PROBLEM, integer_tables(PROBLEM, plan.degrees, c), plan)
    assert cost.stage_ns.shape == (len(degree_tables(PROBLEM, plan.degrees).steps), plan.degrees.pp)
    # whole nanoseconds an entry: a round is off by well under a microsecond
    assert cost.latencies.tpot_s[0] * 1e3 == pytest.approx(m.tpot_ms, rel=0, abs=1e-3)
    assert cost.latencies.ttft_s[0] * 1e3 == pytest.approx(m.ttft_ms, rel=1e-4)
    assert cost.latencies.throughput[0] == pytest.approx(m.throughput_tok_s, rel=1e-4)
    # memory as the engine budgets it, on the fullest stage, within a byte an entry
    assert cost.stage_bytes.max() / 1e9 == pytest.approx(m.memory_gb_per_gpu, rel=1e-6)
    assert cost.fits == (m.memory_gb_per_gpu <= m.hbm_gb)
