"""The vectorized arithmetic of pricing: arrays of plans of any degree tuples, in one
numpy pass over the problem's stacked tables (:mod:`shardlab.costmodel.stack`).

Definitions:

- Requests: ``workload.batch`` requests are spread over the replicas and, inside a
  replica, over the attention-data-parallel ranks (the busiest rank sets the pace);
  a rank's requests form ``m = min(pp, requests)`` micro-batches.
- Pipeline: with stage times ``t_s`` of one micro-batch, a static prefill of ``m``
  micro-batches takes ``sum(t_s) + (m - 1) * max(t_s)``; a steady-state round in which
  every request advances by one step takes ``max(sum(t_s), m * max(t_s))``.
- ``static`` schedule: TTFT is the prefill of the whole batch, TPOT the mean decode
  round, latency ``TTFT + (output_len - 1) * TPOT``, throughput
  ``batch * output_len / latency`` (prefill phase: ``batch * input_len / TTFT``; decode
  phase: ``batch / TPOT``).
- ``inflight`` schedule: the concurrency ``c`` (requests per dp rank, the engine's max
  batch size) is a decision of the plan, ``1 <= c <=`` what the workload offers a rank
  (the workload's batch over the replicas and dp ranks, within the engine's max batch
  and max tokens). A plan that fixes it (``Plan.requests_per_rank``) runs with it; otherwise
  every ``c`` up to what its KV cache holds is priced and the best one under the SLOs
  is kept (none feasible: ``c = 1``, the least memory and, but for bumps in measured
  kernel tables, the least latency). TPOT is the round, which carries its share of
  whole prompts in flight (:mod:`shardlab.costmodel.steps`); TTFT the closed loop's
  (:mod:`shardlab.costmodel.regimes`: the first wave's cohorts, later prompts beside
  a round, the engine's cost per request); throughput is requests in flight / TPOT
  (prefill phase: input tokens per round).
- Memory per GPU: the stage's weights, the KV cache of the stage's layers for the
  requests the GPU holds, the activation workspace of the largest micro-batch step
  (engines reserve it at start-up) and a runtime reserve, as the serving engine
  budgets them (its KV-cache share, :mod:`shardlab.costmodel.engines`), against HBM
  capacity; ``memory_gb_per_gpu`` is that budget, its parts are the bytes themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.costmodel.constants import RUNTIME_RESERVE_GB
from shardlab.costmodel.metrics import BatchMetrics
from shardlab.costmodel.regimes import DegreeArrays, Judgement, Latencies, judge, latencies
from shardlab.costmodel.stage_sums import Stages, fixed_entries, stage_times, stages
from shardlab.costmodel.units import Terms, Units, terms_of
from shardlab.problems.operators import HEAD_OPS, Head
from shardlab.problems.problem import Problem

# Objectives this close (relative) are a tie between concurrencies: the fewest wins.
TIE = 1e-9


@dataclass(frozen=True, kw_only=True)
class Assembled:
    metrics: BatchMetrics
    b_index: np.ndarray  # (n,) column of the slot's tables (its b) at the chosen concurrency
    requests_per_rank: np.ndarray  # (n,) requests per dp rank: the chosen concurrency
    fullest_stage: np.ndarray
    curves: dict[str, np.ndarray]  # every candidate concurrency, flat ("plan": whose)


def _capacity(
    base: np.ndarray,
    kv_full: np.ndarray,
    kv_split: np.ndarray,
    tp: np.ndarray,
    hbm: float,
    top: np.ndarray,
) -> np.ndarray:
    """``(n,)``: the most requests per dp rank (at most ``top``; 0 for none) whose memory
    fits on every stage.

    A stage holding ``c`` requests needs ``base + kv_full c + kv_split q`` with ``q =
    ceil(c / tp)``. Memory grows with ``c``, so each stage fits a prefix of
    concurrencies and the plan fits the shortest. A stage's is found in closed form: the
    most ``q`` whose first concurrency fits, then the most ``c`` of that ``q``. Floating
    point can put that a request off the sum as computed everywhere else, so the answer
    is then moved until the sum itself agrees."""
    tp2 = tp[:, None]
    room = hbm - base
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.floor((room + kv_full * (tp2 - 1)) / (kv_full * tp2 + kv_split))
        in_q = np.where(kv_full > 0, np.floor((room - kv_split * q) / kv_full), q * tp2)
        per_stage = np.where(q >= 1, np.minimum(q * tp2, in_q), 0.0)
        # a stage that holds no cache fits any concurrency, or none
        per_stage = np.where(kv_full + kv_split > 0, per_stage, np.where(room >= 0, np.inf, 0))
    c = np.clip(per_stage.min(axis=1), 0, top).astype(np.int64)

    def fits(c: np.ndarray) -> np.ndarray:
        mem = base + kv_full * c[:, None] + kv_split * (-(-c[:, None] // tp2))
        return (mem <= hbm).all(axis=1)

    while (up := (c < top) & fits(c + 1)).any():
        c = c + up
    while (down := (c >= 1) & ~fits(c)).any():
        c = c - down
    return c


# Memory of a stage a plan does not have: below anything, so it never binds.
NO_STAGE = -1e30


@dataclass(frozen=True, kw_only=True)
class _Candidates:
    """The concurrencies each plan is priced at, flat and plan by plan."""

    plan: np.ndarray  # (C,) plan of each candidate
    requests_per_rank: np.ndarray  # (C,) requests per dp rank
    col: np.ndarray  # (C,) b column of the tables it reads
    first: np.ndarray  # (n,) first candidate of each plan
    need: np.ndarray  # (n,) b columns each plan reads


def _candidates(
    problem: Problem,
    requests_per_rank: np.ndarray | None,
    capacity: np.ndarray,
    pp: np.ndarray,
    max_requests_per_rank: np.ndarray,
    in_flight_per_rank: np.ndarray,
) -> _Candidates:
    """The static schedule runs its batch; a fixed ``requests_per_rank`` runs itself; in flight
    every concurrency the KV cache holds is a candidate (none: one request), and of the
    concurrencies sharing a micro-batch size only the one that can be best, unless a
    TTFT bound or axis tells them apart (their TTFT grows with the requests: the
    closed loop's first wave, :mod:`shardlab.costmodel.regimes`)."""
    n = len(pp)
    if problem.workload.schedule != "inflight":  # the tables have the batch's b only
        c = (
            max_requests_per_rank
            if requests_per_rank is None
            else np.asarray(requests_per_rank, dtype=np.int64)
        )
        return _Candidates(
            plan=np.arange(n), requests_per_rank=c, col=0 * c, first=np.arange(n), need=0 * c + 1
        )
    if requests_per_rank is not None:
        c = np.asarray(requests_per_rank, dtype=np.int64)
        col = -(-c // np.minimum(pp, c)) - 1
        return _Candidates(
            plan=np.arange(n), requests_per_rank=c, col=col, first=np.arange(n), need=col + 1
        )
    top = np.maximum(capacity, 1)  # more than the KV cache holds never fits
    small = np.minimum(pp, top)  # c <= pp: one request per micro-batch (b = 1)
    n_b = -(-top // small)
    w = problem.workload
    # TTFT moves with every request added (the cohorts of the first wave), not only
    # with the micro-batch size: an SLO on it, or a latency it is part of, sees them all
    if w.phase == "request" and (
        w.ttft_ms is not None
        or w.objective == "request_rate"
        or (w.objective == "pareto" and "ttft_ms" in w.latency_axes)
    ):
        first = np.cumsum(top) - top
        plan = np.repeat(np.arange(n), top)
        c = np.arange(int(top.sum())) - first[plan] + 1
        col = -(-c // np.minimum(pp[plan], c)) - 1
        return _Candidates(plan=plan, requests_per_rank=c, col=col, first=first, need=n_b)
    count = small + n_b - 1
    first = np.cumsum(count) - count
    plan = np.repeat(np.arange(n), count)
    k = np.arange(int(count.sum())) - first[plan]
    in_small = k < small[plan]
    # b >= 2 runs pp micro-batches of b: the c sharing a b share every time, so the
    # fewest requests that bring the most in flight stand for them all (latency: the
    # fewest)
    b = k - small[plan] + 2
    lo = (b - 1) * pp[plan] + 1
    hi = np.maximum(np.minimum(b * pp[plan], top[plan]), lo)
    if problem.workload.objective == "latency":
        rep = lo
    else:
        rep = np.clip(in_flight_per_rank[plan], lo, hi)
    c = np.where(in_small, k + 1, rep)
    col = np.where(in_small, 0, b - 1)
    return _Candidates(plan=plan, requests_per_rank=c, col=col, first=first, need=n_b)


def assemble(problem: Problem, u: Units, requests_per_rank: np.ndarray | None = None) -> Assembled:
    """Metrics of the plans ``u`` (any degree tuples) at ``requests_per_rank`` requests per dp rank,
    or, when None, at the concurrency each plan does best with (see the module
    docstring; the static schedule runs its batch)."""
    stack = u.stack
    stack.ensure(u.slot)
    terms = terms_of(problem, u.layout)
    pp = stack.scalar("pp", u.slot).astype(np.int64)
    sr = stages(u, terms, pp)
    rid = _term_rows(u, terms)
    mem = _memory(problem, u, terms, sr, rid, pp)
    replicas = stack.scalar("replicas", u.slot).astype(np.int64)
    dp_attn = stack.scalar("dp_attn", u.slot).astype(np.int64)
    saturated = -(-problem.workload.batch // (replicas * dp_attn))  # per rank, all in flight
    max_requests_per_rank = stack.scalar("max_requests_per_rank", u.slot).astype(np.int64)
    cs = _candidates(problem, requests_per_rank, mem.capacity, pp, max_requests_per_rank, saturated)
    tm = _latencies(problem, u, terms, sr, rid, cs)
    fits = cs.requests_per_rank <= mem.capacity[cs.plan]
    j = judge(problem, tm, fits)
    pick = _pick(cs, j, len(u.slot))
    c = cs.requests_per_rank[pick]
    metrics, fullest = _batch_metrics(problem, mem, tm, j, fits, pick, c)
    gpus = problem.cluster.num_gpus
    curves = {
        "plan": cs.plan,
        "requests_per_rank": cs.requests_per_rank,
        "feasible": j.feasible,
        "throughput_tok_s_per_gpu": tm.throughput / gpus,
        "ttft_ms": tm.ttft_s * 1e3,
        "tpot_ms": tm.tpot_s * 1e3,
    }
    return Assembled(
        metrics=metrics,
        b_index=cs.col[pick],
        requests_per_rank=c,
        fullest_stage=fullest,
        curves=curves,
    )


def _term_rows(u: Units, terms: Terms) -> np.ndarray:
    """``(n, T)``: the table row of every term of every unit of each plan."""
    # gathers by flat index (np.take): several times faster than by two index arrays
    n, n_units, k_ops = u.opts.shape
    flat_opts = u.opts.reshape(n, n_units * k_ops)
    return (
        terms.base
        + np.take(flat_opts, terms.unit * k_ops + terms.ka, axis=1) * terms.ma
        + np.take(flat_opts, terms.unit * k_ops + terms.kb, axis=1) * terms.mb
    )


@dataclass(frozen=True, kw_only=True)
class _Memory:
    """Each plan's memory per GPU, stage by stage (``(n, S)``; stages past pp hold
    :data:`NO_STAGE`): bytes as summed, and as the engine budgets them (charged)."""

    weights: np.ndarray  # weights of each stage
    kv_full: np.ndarray  # KV bytes per request, of caches every tensor-parallel GPU holds
    kv_split: np.ndarray  # per ceil(requests / tp), of caches split over tensor parallelism
    act: np.ndarray  # (n,) the largest activation workspace
    base: np.ndarray  # charged weights and reserve
    kv_full_charged: np.ndarray
    kv_split_charged: np.ndarray
    capacity: np.ndarray  # (n,) the most requests per dp rank that fit
    tp: np.ndarray  # (n,) tensor-parallel degree: splits the split caches

    def charged(self, c: np.ndarray) -> np.ndarray:
        """``(n, S)``: the budget of every stage at ``c`` requests per dp rank."""
        splits = -(-c // self.tp)
        return (
            self.base + self.kv_full_charged * c[:, None] + self.kv_split_charged * splits[:, None]
        )


def _memory(
    problem: Problem, u: Units, terms: Terms, sr: Stages, rid: np.ndarray, pp: np.ndarray
) -> _Memory:
    """Weights, KV cache and workspace of every stage of each plan, and how many
    requests fit (:func:`_capacity`)."""
    stack, slot = u.stack, u.slot
    lay = stack.layout
    n, n_stages = u.starts.shape
    rows = np.arange(n)
    # each b-free array holds a slot's rows in a row of lay.rows entries
    at_op = slot[:, None] * lay.rows + np.take(rid, terms.op_terms, axis=1)
    hrid = lay.head0 + np.arange(len(HEAD_OPS)) * lay.n_opts + u.head  # (n, 4)
    at_head = slot[:, None] * lay.rows + hrid

    def stage_sum(per_op: np.ndarray) -> np.ndarray:
        per_unit = np.add.reduceat(per_op, terms.op_unit_starts, axis=1)
        out = np.zeros((n, n_stages))
        out[sr.plan, sr.stage] = (sr.unit_count * per_unit[sr.plan]).sum(axis=1)
        return out

    split = np.take(stack.kv_split.data, at_op)
    kv = np.take(stack.kv.data, at_op)
    head_w = np.take(stack.weight.data, at_head)
    w_stage = stage_sum(np.take(stack.weight.data, at_op))
    w_stage[rows, 0] += head_w[:, Head.EMBEDDING]
    w_stage[rows, pp - 1] += head_w[:, Head.FINAL_NORM :].sum(axis=1)  # the ends after the layers
    kvf_stage = stage_sum(np.where(split, 0.0, kv))
    kvs_stage = stage_sum(np.where(split, kv, 0.0))
    act = np.maximum(
        np.take(stack.act.data, at_op).max(axis=1), np.take(stack.act.data, at_head).max(axis=1)
    )
    hbm = problem.cluster.accelerator.hbm_gb * 1e9
    # as the engine budgets it (shardlab.costmodel.engines)
    ws, rs, ks = (
        stack.scalar(s, slot)[:, None] for s in ("weight_scale", "reserve_scale", "kv_scale")
    )
    real = np.arange(n_stages)[None, :] < pp[:, None]
    reserve = (RUNTIME_RESERVE_GB * 1e9 + act[:, None]) * rs
    base = np.where(real, w_stage * ws + reserve, NO_STAGE)
    kvf_charged, kvs_charged = kvf_stage * ks, kvs_stage * ks
    tp = stack.scalar("tp", slot).astype(np.int64)
    max_requests_per_rank = stack.scalar("max_requests_per_rank", slot).astype(np.int64)
    return _Memory(
        weights=w_stage,
        kv_full=kvf_stage,
        kv_split=kvs_stage,
        act=act,
        base=base,
        kv_full_charged=kvf_charged,
        kv_split_charged=kvs_charged,
        capacity=_capacity(base, kvf_charged, kvs_charged, tp, hbm, max_requests_per_rank),
        tp=tp,
    )


def _latencies(
    problem: Problem, u: Units, terms: Terms, sr: Stages, rid: np.ndarray, cs: _Candidates
) -> Latencies:
    """Stage times of every step at each candidate's b column, through the regimes."""
    stack, slot = u.stack, u.slot
    cp = cs.plan

    def scalar(name: str) -> np.ndarray:
        return stack.scalar(name, slot).astype(np.int64)

    pp = scalar("pp")
    fixed = fixed_entries(problem, u, terms, sr)
    total, peak, offset, width = stage_times(stack, slot, sr, pp, terms, rid, fixed, cs.need)
    sums, maxes = [], []
    start = offset[cp]
    for step in stack.steps:
        at = start if step.single else start + cs.col
        sums.append(total[at])
        maxes.append(peak[at])
        start = start + (1 if step.single else width[cp])
    degrees = DegreeArrays(
        pp=pp[cp],
        replicas=scalar("replicas")[cp],
        dp_attn=scalar("dp_attn")[cp],
        tp=scalar("tp")[cp],
    )
    return latencies(
        problem,
        degrees,
        stack.steps,
        scalar("per_replica")[cp],
        cs.requests_per_rank,
        sums,
        maxes,
        scalar("max_tokens")[cp],
    )


def _pick(cs: _Candidates, j: Judgement, n: int) -> np.ndarray:
    """Each plan's candidate: the best feasible concurrency; none: one request, the
    nearest to feasible."""
    cp = cs.plan
    if len(cp) == n:
        return np.arange(n)
    score = np.where(j.feasible, j.objective, -np.inf)
    best = np.maximum.reduceat(score, cs.first)[cp]
    # of (near-)ties the fewest requests, whatever the float order of the sums
    near = score >= best - TIE * np.abs(best)
    index = np.arange(len(cp))
    first_near = np.minimum.reduceat(np.where(near, index, len(cp)), cs.first)
    return np.where(np.logical_or.reduceat(j.feasible, cs.first), first_near, cs.first)


def _batch_metrics(
    problem: Problem,
    mem: _Memory,
    tm: Latencies,
    j: Judgement,
    fits: np.ndarray,
    pick: np.ndarray,
    c: np.ndarray,
) -> tuple[BatchMetrics, np.ndarray]:
    """The metrics of each plan at its picked concurrency ``c``, and its fullest stage."""
    n = len(pick)
    rows = np.arange(n)
    splits = -(-c // mem.tp)
    mem_stage = mem.charged(c)
    fullest = mem_stage.argmax(axis=1)
    kv_gb = (mem.kv_full[rows, fullest] * c + mem.kv_split[rows, fullest] * splits) / 1e9
    gpus = problem.cluster.num_gpus
    throughput = tm.throughput[pick]
    metrics = BatchMetrics(
        feasible=j.feasible[pick],
        objective=j.objective[pick],
        ttft_ms=tm.ttft_s[pick] * 1e3,
        tpot_ms=tm.tpot_s[pick] * 1e3,
        latency_ms=tm.latency_s[pick] * 1e3,
        throughput_tok_s=throughput,
        throughput_tok_s_per_gpu=throughput / gpus,
        memory_gb_per_gpu=mem_stage[rows, fullest] / 1e9,
        num_gpus=np.full(n, gpus),
        requests_in_flight=tm.requests_in_flight[pick].astype(np.int64),
        requests_per_rank=c.astype(np.int64),
        capacity_per_rank=mem.capacity,
        weights_gb=mem.weights[rows, fullest] / 1e9,
        kv_cache_gb=kv_gb,
        activations_gb=mem.act / 1e9,
        memory_violation=~fits[pick],
        ttft_violation=j.ttft_violation[pick],
        tpot_violation=j.tpot_violation[pick],
    )
    return metrics, fullest
