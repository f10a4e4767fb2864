"""The requests a plan's attention-DP rank may run (shardlab.problems.request_range),
and the cost model's tables reading it."""

from __future__ import annotations

import numpy as np
import pytest

from shardlab import Degrees, Problem
from shardlab.costmodel.engines import engine_limits
from shardlab.costmodel.steps import steps_of
from shardlab.costmodel.tables import degree_tables
from shardlab.problems.request_range import RequestRange, request_range
from shardlab.problems.workload import get_workload

CHAT = get_workload("chat").with_overrides(batch=100, input_len=1000, output_len=200)
LOOSE = {"max_batch": 10_000, "max_tokens": 10**9, "round_tokens": 6.0}


@pytest.mark.parametrize("schedule", ["static", "inflight"])
def test_the_batch_is_spread_over_replicas_then_dp_ranks(schedule: str) -> None:
    w = CHAT.with_overrides(schedule=schedule)
    r = request_range(w, Degrees(replicas=3, tp=2, dp_attn=2, etp=4), **LOOSE)
    assert r.per_replica == 34  # ceil(100 / 3): the busiest replica
    assert r.max_requests_per_rank == 17  # ceil(34 / 2)
    assert r.inflight == (schedule == "inflight")


def test_in_flight_the_engine_caps_the_requests_per_rank() -> None:
    w = CHAT.with_overrides(schedule="inflight")
    d = Degrees(tp=2, etp=2)
    assert request_range(w, d, **{**LOOSE, "max_batch": 64}).max_requests_per_rank == 64
    # 6 tokens a request per round: 300 tokens an iteration hold 50 requests
    assert request_range(w, d, **{**LOOSE, "max_tokens": 300}).max_requests_per_rank == 50
    # a budget below one request's round still runs one
    assert request_range(w, d, **{**LOOSE, "max_tokens": 2}).max_requests_per_rank == 1


def test_a_static_batch_ignores_the_engine_limits() -> None:
    w = CHAT.with_overrides(schedule="static")
    tight = {"max_batch": 1, "max_tokens": 1, "round_tokens": 6.0}
    assert request_range(w, Degrees(), **tight).max_requests_per_rank == 100


def test_micro_batches_split_a_ranks_requests_over_the_stages() -> None:
    r = RequestRange(per_replica=100, max_requests_per_rank=100, inflight=True)
    requests_per_rank = np.array([1, 3, 4, 5, 9, 100])
    assert r.microbatches(requests_per_rank, 4).tolist() == [1, 3, 4, 4, 4, 4]
    assert r.b_of(requests_per_rank, 4).tolist() == [1, 1, 1, 2, 3, 25]
    assert r.b_of(requests_per_rank, 1).tolist() == requests_per_rank.tolist()


def test_the_tables_cover_every_b_the_range_reaches() -> None:
    problem = Problem.build("llama-3.1-8b", "h100x8", "chat", timing="roofline")
    d = Degrees(replicas=2, pp=2, tp=2, etp=2)
    t = degree_tables(problem, d)
    e = engine_limits(problem, d.tp, d.pp, d.dp_attn)
    expected = request_range(
        problem.workload,
        d,
        max_batch=e.max_batch,
        max_tokens=e.max_tokens,
        round_tokens=steps_of(problem.workload)[0].tokens,
    )
    assert t.request_range == expected
    assert t.b.tolist() == list(
        range(1, int(expected.b_of(expected.max_requests_per_rank, d.pp)) + 1)
    )
