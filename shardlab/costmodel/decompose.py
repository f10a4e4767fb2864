"""The cost of a plan as integer tables, for exact search (CP-SAT).

For a fixed degree tuple and a fixed number of requests per attention-data-parallel
rank (``requests_per_rank``: the static batch, or one candidate concurrency in flight), the time
of every step is, per pipeline stage, a sum of table entries:

    stage time = sum over its layers of (chosen option of each operator
                                         + redistribution on each edge of the layer
                                         + residual redistribution from the layer before)
                 + the model's ends (first stage: embedding and its edge; last stage:
                   final norm, LM head, sampler and their edges)
                 + the send of the residual stream to the next stage

and memory per GPU is ``weights + KV per request * requests + workspace + reserve``
with weights and KV sums of option entries and the workspace the largest entry among
the chosen options. :func:`shardlab.costmodel.regimes.latencies` turns the per-step sums
and maxima over stages into TTFT, TPOT and throughput.

Rounding: times are integer nanoseconds, memory integer bytes, each entry rounded to
the nearest unit. A plan's stage time is off by at most half a nanosecond per entry
it sums (a few hundred entries: well under a microsecond, against steps of
milliseconds); memory by at most half a byte per entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.costmodel.constants import RUNTIME_RESERVE_GB
from shardlab.costmodel.pricing import assemble_plan
from shardlab.costmodel.regimes import Latencies, latencies
from shardlab.costmodel.tables import degree_tables
from shardlab.problems.operators import HEAD_OPS, LAST_STAGE_HEADS, Head, layer_ops
from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem


def _ns(seconds: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(seconds) * 1e9).astype(np.int64)


def _bytes(values: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(values)).astype(np.int64)


@dataclass(frozen=True, kw_only=True)
class IntegerTables:
    """Integer cost tables of one degree tuple at ``requests_per_rank`` requests per dp rank.

    Indices: ``step`` into :attr:`steps`; ``cls`` into :attr:`classes` (layer kind,
    span); ``kind`` into :attr:`kinds`; ``op`` into that kind's operators
    (:func:`layer_ops`); ``opt`` into the operator's options; ``edge`` into
    :attr:`edges` of the kind; ``stage`` into the pipeline's boundaries.
    """

    degrees: Degrees
    requests_per_rank: int
    steps: tuple  # the workload's Step objects
    classes: tuple
    kinds: tuple
    edges: dict  # kind -> ((producer op index, consumer op index), ...)
    op_ns: np.ndarray  # (step, cls, op, opt)
    edge_ns: np.ndarray  # (step, class, edge, opt, opt)
    inter_ns: np.ndarray  # (step, residual opt of layer l-1, residual opt of layer l)
    head_ns: np.ndarray  # (step, head op (a Head), opt)
    emb_first_ns: np.ndarray  # (step, embedding opt, residual opt of layer 0)
    last_fnorm_ns: np.ndarray  # (step, residual opt of the last layer, final_norm opt)
    fnorm_lm_ns: np.ndarray  # (step, final_norm opt, lm_head opt)
    lm_sampler_ns: np.ndarray  # (step, lm_head opt, sampler opt)
    p2p_ns: np.ndarray  # (step, stage boundary, residual opt of the stage's last layer)
    weight_bytes: np.ndarray  # (cls, op, opt) per GPU
    kv_bytes: np.ndarray  # (cls, op, opt) per GPU for the requests it holds
    act_bytes: np.ndarray  # (cls, op, opt) workspace
    head_weight_bytes: np.ndarray  # (head op (a Head), opt)
    head_act_bytes: np.ndarray  # (head op (a Head), opt)
    reserve_bytes: int
    hbm_bytes: int


def time_ns(
    problem: Problem, degrees: Degrees, requests_per_rank: np.ndarray, *, floor: bool = False
) -> dict[str, np.ndarray]:
    """The time tables of :class:`IntegerTables` for several concurrencies at once: each
    table gains a trailing axis, one entry per value of ``requests_per_rank``. ``floor``: each
    entry is the least over that concurrency and every larger one
    (:meth:`~shardlab.costmodel.tables.DegreeTables.floor`), a lower bound valid for
    all of them."""
    t = degree_tables(problem, degrees)
    bi = t.b_index(t.request_range.b_of(np.asarray(requests_per_rank), degrees.pp))

    def at(name: str) -> np.ndarray:
        """Slice the b axis: the run's micro-batch, or one request for single steps."""
        table = getattr(t, name)
        run = t.floor(name) if floor else table
        out = np.empty((*table.shape[:-1], len(bi)))
        for si, step in enumerate(t.steps):
            out[si] = table[si][..., [0]] if step.single else run[si][..., bi]
        return _ns(out)

    return {
        "op_ns": at("op_time"),
        "edge_ns": at("edge_time"),
        "inter_ns": at("inter_time"),
        "head_ns": at("head_time"),
        "emb_first_ns": at("emb_first"),
        "last_fnorm_ns": at("last_fnorm"),
        "fnorm_lm_ns": at("fnorm_lm"),
        "lm_sampler_ns": at("lm_sampler"),
        "p2p_ns": at("p2p"),
    }


