"""The CP-SAT solver: the scalar search, or a Pareto front, by the workload's
objective."""

from __future__ import annotations

import contextlib
import os

import numpy as np

from shardlab.solvers.base import Outcome, SearchContext, Solver
from shardlab.solvers.cpsat.fronts import SubproblemFront, SweepFront
from shardlab.solvers.cpsat.search import ScalarSearch
from shardlab.solvers.evaluator import BudgetExhausted
from shardlab.solvers.megatron import megatron_candidates
from shardlab.solvers.options import CpSatOptions
from shardlab.solvers.registry import register


@register("cpsat")
class CpSatSolver(Solver):
    exact = True
    description = "CP-SAT over (degrees, concurrency) subproblems: proven optimum"

    Options = CpSatOptions
    options: CpSatOptions

    @property
    def workers(self) -> int:
        return self.options.workers or os.cpu_count() or 1

    def _search(self, ctx: SearchContext) -> Outcome:
        if ctx.problem.workload.objective != "pareto":
            return ScalarSearch(ctx, self.workers).run(self._diagnose)
        if ctx.problem.workload.schedule == "inflight":
            return SubproblemFront(ctx, self.workers).run()
        return SweepFront(ctx, self, self.workers).run()

    def _diagnose(self, ctx: SearchContext) -> None:
        """No plan exists: price a few (Megatron's and a sample) so the message can say
        which constraint they all miss, and by how much."""
        codes = [
            ctx.space.encode(ctx.space.megatron_plan(d)) for d in megatron_candidates(ctx.problem)
        ]
        codes += list(ctx.space.sample(64, seed=ctx.seed))
        with contextlib.suppress(BudgetExhausted):
            ctx.evaluator.evaluate(np.array(codes))
