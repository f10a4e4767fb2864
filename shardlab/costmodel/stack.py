"""The cost tables of every degree tuple of a problem, stacked for one vectorized pass.

:class:`~shardlab.costmodel.tables.DegreeTables` holds one degree tuple's tables as
arrays over (class, operator, option, ...). Pricing a batch of plans with many degree
tuples one tuple at a time costs a Python-level pass per tuple; here every tuple's
tables become rows of shared arrays, so that a plan's table entries are found by
index arithmetic whatever its degrees:

- a *slot* per degree tuple (built once, when first asked for);
- a fixed *row layout*, the same for every slot: one row per (class, operator,
  option), per (class, edge, source option, destination option), per residual hop,
  per head operator and option, per head edge and per pipeline send;
- per-request-count time rows: for every step, each slot's rows over its ``b``
  columns (requests per micro-batch) are copied into an arena of width ``w`` (a power
  of two), one per width a plan may need, so that the time of a plan's stages at
  every ``b`` is a few sparse products (:func:`scipy.sparse.csr_matrix` rows of table
  entries times the arena) and the columns computed are close to the columns needed;
- per-slot scalars (pipeline and parallel degrees, what the workload offers a rank,
  the engine's memory budget) and ``b``-independent rows (weights, KV cache,
  activation workspace).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from shardlab.costmodel.steps import steps_of
from shardlab.costmodel.tables import DegreeTables, degree_tables, table_dims
from shardlab.errors import ShardlabError
from shardlab.problems.degrees import enumerate_degrees
from shardlab.problems.operators import HEAD_OPS
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from shardlab.problems.space import SearchSpace


@dataclass(frozen=True, kw_only=True)
class RowLayout:
    """Where each table entry sits among a slot's rows (the same for every slot)."""

    n_classes: int
    n_ops: int
    n_opts: int
    n_edges: int
    max_pp: int
    op0: int  # (class, op, option)
    edge0: int  # (class, edge, source option, destination option)
    inter0: int  # (previous residual option, residual option)
    head0: int  # (head op, option)
    emb0: int  # embedding option -> first residual option
    lastf0: int  # last residual option -> final norm option
    fnlm0: int  # final norm -> LM head
    lmsa0: int  # LM head -> sampler
    p2p0: int  # (stage, residual option of its last layer)
    rows: int

    @staticmethod
    def of(problem: Problem, max_pp: int) -> RowLayout:
        n_classes, n_ops, n_opts, n_edges = table_dims(problem.model)
        o = n_opts
        op0 = 0
        edge0 = op0 + n_classes * n_ops * o
        inter0 = edge0 + n_classes * n_edges * o * o
        head0 = inter0 + o * o
        emb0 = head0 + len(HEAD_OPS) * o
        lastf0 = emb0 + o * o
        fnlm0 = lastf0 + o * o
        lmsa0 = fnlm0 + o * o
        p2p0 = lmsa0 + o * o
        # at least one block of sends: the last stage's (weight 0) entry points there
        rows = p2p0 + max(max_pp - 1, 1) * o
        return RowLayout(
            n_classes=n_classes,
            n_ops=n_ops,
            n_opts=n_opts,
            n_edges=n_edges,
            max_pp=max_pp,
            op0=op0,
            edge0=edge0,
            inter0=inter0,
            head0=head0,
            emb0=emb0,
            lastf0=lastf0,
            fnlm0=fnlm0,
            lmsa0=lmsa0,
            p2p0=p2p0,
            rows=rows,
        )


# Per-slot scalars, one array each (grown as slots are added).
SCALARS = (
    "pp",
    "tp",
    "dp_attn",
    "replicas",
    "per_replica",
    "max_requests_per_rank",
    "max_tokens",
    "weight_scale",
    "reserve_scale",
    "kv_scale",
)


