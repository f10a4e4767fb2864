"""Who searches: one interface, a registry, one module per method, and one entry point
(:func:`solve`) every caller goes through."""

from __future__ import annotations

from shardlab.solvers.base import Budget, Outcome, SearchContext, Solver, SolveResult
from shardlab.solvers.evaluator import Progress
from shardlab.solvers.registry import available_solvers, get_solver, register
from shardlab.solvers.request import SolveRequest, default_budget
from shardlab.solvers.solution import Baseline, Result, Solution
from shardlab.solvers.solve import run, solve

__all__ = [
    "Baseline",
    "Budget",
    "Outcome",
    "Progress",
    "Result",
    "SearchContext",
    "Solution",
    "SolveRequest",
    "SolveResult",
    "Solver",
    "available_solvers",
    "default_budget",
    "get_solver",
    "register",
    "run",
    "solve",
]
