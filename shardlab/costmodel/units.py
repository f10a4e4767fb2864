"""Plans as layer units: the layers of a plan that share a class and options, priced
together, and each unit's table rows as index arithmetic (:class:`Terms`).

A plan comes in either as a :class:`~shardlab.problems.plan.Plan` (:func:`units_of_plan`)
or as rows of its space's encoding (:func:`units_of_codes`); both end as the same
:class:`Units`, which :mod:`shardlab.costmodel.arithmetic` prices.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from shardlab.costmodel.stack import Stack, stack_of
from shardlab.costmodel.tables import layer_classes_of
from shardlab.problems.model import Model
from shardlab.problems.operators import HEAD_OPS, layer_edges, layer_ops
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.problems.space import MAX_SHIFT, SearchSpace, balanced_boundaries


@dataclass(frozen=True, kw_only=True)
class UnitLayout:
    """Which unit each layer belongs to (a set of layers with the same options and
    class), and each unit's class and kind: shared by every plan of a batch."""

    layer_unit: tuple[int, ...]  # (L,)
    unit_class: tuple[int, ...]  # (U,) index into the layer classes
    unit_kind: tuple[int, ...]  # (U,) index into model.kinds


@dataclass(frozen=True, kw_only=True)
class Units:
    """Plans expressed per unit, each with its slot in the problem's stack."""

    layout: UnitLayout
    stack: Stack  # the problem's tables the slots index
    slot: np.ndarray  # (n,) slot of each plan's degree tuple in ``stack``
    opts: np.ndarray  # (n, U, K) option index per unit and operator
    head: np.ndarray  # (n, 4) head option indices
    starts: np.ndarray  # (n, S) first layer of each stage; stages past pp are empty
    ends: np.ndarray  # (n, S) one past the last layer

    def take(self, rows: np.ndarray) -> Units:
        return Units(
            layout=self.layout,
            stack=self.stack,
            slot=self.slot[rows],
            opts=self.opts[rows],
            head=self.head[rows],
            starts=self.starts[rows],
            ends=self.ends[rows],
        )


@dataclass(frozen=True, kw_only=True)
class Terms:
    """Fixed per layout: the table rows each unit's time adds up, as index arithmetic
    on its options (``base + opts[u, ka] * ma + opts[u, kb] * mb``), and layer counts."""

    unit: np.ndarray  # (T,) unit of each term; terms are grouped by unit
    base: np.ndarray
    ka: np.ndarray
    kb: np.ndarray
    ma: np.ndarray
    mb: np.ndarray
    unit_first: np.ndarray  # (U,) first term of each unit
    unit_len: np.ndarray  # (U,) its terms
    op_terms: np.ndarray  # the operator terms (their b-free rows: weights, KV, workspace)
    op_unit_starts: np.ndarray  # first operator term of each unit
    cs_unit: np.ndarray  # (L + 1, U) layers of each unit up to a layer
    cs_pair: np.ndarray  # (L + 1, P) residual hops (unit a -> unit b) into layers up to one
    pair_a: np.ndarray  # (P,)
    pair_b: np.ndarray
    first_unit: int
    last_unit: int
    layer_unit: np.ndarray


