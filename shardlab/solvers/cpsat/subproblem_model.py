"""The CP-SAT model of one (degrees, requests) subproblem, and solving it interruptibly.

One method per family of constraints, built in this order by ``__init__``, each
returning what the later ones read:

- ``_options``: one Boolean per (operator group, operator, valid option), exactly one
  per operator; groups are the layer kinds (options tied) or the layers;
- ``_partition``: boundary ``j`` is the balanced one moved by at most the space's
  shift; layer ``l`` belongs to exactly one stage ``s``, with ``B_s <= l < B_{s+1}``
  (a :class:`Partition`);
- ``_stage_times``: per step and stage, its layers' times (half-reified on
  membership), the model's ends on the first and last stage, the send of the
  residual stream after the stage's last layer; the Booleans of pairs they need
  (``_pairs``: one per pair of options on each edge between operators and on the
  residual stream between consecutive layers of different groups, linked to the
  option Booleans by the product linearization, row and column sums) are made once,
  when first needed;
- ``_memory``: per stage, weights + KV cache of its layers for ``C`` requests + the
  workspace (at least every chosen option's) + reserve <= HBM;
- (a solution callback hands every improving solution to the evaluator as found);
- ``_objective``: the regime's time (the forms of :mod:`shardlab.costmodel`'s regimes,
  affine in the round and the prompt with coefficients fixed by ``C``; fractions
  scaled to integers by their least common denominator) with ``MX >= T_s`` for the
  bottleneck stage and ``R >= SUM, R >= m * MX`` for rounds; TTFT and TPOT SLOs bound
  it; minimized (throughput = tokens / time); an :class:`Objective`.

Integers are nanoseconds and bytes from the decomposition tables, rounded per entry;
an optimum is exact within that rounding (relative 1e-5 on the suite). Symmetry:
options that would shard an axis of size 1 are already absent from the space.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from shardlab.costmodel import basic_times, integer_tables
from shardlab.problems.operators import LAST_STAGE_HEADS, Head
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.problems.space import MAX_SHIFT, balanced_boundaries, max_shift
from shardlab.solvers.cpsat.forms import integer_weight, scaled, subproblem_forms

# Largest value CP-SAT's objective may reach here (a margin below 2^63 for its sums).
OBJECTIVE_LIMIT = 2**61

CP_STATUS = {
    cp_model.OPTIMAL: "optimal",
    cp_model.FEASIBLE: "feasible",
    cp_model.INFEASIBLE: "infeasible",
    cp_model.MODEL_INVALID: "model_invalid",
    cp_model.UNKNOWN: "unknown",
}


@dataclass(frozen=True, kw_only=True)
class SubSolution:
    status: str  # optimal, feasible, infeasible, unknown
    plan: Plan | None
    row: np.ndarray | None  # the plan's encoding in the space
    time_ns: float | None  # the objective's time expression at the plan
    bound_ns: float  # lower bound on the time (CP-SAT's best bound)


OptionVars = dict[int, cp_model.IntVar]
"""An operator's Booleans, one per valid option (by its index in the operator's list)."""

PairVars = dict[tuple[int, int], cp_model.IntVar]
"""Booleans of pairs: of two operators' options, or of (last layer, its residual option)."""

PairKey = tuple[int, int]
"""The two :data:`OptionVars` a :data:`PairVars` links, by identity."""

Expr = cp_model.LinearExprT
"""An integer expression over the model's variables (or a plain integer)."""


@dataclass(frozen=True, kw_only=True)
class Partition:
    """The pipeline's partition: boundary ``j`` is ``bounds[j]``, between ``lo[j]`` and
    ``hi[j]``; ``member[layer][stage]`` is the Boolean of ``layer`` on ``stage`` (1 when
    no other stage can hold it)."""

    shift_vars: list[cp_model.IntVar]  # each inner boundary's shift from the balanced one
    bounds: list[Expr]  # 0, the inner boundaries (expressions), the layer count
    lo: list[int]
    hi: list[int]
    member: dict[int, dict[int, cp_model.IntVar | int]]


@dataclass(frozen=True, kw_only=True)
class Objective:
    """The minimized time as an integer expression, ``scale`` times the time in ns."""

    expr: Expr
    scale: float


