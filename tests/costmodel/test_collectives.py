"""Collectives: group spans and the alpha-beta times (shardlab.costmodel.collectives)."""

from __future__ import annotations

import numpy as np
import pytest

from shardlab import Degrees
from shardlab.costmodel.collectives import (
    Span,
    axis_span,
    collective_time,
    hop_is_inter_node,
    p2p_time,
    span,
)
from shardlab.problems.cluster import parse_cluster

CLUSTER = parse_cluster("h100x32")  # nodes of 8
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SIZES = np.array([1e3, 1e5, 1 << 20, 8 << 20, 64 << 20, 1 << 30, 8 << 30], dtype=float)


@pytest.mark.parametrize("kind", KINDS)
def test_a_group_of_one_costs_nothing(kind: str) -> None:
    t = collective_time(kind, Span(size=1, local=1), SIZES, CLUSTER)
    assert t.shape == SIZES.shape
    assert (t == 0).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("group", [Span(size=8, local=8), Span(size=32, local=8)])
def test_time_grows_with_bytes(kind: str, group: Span) -> None:
    t = collective_time(kind, group, SIZES, CLUSTER)
    assert (t > 0).all()
    assert (np.diff(t) > 0).all()


@pytest.mark.parametrize("kind", KINDS)
def test_time_grows_with_the_group_in_a_node(kind: str) -> None:
    times = [
        float(collective_time(kind, Span(size=n, local=n), 64 << 20, CLUSTER)) for n in (2, 4, 8)
    ]
    assert times == sorted(times) and len(set(times)) == 3


@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_reduce_is_reduce_scatter_then_all_gather_in_a_node(n: int) -> None:
    # ring algorithms: 2(n-1)/n of the tensor against (n-1)/n twice, and the latency
    # steps of the two halves add up to the all-reduce's
    group = Span(size=n, local=n)
    ar = collective_time("all_reduce", group, SIZES, CLUSTER)
    rs = collective_time("reduce_scatter", group, SIZES, CLUSTER)
    ag = collective_time("all_gather", group, SIZES, CLUSTER)
    np.testing.assert_allclose(ar, rs + ag, rtol=1e-12)


def test_an_all_reduce_across_nodes_is_hierarchical() -> None:
    # in the node, then the 1/g shard across nodes, then in the node again
    m = np.array([64 << 20], dtype=float)
    inner = Span(size=8, local=8)
    across = collective_time("all_reduce", Span(size=32, local=8), m, CLUSTER)
    in_node = collective_time("reduce_scatter", inner, m, CLUSTER) + collective_time(
        "all_gather", inner, m, CLUSTER
    )
    assert across > in_node  # the network leg adds to the in-node legs
    # the network leg is an all-reduce of the shard over the 4 nodes (one GPU each)
    net = across - in_node
    acc = CLUSTER.accelerator
    one_per_node = collective_time("all_reduce", Span(size=4, local=1), m / 8, CLUSTER)
    assert float(net[0]) == pytest.approx(float(one_per_node[0]), rel=1e-9)
    # and the network is the slow leg: the same shard over NVLink would be faster
    assert acc.net_gbps < acc.nvlink_gbps
    assert float(one_per_node[0]) > float(
        collective_time("all_reduce", Span(size=4, local=4), m / 8, CLUSTER)[0]
    )


def test_unknown_collectives_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown collective"):
        collective_time("broadcast", Span(size=16, local=8), 1e6, CLUSTER)


def test_span_keeps_what_fits_in_a_node() -> None:
    assert span(8, 1, CLUSTER) == Span(size=8, local=8)
    assert span(16, 1, CLUSTER) == Span(size=16, local=8)
    assert span(4, 4, CLUSTER) == Span(size=4, local=2)  # stride 4: two ranks per node
    assert span(4, 8, CLUSTER) == Span(size=4, local=1)  # stride of a node: one each
    assert span(6, 1, CLUSTER).local == 6
    assert Span(size=32, local=8).nodes == 4


def test_axis_span_lays_tp_innermost_then_dp() -> None:
    d = Degrees(tp=4, dp_attn=4, ep=8, etp=2)
    assert axis_span("tp", d, CLUSTER) == Span(size=4, local=4)
    assert axis_span("dp", d, CLUSTER) == Span(size=4, local=2)  # stride tp = 4
    assert axis_span("group", d, CLUSTER) == Span(size=16, local=8)
    assert axis_span("etp", d, CLUSTER) == Span(size=2, local=2)
    assert axis_span("ep", d, CLUSTER) == Span(size=8, local=4)  # stride etp = 2


def test_pipeline_hops_leave_the_node_where_stages_cross_it() -> None:
    two_per_stage = Degrees(pp=8, tp=2, etp=2)  # four stages per node
    assert [hop_is_inter_node(s, two_per_stage, CLUSTER) for s in range(7)] == [
        False, False, False, True, False, False, False,
    ]  # fmt: skip
    whole_node = Degrees(pp=4, tp=8, etp=8)
    assert all(hop_is_inter_node(s, whole_node, CLUSTER) for s in range(3))


def test_a_send_over_the_network_is_slower_than_over_nvlink() -> None:
    intra = p2p_time(SIZES, False, CLUSTER)
    inter = p2p_time(SIZES, True, CLUSTER)
    assert (inter > intra).all()
    assert (np.diff(intra) > 0).all() and (np.diff(inter) > 0).all()
