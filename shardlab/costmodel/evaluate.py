"""Scalar and batched evaluation of plans: one implementation of the arithmetic.

Both paths call :func:`_assemble`, which works on arrays of plans sharing one degree
tuple; the scalar path adds the per-operator breakdown. Definitions:

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
  kernel tables, the least latency). TPOT is the mixed round; TTFT is a round plus the prefill of
  one prompt through the pipeline; throughput is requests in flight / TPOT (prefill
  phase: input tokens per round).
- Memory per GPU: the stage's weights, the KV cache of the stage's layers for the
  requests the GPU holds, the activation workspace of the largest micro-batch step
  (engines reserve it at start-up) and a runtime reserve, as the serving engine
  budgets them (its KV-cache share, :mod:`shardlab.costmodel.engines`), against HBM
  capacity; ``memory_gb_per_gpu`` is that budget, its parts are the bytes themselves.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import numpy as np

from shardlab.costmodel.constants import RUNTIME_RESERVE_GB
from shardlab.costmodel.opcosts import kernel_class
from shardlab.costmodel.regimes import judge, timing
from shardlab.costmodel.tables import DegreeTables, degree_tables, layer_classes_of
from shardlab.errors import ShardlabError
from shardlab.problems.operators import HEAD_OPS, layer_edges, layer_ops
from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem
from shardlab.problems.space import SearchSpace

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
class Units:
    """Plans expressed per unit (a set of layers with the same options and class)."""

    opts: np.ndarray  # (n, U, K) option index per unit and operator
    layer_unit: np.ndarray  # (L,) unit of each layer
    unit_class: np.ndarray  # (U,) index into DegreeTables.classes
    unit_kind: np.ndarray  # (U,) index into DegreeTables.kinds
    head: np.ndarray  # (n, 4) head option indices
    starts: np.ndarray  # (n, pp) first layer of each stage
    ends: np.ndarray  # (n, pp) one past the last layer


def _stage_bounds(stage_layers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ends = np.cumsum(stage_layers, axis=1)
    return ends - stage_layers, ends


def units_of_plan(problem: Problem, tables: DegreeTables, plan: Plan) -> Units:
    m = problem.model
    k = tables.n_ops
    opts = np.zeros((1, m.num_layers, k), dtype=np.int64)
    for layer, names in enumerate(plan.layer_options):
        for i, (op, name) in enumerate(zip(layer_ops(m, m.layer_kinds[layer]), names, strict=True)):
            opts[0, layer, i] = op.option_names.index(name)
    classes = {c: i for i, c in enumerate(tables.classes)}
    kinds = {c: i for i, c in enumerate(tables.kinds)}
    unit_class = np.array([classes[c] for c in zip(m.layer_kinds, m.attention_layers, strict=True)])
    head = np.array(
        [[op.option_names.index(n) for op, n in zip(HEAD_OPS, plan.head_options, strict=True)]]
    )
    starts, ends = _stage_bounds(np.array([plan.stage_layers]))
    return Units(
        opts=opts,
        layer_unit=np.arange(m.num_layers),
        unit_class=unit_class,
        unit_kind=np.array([kinds[k_] for k_ in m.layer_kinds]),
        head=head,
        starts=starts,
        ends=ends,
    )


@dataclass(frozen=True)
class _SpaceUnits:
    """How a space's encoding maps onto units (fixed per space)."""

    var_index: np.ndarray  # (U, K) column of the code holding each unit's option (-1: pad)
    layer_unit: np.ndarray
    unit_class: np.ndarray
    unit_kind: np.ndarray
    head_vars: np.ndarray  # (4,)


@lru_cache(maxsize=64)
def _space_units(space: SearchSpace) -> _SpaceUnits:
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
    return _SpaceUnits(
        var_index=np.array(rows),
        layer_unit=layer_unit,
        unit_class=np.array(unit_class),
        unit_kind=np.array(unit_kind),
        head_vars=offsets["head"] + np.arange(len(HEAD_OPS)),
    )


