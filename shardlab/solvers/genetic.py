"""A genetic algorithm on the integer encoding.

Population ``POPULATION``; each generation keeps the ``ELITE`` best, and breeds the
rest from parents chosen by tournaments of ``TOURNAMENT``: the child takes its degree
tuple from the first parent and each other variable from either parent (uniform
crossover), is repaired to validity, then mutated (each variable with probability
1/n_vars, the degree tuple with ``DEGREE_MUTATION``). A generation that proposes no
new plan replaces the worse half of the population by random immigrants.
"""

from __future__ import annotations

import numpy as np

from shardlab.solvers.base import Outcome, SearchContext, Solver
from shardlab.solvers.moves import mutate
from shardlab.solvers.registry import register

POPULATION = 64
ELITE = 2
TOURNAMENT = 3
DEGREE_MUTATION = 0.05


def _tournament(fit: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    picks = rng.integers(0, len(fit), size=(k, TOURNAMENT))
    return picks[np.arange(k), fit[picks].argmax(axis=1)]


@register("genetic")
class GeneticSolver(Solver):
    description = "genetic algorithm: tournaments, uniform crossover, repair, mutation"

    def _search(self, ctx: SearchContext) -> Outcome:
        space, ev, rng = ctx.space, ctx.evaluator, ctx.rng
        pop = space.sample(POPULATION, seed=int(rng.integers(0, 2**63 - 1)))
        fit = ev.evaluate(pop)
        n_children = POPULATION - ELITE
        while True:
            order = np.argsort(-fit, kind="stable")
            elite = pop[order[:ELITE]]
            a = pop[_tournament(fit, n_children, rng)]
            b = pop[_tournament(fit, n_children, rng)]
            take_b = rng.random(a.shape) < 0.5
            take_b[:, 0] = False
            children = space.repair(np.where(take_b, b, a))
            children = mutate(
                space, children, rng, rate=1.0 / space.n_vars, degree_rate=DEGREE_MUTATION
            )
            before = ev.n_evals
            child_fit = ev.evaluate(children)
            pop = np.concatenate([elite, children])
            fit = np.concatenate([fit[order[:ELITE]], child_fit])
            if ev.n_evals == before:  # converged: replace the worse half by immigrants
                worst = np.argsort(fit, kind="stable")[: POPULATION // 2]
                pop[worst] = space.sample(len(worst), seed=int(rng.integers(0, 2**63 - 1)))
                fit[worst] = ev.evaluate(pop[worst])
