"""What each candidate option costs under a degree tuple, from the cost model's tables.

An option's name (column, row, alltoall, ...) says what it is; what it costs depends on
the model, the GPUs, the workload and the degrees. A preference learned over names
carries to another problem only where the names cost the same there; a preference over
costs carries further. Each option decision's candidates are described, under one
degree tuple, by (:data:`COST_DIM` features, zeros for degree and cut decisions and for
invalid candidates):

- ``log(time / fastest)``: the seconds the plan spends on the decision's layers with
  this option, the rest of the plan held (the option's own time plus the
  redistributions on its edges to the operators around it at their held options:
  an all-to-all expert layer costs more alone than an all-gathered one and less with
  the gathers it spares), summed over the workload's steps at the tuple's largest
  micro-batch (:func:`~shardlab.costmodel.time_ns`), over the fastest valid option's,
  clipped to ``[0, CLIP]``;
- ``log(memory / least)``: its weight and KV-cache bytes per GPU at the most requests a
  rank holds (:func:`~shardlab.costmodel.kv_bytes`), over the least valid option's.

Left out: the redistributions between layers and at the model's ends, and what a choice
does to the stages' balance and the batch memory allows (the reward sees those).
numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.costmodel import degree_tables, kv_bytes, time_ns
from shardlab.problems.operators import HEAD_OPS, OpSpec
from shardlab.problems.problem import Problem
from shardlab.problems.space import OpGroup
from shardlab.solvers.rl.decisions import Decisions

COST_DIM = 2
CLIP = 4.0
# tuples whose features are kept: a search visits tens to a few hundred
CACHED_TUPLES = 512


@dataclass(frozen=True, kw_only=True)
class TupleCosts:
    """One degree tuple's tables, over the option decisions ``S`` and slots ``W``."""

    time: np.ndarray  # (S, W) the option's own seconds on the decision's layers
    memory: np.ndarray  # (S, W) its log(bytes / least), clipped
    edges: np.ndarray  # (E, W, W) [own option, the neighbour's] seconds of each edge
    valid: np.ndarray  # (S, W)


class OptionCosts:
    """Cost features of one problem's option decisions, per degree tuple (tables cached)."""

    def __init__(self, problem: Problem, dec: Decisions) -> None:
        self.problem = problem
        self.dec = dec
        space = dec.space
        slots = {v: (g, op) for v, g, op in space.option_slots()}
        self.option_steps = np.array(
            [t for t, s in enumerate(dec.steps) if s.kind == "option"], dtype=np.int64
        )
        self._slots = [slots[dec.steps[t].var] for t in self.option_steps]
        self._cache: dict[int, TupleCosts] = {}
        self._layout: _Layout | None = None

    def _layout_of(self, d: int) -> _Layout:
        if self._layout is None:
            self._layout = _Layout.of(self.problem, self._slots, d)
        return self._layout

    def tables(self, d: int) -> TupleCosts:
        """The tables of degree tuple ``d`` (an index into ``space.degree_tuples``)."""
        if d not in self._cache:
            if len(self._cache) >= CACHED_TUPLES:
                self._cache.pop(next(iter(self._cache)))
            self._cache[d] = self._build(d)
        return self._cache[d]

    def features(self, degree_index: np.ndarray, held: np.ndarray) -> np.ndarray:
        """``(n, n_steps, width, COST_DIM)`` of each row's degree tuple, the rest of its
        plan at the action slots ``held`` (``(n, n_steps)``)."""
        dec = self.dec
        n = len(degree_index)
        out = np.zeros((n, dec.n_steps, dec.width, COST_DIM), dtype=np.float32)
        if not len(self.option_steps):
            return out
        lay = self._layout_of(int(degree_index[0]))
        for d in np.unique(degree_index):
            rows = np.flatnonzero(degree_index == d)
            tc = self.tables(int(d))
            time = np.repeat(tc.time[None], len(rows), axis=0)  # (r, S, W)
            if len(lay.edge_step):
                theirs = held[rows][:, self.option_steps[lay.edge_other]]  # (r, E)
                theirs = np.minimum(theirs, tc.edges.shape[2] - 1)
                e = np.arange(len(lay.edge_step))
                # the edges are sorted by the decision they price: one sum per decision
                sums = np.add.reduceat(tc.edges[e[None], :, theirs], lay.edge_starts, axis=1)
                time[:, lay.edge_step[lay.edge_starts]] += sums
            fastest = np.where(tc.valid, time, np.inf).min(2, keepdims=True)
            fastest = np.where(np.isfinite(fastest), fastest, 0.0)
            ratio = np.log(np.maximum(time, 1.0) / np.maximum(fastest, 1.0))
            out[rows[:, None], self.option_steps[None, :], :, 0] = np.where(
                tc.valid, np.clip(ratio, 0.0, CLIP), 0.0
            )
            out[rows[:, None], self.option_steps[None, :], :, 1] = tc.memory
        return out

    def fastest(self, degree_index: np.ndarray, held: np.ndarray, rounds: int) -> np.ndarray:
        """``held`` (``(n, n_steps)`` action slots) with each option decision at its
        fastest valid option under its row's tuple, the options around it held; over
        ``rounds`` rounds, each pricing the edges at the previous round's choices (all
        decisions move at once, so one round prices a neighbour at its old option). A
        held option as fast as the fastest stays. Cut decisions are left as they are."""
        out = held.copy()
        steps = self.option_steps
        if not len(steps):
            return out
        valid = self.dec.rest_masks(degree_index)[:, steps - self.dec.n_degree_steps]
        rows, cols = np.arange(len(out))[:, None], np.arange(len(steps))[None]
        for _ in range(rounds):
            time = self.features(degree_index, out)[..., 0][:, steps]  # (n, S, W)
            score = np.where(valid, time, np.inf)
            # ties go to the held option: it was chosen for a reason the table does not see
            score[rows, cols, out[:, steps]] -= 1e-6
            out[:, steps] = score.argmin(axis=2)
        return out

    def _build(self, d: int) -> TupleCosts:
        problem, dec = self.problem, self.dec
        degrees = problem.space.degree_tuples[d]
        lay = self._layout_of(d)
        t = degree_tables(problem, degrees)
        rpr = np.array([t.request_range.max_requests_per_rank])
        ns = time_ns(problem, degrees, rpr)
        layer_s = ns["op_ns"][..., 0].sum(0).astype(float)  # (classes, ops, options)
        head_s = ns["head_ns"][..., 0].sum(0).astype(float)  # (head ops, options)
        edge_s = ns["edge_ns"][..., 0].sum(0).astype(float)  # (classes, edges, o, o)
        layer_b = (t.op_weight + kv_bytes(problem, degrees, rpr)[..., 0]).astype(float)
        layer = lay.op_row >= 0
        w, o = dec.width, t.n_opts
        time = np.zeros((len(lay.op_row), w))
        mem = np.zeros_like(time)
        rows, counts = lay.op_row[layer], lay.counts[layer]
        time[layer, :o] = np.einsum("sc,cso->so", counts, layer_s[:, rows])
        mem[layer, :o] = np.einsum("sc,cso->so", counts, layer_b[:, rows])
        time[~layer, :o] = head_s[lay.head_row[~layer]]
        mem[~layer, :o] = t.head_weight[lay.head_row[~layer]]
        edges = np.zeros((len(lay.edge_step), w, w))
        if len(lay.edge_step):
            tables = np.einsum("ec,ceuv->euv", lay.edge_counts, edge_s[:, lay.edge_index])
            own = np.where(lay.edge_source[:, None, None], tables, tables.transpose(0, 2, 1))
            edges[:, :o, :o] = own
        valid = dec.rest_masks(np.array([d]))[0][self.option_steps - dec.n_degree_steps]
        least = np.where(valid, mem, np.inf).min(1, keepdims=True)
        least = np.where(np.isfinite(least), least, 0.0)
        memory = np.log(np.maximum(mem, 1.0) / np.maximum(least, 1.0))
        return TupleCosts(
            time=time,
            memory=np.where(valid, np.clip(memory, 0.0, CLIP), 0.0),
            edges=edges,
            valid=valid,
        )


