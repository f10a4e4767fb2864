"""The subproblems and their bounds: every (degrees, requests) pair that may hold a
plan, with an upper bound on its objective and lower bounds on its latencies."""

from __future__ import annotations

import itertools
import math
import multiprocessing as mp
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from shardlab.costmodel import (
    IntegerTables,
    basic_times,
    degree_tables,
    integer_tables,
    kv_bytes,
    time_ns,
)
from shardlab.problems.model import Model
from shardlab.problems.operators import HEAD_OPS, LAST_STAGE_HEADS, Head
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from shardlab.problems.space import SearchSpace, balanced_boundaries, max_shift
from shardlab.solvers.cpsat.forms import bound_forms, objectives, step_weights
from shardlab.solvers.cpsat.minsum import min_sum

ROUNDING = 1e-5  # relative: bounds within this of the incumbent are still solved


def cutoff(best: float) -> float:
    """The bounds that cannot beat ``best`` are at most this (within the tables'
    rounding); -inf while there is no best."""
    return best + ROUNDING * abs(best) if math.isfinite(best) else -math.inf


@dataclass(frozen=True, kw_only=True)
class Subproblem:
    degree_index: int
    requests_per_rank: int
    bound: float  # upper bound on the objective of any plan in it
    # lower bounds on its plans' TTFT and TPOT in ns (None: not a latency of the workload)
    ttft_low: float | None = None
    tpot_low: float | None = None


@lru_cache(maxsize=64)
def _slots_by_op(space: SearchSpace) -> tuple[tuple[tuple[str, str], np.ndarray, int], ...]:
    """The option variables of each (layer kind or 'head', operator), and its options."""
    slots: dict[tuple[str, str], list[int]] = {}
    width: dict[tuple[str, str], int] = {}
    for v, g, op in space.option_slots():
        slots.setdefault((g.kind, op.name), []).append(v)
        width[(g.kind, op.name)] = len(op.options)
    return tuple((key, np.array(vs), width[key]) for key, vs in slots.items())


def valid_options(space: SearchSpace, di: int) -> dict[tuple[str, str], list[int]]:
    """Option indices valid under degree tuple ``di`` somewhere in the model, per
    (layer kind or 'head', operator): the space's masks, so an engine space's too."""
    mask = space.mask(di)
    return {
        key: np.flatnonzero(mask[vs, :n].any(axis=0)).tolist() for key, vs, n in _slots_by_op(space)
    }


def _memory_low(
    problem: Problem,
    d: Degrees,
    valid: dict[tuple[str, str], list[int]],
    t: IntegerTables,
    requests_per_rank: np.ndarray,
) -> np.ndarray:
    """The least memory of the fullest stage over every plan, for each value of
    ``requests_per_rank``: an equal share of the least memory. ``t`` gives what does not depend on
    the requests; ``valid`` the options the degree tuple allows (:func:`valid_options`)."""
    m = problem.model
    kv = kv_bytes(problem, d, requests_per_rank)  # (cls, op, opt, requests_per_rank)
    mem_low = np.zeros(len(requests_per_rank))
    act_low = 0.0
    for ci, (kind, _) in enumerate(t.classes):
        count = sum(
            1
            for k, w in zip(m.layer_kinds, m.attention_layers, strict=True)
            if (k, w) == t.classes[ci]
        )
        for ki, name in enumerate(op_names(problem.space, kind)):
            opts = valid[(kind, name)]
            mem = t.weight_bytes[ci, ki, opts][:, None] + kv[ci, ki, opts]
            mem_low += count * mem.min(axis=0)
            act_low = max(act_low, float(t.act_bytes[ci, ki, opts].min()))
    for ki, op in enumerate(HEAD_OPS):
        opts = valid[("head", op.name)]
        mem_low += float(t.head_weight_bytes[ki, opts].min())
        act_low = max(act_low, float(t.head_act_bytes[ki, opts].min()))
    return mem_low / d.pp + act_low + t.reserve_bytes


