"""Scalar and batched evaluation of plans: one implementation of the arithmetic.

Both paths call :func:`_assemble`, which prices arrays of plans of any degree tuples
in one vectorized pass over the problem's stacked tables
(:mod:`shardlab.costmodel.stack`); the scalar path adds the per-operator breakdown.
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
  (``--batch`` over the replicas and dp ranks, within the engine's max batch and max
  tokens). A plan that fixes it (``Plan.concurrency``) runs with it; otherwise every
  ``c`` up to what its KV cache holds is priced and the best one under the SLOs is
  kept (none feasible: ``c = 1``, the least memory and, but for bumps in measured
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

import dataclasses
import weakref
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import numpy as np
from scipy import sparse

try:  # the kernel behind csr_matrix @ dense (see _sparse_product)
    from scipy.sparse._sparsetools import csr_matvecs as _csr_matvecs
except ImportError:  # pragma: no cover - a scipy that moved it
    _csr_matvecs = None

from shardlab.costmodel.constants import RUNTIME_RESERVE_GB
from shardlab.costmodel.opcosts import kernel_class
from shardlab.costmodel.regimes import DegreeArrays, judge, timing
from shardlab.costmodel.stack import Stack, stack_of
from shardlab.costmodel.tables import degree_tables, layer_classes_of
from shardlab.errors import ShardlabError
from shardlab.problems.model import Model
from shardlab.problems.operators import HEAD_OPS, layer_edges, layer_ops
from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem
from shardlab.problems.space import MAX_SHIFT, SearchSpace, balanced_boundaries

VIOLATIONS = ("memory", "ttft_slo", "tpot_slo")


@dataclass(frozen=True, kw_only=True)
class OpBreakdown:
    """Where one operator's time and memory go (summed over its layers)."""

    step: str  # prefill, decode or mixed
    name: str  # "dense.qkv_proj", "head.lm_head", "pipeline.p2p", ...
    option: str  # the chosen option ("mixed" when layers differ)
    layers: int
    compute_ms: float  # FLOP-bound time per micro-batch pass through the replica
    memory_ms: float  # HBM-bound time
    comm_ms: float  # collectives feeding this operator, and its own dispatch
    time_ms: float  # sum over layers of max(compute, memory) + kernels + communication
    weight_gb: float  # on the fullest GPU
    kv_gb: float
    act_gb: float
    # how its kernels were timed: silicon (measured), roofline, or mixed over its layers
    timing: str = "roofline"
    # its own kernels' calibration class (gemm, attention, moe; None: not calibrated);
    # comm_ms is the communication class
    kernel_class: str | None = None


@dataclass(frozen=True, kw_only=True)
class Metrics:
    feasible: bool
    violations: tuple[str, ...]
    objective: float  # higher is better: tokens/s, tokens/s per GPU, or -latency in ms
    ttft_ms: float
    tpot_ms: float
    latency_ms: float
    throughput_tok_s: float
    throughput_tok_s_per_gpu: float
    memory_gb_per_gpu: float
    hbm_gb: float
    num_gpus: int
    concurrency: int  # requests in flight in the whole cluster
    # requests per attention-DP rank the plan runs with (the engine's max batch size),
    # and the most whose KV cache fits (at most what the workload offers a rank)
    requests_per_rank: int
    capacity_per_rank: int
    weights_gb: float  # parts of the fullest GPU's memory
    kv_cache_gb: float
    activations_gb: float
    breakdown: tuple[OpBreakdown, ...] = field(default=(), compare=False)

    def to_dict(self, *, breakdown: bool = False) -> dict:
        data = asdict(self)
        data["violations"] = list(self.violations)
        if breakdown:
            data["breakdown"] = [asdict(b) for b in self.breakdown]
        else:
            data.pop("breakdown")
        return data


