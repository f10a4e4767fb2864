"""Who searches: one interface, a registry, one module per method, and one entry point
(:func:`solve`) every caller goes through."""

from __future__ import annotations

from shardlab.solvers.base import Budget, Outcome, SearchContext, Solver, SolveResult
from shardlab.solvers.evaluator import Progress
from shardlab.solvers.registry import available_solvers, get_solver, register
from shardlab.solvers.solve import Baseline, Solution, default_budget, solve

__all__ = [
    "Baseline",
    "Budget",
    "Outcome",
    "Progress",
    "SearchContext",
    "Solution",
    "SolveResult",
    "Solver",
    "available_solvers",
    "default_budget",
    "get_solver",
    "register",
    "solve",
]
