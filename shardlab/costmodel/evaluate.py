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
- ``inflight`` schedule: concurrency per rank is the most requests whose KV cache fits
  (at most the offered batch); TPOT is the mixed round; TTFT is a round plus the
  prefill of one prompt through the pipeline; throughput is requests in flight / TPOT
  (prefill phase: input tokens per round).
- Memory per GPU: the stage's weights, the KV cache of the stage's layers for the
  requests the GPU holds, the activation workspace of the largest micro-batch step
  (engines reserve it at start-up) and a runtime reserve, as the serving engine
  budgets them (its KV-cache share, :mod:`shardlab.costmodel.engines`), against HBM
  capacity; ``memory_gb_per_gpu`` is that budget, its parts are the bytes themselves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache

import numpy as np

from shardlab.costmodel.constants import RUNTIME_RESERVE_GB
from shardlab.costmodel.opcosts import kernel_class
from shardlab.costmodel.regimes import judge, timing
from shardlab.costmodel.tables import DegreeTables, degree_tables, layer_classes_of
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
    unit_class = np.array(
        [classes[c] for c in zip(m.layer_kinds, m.attention_windows, strict=True)]
    )
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
            key = (g.key, classes[(m.layer_kinds[layer], m.attention_windows[layer])])
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
    b_index: np.ndarray
    per_dp: np.ndarray  # requests per dp rank
    stage_times: list[np.ndarray]  # per step: (n, pp)
    fullest_stage: np.ndarray


