"""Collectives: which GPUs a group spans, and the alpha-beta time of each algorithm.

Rank layout. Inside a replica, mesh axes are laid out innermost first as
``tp, dp, pp``, replicas outermost; the MoE block's ``etp`` is innermost and ``ep``
strides over it. A group of ``size`` ranks with stride ``stride`` keeps
``min(size, node // stride)`` of its ranks in one NVLink domain (1 when the stride
reaches a whole node); the rest of the group is on other nodes.

Time of a collective over ``n`` ranks with per-rank message ``M`` bytes
(all-reduce: the tensor; all-gather: the gathered output; reduce-scatter: the input;
all-to-all: the local buffer)::

    t = alpha(kind, n) + f(kind, n) * M / (link_bandwidth * efficiency(M))

with ``f = 2(n-1)/n`` for all-reduce and ``(n-1)/n`` otherwise (ring algorithms).
Groups that span nodes run hierarchically: NVLink inside each node, the network
(one NIC per GPU) across nodes. Every function accepts numpy arrays of sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.costmodel.constants import ALPHA_STEPS, BUSBW_EFFICIENCY, BUSBW_SIZES
from shardlab.problems.cluster import Cluster
from shardlab.problems.plan import Degrees

_LOG_SIZES = np.log(np.array(BUSBW_SIZES, dtype=float))
_EFF = np.array(BUSBW_EFFICIENCY, dtype=float)


@dataclass(frozen=True, kw_only=True)
class Span:
    """A communication group: ``size`` ranks, ``local`` of them per NVLink domain."""

    size: int
    local: int

    @property
    def nodes(self) -> int:
        return self.size // self.local


def span(size: int, stride: int, cluster: Cluster) -> Span:
    node = cluster.domain_size
    local = 1 if stride >= node else min(size, max(1, node // stride))
    while size % local:  # uneven packing: fall back to the largest divisor that fits
        local -= 1
    return Span(size=size, local=local)


def axis_span(axis: str, degrees: Degrees, cluster: Cluster) -> Span:
    """Span of the groups of one mesh axis of a pipeline stage."""
    sizes_strides = {
        "tp": (degrees.tp, 1),
        "dp": (degrees.dp_attn, degrees.tp),
        "group": (degrees.group, 1),
        "ep": (degrees.ep, degrees.etp),
        "etp": (degrees.etp, 1),
    }
    size, stride = sizes_strides[axis]
    return span(size, stride, cluster)


def efficiency(nbytes: np.ndarray | float) -> np.ndarray:
    """Fraction of link bandwidth a message of ``nbytes`` reaches (empirical curve)."""
    x = np.log(np.maximum(np.asarray(nbytes, dtype=float), 1.0))
    return np.interp(x, _LOG_SIZES, _EFF)


def _alpha(kind: str, n: int, latency_us: float) -> float:
    return latency_us * 1e-6 * (n + 2) * ALPHA_STEPS[kind]


def _flat(kind: str, n: int, m: np.ndarray, gbps: float, latency_us: float) -> np.ndarray:
    """One-level ring collective over ``n`` ranks on one fabric."""
    if n <= 1:
        return np.zeros_like(m)
    f = 2.0 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n
    return _alpha(kind, n, latency_us) + f * m / (gbps * 1e9 * efficiency(m))


def collective_time(
    kind: str, group: Span, nbytes: np.ndarray | float, cluster: Cluster
) -> np.ndarray:
    """Seconds for one collective of ``kind`` over ``group`` (see module docstring)."""
    m = np.asarray(nbytes, dtype=float)
    if group.size <= 1:
        return np.zeros_like(m)
    acc = cluster.accelerator
    nv, nv_lat = acc.nvlink_gbps, acc.nvlink_latency_us
    net, net_lat = acc.net_gbps, acc.net_latency_us
    g, nodes = group.local, group.nodes
    if nodes == 1:
        return _flat(kind, g, m, nv, nv_lat)
    if kind == "all_reduce":
        # Reduce-scatter in the node, all-reduce of the 1/g shard across nodes, all-gather.
        return (
            _flat("reduce_scatter", g, m, nv, nv_lat)
            + _flat("all_reduce", nodes, m / g, net, net_lat)
            + _flat("all_gather", g, m, nv, nv_lat)
        )
    if kind == "all_gather":
        return _flat("all_gather", nodes, m / g, net, net_lat) + _flat(
            "all_gather", g, m, nv, nv_lat
        )
    if kind == "reduce_scatter":
        return _flat("reduce_scatter", g, m, nv, nv_lat) + _flat(
            "reduce_scatter", nodes, m / g, net, net_lat
        )
    if kind == "all_to_all":
        n = group.size
        off_node = (n - g) / n * m
        on_node = (g - 1) / n * m
        t_net = _alpha(kind, nodes, net_lat) + off_node / (net * 1e9 * efficiency(m))
        t_nv = _alpha(kind, g, nv_lat) + on_node / (nv * 1e9 * efficiency(m)) if g > 1 else 0.0 * m
        return np.maximum(t_net, t_nv)
    raise ValueError(f"unknown collective {kind!r}")


def p2p_time(nbytes: np.ndarray | float, inter_node: bool, cluster: Cluster) -> np.ndarray:
    """Seconds to send ``nbytes`` from one GPU to another (pipeline hop)."""
    m = np.asarray(nbytes, dtype=float)
    acc = cluster.accelerator
    if inter_node:
        return acc.net_latency_us * 1e-6 + m / (acc.net_gbps * 1e9 * efficiency(m))
    return acc.nvlink_latency_us * 1e-6 + m / (acc.nvlink_gbps * 1e9 * efficiency(m))


def hop_is_inter_node(stage: int, degrees: Degrees, cluster: Cluster) -> bool:
    """Whether the hop from ``stage`` to ``stage + 1`` leaves the NVLink domain."""
    g, node = degrees.group, cluster.domain_size
    return (stage * g) // node != ((stage + 1) * g) // node