@dataclass(frozen=True)
class BatchMetrics:
    """Metrics of many plans as arrays, one entry per plan."""

    feasible: np.ndarray
    objective: np.ndarray
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    latency_ms: np.ndarray
    throughput_tok_s: np.ndarray
    throughput_tok_s_per_gpu: np.ndarray
    memory_gb_per_gpu: np.ndarray
    num_gpus: np.ndarray
    concurrency: np.ndarray
    requests_per_rank: np.ndarray
    capacity_per_rank: np.ndarray
    weights_gb: np.ndarray
    kv_cache_gb: np.ndarray
    activations_gb: np.ndarray
    memory_violation: np.ndarray
    ttft_violation: np.ndarray
    tpot_violation: np.ndarray

    def __len__(self) -> int:
        return len(self.feasible)


# -- layer units: layers that share options and tables --------------------------------


@dataclass(frozen=True)
class UnitLayout:
    """Which unit each layer belongs to (a set of layers with the same options and
    class), and each unit's class and kind: shared by every plan of a batch."""

    layer_unit: tuple[int, ...]  # (L,)
    unit_class: tuple[int, ...]  # (U,) index into the layer classes
    unit_kind: tuple[int, ...]  # (U,) index into model.kinds


@dataclass(frozen=True)
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
            self.layout,
            self.stack,
            self.slot[rows],
            self.opts[rows],
            self.head[rows],
            self.starts[rows],
            self.ends[rows],
        )


@dataclass(frozen=True)
class _Terms:
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
def _terms(problem: Problem, layout: UnitLayout) -> _Terms:
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
    return _Terms(
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


@dataclass(frozen=True)
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
        layout=UnitLayout(tuple(layer_unit), tuple(unit_class), tuple(unit_kind)),
        stack=stack,
        slot=stack.slots((plan.degrees,)),
        opts=np.array([rows], dtype=np.int64),
        head=np.array([head], dtype=np.int64),
        starts=ends - np.array([plan.stage_layers]),
        ends=ends,
    )


@dataclass(frozen=True)
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
        layout=UnitLayout(tuple(layer_unit.tolist()), tuple(unit_class), tuple(unit_kind)),
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


# -- the arithmetic --------------------------------------------------------------------


@dataclass(frozen=True)
class _Assembled:
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


@dataclass(frozen=True)
class _Stages:
    """Every real stage of a batch of plans, plan by plan (a "stage row" each)."""

    plan: np.ndarray  # (R,) plan of each stage row
    stage: np.ndarray  # (R,) its stage index
    first_row: np.ndarray  # (n,) first stage row of each plan
    unit_count: np.ndarray  # (R, U) layers of each unit in the stage
    pair_count: np.ndarray  # (R, P) residual hops of each unit pair into the stage's layers
    is_first: np.ndarray
    is_last: np.ndarray


def _stages(u: Units, terms: _Terms, pp: np.ndarray) -> _Stages:
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
    problem: Problem, u: Units, terms: _Terms, sr: _Stages
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
    terms: _Terms,
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


