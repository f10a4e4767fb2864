"""The fastest plan with options per layer, exactly, by dynamic programming.

With one pipeline stage a subproblem's time (the regime's weighted sum of its steps,
:mod:`shardlab.solvers.cpsat`) is a sum over the layers of each layer's operators and
edges, plus the residual stream's hop from each layer to the next, plus the model's
ends. Layers interact only through that hop, so the choice along the layers is a
shortest path whose state is the residual stream's option: a layer's cost for each
residual option is the least sum over its other operators (variable elimination,
:func:`~shardlab.solvers.cpsat.minsum.argmin_sum`), and the path runs through the layers
in order. What it ignores (memory, the SLOs) is checked afterwards: when the fastest
plan also fits and meets them it is the subproblem's optimum, proven, without a CP-SAT
model of hundreds of layers.

With a pipeline (:func:`pipeline_plan`) each stage is such a path, once the partition
and the residual option at each stage boundary are fixed; every partition the space
allows and every boundary option are compared. When the fastest one-stage plan does
not fit, :func:`memory_bound` prices memory into the path (a Lagrangian bound): no plan
that fits is faster, and a subproblem whose bound cannot beat the best plan is pruned.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardlab.costmodel import IntegerTables
from shardlab.problems.operators import HEAD_OPS, LAST_STAGE_HEADS, Head, layer_ops
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.problems.space import balanced_boundaries, max_shift
from shardlab.solvers.cpsat.minsum import Factor, argmin_sum


def _layer_factors(
    t: IntegerTables, weighted: dict[str, np.ndarray], ci: int, opts: list[list[int]]
) -> list[Factor]:
    """The factors of one layer of class ``ci`` over its operators' valid options."""
    kind = t.classes[ci][0]
    factors: list[Factor] = [((k,), weighted["op"][ci, k, o]) for k, o in enumerate(opts)]
    for e, (src, dst) in enumerate(t.edges[kind]):
        factors.append(((src, dst), weighted["edge"][ci, e][np.ix_(opts[src], opts[dst])]))
    return factors


@dataclass(frozen=True, kw_only=True)
class _Layers:
    """A degree tuple's layers under weighted tables, reduced to the residual stream:
    each layer's least cost per residual option (its other operators eliminated), the
    hop between consecutive layers' residual options, and the model's two ends."""

    res: list[int]  # the residual stream's options (indices into its operator's)
    layer_class: list[int]
    best: dict[tuple[int, int], tuple[int, list[int]]]  # (class, residual) -> cost, options
    layer_cost: np.ndarray  # (layers, residual)
    inter: np.ndarray  # (residual of layer l - 1, residual of layer l)
    heads: list[list[int]]  # valid options of each head operator
    tail_cost: np.ndarray  # (residual of the last layer,): the output end's least cost
    tail_pick: list[tuple[int, int, int]]  # its head options (final norm, LM head, sampler)


