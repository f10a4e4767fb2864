"""The KV-cache handoff's time (shardlab.costmodel.handoff)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from shardlab import Problem
from shardlab.costmodel.handoff import handoff_ns, handoff_seconds
from shardlab.problems.handoff import Handoff

BASE = Problem.build("llama-3.1-8b", "h100x8", "chat", phase="prefill")


def pool(received: float, *, same_domain: bool = True, pp: int = 1, tp: int = 2) -> Problem:
    h = Handoff(decode_pp=pp, decode_tp=tp, same_domain=same_domain, received_bytes=received)
    return dataclasses.replace(BASE, handoff=h)


def test_no_handoff_outside_a_prefill_pool() -> None:
    assert BASE.handoff is None
    t = handoff_seconds(BASE, np.array([1, 2]), np.array([4, 1]))
    assert t.shape == (2,) and (t == 0).all()


def test_the_wire_time_grows_linearly_with_the_cache_sent() -> None:
    # same layout on both sides: one link latency, then the bytes over the link
    t = [float(handoff_seconds(pool(b), 1, 2)) for b in (0.0, 1e8, 2e8, 4e8)]
    latency = BASE.cluster.accelerator.nvlink_latency_us * 1e-6
    assert t[0] == pytest.approx(latency)
    assert t[2] - t[1] == pytest.approx(t[1] - t[0], rel=1e-12)
    assert t[3] - t[0] == pytest.approx(4 * (t[1] - t[0]), rel=1e-12)


def test_the_network_is_slower_than_nvlink() -> None:
    near = float(handoff_seconds(pool(1e8, same_domain=True), 1, 2))
    far = float(handoff_seconds(pool(1e8, same_domain=False), 1, 2))
    assert far > near


def test_a_different_layout_costs_a_rewrite_on_the_decode_side() -> None:
    same = float(handoff_seconds(pool(1e8, pp=1, tp=2), 1, 2))
    other_tp = float(handoff_seconds(pool(1e8, pp=1, tp=2), 1, 4))
    other_pp = float(handoff_seconds(pool(1e8, pp=1, tp=2), 2, 2))
    hbm = BASE.cluster.accelerator.hbm_gbps * 1e9
    rewrite = 2.0 * 1e8 / 2 / hbm  # one read and one write of what each of 2 GPUs got
    # more senders do not make it faster: the two receivers are the busier side
    assert other_tp - same == pytest.approx(rewrite, rel=1e-9)
    assert other_pp - same == pytest.approx(rewrite, rel=1e-9)


def test_the_busier_side_sets_the_time() -> None:
    # decode ranks of 2 GPUs; what the wire takes = total - the rewrite of a relayout
    p = pool(1e8, pp=1, tp=2)
    latency = BASE.cluster.accelerator.nvlink_latency_us * 1e-6
    rewrite = 2.0 * 1e8 / 2 / (BASE.cluster.accelerator.hbm_gbps * 1e9)
    one = float(handoff_seconds(p, 1, 1)) - rewrite - latency  # one sender: it sends all
    two = float(handoff_seconds(p, 1, 2)) - latency
    four = float(handoff_seconds(p, 1, 4)) - rewrite - latency  # the 2 receivers bind
    assert one == pytest.approx(2 * two, rel=1e-9)
    assert four == pytest.approx(two, rel=1e-9)


def test_ns_rounds_up() -> None:
    p = pool(123_456_789.0)
    assert handoff_ns(p, 1, 4) == math.ceil(float(handoff_seconds(p, 1, 4)) * 1e9)
    assert handoff_ns(p, 1, 4) >= float(handoff_seconds(p, 1, 4)) * 1e9


def test_arrays_of_plans_are_timed_entry_by_entry() -> None:
    p = pool(1e8)
    pp, tp = np.array([1, 2, 1]), np.array([2, 2, 8])
    batch = handoff_seconds(p, pp, tp)
    one_by_one = [float(handoff_seconds(p, int(a), int(b))) for a, b in zip(pp, tp, strict=True)]
    np.testing.assert_array_equal(batch, one_by_one)


def test_two_gpu_types_hand_off_over_the_slower_network_into_the_receivers_hbm() -> None:
    from shardlab.errors import ShardlabError
    from shardlab.problems.cluster import builtin_accelerators

    h100 = BASE.cluster.accelerator
    slow = dataclasses.replace(
        builtin_accelerators()["a100"], net_gbps=h100.net_gbps / 2, net_latency_us=50.0
    )
    far = pool(1e8, same_domain=False)
    mixed = dataclasses.replace(far, handoff=dataclasses.replace(far.handoff, decode_gpu=slow))
    same, other = (float(handoff_seconds(p, 1, 2)) for p in (far, mixed))
    wire = 1e8 / 2 / (h100.net_gbps * 1e9)
    assert same == pytest.approx(wire + h100.net_latency_us * 1e-6)
    assert other == pytest.approx(2 * wire + 50e-6)  # half the bandwidth, its latency
    # a relayout is rewritten in the decode GPU's HBM
    rewrite = float(handoff_seconds(mixed, 1, 4)) - other
    assert rewrite == pytest.approx(2.0 * 1e8 / 2 / (slow.hbm_gbps * 1e9), rel=1e-9)
    with pytest.raises(ShardlabError, match="share no NVLink domain"):
        Handoff(decode_pp=1, decode_tp=2, same_domain=True, received_bytes=1.0, decode_gpu=slow)
