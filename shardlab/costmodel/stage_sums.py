"""Stage times of a batch of plans: every real stage of every plan (a stage row), its
table entries, and their sums over each plan's stages as sparse products with the
stacked tables (:mod:`shardlab.costmodel.stack`), at every column a plan reads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse

try:  # the kernel behind csr_matrix @ dense (see _sparse_product)
    from scipy.sparse._sparsetools import csr_matvecs as _csr_matvecs
except ImportError:  # pragma: no cover - a scipy that moved it
    _csr_matvecs = None

from shardlab.costmodel.stack import Stack, stack_of
from shardlab.costmodel.units import Terms, Units
from shardlab.problems.problem import Problem

# Entries one pass prices (a plan's terms, and its stage rows' units and fixed entries),
# and floats one product of units' sums writes: keeps arrays to tens of MB.
GATHER_CHUNK = 1 << 22

# Batches this small are priced at powers of four columns, larger ones at powers of two.
FEW_PLANS = 512


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``starts[i], starts[i] + 1, .., starts[i] + counts[i] - 1`` for every i, in order."""
    first = np.cumsum(counts) - counts
    return np.repeat(starts - first, counts) + np.arange(int(counts.sum()))


@dataclass(frozen=True, kw_only=True)
class Stages:
    """Every real stage of a batch of plans, plan by plan (a "stage row" each)."""

    plan: np.ndarray  # (R,) plan of each stage row
    stage: np.ndarray  # (R,) its stage index
    first_row: np.ndarray  # (n,) first stage row of each plan
    unit_count: np.ndarray  # (R, U) layers of each unit in the stage
    pair_count: np.ndarray  # (R, P) residual hops of each unit pair into the stage's layers
    is_first: np.ndarray
    is_last: np.ndarray


def stages(u: Units, terms: Terms, pp: np.ndarray) -> Stages:
    n = len(pp)
    first_row = np.cumsum(pp) - pp
    plan = np.repeat(np.arange(n), pp)
    stage = np.arange(len(plan)) - np.repeat(first_row, pp)
    ends, starts = u.ends[plan, stage], u.starts[plan, stage]
    return Stages(
        plan=plan,
        stage=stage,
        first_row=first_row,
        unit_count=terms.cs_unit[ends] - terms.cs_unit[starts],
        pair_count=terms.cs_pair[ends] - terms.cs_pair[starts],
        is_first=stage == 0,
        is_last=stage == pp[plan] - 1,
    )


def fixed_entries(
    problem: Problem, u: Units, terms: Terms, sr: Stages
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


def stage_times(
    stack: Stack,
    slot: np.ndarray,
    sr: Stages,
    pp: np.ndarray,
    terms: Terms,
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
    ``fixed`` entries (:func:`fixed_entries`)."""
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
    rows = _ranges(sr.first_row[order], pp[order])
    row_pos = np.repeat(np.arange(n), pp[order])  # each row's plan, as its place in order
    chunk = _Chunk(
        terms=terms,
        rid=rid,
        row_end=np.cumsum(pp[order]),
        fixed=_entries(fixed[1][rows], row_pos, fixed[0][rows]),
        units=_entries(sr.unit_count[rows], row_pos),
    )
    for wb, g0, g1 in zip(widths.tolist(), group_bounds[:-1], group_bounds[1:], strict=True):
        arena, blocks = stack.arena(wb, slot[order[g0:g1]])
        cols = arena.shape[1]
        # plans at a time: keeps their units' sums to tens of MB
        step = max(1, GATHER_CHUNK // (len(terms.unit_first) * cols))
        for p0 in range(g0, g1, step):
            p1 = min(p0 + step, g1)
            plans = order[p0:p1]
            st, r0 = chunk.stage_rows(arena, blocks[p0 - g0 : p1 - g0], plans, p0, p1)
            starts = chunk.row_end[p0:p1] - pp[plans] - r0
            at = _ranges(offset[plans], np.full(p1 - p0, cols))
            total[at] = np.add.reduceat(st, starts, axis=0).ravel()
            peak[at] = np.maximum.reduceat(st, starts, axis=0).ravel()
    return total, peak, offset, width


@dataclass(frozen=True, kw_only=True)
class _Entries:
    """The nonzero entries of a dense matrix over stage rows (in plan order), row by
    row: what each entry indexes (a table row, or a unit), its weight, and its plan."""

    ptr: np.ndarray  # (rows + 1,) first entry of each row
    index: np.ndarray
    weight: np.ndarray
    pos: np.ndarray  # each entry's plan, as its place in the order


def _entries(weight: np.ndarray, row_pos: np.ndarray, index: np.ndarray | None = None) -> _Entries:
    """``weight``'s nonzero entries; each indexes ``index`` there, or its column."""
    ptr, row, col = _compressed(weight)
    return _Entries(
        ptr=ptr,
        index=col if index is None else index[row, col],
        weight=weight[row, col],
        pos=row_pos[row],
    )


@dataclass(frozen=True, kw_only=True)
class _Chunk:
    """What every chunk of plans of a batch is priced from."""

    terms: Terms
    rid: np.ndarray  # (n, T) the table row of every term
    row_end: np.ndarray  # (n,) one past each plan's last stage row, in order
    fixed: _Entries  # the stage rows' fixed entries (table rows)
    units: _Entries  # the stage rows' layers of each unit

    def stage_rows(
        self, arena: np.ndarray, block: np.ndarray, plans: np.ndarray, p0: int, p1: int
    ) -> tuple[np.ndarray, int]:
        """The stage rows of plans ``p0 .. p1 - 1`` of the order (``plans``, whose slots
        start at ``block`` in ``arena``): ``(rows, columns)`` times, and the first row."""
        n_units, n_terms = len(self.terms.unit_first), self.rid.shape[1]
        unit_ptr = np.append(self.terms.unit_first, n_terms)
        # every unit's terms summed, plan by plan: (plans x units, cols)
        k = p1 - p0
        ptr = (np.arange(k)[:, None] * n_terms + unit_ptr[None, :-1]).ravel()
        unit_sum = _sparse_product(
            np.append(ptr, k * n_terms),
            (self.rid[plans] + block[:, None]).ravel(),
            np.ones(k * n_terms),
            arena,
        )
        r0, r1 = (self.row_end[p0 - 1] if p0 else 0), self.row_end[p1 - 1]
        st = np.zeros((r1 - r0, arena.shape[1]))
        f = self.fixed
        e0, e1 = f.ptr[r0], f.ptr[r1]
        whose = f.pos[e0:e1] - p0
        _sparse_product(
            f.ptr[r0 : r1 + 1] - e0, f.index[e0:e1] + block[whose], f.weight[e0:e1], arena, out=st
        )
        c = self.units
        e0, e1 = c.ptr[r0], c.ptr[r1]
        at = (c.pos[e0:e1] - p0) * n_units + c.index[e0:e1]
        _sparse_product(c.ptr[r0 : r1 + 1] - e0, at, c.weight[e0:e1], unit_sum, out=st)
        return st, int(r0)


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