def _assemble(problem: Problem, t: DegreeTables, u: Units) -> _Assembled:
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
    if bt.inflight:
        cand = np.arange(1, bt.per_dp_max + 1)
        splits = -(-cand // d.tp)
        mem = (
            base[:, :, None]
            + kvf_charged[:, :, None] * cand[None, None, :]
            + kvs_charged[:, :, None] * splits[None, None, :]
        )
        fits = (mem <= hbm).all(axis=1)
        per_dp = np.maximum(fits.sum(axis=1), 1)
        memory_ok = fits[:, 0]
    else:
        per_dp = np.full(n, bt.per_dp_max)
        memory_ok = np.ones(n, dtype=bool)
    mem_stage = base + kvf_charged * per_dp[:, None] + kvs_charged * (-(-per_dp // d.tp))[:, None]
    if not bt.inflight:
        memory_ok = (mem_stage <= hbm).all(axis=1)
    fullest = mem_stage.argmax(axis=1)
    memory = mem_stage[rows, fullest]
    kv_gb = (
        kvf_stage[rows, fullest] * per_dp + kvs_stage[rows, fullest] * -(-per_dp // d.tp)
    ) / 1e9

    # -- time per step -----------------------------------------------------------------
    b = bt.b_of(per_dp, d.pp)
    bi = t.b_index(b)
    edge_src = np.zeros((n_units, t.n_edges), dtype=np.int64)
    edge_dst = np.zeros_like(edge_src)
    for ui, kind_i in enumerate(u.unit_kind):
        for e, (s_, d_) in enumerate(t.edges[t.kinds[kind_i]]):
            edge_src[ui, e], edge_dst[ui, e] = s_, d_
    uu = np.arange(n_units)[None, :, None]
    src = u.opts[rows[:, None, None], uu, edge_src[None]]
    dst = u.opts[rows[:, None, None], uu, edge_dst[None]]
    ee = np.arange(t.n_edges)[None, None, :]
    uk = u.unit_kind[None, :, None]
    last_layer = u.ends[:, :-1] - 1  # (n, pp - 1)
    res_last = res_u[rows[:, None], u.layer_unit[last_layer]]
    h = u.head
    res_first = res_u[:, u.layer_unit[0]]
    res_end = res_u[:, u.layer_unit[-1]]
    # All steps at once: step s reads its tables at b (one request for single steps).
    ns = len(t.steps)
    sx = np.arange(ns)[:, None]
    bis = np.stack([np.zeros_like(bi) if st_.single else bi for st_ in t.steps])  # (ns, n)
    b4 = bis[:, :, None, None]
    s4 = sx[:, :, None, None]
    unit_t = t.op_time[s4, cls[None], kk[None], u.opts[None], b4].sum(-1) + t.edge_time[
        s4, uk[None], ee[None], src[None], dst[None], b4
    ].sum(-1)  # (ns, n, U)
    st_all = np.einsum("rsu,kru->krs", unit_count, unit_t)
    st_all += np.einsum(
        "rsp,krp->krs",
        pair_count,
        t.inter_time[sx[:, :, None], res_a[None], res_b[None], bis[:, :, None]],
    )
    st_all[:, :, 0] += (
        t.head_time[sx, 0, h[None, :, 0], bis]
        + t.emb_first[sx, h[None, :, 0], res_first[None], bis]
    )
    st_all[:, :, -1] += (
        t.head_time[sx, 1, h[None, :, 1], bis]
        + t.head_time[sx, 2, h[None, :, 2], bis]
        + t.head_time[sx, 3, h[None, :, 3], bis]
        + t.last_fnorm[sx, res_end[None], h[None, :, 1], bis]
        + t.fnorm_lm[sx, h[None, :, 1], h[None, :, 2], bis]
        + t.lm_sampler[sx, h[None, :, 2], h[None, :, 3], bis]
    )
    if d.pp > 1:
        st_all[:, :, :-1] += t.p2p[
            sx[:, :, None], np.arange(d.pp - 1)[None, None, :], res_last[None], bis[:, :, None]
        ]
    stage_times = list(st_all)
    sums = list(st_all.sum(2))
    maxes = list(st_all.max(2))

    # -- regimes ---------------------------------------------------------------------------
    tm = timing(problem, d, t.steps, bt.per_replica, per_dp, sums, maxes)
    j = judge(problem, tm, memory_ok)
    gpus = problem.cluster.num_gpus
    metrics = BatchMetrics(
        feasible=j.feasible,
        objective=j.objective,
        ttft_ms=tm.ttft_s * 1e3,
        tpot_ms=tm.tpot_s * 1e3,
        latency_ms=tm.latency_s * 1e3,
        throughput_tok_s=tm.throughput,
        throughput_tok_s_per_gpu=tm.throughput / gpus,
        memory_gb_per_gpu=memory / 1e9,
        num_gpus=np.full(n, gpus),
        concurrency=tm.concurrency.astype(np.int64),
        weights_gb=w_stage[rows, fullest] / 1e9,
        kv_cache_gb=kv_gb,
        activations_gb=act / 1e9,
        memory_violation=~memory_ok,
        ttft_violation=j.ttft_violation,
        tpot_violation=j.tpot_violation,
    )
    return _Assembled(metrics, bi, per_dp, stage_times, fullest)


# -- public entry points ---------------------------------------------------------------


def prepare(problem: Problem, degrees: Degrees) -> None:
    """Build the cost tables of one degree tuple (kept for later calls): the slow part
    of pricing the first plan with these degrees, for callers that watch a clock."""
    degree_tables(problem, degrees)


def evaluate_batch(problem: Problem, codes: np.ndarray, *, check: bool = True) -> BatchMetrics:
    """Evaluate encoded plans (rows of ``problem.space``'s encoding).

    ``check=False`` skips the validity check, for callers whose codes come from the
    space's own sampling and masks.
    """
    space = problem.space
    codes = np.atleast_2d(np.asarray(codes, dtype=np.int64))
    if check:
        valid = space.is_valid(codes)
        if not valid.all():
            bad = int(np.flatnonzero(~valid)[0])
            raise ValueError(f"row {bad} is not a valid encoding; use SearchSpace.repair()")
    order = np.argsort(codes[:, 0], kind="stable")
    starts = np.flatnonzero(np.diff(codes[order, 0], prepend=-1))
    parts = []
    for rows in np.split(order, starts[1:]):
        tables = degree_tables(problem, space.degree_tuples[int(codes[rows[0], 0])])
        parts.append(_assemble(problem, tables, units_of_codes(space, tables, codes[rows])).metrics)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return BatchMetrics(
        **{
            name: np.concatenate([getattr(part, name) for part in parts])[inverse]
            for name in BatchMetrics.__dataclass_fields__
        }
    )


def evaluate(problem: Problem, plan: Plan) -> Metrics:
    """Evaluate one plan, with the per-operator breakdown."""
    tables = degree_tables(problem, plan.degrees)
    units = units_of_plan(problem, tables, plan)
    a = _assemble(problem, tables, units)
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
            kind_i = t.kinds.index(kind)
            ops = layer_ops(m, kind)
            opts = u.opts[0, layer]
            on_fullest = stage_of[layer] == fullest
            names = [op.name for op in ops]
            comm_in = dict.fromkeys(names, 0.0)
            for e, (src, dst) in enumerate(layer_edges(m, kind)):
                s_i, d_i = names.index(src), names.index(dst)
                comm_in[dst] += t.edge_time[si, kind_i, e, opts[s_i], opts[d_i], bi]
            if layer > 0:
                prev = int(u.opts[0, layer - 1, t.res_index])
                comm_in["residual"] += t.inter_time[si, prev, opts[t.res_index], bi]
            for ki, op in enumerate(ops):
                c = t.op_costs[si][ci][ki][int(opts[ki])]
                assert c is not None
                kv = c.kv_bytes_per_req * (split_reqs if c.kv_split_tp else per_dp)
                add(
                    f"{kind}.{op.name}",
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
            add(
                f"head.{op.name}",
                op.options[int(h[ki])].name,
                layer_on_fullest=stage == fullest,
                time=float(c.time_s[bi]) + comm,
                compute=float(c.compute_s[bi]),
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
