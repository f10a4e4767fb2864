"""The subproblems and their bounds: every (degrees, requests) pair that may hold a
plan, with an upper bound on its objective and lower bounds on its latencies."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from shardlab.costmodel import (
    IntegerTables,
    basic_times,
    degree_tables,
    integer_tables,
    kv_bytes,
    time_ns,
)
from shardlab.problems.operators import HEAD_OPS
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from shardlab.problems.space import SearchSpace
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


def _layer_kind_times(
    problem: Problem,
    t: IntegerTables,
    ns: dict[str, np.ndarray],
    valid: dict[tuple[str, str], list[int]],
    weights: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The layers' least times, each layer kind at its best joint choice of options
    (:func:`min_sum` over its operators' graph): per step (each at its own best), and
    the regime's weighted sum of steps at one choice for all of them."""
    m = problem.model
    n_steps, n_c = weights.shape
    tied = problem.tie == "kind"
    layer_units = list(zip(m.layer_kinds, m.attention_layers, strict=True))
    per_step = np.zeros((n_steps, n_c))
    joint = np.zeros(n_c)
    inter_min = ns["inter_ns"].reshape(n_steps, -1, n_c).min(axis=1)  # (step, requests_per_rank)
    for ci, cls in enumerate(t.classes):
        kind = cls[0]
        opts = [valid[(kind, n)] for n in op_names(problem.space, kind)]
        count = layer_units.count(cls)
        same = sum(1 for a, b in itertools.pairwise(layer_units) if a == b == cls)
        steps: list[list[tuple[tuple[int, ...], np.ndarray]]] = []
        for st in range(n_steps):
            factors = [((ki,), count * ns["op_ns"][st, ci, ki][o]) for ki, o in enumerate(opts)]
            for e, (src, dst) in enumerate(t.edges[kind]):
                table = ns["edge_ns"][st, ci, e][opts[src]][:, opts[dst]]
                factors.append(((src, dst), count * table))
            if tied:
                res = opts[0]
                factors.append(((0,), same * ns["inter_ns"][st][res, res]))
            steps.append(factors)
        domains = [len(o) for o in opts]
        extra = np.zeros((n_steps, n_c)) if tied else same * inter_min
        for st, factors in enumerate(steps):
            per_step[st] += min_sum(domains, factors) + extra[st]
        mixed = [
            (factors[0][0], sum(w * step[i][1] for w, step in zip(weights, steps, strict=True)))
            for i, factors in enumerate(zip(*steps, strict=True))
        ]
        joint += min_sum(domains, mixed) + (weights * extra).sum(axis=0)
    changes = sum(1 for a, b in itertools.pairwise(layer_units) if a != b)
    inter = changes * inter_min
    return per_step + inter, joint + (weights * inter).sum(axis=0)


def _head_times(
    ns: dict[str, np.ndarray], valid: dict[tuple[str, str], list[int]], n_steps: int, n_c: int
) -> np.ndarray:
    """The model's ends at every joint choice of the head operators' options:
    (step, choice, requests_per_rank)."""
    heads = _combos(tuple(tuple(valid[("head", op.name)]) for op in HEAD_OPS))
    cost = np.zeros((n_steps, len(heads), n_c))
    for ki in range(len(HEAD_OPS)):
        cost += ns["head_ns"][:, ki][:, heads[:, ki]]
    cost += ns["emb_first_ns"][:, heads[:, 0]].min(axis=2)
    cost += ns["last_fnorm_ns"][:, :, heads[:, 1]].min(axis=1)
    cost += ns["fnorm_lm_ns"][:, heads[:, 1], heads[:, 2]]
    cost += ns["lm_sampler_ns"][:, heads[:, 2], heads[:, 3]]
    return cost


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
    per_step, joint = _layer_kind_times(problem, t, ns, valid, weights)
    if pp > 1:  # each stage but the last sends the residual stream on, once
        res = valid[(m.layer_kinds[0], op_names(problem.space, m.layer_kinds[0])[0])]
        per_step = per_step + ns["p2p_ns"][:, : pp - 1][:, :, res].min(axis=2).sum(axis=1)
    cost = _head_times(ns, valid, n_steps, n_c)
    per_step += cost.min(axis=1)
    joint += (weights[:, None, :] * cost).sum(axis=0).min(axis=0)
    sums = list(per_step)
    # every coefficient of a form is nonnegative: the forms at the least times bound
    rnd, prompt = basic_times(
        f, np.minimum(pp, requests_per_rank), sums, [x / pp for x in sums], np.maximum
    )
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


# Concurrencies bounded in one numpy pass: keeps the tables of a pass to tens of MB,
# and is how often the enumeration reads the clock inside one degree tuple.
BOUND_CHUNK = 256


def subproblems(
    problem: Problem, check: Callable[[], None] = lambda: None
) -> tuple[list[Subproblem], int]:
    """Subproblems that may hold a plan, best bound first; and how many were discarded
    (no plan fits the memory, every plan holds more requests, or the SLOs are out of
    reach even at the time bound).

    ``check`` is called between chunks of the work (the solver's clock); it may raise
    to stop the enumeration.
    """
    space = problem.space
    out: list[Subproblem] = []
    discarded = 0
    for di, d in enumerate(space.degree_tuples):
        check()
        bt = degree_tables(problem, d).request_range
        top = bt.max_requests_per_rank
        cs = np.arange(1, top + 1) if bt.inflight else np.array([top])
        t = integer_tables(problem, d, top)
        valid = valid_options(space, di)
        mem_low = _memory_low(problem, d, valid, t, cs)
        fits = mem_low <= t.hbm_bytes
        discarded += int((~fits).sum())
        kept = cs[fits][::-1]
        for start in range(0, len(kept), BOUND_CHUNK):
            chunk = kept[start : start + BOUND_CHUNK]
            check()
            time_low, ttft_low, tpot_low = _time_bounds(problem, d, t, chunk, valid)
            miss = np.broadcast_to(_misses_slo(problem, ttft_low, tpot_low), chunk.shape)
            discarded += int(miss.sum())
            bounds = objectives(problem, d, chunk, time_low)
            ttft = np.broadcast_to(np.nan if ttft_low is None else ttft_low, chunk.shape)
            tpot = np.broadcast_to(np.nan if tpot_low is None else tpot_low, chunk.shape)
            out += [
                Subproblem(
                    degree_index=di,
                    requests_per_rank=int(c),
                    bound=float(bound),
                    ttft_low=_finite(a),
                    tpot_low=_finite(b),
                )
                for c, bound, a, b in zip(
                    chunk[~miss], bounds[~miss], ttft[~miss], tpot[~miss], strict=True
                )
            ]
    out.sort(key=lambda s: (-s.bound, s.degree_index, -s.requests_per_rank))
    return out, discarded


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


# -- the model of one subproblem ----------------------------------------------------------