@lru_cache(maxsize=256)
def terms_of(problem: Problem, layout: UnitLayout) -> Terms:
    m = problem.model
    lay = stack_of(problem).layout
    k_all, o = lay.n_ops, lay.n_opts
    unit, base, ka, kb, ma, mb, is_op = [], [], [], [], [], [], []
    op_unit_starts = []
    for u, (ci, kind_i) in enumerate(zip(layout.unit_class, layout.unit_kind, strict=True)):
        kind = m.kinds[kind_i]
        op_unit_starts.append(sum(is_op))
        for k in range(len(layer_ops(m, kind))):
            unit.append(u)
            base.append(lay.op0 + (ci * k_all + k) * o)
            ka.append(k), kb.append(0), ma.append(1), mb.append(0), is_op.append(True)
        names = [op.name for op in layer_ops(m, kind)]
        for e, (src, dst) in enumerate(layer_edges(m, kind)):
            unit.append(u)
            base.append(lay.edge0 + (ci * lay.n_edges + e) * o * o)
            ka.append(names.index(src)), kb.append(names.index(dst))
            ma.append(o), mb.append(1), is_op.append(False)
    layer_unit = np.array(layout.layer_unit, dtype=np.int64)
    n_units = len(layout.unit_class)
    pair_of = layer_unit[:-1] * n_units + layer_unit[1:]
    pairs, pair_key = np.unique(pair_of, return_inverse=True)
    arr = lambda x: np.array(x, dtype=np.int64)  # noqa: E731
    return Terms(
        unit=arr(unit),
        base=arr(base),
        ka=arr(ka),
        kb=arr(kb),
        ma=arr(ma),
        mb=arr(mb),
        unit_first=np.searchsorted(unit, np.arange(n_units)),
        unit_len=np.bincount(unit, minlength=n_units),
        op_terms=np.flatnonzero(is_op),
        op_unit_starts=arr(op_unit_starts),
        cs_unit=_cumulative(layer_unit, n_units),
        cs_pair=_cumulative(np.concatenate([[-1], pair_key.ravel()]), len(pairs)),
        pair_a=pairs // n_units,
        pair_b=pairs % n_units,
        first_unit=int(layer_unit[0]),
        last_unit=int(layer_unit[-1]),
        layer_unit=layer_unit,
    )


def _cumulative(keys: np.ndarray, n_keys: int) -> np.ndarray:
    """``(L + 1, n_keys)``: how many of positions ``0 .. l - 1`` carry each key (-1:
    none); a stage's count of a key is then a difference of two rows."""
    onehot = np.zeros((len(keys) + 1, n_keys))
    valid = keys >= 0
    onehot[1:][np.flatnonzero(valid), keys[valid]] = 1.0
    return np.cumsum(onehot, axis=0)


@dataclass(frozen=True, kw_only=True)
class _LayerIndex:
    """Each layer's class and kind as indices (into :func:`layer_classes_of` and
    ``model.kinds``), and each kind's operators' option indices by name: looked up
    once per model, not once per layer of every plan."""

    layer_class: tuple[int, ...]
    layer_kind: tuple[int, ...]
    options: tuple[tuple[dict[str, int], ...], ...]  # per kind, per operator


@lru_cache(maxsize=64)
def _layer_index(model: Model) -> _LayerIndex:
    classes = {c: i for i, c in enumerate(layer_classes_of(model))}
    kinds = {c: i for i, c in enumerate(model.kinds)}
    pairs = zip(model.layer_kinds, model.attention_layers, strict=True)
    return _LayerIndex(
        layer_class=tuple(classes[c] for c in pairs),
        layer_kind=tuple(kinds[k] for k in model.layer_kinds),
        options=tuple(
            tuple({o.name: i for i, o in enumerate(op.options)} for op in layer_ops(model, k))
            for k in model.kinds
        ),
    )


_HEAD_OPTIONS = tuple({o.name: i for i, o in enumerate(op.options)} for op in HEAD_OPS)


def units_of_plan(problem: Problem, plan: Plan) -> Units:
    """One plan as units: layers with the same class and options form one."""
    m = problem.model
    stack = stack_of(problem)
    k = stack.layout.n_ops
    index = _layer_index(m)
    ids: dict[tuple, int] = {}
    rows: list[list[int]] = []
    layer_unit, unit_class, unit_kind = [], [], []
    for layer, names in enumerate(plan.layer_options):
        ci = index.layer_class[layer]
        key = (ci, names)
        if key not in ids:
            ids[key] = len(rows)
            kind = index.layer_kind[layer]
            ops = index.options[kind]
            row = [of[n] for of, n in zip(ops, names, strict=True)]
            rows.append(row + [0] * (k - len(row)))
            unit_class.append(ci)
            unit_kind.append(kind)
        layer_unit.append(ids[key])
    head = [of[n] for of, n in zip(_HEAD_OPTIONS, plan.head_options, strict=True)]
    ends = np.cumsum(plan.stage_layers)[None, :]
    return Units(
        layout=UnitLayout(
            layer_unit=tuple(layer_unit), unit_class=tuple(unit_class), unit_kind=tuple(unit_kind)
        ),
        stack=stack,
        slot=stack.slots((plan.degrees,)),
        opts=np.array([rows], dtype=np.int64),
        head=np.array([head], dtype=np.int64),
        starts=ends - np.array([plan.stage_layers]),
        ends=ends,
    )