def units_of_codes(space: SearchSpace, tables: DegreeTables, codes: np.ndarray) -> Units:
    su = _space_units(space)
    padded = np.concatenate([codes, np.zeros((len(codes), 1), dtype=codes.dtype)], axis=1)
    opts = padded[:, su.var_index]  # -1 reads the zero column
    pp = tables.degrees.pp
    starts, ends = _stage_bounds(space.stage_layers_batch(pp, codes[:, space.first_cut :]))
    return Units(
        opts=opts,
        layer_unit=su.layer_unit,
        unit_class=su.unit_class,
        unit_kind=su.unit_kind,
        head=codes[:, su.head_vars],
        starts=starts,
        ends=ends,
    )


# -- the arithmetic --------------------------------------------------------------------


def _counts(keys: np.ndarray, n_keys: int, u: Units) -> np.ndarray:
    """``(n, pp, n_keys)``: how many positions of each key fall in each stage.

    ``keys[l]`` is the key of layer position ``l`` (a unit, or a unit pair for the
    residual edge into layer ``l``; -1 for none). Stage sums of any per-key quantity
    are then one product, whatever the number of layers.
    """
    onehot = np.zeros((len(keys) + 1, n_keys))
    valid = keys >= 0
    onehot[1:][np.flatnonzero(valid), keys[valid]] = 1.0
    cs = np.cumsum(onehot, axis=0)
    return cs[u.ends] - cs[u.starts]


@dataclass(frozen=True)
class _Assembled:
    metrics: BatchMetrics
    b_index: np.ndarray  # (n,) index into the tables' b of the chosen concurrency
    per_dp: np.ndarray  # (n,) requests per dp rank: the chosen concurrency
    stage_times: list[np.ndarray]  # per step: (n, pp) at the chosen concurrency
    fullest_stage: np.ndarray
    curves: dict[str, np.ndarray]  # every candidate concurrency: (n, J) each