@dataclass(frozen=True)
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
        return _Candidates(np.arange(n), c, 0 * c, np.arange(n), 0 * c + 1)
    if per_dp is not None:
        c = np.asarray(per_dp, dtype=np.int64)
        col = -(-c // np.minimum(pp, c)) - 1
        return _Candidates(np.arange(n), c, col, np.arange(n), col + 1)
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
        return _Candidates(plan, c, col, first, n_b)
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
    return _Candidates(plan, c, col, first, n_b)


def _assemble(problem: Problem, u: Units, per_dp: np.ndarray | None = None) -> _Assembled:
    """Metrics of the plans ``u`` (any degree tuples) at ``per_dp`` requests per dp rank,
    or, when None, at the concurrency each plan does best with (see the module
    docstring; the static schedule runs its batch)."""
    w = problem.workload
    stack = u.stack
    stack.ensure(u.slot)
    lay = stack.layout
    terms = _terms(problem, u.layout)
    n = len(u.slot)
    rows = np.arange(n)
    slot = u.slot

    def scalar(name: str) -> np.ndarray:
        return stack.scalar(name, slot)

    pp = scalar("pp").astype(np.int64)
    tp = scalar("tp").astype(np.int64)
    per_dp_max = scalar("per_dp_max").astype(np.int64)
    n_stages = u.starts.shape[1]
    sr = _stages(u, terms, pp)
    # gathers by flat index (np.take): several times faster than by two index arrays
    k_ops = u.opts.shape[2]
    flat_opts = u.opts.reshape(n, u.opts.shape[1] * k_ops)
    rid = (
        terms.base
        + np.take(flat_opts, terms.unit * k_ops + terms.ka, axis=1) * terms.ma
        + np.take(flat_opts, terms.unit * k_ops + terms.kb, axis=1) * terms.mb
    )  # (n, T) the table row of every term of every unit

    # -- memory ------------------------------------------------------------------------
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
    ws, rs, ks = (scalar(s)[:, None] for s in ("weight_scale", "reserve_scale", "kv_scale"))
    real = np.arange(n_stages)[None, :] < pp[:, None]
    reserve = (RUNTIME_RESERVE_GB * 1e9 + act[:, None]) * rs
    base = np.where(real, w_stage * ws + reserve, NO_STAGE)
    kvf_charged, kvs_charged = kvf_stage * ks, kvs_stage * ks
    capacity = _capacity(base, kvf_charged, kvs_charged, tp, hbm, per_dp_max)

    # -- candidate concurrencies, and the b column each one reads ----------------------
    replicas = scalar("replicas").astype(np.int64)
    dp_attn = scalar("dp_attn").astype(np.int64)
    saturated = -(-w.batch // (replicas * dp_attn))  # per rank, when all are in flight
    cs = _candidates(problem, per_dp, capacity, pp, per_dp_max, saturated)
    cp = cs.plan

    # -- stage times per step at those columns, then the regimes -------------------------
    fixed = _fixed_entries(problem, u, terms, sr)
    total, peak, offset, width = _stage_times(stack, slot, sr, pp, terms, rid, fixed, cs.need)
    steps = stack.steps
    sums, maxes = [], []
    start = offset[cp]
    for step in steps:
        at = start if step.single else start + cs.col
        sums.append(total[at])
        maxes.append(peak[at])
        start = start + (1 if step.single else width[cp])
    per_replica = scalar("per_replica").astype(np.int64)[cp]
    budget = scalar("max_tokens").astype(np.int64)[cp]
    degrees = DegreeArrays(pp=pp[cp], replicas=replicas[cp], dp_attn=dp_attn[cp], tp=tp[cp])
    tm = timing(problem, degrees, steps, per_replica, cs.per_dp, sums, maxes, budget)
    fits = cs.per_dp <= capacity[cp]
    j = judge(problem, tm, fits)
    if len(cp) == n:
        pick = np.arange(n)
    else:  # the best feasible concurrency; none: one request, the nearest to feasible
        score = np.where(j.feasible, j.objective, -np.inf)
        best = np.maximum.reduceat(score, cs.first)[cp]
        # of (near-)ties the fewest requests, whatever the float order of the sums
        near = score >= best - TIE * np.abs(best)
        index = np.arange(len(cp))
        first_near = np.minimum.reduceat(np.where(near, index, len(cp)), cs.first)
        pick = np.where(np.logical_or.reduceat(j.feasible, cs.first), first_near, cs.first)

    c = cs.per_dp[pick]
    splits = -(-c // tp)
    mem_stage = base + kvf_charged * c[:, None] + kvs_charged * splits[:, None]
    fullest = mem_stage.argmax(axis=1)
    kv_gb = (kvf_stage[rows, fullest] * c + kvs_stage[rows, fullest] * splits) / 1e9
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
        capacity_per_rank=capacity,
        weights_gb=w_stage[rows, fullest] / 1e9,
        kv_cache_gb=kv_gb,
        activations_gb=act / 1e9,
        memory_violation=~fits[pick],
        ttft_violation=j.ttft_violation[pick],
        tpot_violation=j.tpot_violation[pick],
    )
    curves = {
        "plan": cp,
        "per_rank": cs.per_dp,
        "feasible": j.feasible,
        "throughput_tok_s_per_gpu": tm.throughput / gpus,
        "ttft_ms": tm.ttft_s * 1e3,
        "tpot_ms": tm.tpot_s * 1e3,
    }
    return _Assembled(metrics, cs.col[pick], c, fullest, curves)


# -- public entry points ---------------------------------------------------------------


def forget_tables() -> None:
    """Drop every table built so far (the next evaluation builds them, as a fresh
    process would): for measuring that cost."""
    degree_tables.cache_clear()
    stack_of.cache_clear()
    _terms.cache_clear()
    _SPACE_UNITS.clear()


def prepare(problem: Problem, degrees: Degrees) -> None:
    """Build the cost tables of one degree tuple (kept for later calls): the slow part
    of pricing the first plan with these degrees, for callers that watch a clock."""
    stack = stack_of(problem)
    stack.ensure(stack.slots((degrees,)))


# Objectives this close (relative) are a tie between concurrencies: the fewest wins.
TIE = 1e-9


def evaluate_batch(
    problem: Problem,
    codes: np.ndarray,
    *,
    check: bool = True,
    per_rank: np.ndarray | None = None,
) -> BatchMetrics:
    """Evaluate encoded plans (rows of ``problem.space``'s encoding), each at the
    concurrency it does best with, or at ``per_rank`` requests per dp rank (one value
    per row, within the workload's offer; in flight only).

    ``check=False`` skips the validity check, for callers whose codes come from the
    space's own sampling and masks.
    """
    return _evaluate(problem, codes, check=check, per_rank=per_rank, points=False)[0]


@dataclass(frozen=True)
class ConcurrencyPoints:
    """Feasible (plan, concurrency) points: ``row`` indexes the codes they came from."""

    row: np.ndarray
    per_rank: np.ndarray
    throughput_tok_s_per_gpu: np.ndarray
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray

    def __len__(self) -> int:
        return len(self.row)


def evaluate_points(
    problem: Problem, codes: np.ndarray, *, check: bool = True
) -> tuple[BatchMetrics, ConcurrencyPoints]:
    """:func:`evaluate_batch`, and every feasible point of the plans from the same pass:
    in flight one per concurrency each plan can run that no other concurrency of the
    same plan dominates (the trade-off a Pareto front is over); static, each plan's one
    point."""
    m, points = _evaluate(problem, codes, check=check, per_rank=None, points=True)
    assert points is not None
    return m, points


def _evaluate(
    problem: Problem,
    codes: np.ndarray,
    *,
    check: bool,
    per_rank: np.ndarray | None,
    points: bool,
) -> tuple[BatchMetrics, ConcurrencyPoints | None]:
    space = problem.space
    codes = np.atleast_2d(np.asarray(codes, dtype=np.int64))
    if check:
        valid = space.is_valid(codes)
        if not valid.all():
            bad = int(np.flatnonzero(~valid)[0])
            raise ValueError(f"row {bad} is not a valid encoding; use SearchSpace.repair()")
    units = units_of_codes(problem, codes)
    # plans per pass: keeps the per-plan arrays (terms, stage rows) to tens of MB
    terms = _terms(problem, units.layout)
    per_stage = len(terms.unit_first) + len(terms.pair_a) + 9  # units, hops, ends, send
    per_pass = max(64, GATHER_CHUNK // (len(terms.unit) + space.max_pp * per_stage))
    parts: list[BatchMetrics] = []
    found: list[tuple[np.ndarray, ...]] = []
    point_fields = [f for f in ConcurrencyPoints.__dataclass_fields__ if f != "row"]
    for i in range(0, max(len(codes), 1), per_pass):
        rows = np.arange(i, min(i + per_pass, len(codes)))
        u = units.take(rows)
        fixed = None if per_rank is None else _requests(problem, u, per_rank[rows])
        a = _assemble(problem, u, fixed)
        parts.append(a.metrics)
        if points:
            ok = a.curves["feasible"]
            found.append((rows[a.curves["plan"][ok]], *(a.curves[f][ok] for f in point_fields)))
    metrics = (
        parts[0]
        if len(parts) == 1
        else BatchMetrics(
            **{
                name: np.concatenate([getattr(part, name) for part in parts])
                for name in BatchMetrics.__dataclass_fields__
            }
        )
    )
    if not points:
        return metrics, None
    return metrics, ConcurrencyPoints(*(np.concatenate(c) for c in zip(*found, strict=True)))


def _requests(problem: Problem, u: Units, per_rank: np.ndarray) -> np.ndarray:
    """Requests per dp rank given to plans, checked against what the workload offers."""
    per_rank = np.asarray(per_rank, dtype=np.int64)
    stack = u.stack
    stack.ensure(u.slot)
    offer = stack.scalar("per_dp_max", u.slot).astype(np.int64)
    if problem.workload.schedule != "inflight":
        if (per_rank != offer).any():
            i = int(np.flatnonzero(per_rank != offer)[0])
            raise ShardlabError(
                f"plan concurrency {int(per_rank[i])} per rank: the static schedule runs "
                f"its batch ({offer[i]} per attention-DP rank); drop the plan's "
                "'concurrency' or use --schedule inflight"
            )
        return per_rank
    bad = (per_rank < 1) | (per_rank > offer)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        d = stack.degrees[int(u.slot[i])]
        raise ShardlabError(
            f"plan concurrency {int(per_rank[i])} per rank is more than this workload "
            f"offers an attention-DP rank under {d.short()} ({offer[i]}: "
            "--batch over replicas and dp_attn, the engine's max batch and max tokens); "
            "raise --batch or lower the plan's 'concurrency'"
        )
    return per_rank


def assemble_plan(problem: Problem, plan: Plan) -> tuple[Units, _Assembled]:
    """One plan through the batched arithmetic: at its ``concurrency`` when it has one,
    else at the concurrency it does best with."""
    units = units_of_plan(problem, plan)
    fixed = None
    if plan.concurrency is not None:
        fixed = _requests(problem, units, np.array([plan.concurrency]))
    return units, _assemble(problem, units, fixed)


def with_concurrency(problem: Problem, plan: Plan, metrics: Metrics) -> Plan:
    """``plan`` with the concurrency ``metrics`` were evaluated at (in flight), so that
    its JSON says the engine's max batch size and re-evaluates to the same point."""
    if problem.workload.schedule != "inflight" or plan.concurrency is not None:
        return plan
    return dataclasses.replace(plan, concurrency=metrics.requests_per_rank)


def at_capacity(problem: Problem, plan: Plan) -> Plan:
    """``plan`` at the concurrency an engine left at its defaults runs it with: every
    offered request its KV cache holds (in flight; at least one). Measurements of
    "max-throughput" serving are taken there, not at the best concurrency."""
    if problem.workload.schedule != "inflight":
        return plan
    free = dataclasses.replace(plan, concurrency=None)
    held = _assemble(problem, units_of_plan(problem, free)).metrics.capacity_per_rank[0]
    return dataclasses.replace(plan, concurrency=max(int(held), 1))


def evaluate(problem: Problem, plan: Plan, *, breakdown: bool = True) -> Metrics:
    """Evaluate one plan, with the per-operator breakdown (``breakdown=False``: without,
    three times faster): at its ``concurrency`` when it has one, else at the
    concurrency it does best with."""
    units, a = assemble_plan(problem, plan)
    bm = a.metrics
    violations = tuple(
        name
        for name, flag in zip(
            VIOLATIONS,
            (bm.memory_violation[0], bm.ttft_violation[0], bm.tpot_violation[0]),
            strict=True,
        )
        if flag
    )
    return Metrics(
        feasible=bool(bm.feasible[0]),
        violations=violations,
        objective=float(bm.objective[0]),
        ttft_ms=float(bm.ttft_ms[0]),
        tpot_ms=float(bm.tpot_ms[0]),
        latency_ms=float(bm.latency_ms[0]),
        throughput_tok_s=float(bm.throughput_tok_s[0]),
        throughput_tok_s_per_gpu=float(bm.throughput_tok_s_per_gpu[0]),
        memory_gb_per_gpu=float(bm.memory_gb_per_gpu[0]),
        hbm_gb=problem.cluster.accelerator.hbm_gb,
        num_gpus=int(bm.num_gpus[0]),
        concurrency=int(bm.concurrency[0]),
        requests_per_rank=int(bm.requests_per_rank[0]),
        capacity_per_rank=int(bm.capacity_per_rank[0]),
        weights_gb=float(bm.weights_gb[0]),
        kv_cache_gb=float(bm.kv_cache_gb[0]),
        activations_gb=float(bm.activations_gb[0]),
        breakdown=_breakdown(problem, plan, units, a) if breakdown else (),
    )


class _Rows:
    """The breakdown's rows of one step, accumulated by name."""

    def __init__(self) -> None:
        self.acc: dict[str, dict] = {}

    def add(
        self,
        name: str,
        option: str,
        *,
        layers: int = 1,
        on_fullest: int = 0,
        time: float,
        compute: float = 0.0,
        memory: float = 0.0,
        comm: float = 0.0,
        weight: float = 0.0,
        kv: float = 0.0,
        act: float = 0.0,
        source: str = "roofline",
        kernel: str | None = None,
    ) -> None:
        """``layers`` layers (``on_fullest`` of them on the fullest stage) with these
        per-layer costs; ``time`` is theirs in total."""
        e = self.acc.setdefault(
            name,
            {
                "option": option,
                "layers": 0,
                "compute": 0.0,
                "memory": 0.0,
                "comm": 0.0,
                "time": 0.0,
                "weight": 0.0,
                "kv": 0.0,
                "act": 0.0,
                "timing": source,
                "kernel_class": kernel,
            },
        )
        if e["option"] != option:
            e["option"] = "mixed"
        if e["timing"] != source:
            e["timing"] = "mixed"
        e["layers"] += layers
        e["time"] += time
        e["compute"] += compute * layers
        e["memory"] += memory * layers
        e["comm"] += comm
        e["weight"] += weight * on_fullest
        e["kv"] += kv * on_fullest
        e["act"] = max(e["act"], act)


def _breakdown(problem: Problem, plan: Plan, u: Units, a: _Assembled) -> tuple[OpBreakdown, ...]:
    m = problem.model
    t = degree_tables(problem, plan.degrees)
    terms = _terms(problem, u.layout)
    bi_run = int(a.b_index[0])
    per_dp = int(a.per_dp[0])
    fullest = int(a.fullest_stage[0])
    split_reqs = -(-per_dp // t.degrees.tp)
    layers = terms.cs_unit[-1].astype(int)  # (U,)
    on_fullest = (terms.cs_unit[u.ends[0, fullest]] - terms.cs_unit[u.starts[0, fullest]]).astype(
        int
    )
    hops = terms.cs_pair[-1]  # residual hops of each unit pair, over the model
    classes = layer_classes_of(m)
    mixers = len(m.attentions) > 1
    res = u.opts[0, :, t.res_index]
    out: list[OpBreakdown] = []
    for si, step in enumerate(t.steps):
        bi = 0 if step.single else bi_run
        acc = _Rows()
        for ui, (ci, kind_i) in enumerate(
            zip(u.layout.unit_class, u.layout.unit_kind, strict=True)
        ):
            kind = m.kinds[kind_i]
            attn = classes[ci][1]
            ops = layer_ops(m, kind)
            opts = u.opts[0, ui]
            names = [op.name for op in ops]
            comm_in = dict.fromkeys(names, 0.0)  # per layer
            for e, (src, dst) in enumerate(layer_edges(m, kind)):
                s_i, d_i = names.index(src), names.index(dst)
                comm_in[dst] += t.edge_time[si, ci, e, opts[s_i], opts[d_i], bi]
            into = terms.pair_b == ui  # residual hops into this unit's layers, in total
            hop_in = float(
                (t.inter_time[si, res[terms.pair_a[into]], res[ui], bi] * hops[into]).sum()
            )
            for ki, op in enumerate(ops):
                c = t.op_costs[si][ci][ki][int(opts[ki])]
                assert c is not None
                kv = c.kv_bytes_per_req * (split_reqs if c.kv_split_tp else per_dp)
                name = f"{kind}.{op.name}"
                if mixers and op.family in ("kv_cache", "attention"):
                    # Mixers of different kinds hold, cache and read differently.
                    name += f" ({attn.short()})"
                hop = hop_in if ki == t.res_index else 0.0
                acc.add(
                    name,
                    op.options[int(opts[ki])].name,
                    layers=int(layers[ui]),
                    on_fullest=int(on_fullest[ui]),
                    time=(float(c.time_s[bi]) + comm_in[op.name]) * layers[ui] + hop,
                    compute=float(c.compute_s[bi]),
                    memory=float(c.memory_s[bi]) + c.kernel_s,
                    comm=(float(c.comm_s[bi]) + comm_in[op.name]) * layers[ui] + hop,
                    weight=c.weight_bytes,
                    kv=kv,
                    act=float(c.act_bytes[-1]),
                    source=c.source,
                    kernel=kernel_class(op),
                )
        h = u.head[0]
        head_comm = {
            "embedding": t.emb_first[si, h[0], res[terms.first_unit], bi],
            "final_norm": t.last_fnorm[si, res[terms.last_unit], h[1], bi],
            "lm_head": t.fnorm_lm[si, h[1], h[2], bi],
            "sampler": t.lm_sampler[si, h[2], h[3], bi],
        }
        for ki, op in enumerate(HEAD_OPS):
            c = t.head_costs[si][ki][int(h[ki])]
            stage = 0 if ki == 0 else t.degrees.pp - 1
            comm = float(head_comm[op.name])
            draft = float(np.broadcast_to(c.draft_s, c.compute_s.shape)[bi])
            acc.add(
                # speculative decoding's draft passes run with the sampler (as compute)
                f"head.{op.name}" + (" + MTP drafts" if draft else ""),
                op.options[int(h[ki])].name,
                on_fullest=int(stage == fullest),
                time=float(c.time_s[bi]) + comm,
                compute=float(c.compute_s[bi]) + draft,
                memory=float(c.memory_s[bi]) + c.kernel_s,
                comm=comm,
                weight=c.weight_bytes,
                act=float(c.act_bytes[-1]),
                source=c.source,
                kernel=kernel_class(op),
            )
        for s in range(t.degrees.pp - 1):
            last = int(res[terms.layer_unit[int(u.ends[0, s]) - 1]])
            hop = float(t.p2p[si, s, last, bi])
            acc.add("pipeline.p2p", "send", time=hop, comm=hop)
        for name, e in acc.acc.items():
            out.append(
                OpBreakdown(
                    step=step.kind,
                    name=name,
                    option=e["option"],
                    layers=e["layers"],
                    compute_ms=e["compute"] * 1e3,
                    memory_ms=e["memory"] * 1e3,
                    comm_ms=e["comm"] * 1e3,
                    time_ms=e["time"] * 1e3,
                    weight_gb=e["weight"] / 1e9,
                    kv_gb=e["kv"] / 1e9,
                    act_gb=e["act"] / 1e9,
                    timing=e["timing"],
                    kernel_class=e["kernel_class"],
                )
            )
    return tuple(out)