def _layers(
    problem: Problem,
    t: IntegerTables,
    w: dict[str, np.ndarray],
    valid: dict[tuple[str, str], list[int]],
) -> _Layers | None:
    """None: layer kinds whose residual streams allow different options."""
    m = problem.model
    classes = {c: i for i, c in enumerate(t.classes)}
    layer_class = [classes[c] for c in zip(m.layer_kinds, m.attention_layers, strict=True)]
    # the residual stream's options ("residual" is every kind's first operator)
    per_kind = {tuple(valid[(k, layer_ops(m, k)[0].name)]) for k in m.kinds}
    if len(per_kind) != 1:
        return None
    res = list(per_kind.pop())
    best: dict[tuple[int, int], tuple[int, list[int]]] = {}
    for ci in set(layer_class):
        kind = t.classes[ci][0]
        opts = [valid[(kind, op.name)] for op in layer_ops(m, kind)]
        base = _layer_factors(t, w, ci, opts)
        for j in range(len(res)):
            pin = np.full(len(res), np.iinfo(np.int64).max // 4, dtype=np.int64)
            pin[j] = 0
            cost, choice = argmin_sum([len(o) for o in opts], [*base, ((0,), pin)])
            best[(ci, j)] = (cost, [o[x] for o, x in zip(opts, choice, strict=True)])
    layer_cost = np.array([[best[(ci, j)][0] for j in range(len(res))] for ci in layer_class])
    heads = [valid[("head", op.name)] for op in HEAD_OPS]
    # the output end for each residual option of the last layer: its best head options
    tail_cost = np.full(len(res), np.iinfo(np.int64).max, dtype=np.int64)
    tail_pick: list[tuple[int, int, int]] = [(0, 0, 0)] * len(res)
    for fnorm, lm, sampler in itertools.product(*(heads[h] for h in LAST_STAGE_HEADS)):
        fixed = (
            w["head"][Head.FINAL_NORM, fnorm] + w["head"][Head.LM_HEAD, lm]
            + w["head"][Head.SAMPLER, sampler]
            + w["fnorm_lm"][fnorm, lm] + w["lm_sampler"][lm, sampler]
        )  # fmt: skip
        cost = fixed + w["last_fnorm"][res, fnorm]
        better = cost < tail_cost
        tail_cost = np.where(better, cost, tail_cost)
        pick = (fnorm, lm, sampler)
        tail_pick = [p if not b else pick for p, b in zip(tail_pick, better, strict=True)]
    return _Layers(
        res=res,
        layer_class=layer_class,
        best=best,
        layer_cost=layer_cost,
        inter=w["inter"][np.ix_(res, res)],
        heads=heads,
        tail_cost=tail_cost,
        tail_pick=tail_pick,
    )


def _weighted(t: IntegerTables, weights: np.ndarray) -> dict[str, np.ndarray]:
    def weigh(name: str) -> np.ndarray:
        return np.tensordot(weights, getattr(t, name), axes=1).astype(np.int64)

    names = ("op", "edge", "inter", "head", "emb_first", "last_fnorm", "fnorm_lm", "lm_sampler")
    return {name: weigh(f"{name}_ns") for name in names} | {"p2p": weigh("p2p_ns")}


def _plan(
    problem: Problem,
    t: IntegerTables,
    ly: _Layers,
    stage_layers: tuple[int, ...],
    path: list[int],
    h0: int,
    requests_per_rank: int | None,
) -> Plan:
    """The plan of residual options ``path`` (one per layer), each layer's other
    operators at their best for it, the embedding at ``h0`` and the output end at its
    best for the last layer."""
    m = problem.model
    layer_options = []
    for layer, j in enumerate(path):
        kind = m.layer_kinds[layer]
        chosen = ly.best[(ly.layer_class[layer], j)][1]
        layer_options.append(
            tuple(op.options[o].name for op, o in zip(layer_ops(m, kind), chosen, strict=True))
        )
    head = (h0, *ly.tail_pick[path[-1]])
    return Plan(
        degrees=t.degrees,
        stage_layers=stage_layers,
        layer_options=tuple(layer_options),
        head_options=tuple(op.options[o].name for op, o in zip(HEAD_OPS, head, strict=True)),
        requests_per_rank=requests_per_rank,
    )


def chain_plan(
    problem: Problem,
    t: IntegerTables,
    weights: np.ndarray,
    valid: dict[tuple[str, str], list[int]],
    requests_per_rank: int | None,
) -> tuple[Plan, int] | None:
    """The one-stage plan of least weighted time under ``t`` (degrees with pp = 1), and
    that time in ns (None: layer kinds whose residual streams differ, not a chain of
    one state). ``weights`` weigh the steps; ``valid`` holds the options the degrees
    allow per (layer kind or 'head', operator)."""
    assert t.degrees.pp == 1
    return _one_stage(problem, t, _weighted(t, weights), valid, requests_per_rank)


def _one_stage(
    problem: Problem,
    t: IntegerTables,
    w: dict[str, np.ndarray],
    valid: dict[tuple[str, str], list[int]],
    requests_per_rank: int | None,
) -> tuple[Plan, int] | None:
    """:func:`chain_plan` under the weighted tables ``w``."""
    m = problem.model
    ly = _layers(problem, t, w, valid)
    if ly is None:
        return None
    entry, entry_pick = _input_end(w, ly)
    at_end, back = _stage_paths(ly, entry[None, :], 0, [m.num_layers], ly.tail_cost)
    final = at_end[m.num_layers][0]
    last = int(final.argmin())
    path = _trace(back, 0, last, m.num_layers)
    plan = _plan(problem, t, ly, (m.num_layers,), path, entry_pick[path[0]], requests_per_rank)
    return plan, int(final[last])


def _input_end(w: dict[str, np.ndarray], ly: _Layers) -> tuple[np.ndarray, list[int]]:
    """For each residual option of layer 0: the input end's least cost (embedding and
    its hop into the layer), and the embedding option reaching it."""
    embeddings = ly.heads[Head.EMBEDDING]
    costs = np.stack([w["head"][Head.EMBEDDING, e] + w["emb_first"][e, ly.res] for e in embeddings])
    return costs.min(axis=0), [embeddings[i] for i in costs.argmin(axis=0)]


def _stage_paths(
    ly: _Layers, entry: np.ndarray, start: int, ends: list[int], exit_cost: np.ndarray
) -> tuple[dict[int, np.ndarray], list[np.ndarray]]:
    """Shortest paths through layers ``start`` .. ``end - 1`` for every ``end`` in
    ``ends``: ``entry`` (entering state, residual option of layer ``start``) is the cost
    of entering, ``exit_cost`` (residual option of the last layer) that of leaving.
    Returns each end's (entering state, last option) costs, and back pointers (per
    layer after ``start``: (entering state, option) -> the previous layer's option)."""
    value = entry + ly.layer_cost[start]
    back: list[np.ndarray] = []
    at_end: dict[int, np.ndarray] = {}
    for layer in range(start, max(ends)):
        if layer > start:
            through = value[:, :, None] + ly.inter[None]  # (in, previous, this)
            back.append(through.argmin(axis=1))
            value = through.min(axis=1) + ly.layer_cost[layer]
        if layer + 1 in ends:
            at_end[layer + 1] = value + exit_cost[None, :]
    return at_end, back


def _trace(back: list[np.ndarray], enter: int, last: int, layers: int) -> list[int]:
    """The residual options of a stage of ``layers`` layers ending on ``last``, from
    :func:`_stage_paths`'s back pointers."""
    path = [last]
    for pointers in reversed(back[: layers - 1]):
        path.append(int(pointers[enter, path[-1]]))
    return path[::-1]


# Memory prices (ns per byte) the memory bound tries, relative to the fastest plan's
# time over the memory there is: a grid, then a golden-section search around its best.
PRICE_GRID = np.geomspace(1e-3, 1e2, 16)
PRICE_REFINE = 12


def memory_bound(
    problem: Problem,
    t: IntegerTables,
    weights: np.ndarray,
    valid: dict[tuple[str, str], list[int]],
) -> float | None:
    """A lower bound (ns) on the weighted time of every one-stage plan under ``t`` whose
    memory fits (None: not a chain, as :func:`chain_plan`).

    Memory is a sum over the options (weights, KV cache, the head's weights; plus the
    workspace, at least 0, and the reserve), so pricing it at ``p`` ns per byte gives
    the Lagrangian bound ``min over plans of (time + p memory) - p room``: no plan that
    fits is faster, whatever ``p`` (rounding the prices down keeps it a bound). Each
    ``p`` costs one shortest path; the best found is returned."""
    room = t.hbm_bytes - t.reserve_bytes
    w = _weighted(t, weights)
    fastest = _one_stage(problem, t, w, valid, None)
    if fastest is None:
        return None
    scale = max(fastest[1], 1) / room
    memory = t.weight_bytes + t.kv_bytes

    def bound(log_price: float) -> float:
        p = scale * math.exp(log_price)
        priced = w | {
            "op": w["op"] + np.floor(p * memory).astype(np.int64),
            "head": w["head"] + np.floor(p * t.head_weight_bytes).astype(np.int64),
        }
        found = _one_stage(problem, t, priced, valid, None)
        assert found is not None
        return found[1] - p * room

    grid = np.log(PRICE_GRID)
    values = [bound(x) for x in grid]
    i = int(np.argmax(values))
    best = max(float(fastest[1]), values[i])
    # the dual is concave in the price: golden-section search in the grid's bracket,
    # each step pricing one new point
    golden = (math.sqrt(5) - 1) / 2
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
    fa, fb = bound(a), bound(b)
    best = max(best, fa, fb)
    for _ in range(PRICE_REFINE):
        if fa >= fb:
            hi, b, fb = b, a, fa
            a = hi - golden * (hi - lo)
            fa = bound(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + golden * (hi - lo)
            fb = bound(b)
        best = max(best, fa, fb)
    return best


# Partitions x residual options at stage boundaries a pipeline's search enumerates at
# most (beyond: CP-SAT's model).
MAX_PIPELINE_COMBOS = 200_000


def pipeline_plan(
    problem: Problem,
    t: IntegerTables,
    valid: dict[tuple[str, str], list[int]],
    requests_per_rank: int | None,
    time_of: Callable[[list[np.ndarray], list[np.ndarray]], np.ndarray],
) -> tuple[Plan, int] | None:
    """The plan of least time under ``t`` with ``pp > 1`` stages, over the space's
    partitions, and that time in ns; ``time_of(sums, maxes)`` is the regime's time from
    each step's sum and maximum over the stages.

    When that time depends on one step's stage times only (throughput in flight: the
    decode step; one-step workloads), it grows with each stage's time. Once the
    partition and the residual option of each stage's last layer are fixed, the stages
    no longer interact (a stage's time holds the hop into its first layer from the
    previous stage's last, and the send after its own last), so each stage at its
    least time is the least time of the plan: a shortest path per stage, then every
    partition and boundary option compared. None: the time depends on several steps
    (their stage maxima do not add up), residual streams that differ by layer kind, or
    more than :data:`MAX_PIPELINE_COMBOS` combinations."""
    pp, n_layers = t.degrees.pp, problem.model.num_layers
    assert pp > 1
    step = _only_step(time_of, len(t.steps))
    if step is None:
        return None
    w = _weighted(t, np.eye(len(t.steps), dtype=np.int64)[step])
    ly = _layers(problem, t, w, valid)
    if ly is None:
        return None
    base = balanced_boundaries(n_layers, pp)
    shift = max_shift(n_layers, pp)
    cuts = [range(b - shift, b + shift + 1) for b in base]
    if math.prod(len(c) for c in cuts) * len(ly.res) ** (pp - 1) > MAX_PIPELINE_COMBOS:
        return None
    entry, entry_pick = _input_end(w, ly)
    paths = _stage_tables(ly, w, entry, cuts, n_layers)
    cost, bounds, states = _best_partition(ly, paths, cuts, n_layers, step, len(t.steps), time_of)
    edges = (0, *bounds, n_layers)
    path: list[int] = []
    for s in range(pp):
        at_end, back = paths[(s, edges[s])]
        final = at_end[edges[s + 1]]
        enter = 0 if s == 0 else int(states[s - 1])
        last = int(states[s]) if s < pp - 1 else int(final[enter].argmin())
        path += _trace(back, enter, last, edges[s + 1] - edges[s])
    stage_layers = tuple(int(b - a) for a, b in itertools.pairwise(edges))
    return _plan(problem, t, ly, stage_layers, path, entry_pick[path[0]], requests_per_rank), cost


def _only_step(
    time_of: Callable[[list[np.ndarray], list[np.ndarray]], np.ndarray], n_steps: int
) -> int | None:
    """The one step whose stage times the time depends on; None: several (or none)."""
    zero = [np.zeros(1, dtype=np.int64)] * n_steps
    rest = time_of(zero, zero)
    depends = []
    for k in range(n_steps):
        one = [np.full(1, 1 if i == k else 0, dtype=np.int64) for i in range(n_steps)]
        if time_of(one, one)[0] != rest[0]:
            depends.append(k)
    return depends[0] if len(depends) == 1 else None


Paths = dict[tuple[int, int], tuple[dict[int, np.ndarray], list[np.ndarray]]]


def _stage_tables(
    ly: _Layers,
    w: dict[str, np.ndarray],
    entry: np.ndarray,
    cuts: list[range],
    n_layers: int,
) -> Paths:
    """Stage ``s`` from layer ``a``: its (entering option, last option) costs at each
    possible end, with the back pointers of its shortest paths, keyed ``(s, a)``."""
    pp = len(cuts) + 1
    p2p = w["p2p"][:, ly.res]  # (boundary, residual of the stage's last layer)
    starts = [[0], *cuts]
    ends = [*cuts, [n_layers]]
    paths: Paths = {}
    for s in range(pp):
        exit_cost = p2p[s] if s < pp - 1 else ly.tail_cost
        for a in starts[s]:
            into = entry[None, :] if s == 0 else ly.inter  # from the previous stage's last
            paths[(s, a)] = _stage_paths(ly, into, a, list(ends[s]), exit_cost)
    return paths


def _best_partition(
    ly: _Layers,
    paths: Paths,
    cuts: list[range],
    n_layers: int,
    step: int,
    n_steps: int,
    time_of: Callable[[list[np.ndarray], list[np.ndarray]], np.ndarray],
) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """The least time over every partition and boundary option: (time, the stage
    boundaries, the residual option each stage but the last ends on)."""
    pp, n_res = len(cuts) + 1, len(ly.res)
    top: tuple[int, tuple[int, ...], tuple[int, ...]] | None = None
    for bounds in itertools.product(*cuts):
        edges = (0, *bounds, n_layers)
        # time of each stage over the boundary options (e_0 .. e_{pp-2}) as a grid
        grid = [n_res] * (pp - 1)
        stage_times = []
        for s in range(pp):
            cost = paths[(s, edges[s])][0][edges[s + 1]]  # (in, last)
            if s == pp - 1:
                cost = cost.min(axis=1, keepdims=True)  # the last stage's own end is free
            shape = [1] * (pp - 1)
            if s > 0:
                shape[s - 1] = n_res
            if s < pp - 1:
                shape[s] = n_res
            stage_times.append(cost.reshape(shape) if s else cost[0].reshape(shape))
        sums = sum(np.broadcast_to(x, grid) for x in stage_times)
        maxes = np.maximum.reduce([np.broadcast_to(x, grid) for x in stage_times])
        total = time_of(
            [sums if k == step else np.zeros(grid, np.int64) for k in range(n_steps)],
            [maxes if k == step else np.zeros(grid, np.int64) for k in range(n_steps)],
        )
        i = int(np.argmin(total))
        if top is None or int(total.flat[i]) < top[0]:
            top = (int(total.flat[i]), bounds, np.unravel_index(i, grid))
    assert top is not None
    return top
