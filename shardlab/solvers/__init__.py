"""Who searches: one interface, a registry, and one module per method."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from shardlab.problems.problem import Problem
from shardlab.solvers.base import Budget, Outcome, SearchContext, Solver, SolveResult
from shardlab.solvers.evaluator import Progress
from shardlab.solvers.registry import available_solvers, get_solver, register


def solve(
    problem: Problem,
    method: str = "cpsat",
    *,
    budget: Budget | None = None,
    seed: int = 0,
    callback: Callable[[Progress], None] | None = None,
) -> SolveResult:
    """Search ``problem`` with ``method`` (see :func:`available_solvers`).

    A time budget counts from this call: loading the method (PyTorch, for ``rl``) is
    part of its start-up.
    """
    budget = budget or Budget()
    if budget.seconds is not None and budget.started is None:
        budget = dataclasses.replace(budget, started=time.perf_counter())
    return get_solver(method).solve(problem, budget=budget, seed=seed, callback=callback)


__all__ = [
    "Budget",
    "Outcome",
    "Progress",
    "SearchContext",
    "SolveResult",
    "Solver",
    "available_solvers",
    "get_solver",
    "register",
    "solve",
]