@lru_cache(maxsize=4096)
def _combos(lists: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """Every joint choice of options, one row per combination."""
    return np.array(list(itertools.product(*lists)), dtype=np.int64).reshape(-1, len(lists))


@lru_cache(maxsize=64)
def _class_runs(m: Model) -> dict[Any, tuple[int, int]]:
    """Per layer class: its layers, and the consecutive pairs of them; under None, the
    consecutive pairs of different classes."""
    units = list(zip(m.layer_kinds, m.attention_layers, strict=True))
    pairs = list(itertools.pairwise(units))
    runs: dict[Any, tuple[int, int]] = {
        cls: (units.count(cls), sum(1 for a, b in pairs if a == b == cls)) for cls in set(units)
    }
    runs[None] = (0, sum(1 for a, b in pairs if a != b))
    return runs


def _layer_kind_times(
    problem: Problem,
    t: IntegerTables,
    ns: dict[str, np.ndarray],
    valid: dict[tuple[str, str], list[int]],
    weights: np.ndarray,
    stages: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The layers' least times, each layer kind at its best joint choice of options
    (:func:`min_sum` over its operators' graph): per step (each at its own best), and
    the regime's weighted sum of steps at one choice for all of them; and one layer's
    least time per step and class, the residual between layers left out (for the
    stages, :func:`_stage_floor`)."""
    m = problem.model
    n_steps, n_c = weights.shape
    tied = problem.tie == "kind"
    runs = _class_runs(m)
    per_step = np.zeros((n_steps, n_c))
    joint = np.zeros(n_c)
    one_layer = np.zeros((n_steps, len(t.classes), n_c))
    inter_min = ns["inter_ns"].reshape(n_steps, -1, n_c).min(axis=1)  # (step, requests_per_rank)
    for ci, cls in enumerate(t.classes):
        kind = cls[0]
        opts = [valid[(kind, n)] for n in op_names(problem.space, kind)]
        count, same = runs[cls]
        # every factor's table per step, the regime's weighted sum of them, and (for
        # the stages) one layer's, stacked on the instance axis: one elimination in all
        factors: list[tuple[tuple[int, ...], np.ndarray]] = []
        for ki, o in enumerate(opts):
            factors.append(((ki,), count * ns["op_ns"][:, ci, ki][:, o]))
        for e, (src, dst) in enumerate(t.edges[kind]):
            table = ns["edge_ns"][:, ci, e][:, opts[src]][:, :, opts[dst]]
            factors.append(((src, dst), count * table))
        alone = len(factors)  # the residual between layers is left out of one layer's
        if tied:
            res = opts[0]
            factors.append(((0,), same * ns["inter_ns"][:, res, res]))
        stacked = []
        for i, (vs, table) in enumerate(factors):  # table: (step, *options, c)
            per = [table[st] for st in range(n_steps)]
            mixed = sum(w * x for w, x in zip(weights, per, strict=True))
            parts = [*per, mixed]
            if stages > 1:
                parts += [x / count if i < alone else np.zeros_like(x) for x in per]
            stacked.append((vs, np.concatenate(parts, axis=-1)))
        least = min_sum([len(o) for o in opts], stacked).reshape(-1, n_c)
        extra = np.zeros((n_steps, n_c)) if tied else same * inter_min
        per_step += least[:n_steps] + extra
        joint += least[n_steps] + (weights * extra).sum(axis=0)
        if stages > 1:
            one_layer[:, ci] = least[n_steps + 1 :]
    inter = runs[None][1] * inter_min
    return per_step + inter, joint + (weights * inter).sum(axis=0), one_layer


def _head_times(
    ns: dict[str, np.ndarray], heads: np.ndarray, n_steps: int, n_c: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The model's ends at every joint choice ``heads`` of the head operators' options,
    each (step, choice, requests_per_rank): in all, and the parts the first stage (the
    embedding) and the last stage (the final norm, the LM head, the sampler) run."""
    emb, fnorm, lm, sampler = (heads[:, h] for h in Head)
    first = ns["head_ns"][:, Head.EMBEDDING][:, emb] + ns["emb_first_ns"][:, emb].min(axis=2)
    last = np.zeros((n_steps, len(heads), n_c))
    for h in LAST_STAGE_HEADS:
        last += ns["head_ns"][:, h][:, heads[:, h]]
    last += ns["last_fnorm_ns"][:, :, fnorm].min(axis=1)
    last += ns["fnorm_lm_ns"][:, fnorm, lm]
    last += ns["lm_sampler_ns"][:, lm, sampler]
    return first + last, first, last


def _stage_floor(
    layer_low: np.ndarray,
    first_low: np.ndarray,
    last_low: np.ndarray,
    sends: np.ndarray,
    pp: int,
) -> np.ndarray:
    """A lower bound on the slowest stage's time per (step, requests_per_rank): the
    least, over the space's partitions, of the slowest stage when every layer takes its
    least time (``layer_low``: step, layer, requests_per_rank), the first stage the
    embedding's, the last the head's and each other its send's. Layers are whole: with
    the head the size of a layer or more (a 128k vocabulary), equal shares of the sum
    undercount the slowest stage by most of the head. Dynamic programming over the
    boundaries, each within the space's shift of the balanced one."""
    n_steps, n_layers, n_c = layer_low.shape
    prefix = np.concatenate([np.zeros((n_steps, 1, n_c)), np.cumsum(layer_low, axis=1)], axis=1)
    shift = max_shift(n_layers, pp)
    starts = [np.arange(b - shift, b + shift + 1) for b in balanced_boundaries(n_layers, pp)]
    # best[:, i]: the least slowest stage so far, stage j - 1 ending at starts[j - 1][i]
    best = prefix[:, starts[0]] + first_low[:, None] + sends[:, 0][:, None]
    for j in range(1, pp - 1):
        span = prefix[:, starts[j]][:, None] - prefix[:, starts[j - 1]][:, :, None]
        stage = np.maximum(best[:, :, None], span + sends[:, j][:, None, None])
        stage = np.where(
            (starts[j][None] > starts[j - 1][:, None])[None, :, :, None], stage, np.inf
        )
        best = stage.min(axis=1)
    tail = prefix[:, -1][:, None] - prefix[:, starts[-1]] + last_low[:, None]
    return np.maximum(best, tail).min(axis=1)


def _time_bounds(
    problem: Problem,
    d: Degrees,
    t: IntegerTables,
    requests_per_rank: np.ndarray,
    valid: dict[tuple[str, str], list[int]],
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Lower bounds on (the time to minimize, TTFT, TPOT) of any plan, for each value of
    ``requests_per_rank``: each layer kind (and the model's ends) at its best joint choice of
    options, ignoring memory and the pipeline's balance, plus the least send between
    stages at each boundary. A layer kind's best joint choice is a least sum over its
    operators' graph (:func:`min_sum`), per step and for the regime's weighted sum of
    steps."""
    m = problem.model
    n_steps, n_c, pp = len(t.steps), len(requests_per_rank), d.pp
    f = bound_forms(problem, d, requests_per_rank)
    objective = f.time(problem.workload.objective)
    listed, const = step_weights(f, objective, n_steps)
    weights = np.array([np.broadcast_to(w, (n_c,)) for w in listed], dtype=float)
    ns = time_ns(problem, d, requests_per_rank)  # each table: (step, ..., requests_per_rank)
    per_step, joint, one_layer = _layer_kind_times(problem, t, ns, valid, weights, pp)
    sends = np.zeros((n_steps, 0, n_c))
    if pp > 1:  # each stage but the last sends the residual stream on, once
        res = valid[(m.layer_kinds[0], op_names(problem.space, m.layer_kinds[0])[0])]
        sends = ns["p2p_ns"][:, : pp - 1][:, :, res].min(axis=2)
        per_step = per_step + sends.sum(axis=1)
    heads = _combos(tuple(tuple(valid[("head", op.name)]) for op in HEAD_OPS))
    cost, first, last = _head_times(ns, heads, n_steps, n_c)
    per_step += cost.min(axis=1)
    joint += (weights[:, None, :] * cost).sum(axis=0).min(axis=0)
    sums = list(per_step)
    maxes = [x / pp for x in sums]
    if pp > 1:
        classes = {c: i for i, c in enumerate(t.classes)}
        layer = [classes[c] for c in zip(m.layer_kinds, m.attention_layers, strict=True)]
        floor = _stage_floor(one_layer[:, layer], first.min(axis=1), last.min(axis=1), sends, pp)
        maxes = [np.maximum(a, b) for a, b in zip(maxes, floor, strict=True)]
    # every coefficient of a form is nonnegative: the forms at the least times bound
    rnd, prompt = basic_times(f, np.minimum(pp, requests_per_rank), sums, maxes, np.maximum)
    time_low = objective.at(rnd, prompt)
    ttft = None if f.ttft is None else f.ttft.at(rnd, prompt)
    tpot = None if f.tpot is None else f.tpot.at(rnd, prompt)
    if pp == 1:  # one stage: the time is linear in the steps, the joint bound is tighter
        time_low = np.maximum(time_low, joint + const)
    return np.asarray(time_low, dtype=float), ttft, tpot


def op_names(space: SearchSpace, kind: str) -> list[str]:
    for g in space.groups:
        if g.kind == kind:
            return [op.name for op in g.ops]
    raise KeyError(kind)


def _misses_slo(
    problem: Problem, ttft_ns: np.ndarray | None, tpot_ns: np.ndarray | None
) -> np.ndarray | bool:
    w = problem.workload
    miss: np.ndarray | bool = False
    if w.ttft_ms is not None and ttft_ns is not None:
        miss = miss | (np.asarray(ttft_ns) > w.ttft_ms * 1e6)
    if w.tpot_ms is not None and tpot_ns is not None:
        miss = miss | (np.asarray(tpot_ns) > w.tpot_ms * 1e6)
    return miss


# The problems bounded last, with each degree tuple's bounds (rows of requests per rank,
# bound, TTFT low, TPOT low) and how many it discarded: a problem bounded again (a
# sizing's instance, bounded for its ceiling, then solved) reads them here. Problems
# are frozen values: an equal problem has equal bounds. A few MB each at most.
_BOUNDED: OrderedDict[Problem, list[tuple[np.ndarray, int]]] = OrderedDict()
_BOUNDED_KEPT = 32


# Concurrencies bounded in one numpy pass: keeps the tables of a pass to tens of MB,
# and is how often the enumeration reads the clock inside one degree tuple. A pass
# costs as much in Python as in numpy below a thousand or so: DeepSeek-V3's decode on
# 8 B300 (up to thousands of requests per rank) is bounded in 1.8 s in passes of 1,024,
# 3.2-3.9 s in passes of 256.
BOUND_CHUNK = 1024


# Degree tuples from which the bounds are spread over worker processes: below it,
# forking costs more than it saves.
PARALLEL_FROM = 24


def subproblems(
    problem: Problem, check: Callable[[], None] = lambda: None, workers: int = 1
) -> tuple[list[Subproblem], int]:
    """Subproblems that may hold a plan, best bound first; and how many were discarded
    (no plan fits the memory, every plan holds more requests, or the SLOs are out of
    reach even at the time bound).

    ``check`` is called between chunks of the work (the solver's clock); it may raise
    to stop the enumeration. With ``workers`` > 1 the degree tuples are bounded in
    that many forked processes (the tables and bounds are pure Python-heavy numpy:
    threads would share one core); the answer is the same.
    """
    rows = _rows(problem, check, workers)
    out = [
        Subproblem(
            degree_index=di,
            requests_per_rank=int(c),
            bound=float(bound),
            ttft_low=_finite(a),
            tpot_low=_finite(b),
        )
        for di, (kept, _) in enumerate(rows)
        for c, bound, a, b in kept.tolist()
    ]
    out.sort(key=lambda s: (-s.bound, s.degree_index, -s.requests_per_rank))
    return out, sum(discarded for _, discarded in rows)


def largest_bound(
    problem: Problem, check: Callable[[], None] = lambda: None, workers: int = 1
) -> float:
    """The bound of :func:`subproblems`' first (-inf: none may hold a plan), without
    building them; the bounds are kept for a solve of the same problem that may follow
    (a sizing bounds an instance before it decides to solve it)."""
    tops = [float(kept[:, 1].max()) for kept, _ in _rows(problem, check, workers) if len(kept)]
    return max(tops, default=-math.inf)


def _rows(
    problem: Problem, check: Callable[[], None], workers: int
) -> list[tuple[np.ndarray, int]]:
    """:func:`_bound_degrees` of every degree tuple, in ``workers`` forked processes
    when there are enough of them; those of a problem bounded lately are read back."""
    check()
    if (kept := _BOUNDED.get(problem)) is not None:
        _BOUNDED.move_to_end(problem)
        return kept
    n = len(problem.space.degree_tuples)
    if workers > 1 and n >= PARALLEL_FROM and "fork" in mp.get_all_start_methods():
        rows = _bound_in_processes(problem, check, workers)
    else:
        rows = [_bound_degrees(problem, di, check) for di in range(n)]
    _BOUNDED[problem] = rows
    if len(_BOUNDED) > _BOUNDED_KEPT:
        _BOUNDED.popitem(last=False)
    return rows


def _bound_degrees(
    problem: Problem, di: int, check: Callable[[], None] = lambda: None
) -> tuple[np.ndarray, int]:
    """The subproblems of degree tuple ``di`` that may hold a plan, as rows of
    (requests per rank, bound, TTFT low, TPOT low), and how many were discarded."""
    space = problem.space
    d = space.degree_tuples[di]
    check()
    bt = degree_tables(problem, d).request_range
    top = bt.max_requests_per_rank
    cs = np.arange(1, top + 1) if bt.inflight else np.array([top])
    t = integer_tables(problem, d, top)
    valid = valid_options(space, di)
    mem_low = _memory_low(problem, d, valid, t, cs)
    fits = mem_low <= t.hbm_bytes
    discarded = int((~fits).sum())
    kept = cs[fits][::-1]
    rows = [np.zeros((0, 4))]
    for start in range(0, len(kept), BOUND_CHUNK):
        chunk = kept[start : start + BOUND_CHUNK]
        check()
        time_low, ttft_low, tpot_low = _time_bounds(problem, d, t, chunk, valid)
        miss = np.broadcast_to(_misses_slo(problem, ttft_low, tpot_low), chunk.shape)
        discarded += int(miss.sum())
        bounds = objectives(problem, d, chunk, time_low)
        ttft = np.broadcast_to(np.nan if ttft_low is None else ttft_low, chunk.shape)
        tpot = np.broadcast_to(np.nan if tpot_low is None else tpot_low, chunk.shape)
        rows.append(np.stack([chunk, bounds, ttft, tpot], axis=1)[~miss])
    return np.concatenate(rows), discarded


_FORKED: Problem | None = None  # the problem forked workers bound (inherited, not pickled)


def _bound_forked(di: int) -> tuple[np.ndarray, int]:
    assert _FORKED is not None
    return _bound_degrees(_FORKED, di)


def _bound_in_processes(
    problem: Problem, check: Callable[[], None], workers: int
) -> list[tuple[np.ndarray, int]]:
    """:func:`_bound_degrees` of every degree tuple in ``workers`` forked processes;
    ``check`` runs while waiting, and what it raises stops the workers."""
    global _FORKED
    _FORKED = problem
    pool = mp.get_context("fork").Pool(workers)
    try:
        pending = [
            pool.apply_async(_bound_forked, (di,)) for di in range(len(problem.space.degree_tuples))
        ]
        rows = []
        for result in pending:
            while not result.ready():
                check()
                result.wait(0.05)
            rows.append(result.get())
        pool.close()
        return rows
    finally:
        pool.terminate()
        pool.join()
        _FORKED = None


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


# -- the model of one subproblem ----------------------------------------------------------