@dataclass(frozen=True, kw_only=True)
class _SpaceUnits:
    """How a space's encoding maps onto units (fixed per space)."""

    layout: UnitLayout
    var_index: np.ndarray  # (U, K) column of the code holding each unit's option (-1: pad)
    head_vars: np.ndarray  # (4,)
    bounds: np.ndarray  # (degree indices, S - 1) balanced stage boundaries (L: no stage)
    has_cut: np.ndarray  # (degree indices, S - 1) whether the boundary exists


def _space_units(problem: Problem) -> _SpaceUnits:
    space = problem.space
    cached = _SPACE_UNITS.get(space)
    if cached is not None:
        return cached
    m = space.model
    offsets: dict[str, int] = {}
    for v, g, _ in space.option_slots():
        offsets.setdefault(g.key, v)
    classes = {c: i for i, c in enumerate(layer_classes_of(m))}
    kinds = {c: i for i, c in enumerate(m.kinds)}
    n_ops = max(len(layer_ops(m, kind)) for kind in m.kinds)
    unit_ids: dict[tuple[str, int], int] = {}
    layer_unit = np.zeros(m.num_layers, dtype=np.int64)
    rows, unit_class, unit_kind = [], [], []
    for g in space.groups:
        if g.kind == "head":
            continue
        for layer in g.layers:
            key = (g.key, classes[(m.layer_kinds[layer], m.attention_layers[layer])])
            if key not in unit_ids:
                unit_ids[key] = len(rows)
                row = np.full(n_ops, -1, dtype=np.int64)
                row[: len(g.ops)] = offsets[g.key] + np.arange(len(g.ops))
                rows.append(row)
                unit_class.append(key[1])
                unit_kind.append(kinds[g.kind])
            layer_unit[layer] = unit_ids[key]
    cuts = max(space.max_pp - 1, 0)
    bounds = np.full((len(space.degree_tuples), cuts), m.num_layers, dtype=np.int64)
    for i, d in enumerate(space.degree_tuples):
        bounds[i, : d.pp - 1] = balanced_boundaries(m.num_layers, d.pp)
    has_cut = np.arange(cuts)[None, :] < np.array([d.pp - 1 for d in space.degree_tuples])[:, None]
    out = _SpaceUnits(
        layout=UnitLayout(
            layer_unit=tuple(layer_unit.tolist()),
            unit_class=tuple(unit_class),
            unit_kind=tuple(unit_kind),
        ),
        var_index=np.array(rows),
        head_vars=offsets["head"] + np.arange(len(HEAD_OPS)),
        bounds=bounds,
        has_cut=has_cut,
    )
    _SPACE_UNITS[space] = out
    return out


# Spaces are compared by identity; a problem's space lives as long as the problem.
_SPACE_UNITS: weakref.WeakKeyDictionary[SearchSpace, _SpaceUnits] = weakref.WeakKeyDictionary()


def units_of_codes(problem: Problem, codes: np.ndarray) -> Units:
    space = problem.space
    su = _space_units(problem)
    padded = np.concatenate([codes, np.zeros((len(codes), 1), dtype=codes.dtype)], axis=1)
    di = codes[:, 0]
    cuts = codes[:, space.first_cut : space.first_cut + su.bounds.shape[1]] - MAX_SHIFT
    inner = np.where(su.has_cut[di], su.bounds[di] + cuts, space.model.num_layers)
    n = len(codes)
    starts = np.concatenate([np.zeros((n, 1), np.int64), inner], axis=1)
    ends = np.concatenate([inner, np.full((n, 1), space.model.num_layers)], axis=1)
    stack = stack_of(problem)
    return Units(
        layout=su.layout,
        stack=stack,
        slot=stack.space_slots(space)[di],
        opts=padded[:, su.var_index],  # -1 reads the zero column
        head=codes[:, su.head_vars],
        starts=starts,
        ends=ends,
    )


def forget_layouts() -> None:
    """Drop what was cached about layouts and spaces (with the tables they index)."""
    terms_of.cache_clear()
    _SPACE_UNITS.clear()
