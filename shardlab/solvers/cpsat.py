"""CP-SAT exact search: the plan the cost model rates best, with a proof.

Decomposition. A plan's degree tuple ``d`` and the requests each attention-data-
parallel rank holds, ``C`` (the static batch; in flight, the plan's concurrency, a
decision between one and what the rank is offered) fix every table of the cost model
(:mod:`shardlab.costmodel.decompose`). The search therefore splits into subproblems
``(d, C)`` enumerated outside CP-SAT: inside one, the objective is linear in Boolean
choices, whereas ``C`` enters every table non-linearly and ``d`` changes which
options exist. Degree Booleans inside one model were not built: ``C`` would still be
enumerated, and the model would be the union of the subproblems' models without the
bounds that separate them.

Subproblems are visited in decreasing order of an upper bound on their objective
(each layer kind and the model's ends at their best joint choice of options, found
exactly by min-sum elimination over the operators' graph (:mod:`~shardlab.solvers.minsum`)
for every ``C`` of a degree tuple at once, ignoring memory and the pipeline's balance)
and skipped once the bound cannot beat the incumbent. Bounds also discard the
``(d, C)`` no plan can have: ``C`` requests fit for no plan, or even the time bound
misses an SLO. When a subproblem proves infeasible, a bisection over ``C`` with
*floor* models (every time at its least over ``C`` requests or more, a relaxation of
all of them; :class:`_Feasibility`) finds the requests from which the degree tuple
holds no plan, and every subproblem from there on is skipped: an SLO that binds costs
a logarithmic number of proofs per degree tuple, not one per concurrency. The Megatron
rule's plan is priced first (the incumbent however early the clock runs out); each
solve is warm-started from the last plan found with its degrees when that plan meets
memory and the SLOs at its requests. The clock is read between chunks of the bounds,
between the constraint families of each model, and after every solve.

The model of one subproblem, one method per family of constraints:

- ``_options``: one Boolean per (operator group, operator, valid option), exactly one
  per operator; groups are the layer kinds (options tied) or the layers;
- ``_pairs``: one Boolean per pair of options on each edge between operators and on
  the residual stream between consecutive layers of different groups, linked to the
  option Booleans by the product linearization (row and column sums);
- ``_partition``: boundary ``j`` is the balanced one moved by at most the space's
  shift; layer ``l`` belongs to exactly one stage ``s``, with ``B_s <= l < B_{s+1}``;
- ``_stage_times``: per step and stage, its layers' times (half-reified on
  membership), the model's ends on the first and last stage, the send of the
  residual stream after the stage's last layer;
- ``_memory``: per stage, weights + KV cache of its layers for ``C`` requests + the
  workspace (at least every chosen option's) + reserve <= HBM;
- (a solution callback hands every improving solution to the evaluator as found);
- ``_objective``: the regime's time (the forms of :mod:`shardlab.costmodel.regimes`,
  affine in the round and the prompt with coefficients fixed by ``C``; fractions
  scaled to integers by their least common denominator) with ``MX >= T_s`` for the
  bottleneck stage and ``R >= SUM, R >= m * MX`` for rounds; TTFT and TPOT SLOs bound
  it; minimized (throughput = tokens / time).

Integers are nanoseconds and bytes from the decomposition tables, rounded per entry;
an optimum is exact within that rounding (relative 1e-5 on the suite). Symmetry:
options that would shard an axis of size 1 are already absent from the space.
Status: ``optimal`` only when every subproblem was solved to CP-SAT's proof or
discarded by a bound; otherwise ``feasible`` with the bound and the relative gap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from shardlab.costmodel import (
    Form,
    Forms,
    IntegerTables,
    basic_times,
    clients_per_rank,
    degree_tables,
    evaluate,
    forms,
    handoff_ns,
    integer_tables,
    judge,
    kv_bytes,
    price,
    requests_per_rank,
    time_ns,
    tokens,
)
from shardlab.problems.operators import HEAD_OPS
from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem
from shardlab.problems.space import (
    MAX_SHIFT,
    SearchSpace,
    balanced_boundaries,
    max_shift,
)
from shardlab.solvers.base import Budget, Outcome, SearchContext, Solver
from shardlab.solvers.chain import chain_plan, memory_bound, pipeline_plan
from shardlab.solvers.evaluator import BudgetExhausted
from shardlab.solvers.front import dominated_by
from shardlab.solvers.megatron import megatron_candidates, megatron_rule
from shardlab.solvers.minsum import min_sum
from shardlab.solvers.registry import register

ROUNDING = 1e-5  # relative: bounds within this of the incumbent are still solved

# Pareto sweep (CpSatSolver._front): the next latency bound is this far (relative)
# below the last point's, and the model allows this much above a bound.
SWEEP_STEP = 1e-4
SWEEP_SLACK = 2e-5

CP_STATUS = {
    cp_model.OPTIMAL: "optimal",
    cp_model.FEASIBLE: "feasible",
    cp_model.INFEASIBLE: "infeasible",
    cp_model.MODEL_INVALID: "model_invalid",
    cp_model.UNKNOWN: "unknown",
}


# -- the regime's forms in a subproblem ------------------------------------------------


def subproblem_forms(problem: Problem, d: Degrees, per_dp: int, *, floor: bool = False) -> Forms:
    """The regime of subproblem ``(d, per_dp)`` with exact coefficients, times in ns
    (:func:`shardlab.costmodel.regimes.forms`). ``floor``: the least coefficients of
    every subproblem with ``per_dp`` requests or more (the wait for a slot, which
    shrinks as more run, left out; every other coefficient grows with them)."""
    t = degree_tables(problem, d)
    kinds = [s.kind for s in t.steps]
    clients = per_dp if floor else int(clients_per_rank(problem, d, per_dp))
    return forms(
        problem,
        kinds,
        per_dp,
        clients,
        t.engine.max_tokens,
        handoff_ns(problem, d.pp, d.tp),
        exact=True,
    )


def bound_forms(problem: Problem, d: Degrees, per_dp: np.ndarray) -> Forms:
    """The regime's forms for several requests per rank at once (float coefficients,
    times in ns): for bounds."""
    t = degree_tables(problem, d)
    kinds = [s.kind for s in t.steps]
    return forms(
        problem,
        kinds,
        per_dp,
        clients_per_rank(problem, d, per_dp),
        np.full(len(per_dp), t.engine.max_tokens),
        float(handoff_ns(problem, d.pp, d.tp)),
        exact=False,
        ns=True,
    )


def scaled(form: Form, rnd: Any, prompt: Any) -> tuple[Any, int]:
    """``form`` at CP-SAT expressions as an integer expression, and the factor it is
    scaled by (the least common denominator of its coefficients)."""
    coefficients = [Fraction(form.round), Fraction(form.prompt), Fraction(form.const)]
    scale = math.lcm(*(c.denominator for c in coefficients))
    a, b, c = (int(x * scale) for x in coefficients)
    return a * rnd + b * prompt + c, scale


def step_weights(f: Forms, form: Form, n_steps: int) -> tuple[list[Any], Any]:
    """``form`` as a weighted sum of step times plus a constant (exact with one stage,
    where the round and the prompt are their steps' times)."""
    weights: list[Any] = [0.0] * n_steps
    const = form.const
    if f.round_step is not None:
        weights[f.round_step] = weights[f.round_step] + form.round
        const = const + form.round * f.iteration
    if f.prompt_step is not None:
        weights[f.prompt_step] = weights[f.prompt_step] + form.prompt
    return weights, const


def chain_weights(problem: Problem, d: Degrees, per_dp: int) -> tuple[np.ndarray, float]:
    """The objective's time in subproblem ``(d, per_dp)`` as step weights and a
    constant (exact with one stage): what the layers' shortest path minimizes."""
    f = subproblem_forms(problem, d, per_dp)
    n_steps = len(degree_tables(problem, d).steps)
    listed, const = step_weights(f, f.time(problem.workload.objective), n_steps)
    return np.array([float(x) for x in listed]), float(const)


def time_function(
    problem: Problem, d: Degrees, per_dp: int
) -> Callable[[list[np.ndarray], list[np.ndarray]], np.ndarray]:
    """The objective's time in subproblem ``(d, per_dp)`` from per-step stage sums and
    maxima (numpy, ns): what a pipeline's shortest path minimizes."""
    f = subproblem_forms(problem, d, per_dp)
    objective = f.time(problem.workload.objective)
    m = min(d.pp, per_dp)
    a, b, c = float(objective.round), float(objective.prompt), float(objective.const)

    def time_of(sums: list[np.ndarray], maxes: list[np.ndarray]) -> np.ndarray:
        rnd, prompt = basic_times(f, m, sums, maxes, np.maximum)
        return a * rnd + b * prompt + c

    return time_of


def objectives(problem: Problem, d: Degrees, per_dp: np.ndarray, time_ns: np.ndarray) -> np.ndarray:
    """The workload's objective (higher is better) for subproblem times in ns."""
    time_ns = np.asarray(time_ns, dtype=float)
    if problem.workload.objective == "latency":
        out = -time_ns / 1e6
    else:
        per_replica = degree_tables(problem, d).batching.per_replica
        served = tokens(problem, d, per_replica, np.asarray(per_dp))
        with np.errstate(divide="ignore"):
            out = served / (time_ns / 1e9)
        if problem.workload.per_gpu:
            out = out / problem.cluster.num_gpus
    return np.where(time_ns <= 0, math.inf, out)


def objective_of(problem: Problem, d: Degrees, per_dp: int, time_ns: float) -> float:
    return float(objectives(problem, d, np.array([per_dp]), np.array([time_ns]))[0])


# -- the subproblems and their bounds ---------------------------------------------------


@dataclass(frozen=True)
class Subproblem:
    degree_index: int
    per_dp: int
    bound: float  # upper bound on the objective of any plan in it
    # lower bounds on its plans' TTFT and TPOT in ns (None: not a latency of the workload)
    ttft_low: float | None = None
    tpot_low: float | None = None


@lru_cache(maxsize=64)
def _slots_by_op(space: SearchSpace) -> tuple[tuple[tuple[str, str], np.ndarray, int], ...]:
    """The option variables of each (layer kind or 'head', operator), and its options."""
    slots: dict[tuple[str, str], list[int]] = {}
    width: dict[tuple[str, str], int] = {}
    for v, g, op in space.option_slots():
        slots.setdefault((g.kind, op.name), []).append(v)
        width[(g.kind, op.name)] = len(op.options)
    return tuple((key, np.array(vs), width[key]) for key, vs in slots.items())


def _valid_options(space: SearchSpace, di: int) -> dict[tuple[str, str], list[int]]:
    """Option indices valid under degree tuple ``di`` somewhere in the model, per
    (layer kind or 'head', operator): the space's masks, so an engine space's too."""
    mask = space.mask(di)
    return {
        key: np.flatnonzero(mask[vs, :n].any(axis=0)).tolist() for key, vs, n in _slots_by_op(space)
    }


def _memory_low(
    problem: Problem,
    d: Degrees,
    valid: dict[tuple[str, str], list[int]],
    t: IntegerTables,
    per_dp: np.ndarray,
) -> np.ndarray:
    """The least memory of the fullest stage over every plan, for each value of
    ``per_dp``: an equal share of the least memory. ``t`` gives what does not depend on
    the requests; ``valid`` the options the degree tuple allows (:func:`_valid_options`)."""
    m = problem.model
    kv = kv_bytes(problem, d, per_dp)  # (cls, op, opt, per_dp)
    mem_low = np.zeros(len(per_dp))
    act_low = 0.0
    for ci, (kind, _) in enumerate(t.classes):
        count = sum(
            1
            for k, w in zip(m.layer_kinds, m.attention_layers, strict=True)
            if (k, w) == t.classes[ci]
        )
        for ki, name in enumerate(_op_names(problem.space, kind)):
            opts = valid[(kind, name)]
            mem = t.weight_bytes[ci, ki, opts][:, None] + kv[ci, ki, opts]
            mem_low += count * mem.min(axis=0)
            act_low = max(act_low, float(t.act_bytes[ci, ki, opts].min()))
    for ki, op in enumerate(HEAD_OPS):
        opts = valid[("head", op.name)]
        mem_low += float(t.head_weight_bytes[ki, opts].min())
        act_low = max(act_low, float(t.head_act_bytes[ki, opts].min()))
    return mem_low / d.pp + act_low + t.reserve_bytes


@lru_cache(maxsize=4096)
def _combos(lists: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """Every joint choice of options, one row per combination."""
    return np.array(list(itertools.product(*lists)), dtype=np.int64).reshape(-1, len(lists))


def _time_bounds(
    problem: Problem,
    d: Degrees,
    t: IntegerTables,
    per_dp: np.ndarray,
    valid: dict[tuple[str, str], list[int]],
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Lower bounds on (the time to minimize, TTFT, TPOT) of any plan, for each value of
    ``per_dp``: each layer kind (and the model's ends) at its best joint choice of
    options, ignoring memory and the pipeline's balance, plus the least send between
    stages at each boundary. A layer kind's best joint choice is a least sum over its
    operators' graph (:func:`min_sum`), per step and for the regime's weighted sum of
    steps."""
    m = problem.model
    kinds = [s.kind for s in t.steps]
    n_steps = len(kinds)
    tied = problem.tie == "kind"
    pp = d.pp
    n_c = len(per_dp)
    f = bound_forms(problem, d, per_dp)
    objective = f.time(problem.workload.objective)
    listed, const = step_weights(f, objective, n_steps)
    weights = np.array([np.broadcast_to(w, (n_c,)) for w in listed], dtype=float)
    ns = time_ns(problem, d, per_dp)  # each table: (step, ..., per_dp)
    layer_units = list(zip(m.layer_kinds, m.attention_layers, strict=True))
    per_step = np.zeros((n_steps, n_c))  # each step at its own best: bounds TTFT and TPOT
    joint = np.zeros(n_c)  # the weighted time at one choice for all steps

    def weighted(tables: list[np.ndarray]) -> np.ndarray:
        return sum(w * table for w, table in zip(weights, tables, strict=True))

    inter_min = ns["inter_ns"].reshape(n_steps, -1, n_c).min(axis=1)  # (step, per_dp)
    for ci, cls in enumerate(t.classes):
        kind = cls[0]
        names = _op_names(problem.space, kind)
        opts = [valid[(kind, n)] for n in names]
        count = layer_units.count(cls)
        same = sum(1 for a, b in itertools.pairwise(layer_units) if a == b == cls)
        steps: list[list[tuple[tuple[int, ...], np.ndarray]]] = []
        for st in range(n_steps):
            factors = [((ki,), count * ns["op_ns"][st, ci, ki][o]) for ki, o in enumerate(opts)]
            for e, (src, dst) in enumerate(t.edges[kind]):
                table = ns["edge_ns"][st, ci, e][opts[src]][:, opts[dst]]
                factors.append(((src, dst), count * table))
            if tied:
                res = opts[0]
                factors.append(((0,), same * ns["inter_ns"][st][res, res]))
            steps.append(factors)
        domains = [len(o) for o in opts]
        extra = np.zeros((n_steps, n_c)) if tied else same * inter_min
        for st, factors in enumerate(steps):
            per_step[st] += min_sum(domains, factors) + extra[st]
        mixed = [
            (factors[0][0], weighted([step[i][1] for step in steps]))
            for i, factors in enumerate(zip(*steps, strict=True))
        ]
        joint += min_sum(domains, mixed) + (weights * extra).sum(axis=0)
    changes = sum(1 for a, b in itertools.pairwise(layer_units) if a != b)
    inter = changes * inter_min
    per_step, joint = per_step + inter, joint + (weights * inter).sum(axis=0)
    if pp > 1:  # each stage but the last sends the residual stream on, once
        res = valid[(m.layer_kinds[0], _op_names(problem.space, m.layer_kinds[0])[0])]
        per_step = per_step + ns["p2p_ns"][:, : pp - 1][:, :, res].min(axis=2).sum(axis=1)
    heads = _combos(tuple(tuple(valid[("head", op.name)]) for op in HEAD_OPS))
    cost = np.zeros((n_steps, len(heads), n_c))
    for ki in range(len(HEAD_OPS)):
        cost += ns["head_ns"][:, ki][:, heads[:, ki]]
    cost += ns["emb_first_ns"][:, heads[:, 0]].min(axis=2)
    cost += ns["last_fnorm_ns"][:, :, heads[:, 1]].min(axis=1)
    cost += ns["fnorm_lm_ns"][:, heads[:, 1], heads[:, 2]]
    cost += ns["lm_sampler_ns"][:, heads[:, 2], heads[:, 3]]
    per_step += cost.min(axis=1)
    joint += (weights[:, None, :] * cost).sum(axis=0).min(axis=0)
    m_batches = np.minimum(pp, per_dp)
    sums = list(per_step)
    # every coefficient of a form is nonnegative: the forms at the least times bound
    rnd, prompt = basic_times(f, m_batches, sums, [x / pp for x in sums], np.maximum)
    time_low = objective.at(rnd, prompt)
    ttft = None if f.ttft is None else f.ttft.at(rnd, prompt)
    tpot = None if f.tpot is None else f.tpot.at(rnd, prompt)
    if pp == 1:  # one stage: the time is linear in the steps, the joint bound is tighter
        time_low = np.maximum(time_low, joint + const)
    return np.asarray(time_low, dtype=float), ttft, tpot


def _op_names(space: SearchSpace, kind: str) -> list[str]:
    for g in space.groups:
        if g.kind == kind:
            return [op.name for op in g.ops]
    raise KeyError(kind)


def _misses_slo(
    problem: Problem, ttft_ns: np.ndarray | None, tpot_ns: np.ndarray | None
) -> np.ndarray | bool:
    w = problem.workload
    miss: np.ndarray | bool = False
    if w.ttft_ms is not None and ttft_ns is not None:
        miss = miss | (np.asarray(ttft_ns) > w.ttft_ms * 1e6)
    if w.tpot_ms is not None and tpot_ns is not None:
        miss = miss | (np.asarray(tpot_ns) > w.tpot_ms * 1e6)
    return miss


# Concurrencies bounded in one numpy pass: keeps the tables of a pass to tens of MB,
# and is how often the enumeration reads the clock inside one degree tuple.
BOUND_CHUNK = 256


def subproblems(
    problem: Problem, check: Callable[[], None] = lambda: None
) -> tuple[list[Subproblem], int]:
    """Subproblems that may hold a plan, best bound first; and how many were discarded
    (no plan fits the memory, every plan holds more requests, or the SLOs are out of
    reach even at the time bound).

    ``check`` is called between chunks of the work (the solver's clock); it may raise
    to stop the enumeration.
    """
    space = problem.space
    out: list[Subproblem] = []
    discarded = 0
    for di, d in enumerate(space.degree_tuples):
        check()
        bt = degree_tables(problem, d).batching
        top = bt.per_dp_max
        cs = np.arange(1, top + 1) if bt.inflight else np.array([top])
        t = integer_tables(problem, d, top)
        valid = _valid_options(space, di)
        mem_low = _memory_low(problem, d, valid, t, cs)
        fits = mem_low <= t.hbm_bytes
        discarded += int((~fits).sum())
        kept = cs[fits][::-1]
        for start in range(0, len(kept), BOUND_CHUNK):
            chunk = kept[start : start + BOUND_CHUNK]
            check()
            time_low, ttft_low, tpot_low = _time_bounds(problem, d, t, chunk, valid)
            miss = np.broadcast_to(_misses_slo(problem, ttft_low, tpot_low), chunk.shape)
            discarded += int(miss.sum())
            bounds = objectives(problem, d, chunk, time_low)
            ttft = np.broadcast_to(np.nan if ttft_low is None else ttft_low, chunk.shape)
            tpot = np.broadcast_to(np.nan if tpot_low is None else tpot_low, chunk.shape)
            out += [
                Subproblem(di, int(c), float(bound), _finite(a), _finite(b))
                for c, bound, a, b in zip(
                    chunk[~miss], bounds[~miss], ttft[~miss], tpot[~miss], strict=True
                )
            ]
    out.sort(key=lambda s: (-s.bound, s.degree_index, -s.per_dp))
    return out, discarded


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


# -- the model of one subproblem ----------------------------------------------------------


@dataclass(frozen=True)
class SubSolution:
    status: str  # optimal, feasible, infeasible, unknown
    plan: Plan | None
    time_ns: float | None  # the objective's time expression at the plan
    bound_ns: float  # lower bound on the time (CP-SAT's best bound)


class SubproblemModel:
    """The CP-SAT model of one subproblem ``(d, C)`` (see the module docstring)."""

    def __init__(
        self,
        problem: Problem,
        degree_index: int,
        per_dp: int,
        check: Callable[[], None] = lambda: None,
        limits: dict[str, float] | None = None,
        *,
        floor: bool = False,
    ) -> None:
        """``check`` is called between the families of constraints (the clock);
        ``limits`` bounds ``ttft_ms`` and ``tpot_ms`` beyond the workload's SLOs;
        ``floor``: the relaxation of every subproblem with ``per_dp`` requests or more
        (see :class:`_Feasibility`)."""
        self.problem = problem
        self.limits = limits or {}
        self.space = problem.space
        self.m = problem.model
        self.degree_index = degree_index
        self.d = self.space.degree_tuples[degree_index]
        self.per_dp = per_dp
        self.t = integer_tables(problem, self.d, per_dp, floor=floor)
        self.forms = subproblem_forms(problem, self.d, per_dp, floor=floor)
        self.model = cp_model.CpModel()
        self.steps = len(self.t.steps)
        self._pair_cache: dict[tuple[int, int], dict[tuple[int, int], cp_model.IntVar]] = {}
        for family in (
            self._options,
            self._partition,
            self._stage_times,
            self._memory,
            self._objective,
        ):
            check()
            family()

    # options ----------------------------------------------------------------------------

    def _options(self) -> None:
        """One Boolean per valid option of each operator of each group; exactly one."""
        mask = self.space.mask(self.degree_index)
        self.x: dict[tuple[str, int], dict[int, cp_model.IntVar]] = {}
        for v, g, op in self.space.option_slots():
            k = [o.name for o in g.ops].index(op.name)
            choices = {
                o: self.model.NewBoolVar(f"x[{g.key}.{op.name}={op.options[o].name}]")
                for o in np.flatnonzero(mask[v]).tolist()
            }
            self.model.AddExactlyOne(choices.values())
            self.x[(g.key, k)] = choices
        self.group_of_layer = {}
        for g in self.space.groups:
            for layer in g.layers:
                self.group_of_layer[layer] = g
        self.classes = {c: i for i, c in enumerate(self.t.classes)}

    def _pairs(
        self, a: dict[int, cp_model.IntVar], b: dict[int, cp_model.IntVar]
    ) -> dict[tuple[int, int], cp_model.IntVar]:
        """Booleans for the pairs of two operators' options, linked by row/column sums."""
        key = (id(a), id(b))
        if key in self._pair_cache:
            return self._pair_cache[key]
        z = {(i, j): self.model.NewBoolVar("") for i in a for j in b}
        for i, xi in a.items():
            self.model.Add(sum(z[(i, j)] for j in b) == xi)
        for j, xj in b.items():
            self.model.Add(sum(z[(i, j)] for i in a) == xj)
        self._pair_cache[key] = z
        return z

    def _cost(self, x: dict[int, cp_model.IntVar], table: np.ndarray) -> Any:
        return sum(int(table[o]) * var for o, var in x.items())

    def _pair_cost(self, z: dict[tuple[int, int], cp_model.IntVar], table: np.ndarray) -> Any:
        return sum(int(table[i, j]) * var for (i, j), var in z.items() if table[i, j])

    # partition ----------------------------------------------------------------------------

    def _partition(self) -> None:
        """Boundaries within the space's shift; each layer in exactly one stage."""
        pp, n_layers = self.d.pp, self.m.num_layers
        base = balanced_boundaries(n_layers, pp)
        shift = max_shift(n_layers, pp)
        self.shift_vars = [self.model.NewIntVar(-shift, shift, f"shift{j + 1}") for j in base]
        bounds = [0, *[b + s for b, s in zip(base, self.shift_vars, strict=True)], n_layers]
        lo = [0, *[b - shift for b in base], n_layers]
        hi = [0, *[b + shift for b in base], n_layers]
        self.bounds = bounds
        self.member: dict[int, dict[int, Any]] = {}
        for layer in range(n_layers):
            stages = [s for s in range(pp) if lo[s] <= layer < hi[s + 1]]
            if len(stages) == 1:
                self.member[layer] = {stages[0]: 1}
                continue
            ys = {s: self.model.NewBoolVar(f"y[{layer},{s}]") for s in stages}
            self.model.AddExactlyOne(ys.values())
            for s, y in ys.items():
                if s >= 1:
                    self.model.Add(bounds[s] <= layer).OnlyEnforceIf(y)
                if s < pp - 1:
                    self.model.Add(bounds[s + 1] >= layer + 1).OnlyEnforceIf(y)
            self.member[layer] = ys
        self.lo, self.hi = lo, hi

    def _on_stage(self, layer: int, stage: int, expr: Any, high: int, name: str) -> Any:
        """``expr`` if ``layer`` is on ``stage`` else 0 (half-reified when undecided)."""
        y = self.member[layer].get(stage)
        if y is None:
            return 0
        if isinstance(y, int):
            return expr
        w = self.model.NewIntVar(0, max(high, 0), name)
        self.model.Add(w == expr).OnlyEnforceIf(y)
        self.model.Add(w == 0).OnlyEnforceIf(y.Not())
        return w

    # times ----------------------------------------------------------------------------------

    def _residual(self, layer: int) -> dict[int, cp_model.IntVar]:
        return self.x[(self.group_of_layer[layer].key, 0)]

    def _layer_time(self, layer: int, step: int) -> tuple[Any, int]:
        """(time expression, an upper bound) of one layer in one step."""
        g = self.group_of_layer[layer]
        kind = self.m.layer_kinds[layer]
        c = self.classes[(kind, self.m.attention_layers[layer])]
        expr: Any = 0
        high = 0
        for ki in range(len(g.ops)):
            x = self.x[(g.key, ki)]
            table = self.t.op_ns[step, c, ki]
            expr += self._cost(x, table)
            high += int(max(table[o] for o in x))
        for e, (src, dst) in enumerate(self.t.edges[kind]):
            z = self._pairs(self.x[(g.key, src)], self.x[(g.key, dst)])
            table = self.t.edge_ns[step, c, e]
            expr += self._pair_cost(z, table)
            high += int(max(table[i, j] for i, j in z))
        if layer > 0:
            prev, cur = self._residual(layer - 1), self._residual(layer)
            table = self.t.inter_ns[step]
            if prev is cur:
                expr += sum(int(table[o, o]) * var for o, var in cur.items())
                high += int(max(table[o, o] for o in cur))
            else:
                z = self._pairs(prev, cur)
                expr += self._pair_cost(z, table)
                high += int(max(table[i, j] for i, j in z))
        return expr, high

    def _stage_times(self) -> None:
        pp, t = self.d.pp, self.t
        head = [self.x[("head", ki)] for ki in range(len(HEAD_OPS))]
        first_res, last_res = self._residual(0), self._residual(self.m.num_layers - 1)
        self.stage_time: list[list[Any]] = []
        for step in range(self.steps):
            per_stage: list[Any] = [0] * pp
            for layer in range(self.m.num_layers):
                expr, high = self._layer_time(layer, step)
                for s in self.member[layer]:
                    per_stage[s] += self._on_stage(layer, s, expr, high, f"t[{step},{layer},{s}]")
            per_stage[0] += self._cost(head[0], t.head_ns[step, 0])
            per_stage[0] += self._pair_cost(self._pairs(head[0], first_res), t.emb_first_ns[step])
            for ki in (1, 2, 3):
                per_stage[-1] += self._cost(head[ki], t.head_ns[step, ki])
            per_stage[-1] += self._pair_cost(self._pairs(last_res, head[1]), t.last_fnorm_ns[step])
            per_stage[-1] += self._pair_cost(self._pairs(head[1], head[2]), t.fnorm_lm_ns[step])
            per_stage[-1] += self._pair_cost(self._pairs(head[2], head[3]), t.lm_sampler_ns[step])
            for s in range(pp - 1):
                per_stage[s] += self._send(s, step)
            self.stage_time.append(per_stage)

    def _send(self, stage: int, step: int) -> Any:
        """The p2p send after the stage's last layer, by that layer's residual option."""
        table = self.t.p2p_ns[step, stage]
        boundary = self.bounds[stage + 1]
        candidates = range(self.lo[stage + 1] - 1, self.hi[stage + 1])
        if len(candidates) == 1:
            return self._cost(self._residual(candidates[0]), table)
        key = ("last", stage)
        if key not in self._pair_cache:  # the same last-layer Booleans serve every step
            lasts = {}
            for layer in candidates:
                last = self.model.NewBoolVar(f"last[{layer},{stage}]")
                self.model.Add(boundary == layer + 1).OnlyEnforceIf(last)
                lasts[layer] = last
            self.model.AddExactlyOne(lasts.values())
            both = {}
            for layer, last in lasts.items():
                for o, x in self._residual(layer).items():
                    q = self.model.NewBoolVar("")
                    self.model.AddBoolAnd([last, x]).OnlyEnforceIf(q)
                    self.model.AddBoolOr([last.Not(), x.Not()]).OnlyEnforceIf(q.Not())
                    both[(layer, o)] = q
            self._pair_cache[key] = both  # type: ignore[assignment]
        both = self._pair_cache[key]  # type: ignore[index]
        return sum(int(table[o]) * q for (_, o), q in both.items() if table[o])

    # memory ------------------------------------------------------------------------------

    def _memory(self) -> None:
        t, pp = self.t, self.d.pp
        head = [self.x[("head", ki)] for ki in range(len(HEAD_OPS))]
        top_act = int(max(t.act_bytes.max(), t.head_act_bytes.max()))
        workspace = self.model.NewIntVar(0, top_act, "workspace")
        stage_mem: list[Any] = [0] * pp
        seen: set[tuple[str, int]] = set()
        for layer in range(self.m.num_layers):
            g = self.group_of_layer[layer]
            kind = self.m.layer_kinds[layer]
            c = self.classes[(kind, self.m.attention_layers[layer])]
            mem: Any = 0
            high = 0
            for ki in range(len(g.ops)):
                x = self.x[(g.key, ki)]
                table = t.weight_bytes[c, ki] + t.kv_bytes[c, ki]
                mem += self._cost(x, table)
                high += int(max(table[o] for o in x))
                if (g.key, c) not in seen:
                    self.model.Add(workspace >= self._cost(x, t.act_bytes[c, ki]))
            seen.add((g.key, c))
            for s in self.member[layer]:
                stage_mem[s] += self._on_stage(layer, s, mem, high, f"m[{layer},{s}]")
        for ki, x in enumerate(head):
            self.model.Add(workspace >= self._cost(x, t.head_act_bytes[ki]))
        stage_mem[0] += self._cost(head[0], t.head_weight_bytes[0])
        for ki in (1, 2, 3):
            stage_mem[-1] += self._cost(head[ki], t.head_weight_bytes[ki])
        limit = t.hbm_bytes - t.reserve_bytes
        for s in range(pp):
            self.model.Add(stage_mem[s] + workspace <= limit)

    # objective ---------------------------------------------------------------------------

    def _objective(self) -> None:
        horizon = 10**15

        def maximum(a: Any, b: Any) -> Any:
            r = self.model.NewIntVar(0, horizon, "")
            self.model.Add(r >= a)
            self.model.Add(r >= b)
            return r

        sums, maxes = [], []
        for step in range(self.steps):
            mx = self.model.NewIntVar(0, horizon, f"max_stage[{step}]")
            for expr in self.stage_time[step]:
                self.model.Add(mx >= expr)
            sums.append(sum(self.stage_time[step]))
            maxes.append(mx)
        f = self.forms
        m = min(self.d.pp, self.per_dp)
        rnd, prompt = basic_times(f, m, sums, maxes, maximum)
        w = self.problem.workload
        for name, form in (("ttft_ms", f.ttft), ("tpot_ms", f.tpot)):
            if form is None:
                continue
            expr, scale = scaled(form, rnd, prompt)
            given = [x for x in (getattr(w, name), self.limits.get(name)) if x is not None]
            if given:
                # scale * latency <= scale * bound, in whole ns (the latency's own are)
                self.model.Add(expr <= math.floor(min(given) * 1e6 * scale))
        time_expr, self.time_scale = scaled(f.time(w.objective), rnd, prompt)
        self.model.Minimize(time_expr)

    # hints and solutions -------------------------------------------------------------

    def hint(self, plan: Plan) -> None:
        """Warm-start from ``plan`` (used when it has this subproblem's degrees)."""
        row = self.space.encode(plan)
        for v, g, op in self.space.option_slots():
            k = [o.name for o in g.ops].index(op.name)
            for o, var in self.x[(g.key, k)].items():
                self.model.AddHint(var, int(o == row[v]))
        for j, var in enumerate(self.shift_vars):
            self.model.AddHint(var, int(row[self.space.first_cut + j]) - MAX_SHIFT)

    def row(self, value: Callable[[Any], int]) -> np.ndarray:
        """The encoding of the solution whose variable values ``value`` reads."""
        row = np.zeros(self.space.n_vars, dtype=np.int64)
        row[0] = self.degree_index
        for v, g, op in self.space.option_slots():
            k = [o.name for o in g.ops].index(op.name)
            row[v] = next(o for o, var in self.x[(g.key, k)].items() if value(var))
        row[self.space.first_cut :] = MAX_SHIFT
        for j, var in enumerate(self.shift_vars):
            row[self.space.first_cut + j] = value(var) + MAX_SHIFT
        return row

    def solve(
        self,
        seconds: float,
        workers: int,
        seed: int,
        on_plan: Callable[[Plan], None],
        *,
        first: bool = False,
    ) -> SubSolution:
        """Solve (``first``: stop at the first solution, a feasibility probe); every
        improving solution is passed to ``on_plan`` as it is found (the history and the
        progress bar). ``on_plan`` may raise ``BudgetExhausted``: the search then stops
        and the exception is raised again here."""
        solver = cp_model.CpSolver()
        solver.parameters.stop_after_first_solution = first
        solver.parameters.max_time_in_seconds = max(seconds, 0.01)
        solver.parameters.num_workers = workers
        solver.parameters.random_seed = seed
        # CP-SAT's own SIGINT handler lives on the solving thread and would take Ctrl-C
        # from Python (aborting the process when the signal lands on another thread);
        # _solve_interruptibly turns Ctrl-C into a stop instead.
        solver.parameters.catch_sigint_signal = False
        # OR-Tools 9.15's inclusion detection in presolve proved a feasible subproblem
        # infeasible ("linear: never in domain"; llama70b-h100x4-chat, pp 2 x tp 2 at 256
        # requests, feasible with presolve off or with the plan fixed): it is turned off.
        solver.parameters.presolve_inclusion_work_limit = 0
        if workers > 1:
            solver.parameters.interleave_search = True  # deterministic with several workers
        callback = _Incumbents(self, on_plan)
        status = CP_STATUS.get(_solve_interruptibly(solver, self.model, callback), "unknown")
        if callback.stopped is not None:
            raise callback.stopped
        if status not in ("optimal", "feasible"):
            return SubSolution(status, None, None, math.inf if status == "infeasible" else 0.0)
        plan = self.space.decode(self.row(solver.Value))
        scale = self.time_scale
        return SubSolution(
            status, plan, solver.ObjectiveValue() / scale, solver.BestObjectiveBound() / scale
        )


def _solve_interruptibly(
    solver: cp_model.CpSolver, model: cp_model.CpModel, callback: _Incumbents
) -> int:
    """``solver.Solve`` on a thread of its own, so that Ctrl-C stops it.

    Python runs signal handlers on the main thread only, between bytecodes, and a Solve
    called there sits in C++ until it returns; with CP-SAT's own handler a Ctrl-C only
    ended the current subproblem's search and the run went on (a 14 s solve
    interrupted at 12 s reported ``optimal``). Here the main thread waits for the
    solver's thread in short slices, which a signal interrupts; the KeyboardInterrupt
    stops the search (``stop_search`` is thread-safe), waits for the search to end and
    is raised again.
    """
    outcome: list[int | BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append(solver.Solve(model, callback))
        except BaseException as exc:
            outcome.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run, name="cp-sat")
    thread.start()
    # Waiting on an Event, not Thread.join: a KeyboardInterrupt inside join (or
    # is_alive) makes CPython 3.11's _wait_for_tstate_lock (bpo-45274) release the lock
    # the running thread holds and mark it stopped; the run then went on while CP-SAT
    # still called back into the evaluator (a wrong best plan, or an abort at exit).
    try:
        while not done.wait(0.05):
            pass
    except KeyboardInterrupt:
        solver.stop_search()
        done.wait()
        raise
    finally:
        if done.is_set():
            thread.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


class _Incumbents(cp_model.CpSolverSolutionCallback):
    """Hands every solution CP-SAT finds to the evaluator while the search runs."""

    def __init__(self, model: SubproblemModel, on_plan: Callable[[Plan], None]) -> None:
        super().__init__()
        self.model = model
        self.on_plan = on_plan
        self.stopped: BaseException | None = None

    def on_solution_callback(self) -> None:
        try:
            self.on_plan(self.model.space.decode(self.model.row(self.Value)))
        except BaseException as exc:
            # The budget, a progress callback's Ctrl-C or a bug: stop and raise it from
            # SubproblemModel.solve, on the caller's thread.
            self.stopped = exc
            self.StopSearch()


class _Feasibility:
    """What the solves so far show about which (degrees, requests) subproblems hold a
    plan, and the plans that warm-start the next ones.

    The model's times are not monotone in the requests (measured tables have bumps),
    so a subproblem infeasible at ``c`` requests per rank says nothing about ``c + 1``.
    Its *floor* model does: each time replaced by its least value at ``c`` requests or
    more (:meth:`~shardlab.costmodel.tables.DegreeTables.floor`), a relaxation of every
    subproblem with ``c`` requests or more, and nondecreasing in ``c`` with the memory.
    A floor model infeasible at ``c`` (``hi``) proves every subproblem of the degree
    tuple from ``c`` on infeasible; one feasible at ``c`` (``lo``) bounds the bisection
    for that boundary from below.
    """

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.lo: dict[int, int] = {}
        self.hi: dict[int, int] = {}
        self.plans: dict[int, Plan] = {}
        self.subs: dict[int, list[Subproblem]] = {}

    def index(self, subs: list[Subproblem]) -> None:
        for sub in subs:
            self.subs.setdefault(sub.degree_index, []).append(sub)

    def found(self, di: int, plan: Plan) -> None:
        self.plans[di] = plan

    def floor_holds(self, di: int, c: int) -> None:
        self.lo[di] = max(self.lo.get(di, 0), c)

    def floor_fails(self, di: int, c: int) -> None:
        self.hi[di] = min(self.hi.get(di, c), c)

    def known_infeasible(self, di: int, c: int) -> bool:
        return di in self.hi and c >= self.hi[di]

    def hint(self, di: int, c: int) -> Plan | None:
        """The last plan found with these degrees, if it meets memory and the SLOs at
        ``c`` requests (only such hints are given: CP-SAT 9.15 aborted the process,
        `Check failed: heuristics.fixed_search != nullptr`, on a hint that missed its
        SLO with interleaved searches)."""
        plan = self.plans.get(di)
        if plan is None:
            return None
        at = dataclasses.replace(plan, concurrency=c)
        return at if evaluate(self.problem, at).feasible else None

    def probe(self, di: int, c: int, best: float) -> int | None:
        """The next requests to test with the floor model after the subproblem at ``c``
        proved infeasible: ``c`` itself, then by bisection between ``lo`` and ``hi``
        among the subproblems of ``di`` whose bound still beats ``best``; None once
        that is settled."""
        lo = self.lo.get(di, 0)
        if c <= lo:
            return None
        if di not in self.hi:
            return c
        hi = self.hi[di]
        cut = best + ROUNDING * abs(best) if math.isfinite(best) else -math.inf
        open_cs = [s.per_dp for s in self.subs.get(di, ()) if lo < s.per_dp < hi and s.bound > cut]
        if not open_cs:
            return None
        lo = max(lo, min(open_cs) - 1)
        return (lo + hi) // 2 if hi - lo > 1 else None


class _Solves:
    """Subproblem solves of one run: models built, warm-started, solved on the run's
    clock, every solution priced, and what they prove recorded in ``feasible``."""

    def __init__(self, ctx: SearchContext, workers: int) -> None:
        self.ctx = ctx
        self.workers = workers
        self.feasible = _Feasibility(ctx.problem)
        self.count = 0
        self.chained = 0  # subproblems the layers' shortest path solved
        self.memory_bounded = 0  # subproblems its memory bound pruned

    def solve(
        self,
        sub: Subproblem,
        where: str,
        *,
        limits: dict[str, float] | None = None,
        floor: bool = False,
    ) -> SubSolution:
        ev, problem = self.ctx.evaluator, self.ctx.problem
        ev.enter(f"{where}: building its model")
        model = SubproblemModel(
            problem, sub.degree_index, sub.per_dp, ev.check_time, limits, floor=floor
        )
        hint = None if limits else self.feasible.hint(sub.degree_index, sub.per_dp)
        if hint is not None:
            model.hint(hint)
        ev.enter(f"{where}: {'probing its floor' if floor else 'solving'}")
        left = ev.left()
        result = model.solve(
            left if left is not None else 3600.0,
            self.workers,
            self.ctx.seed,
            ev.evaluate_plan,
            first=floor,
        )
        self.count += 1
        if floor:
            if result.status == "infeasible":
                self.feasible.floor_fails(sub.degree_index, sub.per_dp)
            elif result.plan is not None:
                self.feasible.floor_holds(sub.degree_index, sub.per_dp)
        elif result.plan is not None:
            self.feasible.found(sub.degree_index, result.plan)
            if self.ctx.space.encode(result.plan).tobytes() not in ev.cache:
                ev.evaluate_plan(result.plan)  # the solution callback prices each
        return result

    def by_chain(self, sub: Subproblem, where: str, best: float) -> str | None:
        """Settle ``sub`` by the layers' shortest path (:mod:`shardlab.solvers.chain`;
        with a pipeline, one per stage over the partitions) when its plans have options
        per layer: ``solved`` when the fastest plan fits and meets the SLOs (it is then
        the subproblem's proven optimum); ``pruned`` when, with one stage, the least
        time of the plans that fit (a Lagrangian bound on memory) leaves no plan better
        than ``best``; None: CP-SAT's model is needed."""
        problem, space, ev = self.ctx.problem, self.ctx.space, self.ctx.evaluator
        d = space.degree_tuples[sub.degree_index]
        if problem.tie != "layer":
            return None
        ev.enter(f"{where}: the layers' shortest path")
        t = integer_tables(problem, d, sub.per_dp)
        valid = _valid_options(space, sub.degree_index)
        concurrency = sub.per_dp if problem.workload.schedule == "inflight" else None
        weights, const = chain_weights(problem, d, sub.per_dp)  # the time with one stage
        if d.pp == 1:
            found = chain_plan(problem, t, weights, valid, concurrency)
        else:
            time_of = time_function(problem, d, sub.per_dp)
            found = pipeline_plan(problem, t, valid, concurrency, time_of)
        if found is None:
            return None
        plan = found[0]
        cost = price(problem, t, plan)
        if judge(problem, cost.timing, np.array([cost.fits])).feasible[0]:
            self.chained += 1
            self.feasible.found(sub.degree_index, plan)
            ev.evaluate_plan(plan)
            return "solved"
        # memory or an SLO binds: CP-SAT's model weighs them, unless no plan that fits
        # can beat the best
        if d.pp == 1 and math.isfinite(best):
            ev.enter(f"{where}: bounding the plans that fit")
            low = memory_bound(problem, t, weights, valid)
            if low is not None:
                bound = objective_of(problem, d, sub.per_dp, max(low + const, 1.0))
                if bound <= best + ROUNDING * abs(best):
                    self.memory_bounded += 1
                    return "pruned"
        return None

    def settle(self, sub: Subproblem, where: str) -> None:
        """After ``sub`` proved infeasible: bisect with floor models for the fewest
        requests from which no subproblem of its degrees holds a plan."""
        ev, di = self.ctx.evaluator, sub.degree_index
        while (c := self.feasible.probe(di, sub.per_dp, ev.best_objective)) is not None:
            probe = Subproblem(di, c, sub.bound)
            answer = self.solve(probe, f"{where}, floor at {c} requests per rank", floor=True)
            ev.check_time()
            if answer.status not in ("infeasible", "feasible", "optimal"):
                break  # not settled (CP-SAT's own limits): leave it to the solves


def _table_objective(problem: Problem, plan: Plan | None) -> float | None:
    """``plan``'s objective priced from CP-SAT's integer tables at the requests the
    evaluator runs it with."""
    if plan is None:
        return None
    c = requests_per_rank(problem, plan)
    cost = price(problem, integer_tables(problem, plan.degrees, c), plan)
    return float(judge(problem, cost.timing, np.array([cost.fits])).objective[0])


# -- the solver ---------------------------------------------------------------------------


@register("cpsat")
class CpSatSolver(Solver):
    exact = True
    description = "CP-SAT over (degrees, concurrency) subproblems: proven optimum"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1

    def _search(self, ctx: SearchContext) -> Outcome:
        if ctx.problem.workload.objective == "pareto":
            return self._front(ctx)
        problem, ev = ctx.problem, ctx.evaluator
        start = time.perf_counter()
        space = ctx.space
        counts = {"solved": 0, "infeasible": 0, "pruned": 0, "unfinished": 0}
        open_bounds: list[float] = []
        best = -math.inf
        cp_objective = None  # the best plan's objective from CP-SAT's integer tables
        subs: list[Subproblem] | None = None
        discarded = 0
        done = 0  # subproblems solved, proven infeasible or pruned
        solves = _Solves(ctx, self.workers)
        try:
            # A plan to report however early the clock runs out, and the warm start.
            ev.enter("pricing the megatron plan")
            hint = megatron_rule(ctx)[0]
            if hint is not None:
                ev.evaluate_plan(hint)
                solves.feasible.found(int(space.encode(hint)[0]), hint)
            ev.enter("bounding the (degrees, requests) subproblems")
            subs, discarded = subproblems(problem, ev.check_time)
            solves.feasible.index(subs)
            best = ev.best_objective
            for i, sub in enumerate(subs):
                if math.isfinite(best) and sub.bound <= best + ROUNDING * abs(best):
                    counts["pruned"] = len(subs) - i
                    done = len(subs)
                    break
                where = f"subproblem {i + 1} of {len(subs)}"
                di = sub.degree_index
                if solves.feasible.known_infeasible(di, sub.per_dp):
                    counts["infeasible"] += 1  # its degrees' floor model failed at fewer
                    done = i + 1
                    continue
                if (settled := solves.by_chain(sub, where, best)) is not None:
                    counts[settled] += 1
                    done = i + 1
                    best = max(best, ev.best_objective)
                    continue
                result = solves.solve(sub, where)
                if result.status == "infeasible":
                    solves.settle(sub, where)
                done = i + 1
                best = max(best, ev.best_objective)
                if result.status == "infeasible":
                    counts["infeasible"] += 1
                    continue
                if result.status != "optimal":
                    counts["unfinished"] += 1
                    d = space.degree_tuples[di]
                    open_bounds.append(
                        objective_of(problem, d, sub.per_dp, result.bound_ns)
                        if result.bound_ns
                        else sub.bound
                    )
                else:
                    counts["solved"] += 1
                ev.check_time()  # the clock stopped this solve: say so, and where
        except BudgetExhausted:
            best = max(best, ev.best_objective)
            if subs is not None:
                rest = subs[done:]
                cut = best + ROUNDING * abs(best) if math.isfinite(best) else -math.inf
                left_open = [s.bound for s in rest if s.bound > cut]
                open_bounds += left_open
                counts["unfinished"] += len(left_open)
                counts["pruned"] += len(rest) - len(left_open)
        complete = subs is not None
        if complete:
            bound: float | None = max([best, *open_bounds]) if open_bounds else best
            gap = 0.0 if not open_bounds or best <= -math.inf else (bound - best) / abs(bound)
        else:  # the clock ran out before every subproblem had a bound
            bound = gap = None
        proven = complete and not open_bounds
        if ev.best_code is None:
            self._diagnose(ctx)
        else:
            cp_objective = _table_objective(problem, ev.best_plan())
            if bound is not None and cp_objective is not None:
                # CP-SAT prices on integer tables (ns): its value of the best plan may sit
                # a rounding above the evaluator's, and a bound is above both.
                bound = max(bound, cp_objective)
        return Outcome(
            proven_optimal=proven and ev.best_code is not None,
            proven_infeasible=proven and ev.best_code is None,
            facts={
                "subproblems": len(subs) if subs is not None else None,
                "discarded_by_bounds": discarded,
                **counts,
                "cp_objective": cp_objective,
                "bound": bound if bound is not None and math.isfinite(bound) else None,
                "gap": gap,
                "solves": solves.count,
                "by_shortest_path": solves.chained,
                "by_memory_bound": solves.memory_bounded,
                "workers": self.workers,
                "seconds": time.perf_counter() - start,
            },
        )

    def _front(self, ctx: SearchContext) -> Outcome:
        """The exact Pareto front by the epsilon-constraint method.

        Each point is a proven optimum of throughput per GPU under latency bounds (the
        user's SLOs tightened to ``epsilon``): the first without a bound, the next with
        the bound just below the latency of the point before, until no plan meets it.
        With two latency axes the sweep nests: for each bound on the outer axis, the
        inner axis is swept, and the outer bound then goes just below the largest
        outer latency of the points found. The evaluator keeps the non-dominated points
        (a point equalled in throughput at a lower latency drops out). A bound is
        ``SWEEP_STEP`` (relative) below the last latency and the CP-SAT model allows
        ``SWEEP_SLACK`` above it, as its integer tables round each entry (relative 1e-5):
        points closer than that in latency count as one. Exact (``optimal``) when every
        solve was proven.
        """
        problem, ev = ctx.problem, ctx.evaluator
        w = problem.workload
        if w.schedule == "inflight":
            return self._front_by_subproblem(ctx)
        start = time.perf_counter()
        stats = {"solves": 0, "unproven": 0}

        def leaf(bounds: dict[str, float]) -> list[Any]:
            slos = {}
            for a, b in bounds.items():
                limits = [x for x in (getattr(w, a), b * (1 + SWEEP_SLACK)) if x is not None]
                if math.isfinite(min(limits)):
                    slos[a] = min(limits)
            sub = dataclasses.replace(
                problem,
                workload=dataclasses.replace(w, objective="throughput_per_gpu", **slos),
            )
            ev.check_time()
            left = ev.left()
            r = CpSatSolver(self.workers).solve(
                sub, budget=Budget(max_evals=None, seconds=left), seed=ctx.seed
            )
            stats["solves"] += 1
            if r.status == "interrupted":
                raise KeyboardInterrupt
            if r.status == "unknown" or (r.status == "infeasible" and r.facts.get("unfinished")):
                stats["unproven"] += 1  # the clock ran out before the proof
                ev.check_time()
                raise BudgetExhausted
            if r.status == "infeasible" or r.plan is None or r.metrics is None:
                return []
            ev.evaluate_plan(r.plan)
            if r.status != "optimal":
                stats["unproven"] += 1
                ev.check_time()
                raise BudgetExhausted  # the clock ran out inside this solve
            return [r.metrics]

        def sweep(bounds: dict[str, float], axes: tuple[str, ...]) -> list[Any]:
            if not axes:
                return leaf(bounds)
            axis, found = axes[0], []
            bound = math.inf
            while True:
                points = sweep({**bounds, axis: bound}, axes[1:])
                if not points:
                    return found
                found += points
                bound = max(getattr(p, axis) for p in points) * (1 - SWEEP_STEP)

        outer_first = tuple(reversed(w.latency_axes))  # the first axis is swept innermost
        try:
            sweep({}, outer_first)
            proven = stats["unproven"] == 0
        except BudgetExhausted:
            proven = False
        facts = {"front_points": len(ev.front or ()), **stats, "workers": self.workers}
        facts["seconds"] = time.perf_counter() - start
        return Outcome(
            proven_optimal=proven and ev.best_code is not None,
            proven_infeasible=proven and ev.best_code is None,
            facts=facts,
        )

    def _front_by_subproblem(self, ctx: SearchContext) -> Outcome:
        """The exact front over (plan, concurrency) in flight, subproblem by subproblem.

        A subproblem ``(d, c)`` fixes the requests in flight, so its throughput is the
        requests over its time (TPOT; TTFT for prefill): its plans trade nothing
        against throughput, only TTFT against TPOT when both are axes. The front is
        therefore the merge of the subproblems' own fronts: one solve (the least time)
        per subproblem, then with two axes a sweep of TTFT bounds below the last
        point's (``SWEEP_STEP``) until none is met. Subproblems are visited by
        decreasing throughput bound and skipped when their optimistic point (the
        throughput bound, the latency bounds, each loosened by the tables' rounding) is
        dominated or equalled by the front of every plan priced so far (each at every
        concurrency it runs: the front of the evaluator); those whose requests exceed
        what was proven infeasible for the degree tuple are skipped as in the scalar
        search. Exact (``optimal``) when every solve was proven.
        """
        problem, ev = ctx.problem, ctx.evaluator
        assert ev.front is not None
        w = problem.workload
        start = time.perf_counter()
        stats = {"subproblems": 0, "solves": 0, "pruned": 0, "infeasible": 0, "unproven": 0}
        sweep_ttft = w.latency_axes == ("tpot_ms", "ttft_ms")
        solves = _Solves(ctx, self.workers)

        def solve_one(sub: Subproblem, where: str, limits: dict[str, float]) -> SubSolution:
            r = solves.solve(sub, where, limits=limits)
            if r.status not in ("optimal", "infeasible"):
                stats["unproven"] += 1
                ev.check_time()
            return r

        def optimistic(sub: Subproblem) -> np.ndarray:
            low = {"ttft_ms": sub.ttft_low, "tpot_ms": sub.tpot_low}
            point = [-sub.bound * (1 + ROUNDING)]
            point += [(low[a] or 0.0) / 1e6 * (1 - ROUNDING) for a in w.latency_axes]
            return np.array([point])

        try:
            ev.enter("bounding the (degrees, requests) subproblems")
            subs, _ = subproblems(problem, ev.check_time)
            solves.feasible.index(subs)
            stats["subproblems"] = len(subs)
            for i, sub in enumerate(subs):
                di, c = sub.degree_index, sub.per_dp
                if solves.feasible.known_infeasible(di, c):
                    stats["infeasible"] += 1
                    continue
                if dominated_by(ev.front.values, optimistic(sub))[0]:
                    stats["pruned"] += 1
                    continue
                where = f"subproblem {i + 1} of {len(subs)}"
                r = solve_one(sub, where, {})
                if r.status == "infeasible":
                    stats["infeasible"] += 1
                    solves.settle(sub, where)
                    continue
                if r.plan is None:
                    continue
                while sweep_ttft:
                    at = evaluate(problem, dataclasses.replace(r.plan, concurrency=c))
                    limits = {"ttft_ms": at.ttft_ms * (1 - SWEEP_STEP)}
                    r = solve_one(sub, f"{where}, TTFT <= {limits['ttft_ms']:.4g} ms", limits)
                    if r.plan is None:
                        break
            proven = stats["unproven"] == 0
        except BudgetExhausted:
            proven = False
        facts = {"front_points": len(ev.front), **stats, "workers": self.workers}
        facts["solves"] = solves.count
        facts["seconds"] = time.perf_counter() - start
        return Outcome(
            proven_optimal=proven and ev.best_code is not None,
            proven_infeasible=proven and ev.best_code is None,
            facts=facts,
        )

    def _diagnose(self, ctx: SearchContext) -> None:
        """No plan exists: price a few (Megatron's and a sample) so the message can say
        which constraint they all miss, and by how much."""
        codes = [ctx.space.encode(ctx.space.megatron_plan(d)) for d in megatron_candidates(ctx)]
        codes += list(ctx.space.sample(64, seed=ctx.seed))
        with contextlib.suppress(BudgetExhausted):
            ctx.evaluator.evaluate(np.array(codes))
