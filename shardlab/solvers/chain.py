"""The fastest one-stage plan with options per layer, exactly, by dynamic programming.

With one pipeline stage a subproblem's time (the regime's weighted sum of its steps,
:mod:`shardlab.solvers.cpsat`) is a sum over the layers of each layer's operators and
edges, plus the residual stream's hop from each layer to the next, plus the model's
ends. Layers interact only through that hop, so the choice along the layers is a
shortest path whose state is the residual stream's option: a layer's cost for each
residual option is the least sum over its other operators (variable elimination,
:func:`~shardlab.solvers.minsum.argmin_sum`), and the path runs through the layers
in order. What it ignores (memory, the SLOs) is checked afterwards: when the fastest
plan also fits and meets them it is the subproblem's optimum, proven, without a CP-SAT
model of hundreds of layers.
"""

from __future__ import annotations

import itertools

import numpy as np

from shardlab.costmodel.decompose import IntegerTables
from shardlab.problems.operators import HEAD_OPS, layer_ops
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.solvers.minsum import Factor, argmin_sum


def _layer_factors(
    t: IntegerTables, weighted: dict[str, np.ndarray], ci: int, opts: list[list[int]]
) -> list[Factor]:
    """The factors of one layer of class ``ci`` over its operators' valid options."""
    kind = t.classes[ci][0]
    factors: list[Factor] = [((k,), weighted["op"][ci, k, o]) for k, o in enumerate(opts)]
    for e, (src, dst) in enumerate(t.edges[kind]):
        factors.append(((src, dst), weighted["edge"][ci, e][np.ix_(opts[src], opts[dst])]))
    return factors


def chain_plan(
    problem: Problem,
    t: IntegerTables,
    weights: np.ndarray,
    valid: dict[tuple[str, str], list[int]],
    concurrency: int | None,
) -> tuple[Plan, int] | None:
    """The one-stage plan of least weighted time under ``t`` (degrees with pp = 1), and
    that time in ns (None: layer kinds whose residual streams differ, not a chain of
    one state). ``weights`` weigh the steps; ``valid`` holds the options the degrees
    allow per (layer kind or 'head', operator)."""
    m = problem.model
    d = t.degrees
    assert d.pp == 1

    def weigh(name: str) -> np.ndarray:
        return np.tensordot(weights, getattr(t, name), axes=1).astype(np.int64)

    w = {
        "op": weigh("op_ns"),
        "edge": weigh("edge_ns"),
        "inter": weigh("inter_ns"),
        "head": weigh("head_ns"),
        "emb_first": weigh("emb_first_ns"),
        "last_fnorm": weigh("last_fnorm_ns"),
        "fnorm_lm": weigh("fnorm_lm_ns"),
        "lm_sampler": weigh("lm_sampler_ns"),
    }
    classes = {c: i for i, c in enumerate(t.classes)}
    layer_class = [classes[c] for c in zip(m.layer_kinds, m.attention_layers, strict=True)]
    # the residual stream's options ("residual" is every kind's first operator)
    per_kind = {tuple(valid[(k, layer_ops(m, k)[0].name)]) for k in m.kinds}
    if len(per_kind) != 1:
        return None  # kinds that allow the residual stream different options
    res = list(per_kind.pop())
    # per class and residual option: the layer's least cost and its operators' options
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
    inter = w["inter"][np.ix_(res, res)]
    heads = [valid[("head", op.name)] for op in HEAD_OPS]
    # the output end for each residual option of the last layer: its best head options
    tail_cost = np.full(len(res), np.iinfo(np.int64).max, dtype=np.int64)
    tail_pick: list[tuple[int, int, int]] = [(0, 0, 0)] * len(res)
    for h1, h2, h3 in itertools.product(*heads[1:]):
        fixed = (
            w["head"][1, h1] + w["head"][2, h2] + w["head"][3, h3]
            + w["fnorm_lm"][h1, h2] + w["lm_sampler"][h2, h3]
        )  # fmt: skip
        cost = fixed + w["last_fnorm"][res, h1]
        better = cost < tail_cost
        tail_cost = np.where(better, cost, tail_cost)
        tail_pick = [p if not b else (h1, h2, h3) for p, b in zip(tail_pick, better, strict=True)]
    top: tuple[int, int, list[int]] | None = None  # (cost, embedding option, path)
    for h0 in heads[0]:
        value = w["head"][0, h0] + w["emb_first"][h0, res] + layer_cost[0]
        back = []
        for layer in range(1, m.num_layers):
            through = value[:, None] + inter  # (previous residual, this residual)
            back.append(through.argmin(axis=0))
            value = through.min(axis=0) + layer_cost[layer]
        total = value + tail_cost
        end = int(total.argmin())
        if top is None or int(total[end]) < top[0]:
            path = [end]
            for step in reversed(back):
                path.append(int(step[path[-1]]))
            top = (int(total[end]), h0, path[::-1])
    assert top is not None
    cost, h0, path = top
    layer_options = []
    for layer, j in enumerate(path):
        kind = m.layer_kinds[layer]
        chosen = best[(layer_class[layer], j)][1]
        layer_options.append(
            tuple(op.options[o].name for op, o in zip(layer_ops(m, kind), chosen, strict=True))
        )
    head = (h0, *tail_pick[path[-1]])
    plan = Plan(
        degrees=d,
        stage_layers=(m.num_layers,),
        layer_options=tuple(layer_options),
        head_options=tuple(op.options[o].name for op, o in zip(HEAD_OPS, head, strict=True)),
        concurrency=concurrency,
    )
    return plan, cost
