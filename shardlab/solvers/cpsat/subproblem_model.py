"""The CP-SAT model of one (degrees, requests) subproblem, and solving it interruptibly.

One method per family of constraints:

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
- ``_objective``: the regime's time (the forms of :mod:`shardlab.costmodel`'s regimes,
  affine in the round and the prompt with coefficients fixed by ``C``; fractions
  scaled to integers by their least common denominator) with ``MX >= T_s`` for the
  bottleneck stage and ``R >= SUM, R >= m * MX`` for rounds; TTFT and TPOT SLOs bound
  it; minimized (throughput = tokens / time).

Integers are nanoseconds and bytes from the decomposition tables, rounded per entry;
an optimum is exact within that rounding (relative 1e-5 on the suite). Symmetry:
options that would shard an axis of size 1 are already absent from the space.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from shardlab.costmodel import basic_times, integer_tables
from shardlab.problems.operators import HEAD_OPS
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
                o: self.cp.NewBoolVar(f"x[{g.key}.{op.name}={op.options[o].name}]")
                for o in np.flatnonzero(mask[v]).tolist()
            }
            self.cp.AddExactlyOne(choices.values())
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
        z = {(i, j): self.cp.NewBoolVar("") for i in a for j in b}
        for i, xi in a.items():
            self.cp.Add(sum(z[(i, j)] for j in b) == xi)
        for j, xj in b.items():
            self.cp.Add(sum(z[(i, j)] for i in a) == xj)
        self._pair_cache[key] = z
        return z

    def _cost(self, x: dict[int, cp_model.IntVar], table: np.ndarray) -> Any:
        return sum(int(table[o]) * var for o, var in x.items())

    def _pair_cost(self, z: dict[tuple[int, int], cp_model.IntVar], table: np.ndarray) -> Any:
        return sum(int(table[i, j]) * var for (i, j), var in z.items() if table[i, j])

    # partition ----------------------------------------------------------------------------

    def _partition(self) -> None:
        """Boundaries within the space's shift; each layer in exactly one stage."""
        pp, n_layers = self.d.pp, self.transformer.num_layers
        base = balanced_boundaries(n_layers, pp)
        shift = max_shift(n_layers, pp)
        self.shift_vars = [self.cp.NewIntVar(-shift, shift, f"shift{j + 1}") for j in base]
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
            ys = {s: self.cp.NewBoolVar(f"y[{layer},{s}]") for s in stages}
            self.cp.AddExactlyOne(ys.values())
            for s, y in ys.items():
                if s >= 1:
                    self.cp.Add(bounds[s] <= layer).OnlyEnforceIf(y)
                if s < pp - 1:
                    self.cp.Add(bounds[s + 1] >= layer + 1).OnlyEnforceIf(y)
            self.member[layer] = ys
        self.lo, self.hi = lo, hi

    def _on_stage(self, layer: int, stage: int, expr: Any, high: int, name: str) -> Any:
        """``expr`` if ``layer`` is on ``stage`` else 0 (half-reified when undecided)."""
        y = self.member[layer].get(stage)
        if y is None:
            return 0
        if isinstance(y, int):
            return expr
        w = self.cp.NewIntVar(0, max(high, 0), name)
        self.cp.Add(w == expr).OnlyEnforceIf(y)
        self.cp.Add(w == 0).OnlyEnforceIf(y.Not())
        return w

    # times ----------------------------------------------------------------------------------

    def _residual(self, layer: int) -> dict[int, cp_model.IntVar]:
        return self.x[(self.group_of_layer[layer].key, 0)]

    def _layer_time(self, layer: int, step: int) -> tuple[Any, int]:
        """(time expression, an upper bound) of one layer in one step."""
        g = self.group_of_layer[layer]
        kind = self.transformer.layer_kinds[layer]
        c = self.classes[(kind, self.transformer.attention_layers[layer])]
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
        first_res, last_res = self._residual(0), self._residual(self.transformer.num_layers - 1)
        self.stage_time: list[list[Any]] = []
        for step in range(self.steps):
            per_stage: list[Any] = [0] * pp
            for layer in range(self.transformer.num_layers):
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
                last = self.cp.NewBoolVar(f"last[{layer},{stage}]")
                self.cp.Add(boundary == layer + 1).OnlyEnforceIf(last)
                lasts[layer] = last
            self.cp.AddExactlyOne(lasts.values())
            both = {}
            for layer, last in lasts.items():
                for o, x in self._residual(layer).items():
                    q = self.cp.NewBoolVar("")
                    self.cp.AddBoolAnd([last, x]).OnlyEnforceIf(q)
                    self.cp.AddBoolOr([last.Not(), x.Not()]).OnlyEnforceIf(q.Not())
                    both[(layer, o)] = q
            self._pair_cache[key] = both  # type: ignore[assignment]
        both = self._pair_cache[key]  # type: ignore[index]
        return sum(int(table[o]) * q for (_, o), q in both.items() if table[o])

    # memory ------------------------------------------------------------------------------

    def _memory(self) -> None:
        t, pp = self.t, self.d.pp
        head = [self.x[("head", ki)] for ki in range(len(HEAD_OPS))]
        top_act = int(max(t.act_bytes.max(), t.head_act_bytes.max()))
        workspace = self.cp.NewIntVar(0, top_act, "workspace")
        stage_mem: list[Any] = [0] * pp
        seen: set[tuple[str, int]] = set()
        for layer in range(self.transformer.num_layers):
            g = self.group_of_layer[layer]
            kind = self.transformer.layer_kinds[layer]
            c = self.classes[(kind, self.transformer.attention_layers[layer])]
            mem: Any = 0
            high = 0
            for ki in range(len(g.ops)):
                x = self.x[(g.key, ki)]
                table = t.weight_bytes[c, ki] + t.kv_bytes[c, ki]
                mem += self._cost(x, table)
                high += int(max(table[o] for o in x))
                if (g.key, c) not in seen:
                    self.cp.Add(workspace >= self._cost(x, t.act_bytes[c, ki]))
            seen.add((g.key, c))
            for s in self.member[layer]:
                stage_mem[s] += self._on_stage(layer, s, mem, high, f"m[{layer},{s}]")
        for ki, x in enumerate(head):
            self.cp.Add(workspace >= self._cost(x, t.head_act_bytes[ki]))
        stage_mem[0] += self._cost(head[0], t.head_weight_bytes[0])
        for ki in (1, 2, 3):
            stage_mem[-1] += self._cost(head[ki], t.head_weight_bytes[ki])
        limit = t.hbm_bytes - t.reserve_bytes
        for s in range(pp):
            self.cp.Add(stage_mem[s] + workspace <= limit)

    # objective ---------------------------------------------------------------------------

    def _objective(self) -> None:
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

        def maximum(a: Any, b: Any) -> Any:
            r = self.cp.NewIntVar(0, horizon, "")
            self.cp.Add(r >= a)
            self.cp.Add(r >= b)
            return r

        sums, maxes = [], []
        for step in range(self.steps):
            mx = self.cp.NewIntVar(0, horizon, f"max_stage[{step}]")
            for expr in self.stage_time[step]:
                self.cp.Add(mx >= expr)
            sums.append(sum(self.stage_time[step]))
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
            time_expr, scale = scaled(time_form, rnd, prompt)
            self.time_scale: float = scale
        else:
            coefficients = [float(time_form.round), float(time_form.prompt)]
            k = OBJECTIVE_LIMIT / (horizon * sum(abs(c) for c in coefficients))
            a, b = (round(c * k) for c in coefficients)
            time_expr = a * rnd + b * prompt + round(float(time_form.const) * k)
            self.time_scale = k
        self.time_expr = time_expr
        self.cp.Minimize(time_expr)

    def cut_at(self, time_ns: float) -> None:
        """Admit only plans whose time is at most ``time_ns`` (those that beat the
        incumbent): CP-SAT then proves "none better" instead of the subproblem's own
        optimum, which its bound rarely closes quickly."""
        self.cp.Add(self.time_expr <= math.floor(time_ns * self.time_scale))

    # hints and solutions -------------------------------------------------------------

    def hint(self, plan: Plan) -> None:
        """Warm-start from ``plan`` (used when it has this subproblem's degrees)."""
        row = self.space.encode(plan)
        for v, g, op in self.space.option_slots():
            k = [o.name for o in g.ops].index(op.name)
            for o, var in self.x[(g.key, k)].items():
                self.cp.AddHint(var, int(o == row[v]))
        for j, var in enumerate(self.shift_vars):
            self.cp.AddHint(var, int(row[self.space.first_cut + j]) - MAX_SHIFT)

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
            time_ns=solver.ObjectiveValue() / self.time_scale,
            bound_ns=solver.BestObjectiveBound() / self.time_scale,
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
