"""The subproblem solves of one run, and what they show about which subproblems hold
a plan (the floor models' bisection; the warm starts)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from shardlab.costmodel import (
    IntegerTables,
    evaluate,
    integer_tables,
    judge,
    price,
    requests_per_rank,
)
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.solvers.base import SearchContext
from shardlab.solvers.cpsat.bounds import Subproblem, cutoff, valid_options
from shardlab.solvers.cpsat.chain import chain_plan, memory_bound, pipeline_plan
from shardlab.solvers.cpsat.forms import chain_weights, objective_of, time_for, time_function
from shardlab.solvers.cpsat.subproblem_model import SubproblemModel, SubSolution


def table_objective(
    problem: Problem, plan: Plan | None, tables: IntegerTables | None = None
) -> float | None:
    """``plan``'s objective priced from CP-SAT's integer tables: ``tables`` (its
    subproblem's), else those at the requests the evaluator runs it with."""
    if plan is None:
        return None
    if tables is None:
        tables = integer_tables(problem, plan.degrees, requests_per_rank(problem, plan))
    cost = price(problem, tables, plan)
    return float(judge(problem, cost.latencies, np.array([cost.fits])).objective[0])


# A hint must lie inside the cut model: its table objective clears the cut by this
# (relative), more than the integer rounding between the tables and CP-SAT's sums.
HINT_MARGIN = 1e-6


class Feasibility:
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
        at = dataclasses.replace(plan, requests_per_rank=c)
        return at if evaluate(self.problem, at, breakdown=False).feasible else None

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
        cut = cutoff(best)
        open_cs = [
            s.requests_per_rank
            for s in self.subs.get(di, ())
            if lo < s.requests_per_rank < hi and s.bound > cut
        ]
        if not open_cs:
            return None
        lo = max(lo, min(open_cs) - 1)
        return (lo + hi) // 2 if hi - lo > 1 else None


class Solves:
    """Subproblem solves of one run: models built, warm-started, solved on the run's
    clock, every solution priced, and what they prove recorded in ``feasible``."""

    def __init__(self, ctx: SearchContext, workers: int) -> None:
        self.ctx = ctx
        self.workers = workers
        self.feasible = Feasibility(ctx.problem)
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
        beat: float | None = None,
    ) -> SubSolution:
        """Solve ``sub`` (``floor``: its floor model, stopping at the first plan).
        ``beat``: only plans whose objective is above it are admitted; "infeasible" then
        means none beats it, not that the subproblem holds no plan."""
        ev, problem = self.ctx.evaluator, self.ctx.problem
        ev.enter(f"{where}: building its model")
        d = problem.space.degree_tuples[sub.degree_index]
        model = SubproblemModel(
            problem, sub.degree_index, sub.requests_per_rank, ev.check_time, limits, floor=floor
        )
        cut_ns = None if beat is None else time_for(problem, d, sub.requests_per_rank, beat)
        if cut_ns is not None and math.isfinite(cut_ns):
            model.cut_at(cut_ns)
        hint = None if limits else self.feasible.hint(sub.degree_index, sub.requests_per_rank)
        if hint is not None and cut_ns is not None:
            # a hint outside the model aborted CP-SAT 9.15 (see Feasibility.hint)
            value = table_objective(problem, hint, model.t)
            if not value > beat + HINT_MARGIN * abs(beat):
                hint = None
        if hint is not None:
            model.hint(hint)
        ev.enter(f"{where}: {'probing its floor' if floor else 'solving'}")
        left = ev.left()
        result = model.solve(
            left if left is not None else 3600.0,
            self.workers,
            self.ctx.seed,
            lambda row: ev.evaluate(row[None]),
            first=floor,
        )
        self.count += 1
        if floor:
            if result.status == "infeasible":
                self.feasible.floor_fails(sub.degree_index, sub.requests_per_rank)
            elif result.plan is not None:
                self.feasible.floor_holds(sub.degree_index, sub.requests_per_rank)
        elif result.plan is not None and result.row is not None:
            self.feasible.found(sub.degree_index, result.plan)
            if result.row.tobytes() not in ev.cache:
                ev.evaluate(result.row[None])  # the solution callback prices each
        return result

    def by_chain(self, sub: Subproblem, where: str, best: float) -> str | None:
        """Settle ``sub`` by the layers' shortest path (:mod:`shardlab.solvers.cpsat.chain`;
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
        t = integer_tables(problem, d, sub.requests_per_rank)
        valid = valid_options(space, sub.degree_index)
        concurrency = sub.requests_per_rank if problem.workload.schedule == "inflight" else None
        weights, const = chain_weights(problem, d, sub.requests_per_rank)  # the time with one stage
        if d.pp == 1:
            found = chain_plan(problem, t, weights, valid, concurrency)
        else:
            time_of = time_function(problem, d, sub.requests_per_rank)
            found = pipeline_plan(problem, t, valid, concurrency, time_of)
        if found is None:
            return None
        plan = found[0]
        cost = price(problem, t, plan)
        if judge(problem, cost.latencies, np.array([cost.fits])).feasible[0]:
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
                bound = objective_of(problem, d, sub.requests_per_rank, max(low + const, 1.0))
                if bound <= cutoff(best):
                    self.memory_bounded += 1
                    return "pruned"
        return None

    def settle(self, sub: Subproblem, where: str) -> None:
        """After ``sub`` proved infeasible: bisect with floor models for the fewest
        requests from which no subproblem of its degrees holds a plan."""
        ev, di = self.ctx.evaluator, sub.degree_index
        while (c := self.feasible.probe(di, sub.requests_per_rank, ev.best_objective)) is not None:
            probe = Subproblem(degree_index=di, requests_per_rank=c, bound=sub.bound)
            answer = self.solve(probe, f"{where}, floor at {c} requests per rank", floor=True)
            ev.check_time()
            if answer.status not in ("infeasible", "feasible", "optimal"):
                break  # not settled (CP-SAT's own limits): leave it to the solves
