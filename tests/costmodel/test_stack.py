"""Every degree tuple's tables stacked in one row layout (shardlab.costmodel.stack)."""

from __future__ import annotations

import numpy as np
import pytest

from shardlab import Degrees, Problem
from shardlab.costmodel.stack import Stack, _Grown
from shardlab.costmodel.tables import degree_tables
from shardlab.errors import ShardlabError

PROBLEM = Problem.build("llama-3.1-8b", "h100x8", "chat", timing="roofline")
TUPLES = (
    Degrees(replicas=8),
    Degrees(replicas=2, pp=2, tp=2, etp=2),
    Degrees(pp=2, tp=4, etp=4),
)


def fresh() -> Stack:
    return Stack(PROBLEM, max_pp=4)


def test_slots_are_assigned_once_per_degree_tuple() -> None:
    stack = fresh()
    first = stack.slots(TUPLES)
    assert first.tolist() == [0, 1, 2]
    assert stack.slots((TUPLES[2], TUPLES[0], TUPLES[2])).tolist() == [2, 0, 2]
    assert stack.tables == [None, None, None]  # built on demand only
    stack.ensure(np.array([1]))
    assert stack.tables[0] is None and stack.tables[1] is degree_tables(PROBLEM, TUPLES[1])


def test_more_stages_than_the_layout_holds_are_refused() -> None:
    with pytest.raises(ShardlabError, match="pipeline stages"):
        fresh().slots((Degrees(pp=8),))


def test_scalars_are_the_tables_degrees_and_limits() -> None:
    stack = fresh()
    slots = stack.slots(TUPLES)
    stack.ensure(slots)
    for s, d in zip(slots.tolist(), TUPLES, strict=True):
        t = degree_tables(PROBLEM, d)
        assert stack.scalar("pp", np.array([s]))[0] == d.pp
        assert stack.scalar("tp", np.array([s]))[0] == d.tp
        assert stack.scalar("replicas", np.array([s]))[0] == d.replicas
        assert (
            stack.scalar("max_requests_per_rank", np.array([s]))[0]
            == t.request_range.max_requests_per_rank
        )
        assert stack.scalar("max_tokens", np.array([s]))[0] == t.engine.max_tokens
        assert stack.scalar("kv_scale", np.array([s]))[0] == t.engine.kv_scale


def test_rows_hold_each_slots_entries_where_the_layout_says() -> None:
    stack = fresh()
    slots = stack.slots(TUPLES)
    stack.ensure(slots)
    lay = stack.layout
    for s, d in zip(slots.tolist(), TUPLES, strict=True):
        t = degree_tables(PROBLEM, d)
        weights = stack.weight.data[s]
        np.testing.assert_array_equal(weights[lay.op0 : lay.edge0], t.op_weight.ravel())
        np.testing.assert_array_equal(weights[lay.head0 : lay.emb0], t.head_weight.ravel())
        np.testing.assert_array_equal(stack.kv.data[s][lay.op0 : lay.edge0], t.op_kv.ravel())
        for si in range(len(t.steps)):
            rows = stack.time_rows(t, si)
            assert rows.shape == (lay.rows, len(t.b))
            np.testing.assert_array_equal(
                rows[lay.inter0 : lay.head0], t.inter_time[si].reshape(-1, len(t.b))
            )
            np.testing.assert_array_equal(
                rows[lay.p2p0 : lay.p2p0 + t.p2p[si].size // len(t.b)],
                t.p2p[si].reshape(-1, len(t.b)),
            )


def test_an_arena_lays_steps_side_by_side_and_repeats_the_last_b() -> None:
    stack = fresh()
    slots = stack.slots(TUPLES[:2])
    stack.ensure(slots)
    width = 4
    cols = stack.columns(width)
    assert cols == tuple(1 if s.single else width for s in stack.steps)
    arena, blocks = stack.arena(width, slots)
    assert arena.shape[1] == sum(cols)
    again, blocks_again = stack.arena(width, slots[::-1])
    assert blocks_again.tolist() == blocks[::-1].tolist()  # built once
    assert len(again) == len(arena)
    lay = stack.layout
    for s, block in zip(slots.tolist(), blocks.tolist(), strict=True):
        t = stack.table(s)
        rows = arena[block : block + lay.rows]
        start = 0
        for si, c in enumerate(cols):
            want = stack.time_rows(t, si)
            got = rows[:, start : start + c]
            n = min(c, want.shape[1])
            np.testing.assert_array_equal(got[:, :n], want[:, :n])
            if c > want.shape[1]:  # fewer b than columns: the last b repeats
                np.testing.assert_array_equal(got[:, n:], np.repeat(want[:, -1:], c - n, axis=1))
            start += c


def test_grown_arrays_keep_what_they_held() -> None:
    g = _Grown(3)
    blocks = [np.full((n, 3), float(n)) for n in (5, 20, 1)]
    starts = [g.append(b) for b in blocks]
    assert starts == [0, 5, 25] and g.used == 26 and len(g.data) >= 26
    for start, b in zip(starts, blocks, strict=True):
        np.testing.assert_array_equal(g.data[start : start + len(b)], b)
