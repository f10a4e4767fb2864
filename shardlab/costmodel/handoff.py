"""Time of the KV-cache handoff of disaggregated serving (what moves:
:mod:`shardlab.problems.handoff`).

Per request:

- the decode rank's ``pp * tp`` GPUs each receive their share (replicas included);
  the prefill rank's ``pp * tp`` GPUs send it all between them; the busier side sets
  the time, over NVLink when both pools sit in one node and over the network
  otherwise, plus one link latency;
- when the two ranks split the cache differently (another ``pp`` or ``tp``), the
  receiver rewrites what it got: one HBM read and one write, in its own HBM;
- pools on two GPU types (capacity planning's mixed pools) sit on separate nodes: the
  slower of the two network links and the larger latency.

The handoff adds to TTFT (after the prompt's prefill, before its first decode step)
and not to the prefill pool's time per round: it runs on the links while the next
prompts prefill. It is not overlapped with the prompt's own prefill, which makes it
an upper bound where an engine sends layer by layer.
"""

from __future__ import annotations

import math

import numpy as np

from shardlab.problems.problem import Problem


def handoff_seconds(problem: Problem, pp: np.ndarray | int, tp: np.ndarray | int) -> np.ndarray:
    """Handoff time per request from prefill ranks of ``pp`` x ``tp`` GPUs (0 when the
    problem is not a prefill pool's)."""
    h = problem.handoff
    pp, tp = np.asarray(pp, dtype=float), np.asarray(tp, dtype=float)
    if h is None:
        return np.zeros(np.broadcast(pp, tp).shape)
    acc = problem.cluster.accelerator
    gbps = acc.nvlink_gbps if h.same_domain else acc.net_gbps
    latency_us = acc.nvlink_latency_us if h.same_domain else acc.net_latency_us
    receiver = acc
    if h.decode_gpu is not None:  # two GPU types: the slower network side sets the pace
        receiver = h.decode_gpu
        gbps = min(gbps, receiver.net_gbps)
        latency_us = max(latency_us, receiver.net_latency_us)
    receiving = h.decode_pp * h.decode_tp
    busiest = np.maximum(h.received_bytes / (pp * tp), h.received_bytes / receiving)
    wire = busiest / (gbps * 1e9) + latency_us * 1e-6
    relayout = (pp != h.decode_pp) | (tp != h.decode_tp)
    rewrite = np.where(
        relayout, 2.0 * h.received_bytes / receiving / (receiver.hbm_gbps * 1e9), 0.0
    )
    return wire + rewrite


def handoff_ns(problem: Problem, pp: int, tp: int) -> int:
    """:func:`handoff_seconds` in whole ns, rounded up (CP-SAT's integer time)."""
    return math.ceil(float(handoff_seconds(problem, pp, tp)) * 1e9)
