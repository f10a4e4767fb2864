"""Simulated annealing on the integer encoding, several chains in lock-step.

Each step moves every chain by one variable (the degree tuple with probability
``DEGREE_MOVE``, repairing the options it invalidates) and accepts by the Metropolis
rule on the relative change of fitness, ``exp(delta / T)``, with ``T`` cooling
geometrically from ``T_START`` to ``T_END`` over the evaluation budget (or over 50
steps per chain when only time limits the run, restarting the schedule after that).
When a step proposes only plans seen before, the worse half of the chains restart
from random plans.
"""

from __future__ import annotations

import numpy as np

from shardlab.solvers.base import Outcome, SearchContext, Solver
from shardlab.solvers.moves import one_move
from shardlab.solvers.registry import register

CHAINS = 16
DEGREE_MOVE = 0.1
T_START = 0.2
T_END = 0.002


@register("anneal")
class AnnealSolver(Solver):
    description = "simulated annealing, 16 chains, one-variable moves"
    anytime = False  # the cooling schedule spans the evaluation budget

    def _search(self, ctx: SearchContext) -> Outcome:
        space, ev, rng = ctx.space, ctx.evaluator, ctx.rng
        state = space.sample(CHAINS, seed=int(rng.integers(0, 2**63 - 1)))
        fit = ev.evaluate(state)
        steps = max((ctx.budget.max_evals or 50 * CHAINS) // CHAINS, 2)
        decay = (T_END / T_START) ** (1.0 / steps)
        temp = T_START
        while True:
            proposal = one_move(space, state, rng, degree_rate=DEGREE_MOVE)
            before = ev.n_evals
            new = ev.evaluate(proposal)
            if ev.n_evals == before:  # every move revisits: restart the worse half
                worst = np.argsort(fit, kind="stable")[: CHAINS // 2]
                state[worst] = space.sample(len(worst), seed=int(rng.integers(0, 2**63 - 1)))
                fit[worst] = ev.evaluate(state[worst])
                continue
            delta = (new - fit) / np.maximum(np.abs(fit), 1e-30)
            accept = (delta >= 0) | (rng.random(CHAINS) < np.exp(np.minimum(delta, 0) / temp))
            state[accept], fit[accept] = proposal[accept], new[accept]
            temp = temp * decay if temp * decay > T_END else T_START
