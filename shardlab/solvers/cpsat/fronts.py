"""The exact Pareto fronts: by an epsilon-constraint sweep of whole solves (static
batches), or subproblem by subproblem (in flight)."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np

from shardlab.costmodel import evaluate
from shardlab.solvers.base import Budget, Outcome, SearchContext, Solver
from shardlab.solvers.cpsat.bounds import ROUNDING, Subproblem, subproblems
from shardlab.solvers.cpsat.solves import Solves
from shardlab.solvers.cpsat.subproblem_model import SubSolution
from shardlab.solvers.evaluator import BudgetExhausted
from shardlab.solvers.front import dominated_by

# The next latency bound is this far (relative) below the last point's, and the model
# allows this much above a bound.
SWEEP_STEP = 1e-4
SWEEP_SLACK = 2e-5


class SweepFront:
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

    def __init__(self, ctx: SearchContext, solver: Solver, workers: int) -> None:
        """``solver`` solves each point's problem (a scalar CP-SAT solve)."""
        self.ctx = ctx
        self.solver = solver
        self.workers = workers
        self.stats = {"solves": 0, "unproven": 0}

    def run(self) -> Outcome:
        ev = self.ctx.evaluator
        start = time.perf_counter()
        outer_first = tuple(reversed(self.ctx.problem.workload.latency_axes))
        try:
            self._sweep({}, outer_first)  # the first axis is swept innermost
            proven = self.stats["unproven"] == 0
        except BudgetExhausted:
            proven = False
        facts = {"front_points": len(ev.front or ()), **self.stats, "workers": self.workers}
        facts["seconds"] = time.perf_counter() - start
        return Outcome(
            proven_optimal=proven and ev.best_code is not None,
            proven_infeasible=proven and ev.best_code is None,
            facts=facts,
        )

    def _sweep(self, bounds: dict[str, float], axes: tuple[str, ...]) -> list[Any]:
        if not axes:
            return self._point(bounds)
        axis, found = axes[0], []
        bound = math.inf
        while True:
            points = self._sweep({**bounds, axis: bound}, axes[1:])
            if not points:
                return found
            found += points
            bound = max(getattr(p, axis) for p in points) * (1 - SWEEP_STEP)

    def _point(self, bounds: dict[str, float]) -> list[Any]:
        """The best plan under ``bounds`` (with the SLOs), as its metrics; none when no
        plan meets them."""
        problem, ev = self.ctx.problem, self.ctx.evaluator
        w = problem.workload
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
        r = self.solver.solve(
            sub, budget=Budget(max_evals=None, seconds=ev.left()), seed=self.ctx.seed
        )
        self.stats["solves"] += 1
        if r.status == "interrupted":
            raise KeyboardInterrupt
        if r.status == "unknown" or (r.status == "infeasible" and r.facts.get("unfinished")):
            self.stats["unproven"] += 1  # the clock ran out before the proof
            ev.check_time()
            raise BudgetExhausted
        if r.status == "infeasible" or r.plan is None or r.metrics is None:
            return []
        ev.evaluate_plan(r.plan)
        if r.status != "optimal":
            self.stats["unproven"] += 1
            ev.check_time()
            raise BudgetExhausted  # the clock ran out inside this solve
        return [r.metrics]


class SubproblemFront:
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

    def __init__(self, ctx: SearchContext, workers: int) -> None:
        self.ctx = ctx
        self.workers = workers
        self.solves = Solves(ctx, workers)
        self.stats = {"subproblems": 0, "solves": 0, "pruned": 0, "infeasible": 0, "unproven": 0}
        self.sweep_ttft = ctx.problem.workload.latency_axes == ("tpot_ms", "ttft_ms")

    def run(self) -> Outcome:
        ev = self.ctx.evaluator
        assert ev.front is not None
        start = time.perf_counter()
        try:
            ev.enter("bounding the (degrees, requests) subproblems")
            subs, _ = subproblems(self.ctx.problem, ev.check_time)
            self.solves.feasible.index(subs)
            self.stats["subproblems"] = len(subs)
            for i, sub in enumerate(subs):
                self._visit(sub, f"subproblem {i + 1} of {len(subs)}")
            proven = self.stats["unproven"] == 0
        except BudgetExhausted:
            proven = False
        facts = {"front_points": len(ev.front), **self.stats, "workers": self.workers}
        facts["solves"] = self.solves.count
        facts["seconds"] = time.perf_counter() - start
        return Outcome(
            proven_optimal=proven and ev.best_code is not None,
            proven_infeasible=proven and ev.best_code is None,
            facts=facts,
        )

    def _visit(self, sub: Subproblem, where: str) -> None:
        """Skip ``sub`` (known infeasible, or its optimistic point dominated), or solve
        it and, with two axes, sweep its TTFT."""
        ev, solves = self.ctx.evaluator, self.solves
        assert ev.front is not None
        di, c = sub.degree_index, sub.requests_per_rank
        if solves.feasible.known_infeasible(di, c):
            self.stats["infeasible"] += 1
            return
        if dominated_by(ev.front.values, self._optimistic(sub))[0]:
            self.stats["pruned"] += 1
            return
        r = self._solve(sub, where, {})
        if r.status == "infeasible":
            self.stats["infeasible"] += 1
            solves.settle(sub, where)
            return
        if r.plan is None:
            return
        while self.sweep_ttft:
            at = evaluate(self.ctx.problem, dataclasses.replace(r.plan, requests_per_rank=c))
            limits = {"ttft_ms": at.ttft_ms * (1 - SWEEP_STEP)}
            r = self._solve(sub, f"{where}, TTFT <= {limits['ttft_ms']:.4g} ms", limits)
            if r.plan is None:
                break

    def _solve(self, sub: Subproblem, where: str, limits: dict[str, float]) -> SubSolution:
        r = self.solves.solve(sub, where, limits=limits)
        if r.status not in ("optimal", "infeasible"):
            self.stats["unproven"] += 1
            self.ctx.evaluator.check_time()
        return r

    def _optimistic(self, sub: Subproblem) -> np.ndarray:
        """The best point any plan of ``sub`` could reach, loosened by the rounding."""
        w = self.ctx.problem.workload
        low = {"ttft_ms": sub.ttft_low, "tpot_ms": sub.tpot_low}
        point = [-sub.bound * (1 + ROUNDING)]
        point += [(low[a] or 0.0) / 1e6 * (1 - ROUNDING) for a in w.latency_axes]
        return np.array([point])