def kv_bytes(problem: Problem, degrees: Degrees, requests_per_rank: np.ndarray) -> np.ndarray:
    """KV-cache bytes per GPU of every (class, op, option) for each value of ``requests_per_rank``
    (a trailing axis): its per-request bytes times the requests the GPU holds, as the
    engine budgets them (its KV share; the other tables' bytes likewise)."""
    t = degree_tables(problem, degrees)
    requests_per_rank = np.asarray(requests_per_rank)
    held = np.where(
        t.op_kv_split[..., None], -(-requests_per_rank // degrees.tp), requests_per_rank
    )
    return _bytes(t.op_kv[..., None] * held * t.engine.kv_scale)


def integer_tables(
    problem: Problem, degrees: Degrees, requests_per_rank: int, *, floor: bool = False
) -> IntegerTables:
    """Tables of ``degrees`` with ``requests_per_rank`` requests on each dp rank (``floor``: times
    that bound every concurrency from ``requests_per_rank`` on from below, see :func:`time_ns`)."""
    t = degree_tables(problem, degrees)
    bt = t.request_range
    if not 1 <= requests_per_rank <= bt.max_requests_per_rank or (
        not bt.inflight and requests_per_rank != bt.max_requests_per_rank
    ):
        raise ValueError(
            f"requests_per_rank={requests_per_rank} is outside "
            f"1..{bt.max_requests_per_rank} for this workload"
        )
    act, head_act = t.workspace()
    times = {
        k: v[..., 0]
        for k, v in time_ns(problem, degrees, np.array([requests_per_rank]), floor=floor).items()
    }
    e = t.engine
    return IntegerTables(
        degrees=degrees,
        requests_per_rank=requests_per_rank,
        steps=t.steps,
        classes=t.classes,
        kinds=t.kinds,
        edges=t.edges,
        **times,
        weight_bytes=_bytes(t.op_weight * e.weight_scale),
        kv_bytes=kv_bytes(problem, degrees, np.array([requests_per_rank]))[..., 0],
        act_bytes=_bytes(act * e.reserve_scale),
        head_weight_bytes=_bytes(t.head_weight * e.weight_scale),
        head_act_bytes=_bytes(head_act * e.reserve_scale),
        reserve_bytes=int(RUNTIME_RESERVE_GB * 1e9 * e.reserve_scale),
        hbm_bytes=int(problem.cluster.accelerator.hbm_gb * 1e9),
    )


@dataclass(frozen=True, kw_only=True)
class TableCost:
    """A plan priced from the integer tables."""

    stage_ns: np.ndarray  # (step, stage)
    stage_bytes: np.ndarray  # (stage,) memory per GPU
    hbm_bytes: int
    latencies: Latencies

    @property
    def fits(self) -> bool:
        return bool((self.stage_bytes <= self.hbm_bytes).all())


def requests_per_rank(problem: Problem, plan: Plan) -> int:
    """Requests per dp rank that :func:`shardlab.evaluate` runs ``plan`` with: its own
    concurrency, else the best."""
    return int(assemble_plan(problem, plan)[1].requests_per_rank[0])


def price(problem: Problem, tables: IntegerTables, plan: Plan) -> TableCost:
    """Sum ``plan``'s table entries; what an exact solver's objective adds up."""
    m = problem.model
    d = tables.degrees
    classes = {c: i for i, c in enumerate(tables.classes)}
    opts = [
        [op.option_names.index(name) for op, name in zip(layer_ops(m, kind), names, strict=True)]
        for kind, names in zip(m.layer_kinds, plan.layer_options, strict=True)
    ]
    head = [op.option_names.index(n) for op, n in zip(HEAD_OPS, plan.head_options, strict=True)]
    stage_of = plan.stage_of_layer()
    ns = len(tables.steps)
    stage_ns = np.zeros((ns, d.pp), dtype=np.int64)
    weight = np.zeros(d.pp, dtype=np.int64)
    kv = np.zeros(d.pp, dtype=np.int64)
    workspace = 0
    for layer, kind in enumerate(m.layer_kinds):
        c = classes[(kind, m.attention_layers[layer])]
        s = stage_of[layer]
        o = opts[layer]
        for op_i, opt in enumerate(o):
            stage_ns[:, s] += tables.op_ns[:, c, op_i, opt]
            weight[s] += tables.weight_bytes[c, op_i, opt]
            kv[s] += tables.kv_bytes[c, op_i, opt]
            workspace = max(workspace, int(tables.act_bytes[c, op_i, opt]))
        for e, (src, dst) in enumerate(tables.edges[kind]):
            stage_ns[:, s] += tables.edge_ns[:, c, e, o[src], o[dst]]
        if layer > 0:
            stage_ns[:, s] += tables.inter_ns[:, opts[layer - 1][0], o[0]]
    first_res, last_res = opts[0][0], opts[-1][0]
    emb, fnorm, lm, sampler = (head[h] for h in Head)
    stage_ns[:, 0] += (
        tables.head_ns[:, Head.EMBEDDING, emb] + tables.emb_first_ns[:, emb, first_res]
    )
    stage_ns[:, -1] += (
        tables.head_ns[:, Head.FINAL_NORM, fnorm]
        + tables.head_ns[:, Head.LM_HEAD, lm]
        + tables.head_ns[:, Head.SAMPLER, sampler]
        + tables.last_fnorm_ns[:, last_res, fnorm]
        + tables.fnorm_lm_ns[:, fnorm, lm]
        + tables.lm_sampler_ns[:, lm, sampler]
    )
    ends = np.cumsum(plan.stage_layers)
    for s in range(d.pp - 1):
        stage_ns[:, s] += tables.p2p_ns[:, s, opts[ends[s] - 1][0]]
    weight[0] += tables.head_weight_bytes[Head.EMBEDDING, emb]
    weight[-1] += sum(int(tables.head_weight_bytes[h, head[h]]) for h in LAST_STAGE_HEADS)
    workspace = max(workspace, *(int(tables.head_act_bytes[h, head[h]]) for h in Head))
    stage_bytes = weight + kv + workspace + tables.reserve_bytes
    seconds = stage_ns.astype(float) / 1e9
    per_replica = -(-problem.workload.batch // d.replicas)
    tm = latencies(
        problem,
        d,
        tables.steps,
        per_replica,
        np.array([tables.requests_per_rank]),
        [seconds[i : i + 1].sum(1) for i in range(ns)],
        [seconds[i : i + 1].max(1) for i in range(ns)],
        np.array([degree_tables(problem, d).engine.max_tokens]),
    )
    return TableCost(
        stage_ns=stage_ns, stage_bytes=stage_bytes, hbm_bytes=tables.hbm_bytes, latencies=tm
    )