@dataclass(frozen=True, kw_only=True)
class _Layout:
    """Where each option decision sits in the tables; the same under every tuple."""

    op_row: np.ndarray  # (S,) its operator's row in the layer tables, -1 for a head one
    head_row: np.ndarray  # (S,) its row in the head tables
    counts: np.ndarray  # (S, classes) the layers of each class it covers
    # one row per (edge inside a layer, end of it): the decision it prices, the one at
    # the other end, the edge's row in the tables, whether the decision is its source,
    # and the layers of each class the two decisions share
    edge_step: np.ndarray  # sorted
    edge_starts: np.ndarray  # where each decision's rows start
    edge_other: np.ndarray
    edge_index: np.ndarray
    edge_source: np.ndarray
    edge_counts: np.ndarray

    @classmethod
    def of(cls, problem: Problem, slots: list[tuple[OpGroup, OpSpec]], d: int) -> _Layout:
        t = degree_tables(problem, problem.space.degree_tuples[d])
        model = problem.model
        head = {op.name: i for i, op in enumerate(HEAD_OPS)}
        n = len(slots)
        op_row = np.full(n, -1, dtype=np.int64)
        head_row = np.zeros(n, dtype=np.int64)
        counts = np.zeros((n, len(t.classes)))
        where: dict[tuple[str, int], int] = {}
        for i, (g, op) in enumerate(slots):
            if g.kind == "head":
                head_row[i] = head[op.name]
                continue
            op_row[i] = t.ops[g.kind].index(op)
            where[g.key, int(op_row[i])] = i
            for layer in g.layers:
                cls_ = (model.layer_kinds[layer], model.attention_layers[layer])
                counts[i, t.classes.index(cls_)] += 1
        step, other, index, source, edge_counts = [], [], [], [], []
        for i, (g, _) in enumerate(slots):
            if g.kind == "head":
                continue
            for e, (src, dst) in enumerate(t.edges[g.kind]):
                if src == op_row[i] and (g.key, dst) in where:
                    step.append(i), other.append(where[g.key, dst]), source.append(True)
                elif dst == op_row[i] and (g.key, src) in where:
                    step.append(i), other.append(where[g.key, src]), source.append(False)
                else:
                    continue
                index.append(e)
                edge_counts.append(counts[i])
        order = np.argsort(np.array(step, dtype=np.int64), kind="stable")
        steps = np.array(step, dtype=np.int64)[order]
        return cls(
            op_row=op_row,
            head_row=head_row,
            counts=counts,
            edge_step=steps,
            edge_starts=np.flatnonzero(np.diff(steps, prepend=-1)),
            edge_other=np.array(other, dtype=np.int64)[order],
            edge_index=np.array(index, dtype=np.int64)[order],
            edge_source=np.array(source, dtype=bool)[order],
            edge_counts=np.array(edge_counts).reshape(len(step), len(t.classes))[order],
        )
