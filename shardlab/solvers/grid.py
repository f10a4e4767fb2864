"""The grid search users run today (AIConfigurator's): every degree tuple the engine
can launch, each with the engine's default flags for it, at every batch size.

The degrees are those of the problem engine's capability model
(:mod:`shardlab.problems.engines`); operators are sharded as the engine shards them
when given only the degrees (its default features, equal pipeline stages), and the
evaluator prices every concurrency up to what the KV cache holds, so the batch size is
searched exhaustively too. What it leaves to ``--space engine``: the engine features
beyond the defaults (all-to-all MoE dispatch, sequence-parallel norms, ...) and uneven
pipeline stages. The plan is always one the engine can launch, whatever the space
searched.
"""

from __future__ import annotations

import numpy as np

from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.solvers.base import Outcome, SearchContext, Solver
from shardlab.solvers.registry import register


def default_engine_plans(problem: Problem) -> list[Plan]:
    """One plan per degree tuple the engine can launch, as it runs them by default."""
    space = problem.with_space("engine").space
    first: dict[object, int] = {}  # a degree tuple's first configuration: its defaults
    for i, d in enumerate(space.degree_tuples):
        first.setdefault(d, i)
    return [space.config_plan(i) for i in first.values()]


@register("grid")
class GridSolver(Solver):
    description = "AIConfigurator-style grid: every engine-launchable degree tuple x batch"

    def _search(self, ctx: SearchContext) -> Outcome:
        plans = default_engine_plans(ctx.problem)
        codes = np.array([ctx.space.encode(p) for p in plans], dtype=np.int64)
        ctx.evaluator.evaluate(codes)
        return Outcome(
            facts={"engine": ctx.problem.engine, "degree_tuples": len(plans)},
        )
