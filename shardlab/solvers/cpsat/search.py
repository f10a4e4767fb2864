"""The scalar search: subproblems visited best bound first, each settled by a bound,
the floor models' bisection, the layers' shortest path or its CP-SAT model, until no
bound beats the incumbent or the clock runs out.

Facts it reports (:class:`~shardlab.solvers.base.Outcome`): ``bound`` is an upper bound
on the objective of every plan, and ``gap`` the relative distance of the best plan to
it; both are None when the clock ran out before every subproblem had a bound
(``subproblems`` None): nothing is then proven about the plans not yet bounded, however
good the best plan found so far.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from shardlab.solvers.base import Outcome, SearchContext
from shardlab.solvers.cpsat.bounds import Subproblem, cutoff, subproblems
from shardlab.solvers.cpsat.forms import objective_of
from shardlab.solvers.cpsat.solves import Solves, table_objective
from shardlab.solvers.cpsat.subproblem_model import SubSolution
from shardlab.solvers.evaluator import BudgetExhausted
from shardlab.solvers.megatron import megatron_rule


class ScalarSearch:
    """One run of the scalar search; :meth:`run` returns what it proved."""

    def __init__(self, ctx: SearchContext, workers: int) -> None:
        self.ctx = ctx
        self.ev = ctx.evaluator
        self.workers = workers
        self.solves = Solves(ctx, workers)
        # cut_off: solved with the incumbent as a cut, and nothing in it beats it
        self.counts = {"solved": 0, "infeasible": 0, "pruned": 0, "cut_off": 0, "unfinished": 0}
        self.open_bounds: list[float] = []  # of the subproblems not settled
        self.best = -math.inf
        self.subs: list[Subproblem] | None = None
        self.discarded = 0
        self.done = 0  # subproblems solved, proven infeasible or pruned

    def run(self, diagnose: Callable[[SearchContext], None]) -> Outcome:
        """Search; ``diagnose(ctx)`` prices a few plans when none was found, for the
        message."""
        start = time.perf_counter()
        try:
            self._start()
            self._visit_all()
        except BudgetExhausted:
            self._ran_out()
        return self._outcome(start, diagnose)

    def _start(self) -> None:
        """The Megatron rule's plan (reported however early the clock runs out, and the
        first warm start), then the subproblems and their bounds."""
        ev, space = self.ev, self.ctx.space
        ev.enter("pricing the megatron plan")
        hint = megatron_rule(self.ctx)[0]
        if hint is not None:
            code = space.encode(hint)
            ev.evaluate(code[None])
            self.solves.feasible.found(int(code[0]), hint)
        ev.enter("bounding the (degrees, requests) subproblems")
        self.subs, self.discarded = subproblems(self.ctx.problem, ev.check_time, self.workers)
        self.solves.feasible.index(self.subs)
        self.best = ev.best_objective

    def _visit_all(self) -> None:
        assert self.subs is not None
        for i, sub in enumerate(self.subs):
            best = self.best
            if math.isfinite(best) and sub.bound <= cutoff(best):
                self.counts["pruned"] = len(self.subs) - i
                self.done = len(self.subs)
                return
            self._visit(i, sub)

    def _visit(self, i: int, sub: Subproblem) -> None:
        """Settle subproblem ``i``: known infeasible, by the shortest path, or solved."""
        assert self.subs is not None
        ev, solves = self.ev, self.solves
        where = f"subproblem {i + 1} of {len(self.subs)}"
        if solves.feasible.known_infeasible(sub.degree_index, sub.requests_per_rank):
            self.counts["infeasible"] += 1  # its degrees' floor model failed at fewer
            self.done = i + 1
            return
        if (settled := solves.by_chain(sub, where, self.best)) is not None:
            self.counts[settled] += 1
            self.done = i + 1
            self.best = max(self.best, ev.best_objective)
            return
        beat = cutoff(self.best) if math.isfinite(self.best) else None
        result = solves.solve(sub, where, beat=beat)
        if result.status == "infeasible" and beat is not None:
            self.counts["cut_off"] += 1
            self.done = i + 1
            return
        if result.status == "infeasible":
            solves.settle(sub, where)
        self.done = i + 1
        self.best = max(self.best, ev.best_objective)
        self._tally(sub, result)
        if result.status != "infeasible":
            ev.check_time()  # the clock stopped this solve: say so, and where

    def _tally(self, sub: Subproblem, result: SubSolution) -> None:
        if result.status == "infeasible":
            self.counts["infeasible"] += 1
        elif result.status == "optimal":
            self.counts["solved"] += 1
        else:
            self.counts["unfinished"] += 1
            d = self.ctx.space.degree_tuples[sub.degree_index]
            self.open_bounds.append(
                objective_of(self.ctx.problem, d, sub.requests_per_rank, result.bound_ns)
                if result.bound_ns
                else sub.bound
            )

    def _ran_out(self) -> None:
        """The clock ran out: the subproblems not visited stay open unless their bound
        cannot beat the best."""
        self.best = max(self.best, self.ev.best_objective)
        if self.subs is None:
            return
        rest = self.subs[self.done :]
        cut = cutoff(self.best)
        left_open = [s.bound for s in rest if s.bound > cut]
        self.open_bounds += left_open
        self.counts["unfinished"] += len(left_open)
        self.counts["pruned"] += len(rest) - len(left_open)

    def _bound_and_gap(self) -> tuple[float | None, float | None]:
        """The bound on every plan and the best plan's relative gap to it; None, None
        when some subproblem has no bound (see the module docstring)."""
        best, open_bounds = self.best, self.open_bounds
        if self.subs is None:
            return None, None
        bound = max([best, *open_bounds]) if open_bounds else best
        gap = 0.0 if not open_bounds or best <= -math.inf else (bound - best) / abs(bound)
        return bound, gap

    def _outcome(self, start: float, diagnose: Callable[[SearchContext], None]) -> Outcome:
        ev = self.ev
        bound, gap = self._bound_and_gap()
        proven = self.subs is not None and not self.open_bounds
        cp_objective = None  # the best plan's objective from CP-SAT's integer tables
        if ev.best_code is None:
            diagnose(self.ctx)
        else:
            cp_objective = table_objective(self.ctx.problem, ev.best_plan())
            if bound is not None and cp_objective is not None:
                # CP-SAT prices on integer tables (ns): its value of the best plan may sit
                # a rounding above the evaluator's, and a bound is above both.
                bound = max(bound, cp_objective)
        return Outcome(
            proven_optimal=proven and ev.best_code is not None,
            proven_infeasible=proven and ev.best_code is None,
            facts={
                "subproblems": len(self.subs) if self.subs is not None else None,
                "discarded_by_bounds": self.discarded,
                **self.counts,
                "cp_objective": cp_objective,
                "bound": bound if bound is not None and math.isfinite(bound) else None,
                "gap": gap,
                "solves": self.solves.count,
                "by_shortest_path": self.solves.chained,
                "by_memory_bound": self.solves.memory_bounded,
                "workers": self.workers,
                "seconds": time.perf_counter() - start,
            },
        )
