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
  and max tokens). A plan that fixes it (``Plan.concurrency``) runs with it; otherwise
  every ``c`` up to what its KV cache holds is priced and the best one under the SLOs
  is kept (none feasible: ``c = 1``, the least memory and, but for bumps in measured
  kernel tables, the least latency). TPOT is the mixed round; TTFT the closed loop's
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
from scipy import sparse

try:  # the kernel behind csr_matrix @ dense (see _sparse_product)
    from scipy.sparse._sparsetools import csr_matvecs as _csr_matvecs
except ImportError:  # pragma: no cover - a scipy that moved it
    _csr_matvecs = None

from shardlab.costmodel.constants import RUNTIME_RESERVE_GB
from shardlab.costmodel.metrics import BatchMetrics
from shardlab.costmodel.regimes import DegreeArrays, Judgement, Latencies, judge, latencies
from shardlab.costmodel.stack import Stack, stack_of
from shardlab.costmodel.units import Terms, Units, terms_of
from shardlab.problems.operators import HEAD_OPS
from shardlab.problems.problem import Problem

# Objectives this close (relative) are a tie between concurrencies: the fewest wins.
TIE = 1e-9


@dataclass(frozen=True, kw_only=True)
class Assembled:
    metrics: BatchMetrics
    b_index: np.ndarray  # (n,) column of the slot's tables (its b) at the chosen concurrency
    per_dp: np.ndarray  # (n,) requests per dp rank: the chosen concurrency
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


# Entries one pass prices (a plan's terms, and its stage rows' units and fixed entries),
# and floats one product of units' sums writes: keeps arrays to tens of MB.
GATHER_CHUNK = 1 << 22

# Batches this small are priced at powers of four columns, larger ones at powers of two.
FEW_PLANS = 512

# Memory of a stage a plan does not have: below anything, so it never binds.
NO_STAGE = -1e30


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``starts[i], starts[i] + 1, .., starts[i] + counts[i] - 1`` for every i, in order."""
    first = np.cumsum(counts) - counts
    return np.repeat(starts - first, counts) + np.arange(int(counts.sum()))


@dataclass(frozen=True, kw_only=True)
class _Stages:
    """Every real stage of a batch of plans, plan by plan (a "stage row" each)."""

    plan: np.ndarray  # (R,) plan of each stage row
    stage: np.ndarray  # (R,) its stage index
    first_row: np.ndarray  # (n,) first stage row of each plan
    unit_count: np.ndarray  # (R, U) layers of each unit in the stage
    pair_count: np.ndarray  # (R, P) residual hops of each unit pair into the stage's layers
    is_first: np.ndarray
    is_last: np.ndarray


def _stages(u: Units, terms: Terms, pp: np.ndarray) -> _Stages:
    n = len(pp)
    first_row = np.cumsum(pp) - pp
    plan = np.repeat(np.arange(n), pp)
    stage = np.arange(len(plan)) - np.repeat(first_row, pp)
    ends, starts = u.ends[plan, stage], u.starts[plan, stage]
    return _Stages(
        plan=plan,
        stage=stage,
        first_row=first_row,
        unit_count=terms.cs_unit[ends] - terms.cs_unit[starts],
        pair_count=terms.cs_pair[ends] - terms.cs_pair[starts],
        is_first=stage == 0,
        is_last=stage == pp[plan] - 1,
    )


def _fixed_entries(
    problem: Problem, u: Units, terms: Terms, sr: _Stages
) -> tuple[np.ndarray, np.ndarray]:
    """``(R, F)`` table rows (before the slot's offset) and weights of what each stage row
    adds besides its units' terms: the residual hops between its layers, the model's
    ends on the first and last stage, the send to the next."""
    lay = stack_of(problem).layout
    o = lay.n_opts
    res = u.opts[:, :, 0]  # (n, U): the residual stream's option ("residual" is op 0)
    h = u.head
    ends_x = np.stack(
        [
            lay.head0 + h[:, 0],  # embedding, then its hop into the first layer
            lay.emb0 + h[:, 0] * o + res[:, terms.first_unit],
            lay.head0 + o + h[:, 1],  # final norm, LM head, sampler and their hops
            lay.head0 + 2 * o + h[:, 2],
            lay.head0 + 3 * o + h[:, 3],
            lay.lastf0 + res[:, terms.last_unit] * o + h[:, 1],
            lay.fnlm0 + h[:, 1] * o + h[:, 2],
            lay.lmsa0 + h[:, 2] * o + h[:, 3],
        ],
        axis=1,
    )
    pair_rid = lay.inter0 + res[:, terms.pair_a] * o + res[:, terms.pair_b]
    # the last stage sends nothing (weight 0): its row index only has to be in range
    last_layer = u.ends[sr.plan, sr.stage] - 1
    hop = np.minimum(sr.stage, max(lay.max_pp - 2, 0))
    p2p_rid = lay.p2p0 + hop * o + res[sr.plan, terms.layer_unit[last_layer]]
    first = sr.is_first[:, None].astype(float)
    last = sr.is_last[:, None].astype(float)
    rid = np.concatenate([pair_rid[sr.plan], ends_x[sr.plan], p2p_rid[:, None]], axis=1)
    weight = np.concatenate(
        [sr.pair_count, np.repeat(first, 2, axis=1), np.repeat(last, 6, axis=1), 1.0 - last],
        axis=1,
    )
    return rid, weight


def _compressed(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compressed rows of a dense ``(rows, columns)`` weight matrix, its zeros dropped:
    (indptr, row, column) of the entries kept, in order."""
    row, col = np.nonzero(weight)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=len(weight)))])
    return indptr, row, col