def _capacity(
    base: np.ndarray, kv_full: np.ndarray, kv_split: np.ndarray, tp: int, hbm: float, top: int
) -> np.ndarray:
    """``(n,)``: the most requests per dp rank (at most ``top``; 0 for none) whose memory
    fits on every stage. Memory grows with the requests, so a bisection finds it."""
    n = len(base)
    lo = np.zeros(n, dtype=np.int64)
    hi = np.full(n, top, dtype=np.int64)
    while (active := lo < hi).any():
        mid = (lo + hi + 1) // 2
        mem = base + kv_full * mid[:, None] + kv_split * (-(-mid // tp))[:, None]
        ok = (mem <= hbm).all(axis=1)
        lo = np.where(active & ok, mid, lo)
        hi = np.where(active & ~ok, mid - 1, hi)
    return lo


def _assemble(
    problem: Problem, t: DegreeTables, u: Units, per_dp: np.ndarray | None = None
) -> _Assembled:
    """Metrics of the plans ``u`` (one degree tuple) at ``per_dp`` requests per dp rank,
    or, when None, at the concurrency each plan does best with (see the module
    docstring; the static schedule runs its batch)."""
    d = t.degrees
    n = len(u.opts)
    n_units = len(u.unit_class)
    cls = u.unit_class[None, :, None]
    kk = np.arange(t.n_ops)[None, None, :]
    rows = np.arange(n)
    unit_count = _counts(u.layer_unit, n_units, u)  # (n, pp, U)
    # Residual edge into layer l (l >= 1) keyed by the pair (unit of l-1, unit of l).
    pair_of = u.layer_unit[:-1] * n_units + u.layer_unit[1:]
    pairs, pair_key = np.unique(pair_of, return_inverse=True)
    pair_count = _counts(np.concatenate([[-1], pair_key]), len(pairs), u)  # (n, pp, P)
    res_u = u.opts[:, :, t.res_index]  # (n, U) residual option per unit
    res_a, res_b = res_u[:, pairs // n_units], res_u[:, pairs % n_units]  # (n, P)

    def per_stage(per_unit: np.ndarray) -> np.ndarray:
        return np.einsum("rsu,ru->rs", unit_count, per_unit)

    # -- memory --------------------------------------------------------------------
    kv = t.op_kv[cls, kk, u.opts]
    split = t.op_kv_split[cls, kk, u.opts]
    w_stage = per_stage(t.op_weight[cls, kk, u.opts].sum(-1))
    kvf_stage = per_stage(np.where(split, 0.0, kv).sum(-1))
    kvs_stage = per_stage(np.where(split, kv, 0.0).sum(-1))
    hi = np.arange(len(HEAD_OPS))[None, :]
    head_w = t.head_weight[hi, u.head]
    w_stage[:, 0] += head_w[:, 0]
    w_stage[:, -1] += head_w[:, 1:].sum(1)
    last_b = len(t.b) - 1
    act = np.zeros(n)
    for si, step in enumerate(t.steps):
        at = 0 if step.single else last_b
        unit_act = t.op_act[si][cls, kk, u.opts, at].max(axis=(1, 2))
        head_act = t.head_act[si][hi, u.head, at].max(1)
        act = np.maximum(act, np.maximum(unit_act, head_act))
    hbm = problem.cluster.accelerator.hbm_gb * 1e9
    # as the engine budgets it (shardlab.costmodel.engines)
    e = t.engine
    base = w_stage * e.weight_scale + (RUNTIME_RESERVE_GB * 1e9 + act[:, None]) * e.reserve_scale
    kvf_charged, kvs_charged = kvf_stage * e.kv_scale, kvs_stage * e.kv_scale
    bt = t.batching
    capacity = _capacity(base, kvf_charged, kvs_charged, d.tp, hbm, bt.per_dp_max)

    # -- candidate concurrencies: (rows or 1, J), and the b column each one reads --------
    if per_dp is not None:
        cand = np.asarray(per_dp, dtype=np.int64).reshape(n, 1)
        b_sel = t.b_index(bt.b_of(cand, d.pp))  # (n, 1)
        col = np.zeros(1, dtype=np.int64)
    elif bt.inflight:
        top = max(int(capacity.max()), 1)  # no plan holds more
        cand = np.arange(1, top + 1)[None, :]
        b_run = bt.b_of(cand[0], d.pp)
        b_sel = t.b_index(np.arange(1, int(b_run[-1]) + 1))[None, :]
        col = t.b_index(b_run)
    else:
        cand = np.array([[bt.per_dp_max]])
        b_sel = t.b_index(bt.b_of(cand, d.pp))
        col = np.zeros(1, dtype=np.int64)

    # -- time per step and stage, at each b column ----------------------------------------
    edge_src = np.zeros((n_units, t.n_edges), dtype=np.int64)
    edge_dst = np.zeros_like(edge_src)
    for ui, kind_i in enumerate(u.unit_kind):
        for k_, (s_, d_) in enumerate(t.edges[t.kinds[kind_i]]):
            edge_src[ui, k_], edge_dst[ui, k_] = s_, d_
    uu = np.arange(n_units)[None, :, None]
    src = u.opts[rows[:, None, None], uu, edge_src[None]]
    dst = u.opts[rows[:, None, None], uu, edge_dst[None]]
    ee = np.arange(t.n_edges)[None, None, :]
    last_layer = u.ends[:, :-1] - 1  # (n, pp - 1)
    res_last = res_u[rows[:, None], u.layer_unit[last_layer]]
    h = u.head
    res_first = res_u[:, u.layer_unit[0]]
    res_end = res_u[:, u.layer_unit[-1]]

    def stage_times(si: int, b: np.ndarray) -> np.ndarray:
        """``(n, pp, B)``: step ``si``'s stage times at b indices ``b`` (rows or 1, B)."""
        b3 = b[:, None, None, :]
        unit_t = t.op_time[si][cls[..., None], kk[..., None], u.opts[..., None], b3].sum(2)
        unit_t = unit_t + t.edge_time[si][
            cls[..., None], ee[..., None], src[..., None], dst[..., None], b3
        ].sum(2)  # (n, U, B)
        st = np.einsum("rsu,rub->rsb", unit_count, unit_t)
        st += np.einsum(
            "rsp,rpb->rsb",
            pair_count,
            t.inter_time[si][res_a[..., None], res_b[..., None], b[:, None, :]],
        )
        c1 = lambda x: x[:, None]  # noqa: E731 (a row's option against the b columns)
        st[:, 0] += (
            t.head_time[si][0, c1(h[:, 0]), b] + t.emb_first[si][c1(h[:, 0]), c1(res_first), b]
        )
        st[:, -1] += (
            t.head_time[si][1, c1(h[:, 1]), b]
            + t.head_time[si][2, c1(h[:, 2]), b]
            + t.head_time[si][3, c1(h[:, 3]), b]
            + t.last_fnorm[si][c1(res_end), c1(h[:, 1]), b]
            + t.fnorm_lm[si][c1(h[:, 1]), c1(h[:, 2]), b]
            + t.lm_sampler[si][c1(h[:, 2]), c1(h[:, 3]), b]
        )
        if d.pp > 1:
            st[:, :-1] += t.p2p[si][
                np.arange(d.pp - 1)[None, :, None], res_last[:, :, None], b[:, None, :]
            ]
        return st

    single = np.zeros((1, 1), dtype=np.int64)
    per_step = [stage_times(si, single if s.single else b_sel) for si, s in enumerate(t.steps)]
    cols = [np.zeros_like(col) if s.single else col for s in t.steps]
    sums = [st.sum(1)[:, k] for st, k in zip(per_step, cols, strict=True)]
    maxes = [st.max(1)[:, k] for st, k in zip(per_step, cols, strict=True)]

    # -- regimes at every candidate, and the best one per plan ------------------------------
    tm = timing(problem, d, t.steps, bt.per_replica, cand, sums, maxes)
    fits = cand <= capacity[:, None]
    j = judge(problem, tm, np.broadcast_to(fits, sums[0].shape))
    if sums[0].shape[1] == 1:
        pick = np.zeros(n, dtype=np.int64)
    else:  # the best feasible concurrency; none: one request, the nearest to feasible
        score = np.where(j.feasible, j.objective, -np.inf)
        top = score.max(axis=1, keepdims=True)
        # of (near-)ties the fewest requests, whatever the float order of the sums
        near = score >= top - TIE * np.abs(top)
        pick = np.where(j.feasible.any(axis=1), near.argmax(axis=1), 0)

    def chosen(x: np.ndarray) -> np.ndarray:
        return np.broadcast_to(x, sums[0].shape)[rows, pick]

    c = chosen(cand)
    memory_ok = chosen(fits)
    splits = -(-c // d.tp)
    mem_stage = base + kvf_charged * c[:, None] + kvs_charged * splits[:, None]
    fullest = mem_stage.argmax(axis=1)
    memory = mem_stage[rows, fullest]
    kv_gb = (kvf_stage[rows, fullest] * c + kvs_stage[rows, fullest] * splits) / 1e9
    b_chosen = col[pick]
    stage_at = [
        st[:, :, 0] if s.single else st[rows, :, b_chosen]
        for st, s in zip(per_step, t.steps, strict=True)
    ]
    gpus = problem.cluster.num_gpus
    throughput = chosen(tm.throughput)
    metrics = BatchMetrics(
        feasible=chosen(j.feasible),
        objective=chosen(j.objective),
        ttft_ms=chosen(tm.ttft_s) * 1e3,
        tpot_ms=chosen(tm.tpot_s) * 1e3,
        latency_ms=chosen(tm.latency_s) * 1e3,
        throughput_tok_s=throughput,
        throughput_tok_s_per_gpu=throughput / gpus,
        memory_gb_per_gpu=memory / 1e9,
        num_gpus=np.full(n, gpus),
        concurrency=chosen(tm.concurrency).astype(np.int64),
        requests_per_rank=c.astype(np.int64),
        capacity_per_rank=capacity,
        weights_gb=w_stage[rows, fullest] / 1e9,
        kv_cache_gb=kv_gb,
        activations_gb=act / 1e9,
        memory_violation=~memory_ok,
        ttft_violation=chosen(j.ttft_violation),
        tpot_violation=chosen(j.tpot_violation),
    )
    b_index = np.asarray(b_sel)[0 if b_sel.shape[0] == 1 else rows, b_chosen]
    shape = sums[0].shape
    curves = {
        "per_rank": np.broadcast_to(cand, shape),
        "feasible": j.feasible,
        "throughput_tok_s_per_gpu": tm.throughput / gpus,
        "ttft_ms": tm.ttft_s * 1e3,
        "tpot_ms": tm.tpot_s * 1e3,
    }
    return _Assembled(metrics, b_index, c, stage_at, fullest, curves)


# -- public entry points ---------------------------------------------------------------


def prepare(problem: Problem, degrees: Degrees) -> None:
    """Build the cost tables of one degree tuple (kept for later calls): the slow part
    of pricing the first plan with these degrees, for callers that watch a clock."""
    degree_tables(problem, degrees)


# Objectives this close (relative) are a tie between concurrencies: the fewest wins.
TIE = 1e-9

# Table entries one pass of the free-concurrency search gathers (rows x units x
# operators x b columns): keeps its arrays to tens of MB.
GATHER_CHUNK = 1 << 22


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
    in flight one per concurrency each plan can run (the trade-off a Pareto front is
    over); static, each plan's one point."""
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
    order = np.argsort(codes[:, 0], kind="stable")
    starts = np.flatnonzero(np.diff(codes[order, 0], prepend=-1))
    parts: list[BatchMetrics] = []
    found: list[tuple[np.ndarray, ...]] = []
    point_fields = [f for f in ConcurrencyPoints.__dataclass_fields__ if f != "row"]
    for group in np.split(order, starts[1:]):
        tables = degree_tables(problem, space.degree_tuples[int(codes[group[0], 0])])
        width = len(_space_units(space).unit_class) * tables.n_ops * len(tables.b)
        step = len(group) if per_rank is not None else max(1, GATHER_CHUNK // width)
        for i in range(0, len(group), step):
            rows = group[i : i + step]
            units = units_of_codes(space, tables, codes[rows])
            fixed = None if per_rank is None else _requests(problem, tables, per_rank[rows])
            a = _assemble(problem, tables, units, fixed)
            parts.append(a.metrics)
            if points:
                r, k = np.nonzero(a.curves["feasible"])
                found.append((rows[r], *(a.curves[f][r, k] for f in point_fields)))
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    metrics = BatchMetrics(
        **{
            name: np.concatenate([getattr(part, name) for part in parts])[inverse]
            for name in BatchMetrics.__dataclass_fields__
        }
    )
    if not points:
        return metrics, None
    return metrics, ConcurrencyPoints(*(np.concatenate(c) for c in zip(*found, strict=True)))


def _requests(problem: Problem, t: DegreeTables, per_rank: np.ndarray) -> np.ndarray:
    """Requests per dp rank given to a plan, checked against what the workload offers."""
    per_rank = np.asarray(per_rank, dtype=np.int64)
    bt = t.batching
    if not bt.inflight:
        if (per_rank != bt.per_dp_max).any():
            raise ShardlabError(
                f"plan concurrency {int(per_rank[0])} per rank: the static schedule runs "
                f"its batch ({bt.per_dp_max} per attention-DP rank); drop the plan's "
                "'concurrency' or use --schedule inflight"
            )
        return per_rank
    if (per_rank < 1).any() or (per_rank > bt.per_dp_max).any():
        raise ShardlabError(
            f"plan concurrency {int(per_rank.max())} per rank is more than this workload "
            f"offers an attention-DP rank under {t.degrees.short()} ({bt.per_dp_max}: "
            "--batch over replicas and dp_attn, the engine's max batch and max tokens); "
            "raise --batch or lower the plan's 'concurrency'"
        )
    return per_rank


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
    t = degree_tables(problem, plan.degrees)
    held = _assemble(problem, t, units_of_plan(problem, t, plan)).metrics.capacity_per_rank[0]
    return dataclasses.replace(plan, concurrency=max(int(held), 1))


def evaluate(problem: Problem, plan: Plan) -> Metrics:
    """Evaluate one plan, with the per-operator breakdown: at its ``concurrency`` when
    it has one, else at the concurrency it does best with."""
    tables = degree_tables(problem, plan.degrees)
    units = units_of_plan(problem, tables, plan)
    fixed = None
    if plan.concurrency is not None:
        fixed = _requests(problem, tables, np.array([plan.concurrency]))
    a = _assemble(problem, tables, units, fixed)
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
        breakdown=_breakdown(problem, tables, plan, units, a),
    )


def _breakdown(
    problem: Problem, t: DegreeTables, plan: Plan, u: Units, a: _Assembled
) -> tuple[OpBreakdown, ...]:
    m = problem.model
    bi = int(a.b_index[0])
    per_dp = int(a.per_dp[0])
    fullest = int(a.fullest_stage[0])
    stage_of = plan.stage_of_layer()
    split_reqs = -(-per_dp // t.degrees.tp)
    out: list[OpBreakdown] = []
    b_run = bi
    for si, step in enumerate(t.steps):
        bi = 0 if step.single else b_run
        acc: dict[str, dict] = {}

        def add(
            name: str,
            option: str,
            *,
            layer_on_fullest: bool,
            time: float,
            compute=0.0,
            memory=0.0,
            comm=0.0,
            weight=0.0,
            kv=0.0,
            act=0.0,
            source="roofline",
            kernel=None,
            _acc=acc,
        ) -> None:
            e = _acc.setdefault(
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
            e["layers"] += 1
            e["time"] += time
            e["compute"] += compute
            e["memory"] += memory
            e["comm"] += comm
            if layer_on_fullest:
                e["weight"] += weight
                e["kv"] += kv
            e["act"] = max(e["act"], act)

        for layer in range(m.num_layers):
            kind = m.layer_kinds[layer]
            ci = int(u.unit_class[layer])
            ops = layer_ops(m, kind)
            opts = u.opts[0, layer]
            on_fullest = stage_of[layer] == fullest
            names = [op.name for op in ops]
            comm_in = dict.fromkeys(names, 0.0)
            for e, (src, dst) in enumerate(layer_edges(m, kind)):
                s_i, d_i = names.index(src), names.index(dst)
                comm_in[dst] += t.edge_time[si, ci, e, opts[s_i], opts[d_i], bi]
            if layer > 0:
                prev = int(u.opts[0, layer - 1, t.res_index])
                comm_in["residual"] += t.inter_time[si, prev, opts[t.res_index], bi]
            for ki, op in enumerate(ops):
                c = t.op_costs[si][ci][ki][int(opts[ki])]
                assert c is not None
                kv = c.kv_bytes_per_req * (split_reqs if c.kv_split_tp else per_dp)
                name = f"{kind}.{op.name}"
                if op.family in ("kv_cache", "attention") and len(m.attentions) > 1:
                    # Mixers of different kinds hold, cache and read differently.
                    name += f" ({m.attention_layers[layer].short()})"
                add(
                    name,
                    op.options[int(opts[ki])].name,
                    layer_on_fullest=on_fullest,
                    time=float(c.time_s[bi]) + comm_in[op.name],
                    compute=float(c.compute_s[bi]),
                    memory=float(c.memory_s[bi]) + c.kernel_s,
                    comm=float(c.comm_s[bi]) + comm_in[op.name],
                    weight=c.weight_bytes,
                    kv=kv,
                    act=float(c.act_bytes[-1]),
                    source=c.source,
                    kernel=kernel_class(op),
                )
        h = u.head[0]
        res = u.opts[0, :, t.res_index]
        head_comm = {
            "embedding": 0.0,
            "final_norm": t.last_fnorm[si, res[-1], h[1], bi],
            "lm_head": t.fnorm_lm[si, h[1], h[2], bi],
            "sampler": t.lm_sampler[si, h[2], h[3], bi],
        }
        comm_first = t.emb_first[si, h[0], res[0], bi]
        for ki, op in enumerate(HEAD_OPS):
            c = t.head_costs[si][ki][int(h[ki])]
            stage = 0 if ki == 0 else t.degrees.pp - 1
            comm = head_comm[op.name] + (comm_first if ki == 0 else 0.0)
            draft = float(np.broadcast_to(c.draft_s, c.compute_s.shape)[bi])
            add(
                # speculative decoding's draft passes run with the sampler (as compute)
                f"head.{op.name}" + (" + MTP drafts" if draft else ""),
                op.options[int(h[ki])].name,
                layer_on_fullest=stage == fullest,
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
            last = int(res[int(u.ends[0, s]) - 1])
            hop = float(t.p2p[si, s, last, bi])
            add("pipeline.p2p", "send", layer_on_fullest=False, time=hop, comm=hop)
        for name, e in acc.items():
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