class SubproblemModel:
    """The CP-SAT model of one subproblem ``(d, C)`` (see the module docstring)."""

    def __init__(
        self,
        problem: Problem,
        degree_index: int,
        requests_per_rank: int,
        check: Callable[[], None] = lambda: None,
        limits: dict[str, float] | None = None,
        *,
        floor: bool = False,
    ) -> None:
        """``check`` is called between the families of constraints (the clock);
        ``limits`` bounds ``ttft_ms`` and ``tpot_ms`` beyond the workload's SLOs;
        ``floor``: the relaxation of every subproblem with ``requests_per_rank`` requests or more
        (see :class:`~shardlab.solvers.cpsat.solves.Feasibility`)."""
        self.problem = problem
        self.limits = limits or {}
        self.space = problem.space
        self.transformer = problem.model  # the network; self.cp is the CP-SAT model
        self.degree_index = degree_index
        self.d = self.space.degree_tuples[degree_index]
        self.requests_per_rank = requests_per_rank
        self.t = integer_tables(problem, self.d, requests_per_rank, floor=floor)
        self.forms = subproblem_forms(problem, self.d, requests_per_rank, floor=floor)
        self.cp = cp_model.CpModel()
        self.steps = len(self.t.steps)
        self.group_of_layer = {layer: g for g in self.space.groups for layer in g.layers}
        self.classes = {c: i for i, c in enumerate(self.t.classes)}
        self._pair_cache: dict[PairKey, PairVars] = {}
        self._last_cache: dict[int, PairVars] = {}  # by stage: see _send
        # the families in the order they are built, the clock checked before each
        check()
        self.x = self._options()
        check()
        self.partition = self._partition()
        check()
        stage_time = self._stage_times()
        check()
        self._memory()
        check()
        self.objective = self._objective(stage_time)

    # options ----------------------------------------------------------------------------

    def _options(self) -> dict[tuple[str, int], OptionVars]:
        """One Boolean per valid option of each operator of each group; exactly one. By
        (group key, the operator's index in the group)."""
        mask = self.space.mask(self.degree_index)
        x: dict[tuple[str, int], OptionVars] = {}
        for v, g, op in self.space.option_slots():
            k = [o.name for o in g.ops].index(op.name)
            choices = {
                o: self.cp.NewBoolVar(f"x[{g.key}.{op.name}={op.options[o].name}]")
                for o in np.flatnonzero(mask[v]).tolist()
            }
            self.cp.AddExactlyOne(choices.values())
            x[(g.key, k)] = choices
        return x

    def _head(self, h: Head) -> OptionVars:
        return self.x[("head", int(h))]

    def _pairs(self, a: OptionVars, b: OptionVars) -> PairVars:
        """Booleans for the pairs of two operators' options, linked by row/column sums."""
        key = (id(a), id(b))
        if key in self._pair_cache:
            return self._pair_cache[key]
        z = {(i, j): self.cp.NewBoolVar("") for i in a for j in b}
        for i, xi in a.items():
            self.cp.Add(sum(z[(i, j)] for j in b) == xi)
        for j, xj in b.items():
            self.cp.Add(sum(z[(i, j)] for i in a) == xj)
        self._pair_cache[key] = z
        return z

    def _cost(self, x: OptionVars, table: np.ndarray) -> Expr:
        return sum(int(table[o]) * var for o, var in x.items())

    def _pair_cost(self, z: PairVars, table: np.ndarray) -> Expr:
        return sum(int(table[i, j]) * var for (i, j), var in z.items() if table[i, j])

    # partition ----------------------------------------------------------------------------

    def _partition(self) -> Partition:
        """Boundaries within the space's shift; each layer in exactly one stage."""
        pp, n_layers = self.d.pp, self.transformer.num_layers
        base = balanced_boundaries(n_layers, pp)
        shift = max_shift(n_layers, pp)
        shift_vars = [self.cp.NewIntVar(-shift, shift, f"shift{j + 1}") for j in base]
        bounds = [0, *[b + s for b, s in zip(base, shift_vars, strict=True)], n_layers]
        lo = [0, *[b - shift for b in base], n_layers]
        hi = [0, *[b + shift for b in base], n_layers]
        member: dict[int, dict[int, cp_model.IntVar | int]] = {}
        for layer in range(n_layers):
            stages = [s for s in range(pp) if lo[s] <= layer < hi[s + 1]]
            if len(stages) == 1:
                member[layer] = {stages[0]: 1}
                continue
            ys = {s: self.cp.NewBoolVar(f"y[{layer},{s}]") for s in stages}
            self.cp.AddExactlyOne(ys.values())
            for s, y in ys.items():
                if s >= 1:
                    self.cp.Add(bounds[s] <= layer).OnlyEnforceIf(y)
                if s < pp - 1:
                    self.cp.Add(bounds[s + 1] >= layer + 1).OnlyEnforceIf(y)
            member[layer] = dict(ys)
        return Partition(shift_vars=shift_vars, bounds=bounds, lo=lo, hi=hi, member=member)

    def _on_stage(self, layer: int, stage: int, expr: Expr, high: int, name: str) -> Expr:
        """``expr`` if ``layer`` is on ``stage`` else 0 (half-reified when undecided)."""
        y = self.partition.member[layer].get(stage)
        if y is None:
            return 0
        if isinstance(y, int):
            return expr
        w = self.cp.NewIntVar(0, max(high, 0), name)
        self.cp.Add(w == expr).OnlyEnforceIf(y)
        self.cp.Add(w == 0).OnlyEnforceIf(y.Not())
        return w

    # times ----------------------------------------------------------------------------------

    def _residual(self, layer: int) -> OptionVars:
        return self.x[(self.group_of_layer[layer].key, 0)]

    def _layer_time(self, layer: int, step: int) -> tuple[Expr, int]:
        """(time expression, an upper bound) of one layer in one step."""
        g = self.group_of_layer[layer]
        kind = self.transformer.layer_kinds[layer]
        c = self.classes[(kind, self.transformer.attention_layers[layer])]
        expr: Expr = 0
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

    def _stage_times(self) -> list[list[Expr]]:
        """Per step, each stage's time: its layers, the model's ends, the send on."""
        pp, t = self.d.pp, self.t
        emb, fnorm, lm, sampler = (self._head(h) for h in Head)
        first_res, last_res = self._residual(0), self._residual(self.transformer.num_layers - 1)
        stage_time: list[list[Expr]] = []
        for step in range(self.steps):
            per_stage: list[Expr] = [0] * pp
            for layer in range(self.transformer.num_layers):
                expr, high = self._layer_time(layer, step)
                for s in self.partition.member[layer]:
                    per_stage[s] += self._on_stage(layer, s, expr, high, f"t[{step},{layer},{s}]")
            per_stage[0] += self._cost(emb, t.head_ns[step, Head.EMBEDDING])
            per_stage[0] += self._pair_cost(self._pairs(emb, first_res), t.emb_first_ns[step])
            for h in LAST_STAGE_HEADS:
                per_stage[-1] += self._cost(self._head(h), t.head_ns[step, h])
            per_stage[-1] += self._pair_cost(self._pairs(last_res, fnorm), t.last_fnorm_ns[step])
            per_stage[-1] += self._pair_cost(self._pairs(fnorm, lm), t.fnorm_lm_ns[step])
            per_stage[-1] += self._pair_cost(self._pairs(lm, sampler), t.lm_sampler_ns[step])
            for s in range(pp - 1):
                per_stage[s] += self._send(s, step)
            stage_time.append(per_stage)
        return stage_time

    def _send(self, stage: int, step: int) -> Expr:
        """The p2p send after the stage's last layer, by that layer's residual option."""
        table = self.t.p2p_ns[step, stage]
        part = self.partition
        candidates = range(part.lo[stage + 1] - 1, part.hi[stage + 1])
        if len(candidates) == 1:
            return self._cost(self._residual(candidates[0]), table)
        if stage not in self._last_cache:  # the same last-layer Booleans serve every step
            lasts = {}
            for layer in candidates:
                last = self.cp.NewBoolVar(f"last[{layer},{stage}]")
                self.cp.Add(part.bounds[stage + 1] == layer + 1).OnlyEnforceIf(last)
                lasts[layer] = last
            self.cp.AddExactlyOne(lasts.values())
            both: PairVars = {}
            for layer, last in lasts.items():
                for o, x in self._residual(layer).items():
                    q = self.cp.NewBoolVar("")
                    self.cp.AddBoolAnd([last, x]).OnlyEnforceIf(q)
                    self.cp.AddBoolOr([last.Not(), x.Not()]).OnlyEnforceIf(q.Not())
                    both[(layer, o)] = q
            self._last_cache[stage] = both
        both = self._last_cache[stage]
        return sum(int(table[o]) * q for (_, o), q in both.items() if table[o])

    # memory ------------------------------------------------------------------------------

    def _memory(self) -> None:
        """Per stage: weights and KV cache of its layers, the workspace and the reserve
        within HBM."""
        t, pp = self.t, self.d.pp
        top_act = int(max(t.act_bytes.max(), t.head_act_bytes.max()))
        workspace = self.cp.NewIntVar(0, top_act, "workspace")
        stage_mem: list[Expr] = [0] * pp
        seen: set[tuple[str, int]] = set()
        for layer in range(self.transformer.num_layers):
            g = self.group_of_layer[layer]
            kind = self.transformer.layer_kinds[layer]
            c = self.classes[(kind, self.transformer.attention_layers[layer])]
            mem: Expr = 0
            high = 0
            for ki in range(len(g.ops)):
                x = self.x[(g.key, ki)]
                table = t.weight_bytes[c, ki] + t.kv_bytes[c, ki]
                mem += self._cost(x, table)
                high += int(max(table[o] for o in x))
                if (g.key, c) not in seen:
                    self.cp.Add(workspace >= self._cost(x, t.act_bytes[c, ki]))
            seen.add((g.key, c))
            for s in self.partition.member[layer]:
                stage_mem[s] += self._on_stage(layer, s, mem, high, f"m[{layer},{s}]")
        for h in Head:
            self.cp.Add(workspace >= self._cost(self._head(h), t.head_act_bytes[h]))
        stage_mem[0] += self._cost(self._head(Head.EMBEDDING), t.head_weight_bytes[Head.EMBEDDING])
        for h in LAST_STAGE_HEADS:
            stage_mem[-1] += self._cost(self._head(h), t.head_weight_bytes[h])
        limit = t.hbm_bytes - t.reserve_bytes
        for s in range(pp):
            self.cp.Add(stage_mem[s] + workspace <= limit)

    # objective ---------------------------------------------------------------------------

    def _objective(self, stage_time: list[list[Expr]]) -> Objective:
        """The regime's time over ``stage_time`` (per step, each stage's), bounded by the
        SLOs and minimized."""
        f = self.forms
        w = self.problem.workload
        # CP-SAT refuses a model whose objective could overflow 64 bits. The minimized
        # form's exact integer coefficients (the request latency's carry (output - 1)
        # and the closed loop's fractions: billions) times the largest time may not fit:
        # the horizon then shrinks to 1,000 s a round or prompt (a plan slower than that
        # serves no one), and past that the coefficients are rounded to 2^61 over the
        # horizon (relative error ~1e-6, below the tables' own rounding).
        time_form = f.time(w.objective)
        weight = integer_weight(time_form)
        horizon = 10**15 if weight * 10**15 <= OBJECTIVE_LIMIT else 10**12

        def maximum(a: Expr, b: Expr) -> Expr:
            r = self.cp.NewIntVar(0, horizon, "")
            self.cp.Add(r >= a)
            self.cp.Add(r >= b)
            return r

        sums, maxes = [], []
        for step in range(self.steps):
            mx = self.cp.NewIntVar(0, horizon, f"max_stage[{step}]")
            for expr in stage_time[step]:
                self.cp.Add(mx >= expr)
            sums.append(sum(stage_time[step]))
            maxes.append(mx)
        m = min(self.d.pp, self.requests_per_rank)
        rnd, prompt = basic_times(f, m, sums, maxes, maximum)
        for name, form in (("ttft_ms", f.ttft), ("tpot_ms", f.tpot)):
            if form is None:
                continue
            expr, scale = scaled(form, rnd, prompt)
            given = [x for x in (getattr(w, name), self.limits.get(name)) if x is not None]
            if given:
                # scale * latency <= scale * bound, in whole ns (the latency's own are)
                self.cp.Add(expr <= math.floor(min(given) * 1e6 * scale))
        if weight * horizon <= OBJECTIVE_LIMIT:
            time_expr, int_scale = scaled(time_form, rnd, prompt)
            objective = Objective(expr=time_expr, scale=int_scale)
        else:
            coefficients = [float(time_form.round), float(time_form.prompt)]
            k = OBJECTIVE_LIMIT / (horizon * sum(abs(c) for c in coefficients))
            a, b = (round(c * k) for c in coefficients)
            time_expr = a * rnd + b * prompt + round(float(time_form.const) * k)
            objective = Objective(expr=time_expr, scale=k)
        self.cp.Minimize(objective.expr)
        return objective

    def cut_at(self, time_ns: float) -> None:
        """Admit only plans whose time is at most ``time_ns`` (those that beat the
        incumbent): CP-SAT then proves "none better" instead of the subproblem's own
        optimum, which its bound rarely closes quickly."""
        # a time read back from a solution is its integer objective over the scale: the
        # float product can fall a few ulps under that integer (1e-12 relative covers it)
        scaled_ns = time_ns * self.objective.scale
        self.cp.Add(self.objective.expr <= math.floor(scaled_ns + abs(scaled_ns) * 1e-12))

    # hints and solutions -------------------------------------------------------------

    def hint(self, plan: Plan) -> None:
        """Warm-start from ``plan`` (used when it has this subproblem's degrees)."""
        row = self.space.encode(plan)
        for v, g, op in self.space.option_slots():
            k = [o.name for o in g.ops].index(op.name)
            for o, var in self.x[(g.key, k)].items():
                self.cp.AddHint(var, int(o == row[v]))
        for j, var in enumerate(self.partition.shift_vars):
            self.cp.AddHint(var, int(row[self.space.first_cut + j]) - MAX_SHIFT)

    def row(self, value: Callable[[cp_model.IntVar], int]) -> np.ndarray:
        """The encoding of the solution whose variable values ``value`` reads."""
        row = np.zeros(self.space.n_vars, dtype=np.int64)
        row[0] = self.degree_index
        for v, g, op in self.space.option_slots():
            k = [o.name for o in g.ops].index(op.name)
            row[v] = next(o for o, var in self.x[(g.key, k)].items() if value(var))
        row[self.space.first_cut :] = MAX_SHIFT
        for j, var in enumerate(self.partition.shift_vars):
            row[self.space.first_cut + j] = value(var) + MAX_SHIFT
        return row

    def solve(
        self,
        seconds: float,
        workers: int,
        seed: int,
        on_row: Callable[[np.ndarray], None],
        *,
        first: bool = False,
    ) -> SubSolution:
        """Solve (``first``: stop at the first solution, a feasibility probe); every
        improving solution is passed to ``on_row`` as it is found, as its encoding in the
        space (the evaluator prices rows; the history and the progress bar). ``on_row``
        may raise ``BudgetExhausted``: the search then stops and the exception is raised
        again here."""
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
        callback = _Incumbents(self, on_row)
        status = CP_STATUS.get(_solve_interruptibly(solver, self.cp, callback), "unknown")
        if callback.stopped is not None:
            raise callback.stopped
        if status not in ("optimal", "feasible"):
            bound_ns = math.inf if status == "infeasible" else 0.0
            return SubSolution(status=status, plan=None, row=None, time_ns=None, bound_ns=bound_ns)
        row = self.row(solver.Value)
        return SubSolution(
            status=status,
            plan=self.space.decode(row),
            row=row,
            time_ns=solver.ObjectiveValue() / self.objective.scale,
            bound_ns=solver.BestObjectiveBound() / self.objective.scale,
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

    def __init__(self, subproblem: SubproblemModel, on_row: Callable[[np.ndarray], None]) -> None:
        super().__init__()
        self.subproblem = subproblem
        self.on_row = on_row
        self.stopped: BaseException | None = None

    def on_solution_callback(self) -> None:
        try:
            self.on_row(self.subproblem.row(self.Value))
        except BaseException as exc:
            # The budget, a progress callback's Ctrl-C or a bug: stop and raise it from
            # SubproblemModel.solve, on the caller's thread.
            self.stopped = exc
            self.StopSearch()
