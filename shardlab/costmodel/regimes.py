"""From stage times to TTFT, TPOT, latency and throughput, per scheduling regime.

With stage times ``t_s`` of one micro-batch and ``m`` micro-batches per dp rank:

- a static prefill takes ``sum(t_s) + (m - 1) * max(t_s)`` (pipeline fill and drain);
- a steady-state round, in which every request advances one step, takes
  ``max(sum(t_s), m * max(t_s))``.

Then, by phase and schedule (see :mod:`shardlab.problems.workload`):

- static prefill: TTFT = the batch's prefill; throughput = batch * input / TTFT;
- static decode: TPOT = the mean round; throughput = batch / TPOT;
- static request: TTFT = prefill, TPOT = decode round, latency = TTFT + (output - 1)
  * TPOT, throughput = batch * output / latency;
- in flight: TPOT = the round (mixed prefill + decode for whole requests); TTFT = a
  round plus one prompt's prefill through the pipeline (prefill phase: the round);
  throughput = requests in flight / TPOT (input tokens per round for prefill).

A prefill pool of disaggregated serving (``problem.handoff``) adds the handoff of each
prompt's cache to the decode pool to its TTFT, not to its time per round
(:mod:`shardlab.costmodel.handoff`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from shardlab.costmodel.handoff import handoff_seconds
from shardlab.costmodel.steps import Step
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem


class DegreeArrays(NamedTuple):
    """The degrees the regimes read, one entry per plan: plans of many degree tuples
    are timed in one pass."""

    pp: np.ndarray
    replicas: np.ndarray
    dp_attn: np.ndarray
    tp: np.ndarray


@dataclass(frozen=True)
class Timing:
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    latency_s: np.ndarray
    throughput: np.ndarray  # tokens/s of the whole cluster
    concurrency: np.ndarray  # requests in flight in the whole cluster


@dataclass(frozen=True)
class Judgement:
    objective: np.ndarray  # higher is better
    ttft_violation: np.ndarray
    tpot_violation: np.ndarray
    feasible: np.ndarray


def in_flight_requests(
    problem: Problem,
    degrees: Degrees | DegreeArrays,
    per_replica: int | np.ndarray,
    per_dp: np.ndarray | int,
) -> np.ndarray:
    """Requests the whole cluster serves at once: the offered batch, or what the
    replicas hold when each dp rank holds ``per_dp`` (the in-flight KV cap)."""
    d = degrees
    held = d.replicas * np.minimum(per_replica, np.asarray(per_dp) * d.dp_attn)
    return np.minimum(problem.workload.batch, held).astype(float)


def timing(
    problem: Problem,
    degrees: Degrees | DegreeArrays,
    steps: tuple[Step, ...],
    per_replica: int | np.ndarray,
    per_dp: np.ndarray,
    sums: list[np.ndarray],
    maxes: list[np.ndarray],
) -> Timing:
    """TTFT, TPOT, latency, throughput from per-step stage-time sums and maxima."""
    w = problem.workload
    d = degrees
    m = np.minimum(d.pp, per_dp)
    inflight = w.schedule == "inflight"
    in_flight = in_flight_requests(problem, d, per_replica, per_dp)
    kinds = [s.kind for s in steps]
    zeros = np.zeros_like(sums[0])
    i_len, o_len = w.input_len, w.output_len
    if kinds == ["prefill"]:
        # a prefill pool of disaggregated serving hands each prompt's cache off after
        # it: TTFT only, the links run while the next prompts prefill
        handoff = handoff_seconds(problem, d.pp, d.tp)
        if inflight:
            prefill = np.maximum(sums[0], m * maxes[0])
            thr = in_flight * i_len / prefill
        else:
            prefill = sums[0] + (m - 1) * maxes[0]
            thr = w.batch * i_len / prefill
        ttft = prefill + handoff
        tpot, latency = zeros, ttft
    elif kinds == ["decode"]:
        tpot = np.maximum(sums[0], m * maxes[0])
        ttft, latency = zeros, tpot
        thr = (in_flight if inflight else w.batch) / tpot
    elif kinds == ["prefill", "decode"]:
        ttft = sums[0] + (m - 1) * maxes[0]
        tpot = np.maximum(sums[1], m * maxes[1])
        latency = ttft + (o_len - 1) * tpot
        thr = w.batch * o_len / latency
    else:  # mixed in-flight rounds; a new prompt adds its own prefill to a round
        tpot = np.maximum(sums[0], m * maxes[0])
        ttft = tpot + sums[1]
        latency = ttft + (o_len - 1) * tpot
        thr = in_flight / tpot
    concurrency = in_flight if inflight else np.full_like(in_flight, float(w.batch))
    return Timing(ttft, tpot, latency, thr, np.broadcast_to(concurrency, np.shape(thr)))


def judge(problem: Problem, t: Timing, memory_ok: np.ndarray) -> Judgement:
    """Objective (higher is better) and SLO violations."""
    w = problem.workload
    ttft_bad = np.zeros(np.shape(memory_ok), dtype=bool)
    tpot_bad = np.zeros(np.shape(memory_ok), dtype=bool)
    if w.ttft_ms is not None and w.phase != "decode":
        ttft_bad = t.ttft_s * 1e3 > w.ttft_ms
    if w.tpot_ms is not None and w.phase != "prefill":
        tpot_bad = t.tpot_s * 1e3 > w.tpot_ms
    if w.objective == "latency":
        objective = -t.latency_s * 1e3
    elif w.per_gpu:
        objective = t.throughput / problem.cluster.num_gpus
    else:
        objective = t.throughput
    return Judgement(objective, ttft_bad, tpot_bad, memory_ok & ~ttft_bad & ~tpot_bad)