def _stage_times(
    stack: Stack,
    slot: np.ndarray,
    sr: _Stages,
    pp: np.ndarray,
    terms: Terms,
    rid: np.ndarray,
    fixed: tuple[np.ndarray, np.ndarray],
    need: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sum and maximum over its stages of each plan's stage times, every step side by
    side (:meth:`Stack.columns` of the plan's width, at least ``need`` columns), flat:
    plan ``i``'s columns start at ``offset[i]``. Returns (sum, max, offset, width).

    Plans are priced at a power-of-two (few plans: power-of-four) number of columns
    just above the ones they read, plans of one width together. Each unit's terms are
    summed once per plan (one sparse product of its table rows with the slots' rows);
    a stage row is then its units' sums weighted by their layers in the stage, plus its
    ``fixed`` entries (:func:`_fixed_entries`)."""
    n = len(slot)
    bits = 2 if n <= FEW_PLANS else 1  # few plans: fewer products (each has a fixed cost)
    width = 1 << (bits * np.ceil(np.log2(need) / bits)).astype(np.int64)
    span = np.zeros(n, dtype=np.int64)
    for step in stack.steps:
        span += 1 if step.single else width
    offset = np.cumsum(span) - span
    total = np.empty(int(span.sum()))
    peak = np.empty_like(total)
    # plans by width, and their stage rows in that order: each width's are contiguous
    order = np.argsort(width, kind="stable")
    widths, group_start = np.unique(width[order], return_index=True)
    group_bounds = np.append(group_start, n).tolist()
    row_end = np.cumsum(pp[order])
    rows = _ranges(sr.first_row[order], pp[order])
    row_pos = np.repeat(np.arange(n), pp[order])  # each row's plan, as its place in order
    fixed_rid, fixed_w = fixed[0][rows], fixed[1][rows]
    f_ptr, f_row, f_col = _compressed(fixed_w)
    f_rid, f_w, f_pos = fixed_rid[f_row, f_col], fixed_w[f_row, f_col], row_pos[f_row]
    counts = sr.unit_count[rows]
    c_ptr, c_row, c_unit = _compressed(counts)
    c_w, c_pos = counts[c_row, c_unit], row_pos[c_row]
    n_units, n_terms = len(terms.unit_first), rid.shape[1]
    unit_ptr = np.append(terms.unit_first, n_terms)
    for wb, g0, g1 in zip(widths.tolist(), group_bounds[:-1], group_bounds[1:], strict=True):
        arena, blocks = stack.arena(wb, slot[order[g0:g1]])
        cols = arena.shape[1]
        # plans at a time: keeps their units' sums to tens of MB
        step = max(1, GATHER_CHUNK // (n_units * cols))
        for p0 in range(g0, g1, step):
            p1 = min(p0 + step, g1)
            plans, block = order[p0:p1], blocks[p0 - g0 : p1 - g0]
            # every unit's terms summed, plan by plan: (plans x units, cols)
            k = p1 - p0
            ptr = (np.arange(k)[:, None] * n_terms + unit_ptr[None, :-1]).ravel()
            unit_sum = _sparse_product(
                np.append(ptr, k * n_terms),
                (rid[plans] + block[:, None]).ravel(),
                np.ones(k * n_terms),
                arena,
            )
            r0, r1 = (row_end[p0 - 1] if p0 else 0), row_end[p1 - 1]
            st = np.zeros((r1 - r0, cols))
            e0, e1 = f_ptr[r0], f_ptr[r1]
            whose = f_pos[e0:e1] - p0
            _sparse_product(
                f_ptr[r0 : r1 + 1] - e0, f_rid[e0:e1] + block[whose], f_w[e0:e1], arena, out=st
            )
            e0, e1 = c_ptr[r0], c_ptr[r1]
            at = (c_pos[e0:e1] - p0) * n_units + c_unit[e0:e1]
            _sparse_product(c_ptr[r0 : r1 + 1] - e0, at, c_w[e0:e1], unit_sum, out=st)
            starts = row_end[p0:p1] - pp[plans] - r0
            at = _ranges(offset[plans], np.full(k, cols))
            total[at] = np.add.reduceat(st, starts, axis=0).ravel()
            peak[at] = np.maximum.reduceat(st, starts, axis=0).ravel()
    return total, peak, offset, width


def _sparse_product(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    dense: np.ndarray,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``csr_matrix((data, indices, indptr)) @ dense`` (added to ``out`` when given),
    through the kernel scipy's product calls: a batch of a search is small, and the
    matrix object's checks cost more than the product."""
    rows = len(indptr) - 1
    if out is None:
        out = np.zeros((rows, dense.shape[1]))
    if _csr_matvecs is None:
        mat = sparse.csr_matrix((data, indices, indptr), shape=(rows, len(dense)))
        out += mat @ dense
        return out
    index = indices.astype(np.int32, copy=False) if len(dense) < 2**31 else indices
    _csr_matvecs(rows, len(dense), dense.shape[1], indptr.astype(index.dtype, copy=False), index,
                 data, dense.ravel(), out.ravel())  # fmt: skip
    return out


@dataclass(frozen=True, kw_only=True)
class _Candidates:
    """The concurrencies each plan is priced at, flat and plan by plan."""

    plan: np.ndarray  # (C,) plan of each candidate
    per_dp: np.ndarray  # (C,) requests per dp rank
    col: np.ndarray  # (C,) b column of the tables it reads
    first: np.ndarray  # (n,) first candidate of each plan
    need: np.ndarray  # (n,) b columns each plan reads


def _candidates(
    problem: Problem,
    per_dp: np.ndarray | None,
    capacity: np.ndarray,
    pp: np.ndarray,
    per_dp_max: np.ndarray,
    in_flight_per_rank: np.ndarray,
) -> _Candidates:
    """The static schedule runs its batch; a fixed ``per_dp`` runs itself; in flight
    every concurrency the KV cache holds is a candidate (none: one request), and of the
    concurrencies sharing a micro-batch size only the one that can be best, unless a
    TTFT bound or axis tells them apart (their TTFT grows with the requests: the
    closed loop's first wave, :mod:`shardlab.costmodel.regimes`)."""
    n = len(pp)
    if problem.workload.schedule != "inflight":  # the tables have the batch's b only
        c = per_dp_max if per_dp is None else np.asarray(per_dp, dtype=np.int64)
        return _Candidates(
            plan=np.arange(n), per_dp=c, col=0 * c, first=np.arange(n), need=0 * c + 1
        )
    if per_dp is not None:
        c = np.asarray(per_dp, dtype=np.int64)
        col = -(-c // np.minimum(pp, c)) - 1
        return _Candidates(plan=np.arange(n), per_dp=c, col=col, first=np.arange(n), need=col + 1)
    top = np.maximum(capacity, 1)  # more than the KV cache holds never fits
    small = np.minimum(pp, top)  # c <= pp: one request per micro-batch (b = 1)
    n_b = -(-top // small)
    w = problem.workload
    if w.phase == "request" and (
        w.ttft_ms is not None or (w.objective == "pareto" and "ttft_ms" in w.latency_axes)
    ):
        first = np.cumsum(top) - top
        plan = np.repeat(np.arange(n), top)
        c = np.arange(int(top.sum())) - first[plan] + 1
        col = -(-c // np.minimum(pp[plan], c)) - 1
        return _Candidates(plan=plan, per_dp=c, col=col, first=first, need=n_b)
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
    return _Candidates(plan=plan, per_dp=c, col=col, first=first, need=n_b)


def assemble(problem: Problem, u: Units, per_dp: np.ndarray | None = None) -> Assembled:
    """Metrics of the plans ``u`` (any degree tuples) at ``per_dp`` requests per dp rank,
    or, when None, at the concurrency each plan does best with (see the module
    docstring; the static schedule runs its batch)."""
    stack = u.stack
    stack.ensure(u.slot)
    terms = terms_of(problem, u.layout)
    pp = stack.scalar("pp", u.slot).astype(np.int64)
    sr = _stages(u, terms, pp)
    rid = _term_rows(u, terms)
    mem = _memory(problem, u, terms, sr, rid, pp)
    replicas = stack.scalar("replicas", u.slot).astype(np.int64)
    dp_attn = stack.scalar("dp_attn", u.slot).astype(np.int64)
    saturated = -(-problem.workload.batch // (replicas * dp_attn))  # per rank, all in flight
    per_dp_max = stack.scalar("per_dp_max", u.slot).astype(np.int64)
    cs = _candidates(problem, per_dp, mem.capacity, pp, per_dp_max, saturated)
    tm = _latencies(problem, u, terms, sr, rid, cs)
    fits = cs.per_dp <= mem.capacity[cs.plan]
    j = judge(problem, tm, fits)
    pick = _pick(cs, j, len(u.slot))
    c = cs.per_dp[pick]
    metrics, fullest = _batch_metrics(problem, mem, tm, j, fits, pick, c)
    gpus = problem.cluster.num_gpus
    curves = {
        "plan": cs.plan,
        "per_rank": cs.per_dp,
        "feasible": j.feasible,
        "throughput_tok_s_per_gpu": tm.throughput / gpus,
        "ttft_ms": tm.ttft_s * 1e3,
        "tpot_ms": tm.tpot_s * 1e3,
    }
    return Assembled(
        metrics=metrics, b_index=cs.col[pick], per_dp=c, fullest_stage=fullest, curves=curves
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
    problem: Problem, u: Units, terms: Terms, sr: _Stages, rid: np.ndarray, pp: np.ndarray
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
    w_stage[rows, 0] += head_w[:, 0]
    w_stage[rows, pp - 1] += head_w[:, 1:].sum(axis=1)
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
    per_dp_max = stack.scalar("per_dp_max", slot).astype(np.int64)
    return _Memory(
        weights=w_stage,
        kv_full=kvf_stage,
        kv_split=kvs_stage,
        act=act,
        base=base,
        kv_full_charged=kvf_charged,
        kv_split_charged=kvs_charged,
        capacity=_capacity(base, kvf_charged, kvs_charged, tp, hbm, per_dp_max),
        tp=tp,
    )


def _latencies(
    problem: Problem, u: Units, terms: Terms, sr: _Stages, rid: np.ndarray, cs: _Candidates
) -> Latencies:
    """Stage times of every step at each candidate's b column, through the regimes."""
    stack, slot = u.stack, u.slot
    cp = cs.plan

    def scalar(name: str) -> np.ndarray:
        return stack.scalar(name, slot).astype(np.int64)

    pp = scalar("pp")
    fixed = _fixed_entries(problem, u, terms, sr)
    total, peak, offset, width = _stage_times(stack, slot, sr, pp, terms, rid, fixed, cs.need)
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
        cs.per_dp,
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
        concurrency=tm.concurrency[pick].astype(np.int64),
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
