"""Random search: uniform degree tuple, then uniform valid values, until the budget."""

from __future__ import annotations

from shardlab.solvers.base import Outcome, SearchContext, Solver
from shardlab.solvers.registry import register

BATCH = 256


@register("random")
class RandomSolver(Solver):
    description = "uniform samples of the encoding (a baseline of Learning to Shard)"

    def _search(self, ctx: SearchContext) -> Outcome:
        while True:
            seed = int(ctx.rng.integers(0, 2**63 - 1))
            ctx.evaluator.evaluate(ctx.space.sample(BATCH, seed=seed))