class _Grown:
    """A 2-D array that grows by rows (doubling), for slots appended one at a time."""

    def __init__(self, width: int, dtype: type = float) -> None:
        self.data = np.zeros((16, width), dtype=dtype)
        self.used = 0

    def append(self, block: np.ndarray) -> int:
        start = self.used
        need = start + len(block)
        if need > len(self.data):
            grown = np.zeros((max(need, 2 * len(self.data)), self.data.shape[1]), self.data.dtype)
            grown[:start] = self.data[:start]
            self.data = grown
        self.data[start:need] = block
        self.used = need
        return start


class Stack:
    """Every slot's tables of one problem (see the module docstring)."""

    def __init__(self, problem: Problem, max_pp: int) -> None:
        self.problem = problem
        self.layout = RowLayout.of(problem, max_pp)
        self.steps = steps_of(problem.workload)  # every slot's tables have these steps
        self.slot_ids: dict[Degrees, int] = {}
        self._space_slots: weakref.WeakKeyDictionary[SearchSpace, np.ndarray] = (
            weakref.WeakKeyDictionary()
        )
        self.degrees: list[Degrees] = []
        self.tables: list[DegreeTables | None] = []
        self._scalars = {name: np.zeros(0) for name in SCALARS}
        # b-independent rows: weight, KV bytes per request, KV split over tp, workspace
        r = self.layout.rows
        self.weight = _Grown(r)
        self.kv = _Grown(r)
        self.kv_split = _Grown(r, bool)
        self.act = _Grown(r)
        # width -> arena of time rows; width -> first arena row of each slot
        self.arenas: dict[int, _Grown] = {}
        self.blocks: dict[int, np.ndarray] = {}

    # -- slots ------------------------------------------------------------------------

    def slots(self, degrees: tuple[Degrees, ...]) -> np.ndarray:
        """Slot index of each degree tuple (assigned now; tables are built on demand)."""
        out = np.empty(len(degrees), dtype=np.int64)
        for i, d in enumerate(degrees):
            s = self.slot_ids.get(d)
            if s is None:
                if d.pp > self.layout.max_pp:
                    raise ShardlabError(
                        f"degrees {d.short()}: {d.pp} pipeline stages, more than any plan "
                        f"of {self.problem.model.name} on {self.problem.cluster.name} "
                        f"can have ({self.layout.max_pp}); use fewer stages"
                    )
                s = self.slot_ids[d] = len(self.degrees)
                self.degrees.append(d)
                self.tables.append(None)
            out[i] = s
        return out

    def space_slots(self, space: SearchSpace) -> np.ndarray:
        """Slot of each of ``space``'s degree indices (kept per space)."""
        kept = self._space_slots.get(space)
        if kept is None:
            kept = self._space_slots[space] = self.slots(space.degree_tuples)
        return kept

    def ensure(self, slots: np.ndarray) -> None:
        """Build the tables of these slots (those not built yet)."""
        for s in np.unique(slots).tolist():
            if self.tables[s] is None:
                self._build(s)

    def scalar(self, name: str, slots: np.ndarray) -> np.ndarray:
        return self._scalars[name][slots]

    def table(self, slot: int) -> DegreeTables:
        t = self.tables[slot]
        assert t is not None
        return t

    def _build(self, s: int) -> None:
        t = degree_tables(self.problem, self.degrees[s])
        d, bt, e = t.degrees, t.request_range, t.engine
        values = {
            "pp": d.pp,
            "tp": d.tp,
            "dp_attn": d.dp_attn,
            "replicas": d.replicas,
            "per_replica": bt.per_replica,
            "max_requests_per_rank": bt.max_requests_per_rank,
            "max_tokens": e.max_tokens,
            "weight_scale": e.weight_scale,
            "reserve_scale": e.reserve_scale,
            "kv_scale": e.kv_scale,
        }
        for name, v in values.items():
            a = self._scalars[name]
            if len(a) <= s:
                a = np.concatenate([a, np.zeros(max(s + 1 - len(a), len(a) + 1))])
                self._scalars[name] = a
            a[s] = v
        self._put(self.weight, s, self._rows_b_free(t.op_weight, t.head_weight))
        self._put(self.kv, s, self._rows_b_free(t.op_kv, np.zeros_like(t.head_weight)))
        self._put(
            self.kv_split,
            s,
            self._rows_b_free(t.op_kv_split, np.zeros_like(t.head_weight, dtype=bool)),
        )
        self._put(self.act, s, self._rows_b_free(*t.workspace()))
        self.tables[s] = t  # last: the slot is built

    @staticmethod
    def _put(grown: _Grown, s: int, row: np.ndarray) -> None:
        if grown.used <= s:
            grown.append(np.zeros((s + 1 - grown.used, grown.data.shape[1]), grown.data.dtype))
        grown.data[s] = row

    def _rows_b_free(self, per_op: np.ndarray, per_head: np.ndarray) -> np.ndarray:
        lay = self.layout
        row = np.zeros(lay.rows, dtype=per_op.dtype)
        row[lay.op0 : lay.edge0] = per_op.ravel()
        row[lay.head0 : lay.emb0] = per_head.ravel()
        return row

    # -- time rows ---------------------------------------------------------------------

    def time_rows(self, t: DegreeTables, si: int) -> np.ndarray:
        """``(rows, n_b)``: step ``si``'s time tables of one slot in the row layout."""
        lay = self.layout
        nb = len(t.b)
        out = np.zeros((lay.rows, nb))
        out[lay.op0 : lay.edge0] = t.op_time[si].reshape(-1, nb)
        out[lay.edge0 : lay.inter0] = t.edge_time[si].reshape(-1, nb)
        out[lay.inter0 : lay.head0] = t.inter_time[si].reshape(-1, nb)
        out[lay.head0 : lay.emb0] = t.head_time[si].reshape(-1, nb)
        out[lay.emb0 : lay.lastf0] = t.emb_first[si].reshape(-1, nb)
        out[lay.lastf0 : lay.fnlm0] = t.last_fnorm[si].reshape(-1, nb)
        out[lay.fnlm0 : lay.lmsa0] = t.fnorm_lm[si].reshape(-1, nb)
        out[lay.lmsa0 : lay.lmsa0 + lay.n_opts**2] = t.lm_sampler[si].reshape(-1, nb)
        p2p = t.p2p[si].reshape(-1, nb)
        out[lay.p2p0 : lay.p2p0 + len(p2p)] = p2p
        return out

    def columns(self, width: int) -> tuple[int, ...]:
        """Columns of each step in an arena of ``width``: ``width`` (b = 1..width), or
        one for a step that runs one request (or a static batch's one b)."""
        return tuple(1 if step.single else width for step in self.steps)

    def arena(self, width: int, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every step's time rows side by side (:meth:`columns`; a slot with fewer
        columns repeats its last), and the first arena row of each of ``slots``."""
        grown = self.arenas.get(width)
        if grown is None:
            grown = self.arenas[width] = _Grown(sum(self.columns(width)))
            self.blocks[width] = np.full(0, -1, dtype=np.int64)
        blocks = self.blocks[width]
        if len(blocks) < len(self.degrees):
            blocks = np.concatenate([blocks, np.full(len(self.degrees) - len(blocks), -1)])
            self.blocks[width] = blocks
        for s in np.unique(slots[blocks[slots] < 0]).tolist():
            t = self.table(s)
            parts = []
            for si, cols in enumerate(self.columns(width)):
                rows = self.time_rows(t, si)
                if rows.shape[1] >= cols:
                    parts.append(rows[:, :cols])
                else:
                    parts.append(np.repeat(rows[:, -1:], cols, axis=1))
                    parts[-1][:, : rows.shape[1]] = rows
            blocks[s] = grown.append(np.concatenate(parts, axis=1))
        return grown.data[: grown.used], blocks[slots]


@lru_cache(maxsize=64)
def stack_of(problem: Problem) -> Stack:
    """The stack of ``problem``: slots for any degree tuple its cluster admits."""
    free = enumerate_degrees(problem.model, problem.cluster)
    return Stack(problem, max(d.pp for d in free))
