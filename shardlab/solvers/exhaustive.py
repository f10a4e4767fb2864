"""Exhaustive enumeration of small spaces: the ground truth for tests.

Every valid encoding is generated (per degree tuple, the mixed-radix product of each
variable's valid values) and evaluated in batches. Spaces with more than
``MAX_PLANS`` plans are refused.
"""

from __future__ import annotations

import math

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.problems.space import SearchSpace
from shardlab.solvers.base import Outcome, SearchContext, Solver
from shardlab.solvers.registry import register

MAX_PLANS = 2_000_000
CHUNK = 8192


def enumerate_codes(space: SearchSpace, degree_idx: int) -> list[np.ndarray]:
    """All valid encodings under one degree tuple, in chunks of at most ``CHUNK`` rows."""
    mask = space.mask(degree_idx)
    values = [np.flatnonzero(mask[v]) for v in range(1, space.n_vars)]
    radices = np.array([len(v) for v in values], dtype=np.int64)
    total = int(np.prod(radices))
    chunks = []
    for start in range(0, total, CHUNK):
        idx = np.arange(start, min(start + CHUNK, total), dtype=np.int64)
        codes = np.empty((len(idx), space.n_vars), dtype=np.int64)
        codes[:, 0] = degree_idx
        rest = idx
        for v in range(space.n_vars - 2, -1, -1):
            codes[:, v + 1] = values[v][rest % radices[v]]
            rest = rest // radices[v]
        chunks.append(codes)
    return chunks


@register("exhaustive")
class ExhaustiveSolver(Solver):
    exact = True
    description = f"every plan (refuses spaces over {MAX_PLANS:,} plans)"

    def _search(self, ctx: SearchContext) -> Outcome:
        size = ctx.space.log10_size()
        if size > math.log10(MAX_PLANS):
            raise ShardlabError(
                f"the space of {ctx.problem.name} has 10^{size:.1f} plans; exhaustive "
                f"search takes at most {MAX_PLANS:,}",
                field="method",
                fix="use method 'cpsat', or a smaller cluster, or tie 'kind'",
            )
        for d in range(ctx.space.num_degree_tuples):
            for codes in enumerate_codes(ctx.space, d):
                ctx.evaluator.evaluate(codes)
        found = ctx.evaluator.best_code is not None
        return Outcome(
            proven_optimal=found,
            proven_infeasible=not found,
            facts={"plans": ctx.evaluator.n_evals, "log10_size": size},
        )
