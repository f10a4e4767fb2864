"""The interface every solver implements, and what a solve returns.

A solver subclasses :class:`Solver` and implements one hook, ``_search``: it proposes
plans to the shared :class:`~shardlab.solvers.evaluator.Evaluator` (which counts,
caches, enforces the budget and keeps the best plan and the history) and returns an
:class:`Outcome` saying what it proved. The public :meth:`Solver.solve` seeds the
random generators, times the run, turns budget exhaustion and Ctrl-C into a result,
and re-checks the best plan with the scalar cost model.
"""

from __future__ import annotations

import math
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from shardlab.costmodel import Metrics, evaluate, with_concurrency
from shardlab.errors import ShardlabError
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.problems.space import SearchSpace
from shardlab.solvers.evaluator import BudgetExhausted, Evaluator, HistoryPoint, Progress
from shardlab.solvers.front import FrontPoint
from shardlab.solvers.options import SolverOptions

# unknown: the time budget ran out before any plan met memory and the SLOs
Status = Literal["optimal", "feasible", "infeasible", "unknown", "interrupted", "error"]


# An exact method's time when its caller sets none: long enough to prove the optima of
# the benchmark suite, short enough that a forgotten run ends.
EXACT_SECONDS = 600.0


def quality(objective: float | None, best: float) -> float:
    """``objective`` relative to ``best``: 1 is as good, below 1 worse (``obj / best``
    for throughputs, ``best / obj`` for latencies, whose objectives are negative)."""
    if objective is None or not math.isfinite(best) or best == 0:
        return 0.0
    return objective / best if best > 0 else best / objective


def priced(problem: Problem, plan: Plan, metrics: Metrics | None = None) -> tuple[Plan, Metrics]:
    """``plan`` at the concurrency its metrics chose, and those metrics: how a solve's
    best plan is priced at the end (and every baseline beside it). ``metrics``: the
    plan's, when the caller has them already."""
    metrics = metrics or evaluate(problem, plan, breakdown=False)
    chosen = with_concurrency(problem, plan, metrics)
    if chosen is plan:
        return plan, metrics
    # Priced again at the concurrency it now carries, so that evaluate(plan) gives
    # these metrics to the bit (choosing c sums other shapes: ulps).
    return chosen, evaluate(problem, chosen, breakdown=False)


@dataclass(frozen=True, kw_only=True)
class Budget:
    """How much a solver may spend: distinct plans evaluated and/or wall seconds.

    ``seconds`` is a contract: wall seconds from the call of :meth:`Solver.solve`, the
    method's own set-up included, and every phase of every method reads the clock (a
    run ends within ``max(1 s, 2%)`` of it; ``tests/solvers/test_budgets.py``). When it runs
    out the run returns its best plan so far, ``feasible``, or ``unknown`` without one.
    """

    max_evals: int | None = 2000
    seconds: float | None = None
    # time.perf_counter() when the clock started, for a caller whose own start-up
    # counts too (the CLI's --time-limit); None: at the call of solve
    started: float | None = None

    @classmethod
    def exact(cls) -> Budget:
        """An exact method's default: until it proves its optimum, or 600 s."""
        return cls(max_evals=None, seconds=EXACT_SECONDS)

    def __post_init__(self) -> None:
        if self.max_evals is not None and self.max_evals < 1:
            raise ShardlabError(f"budget: max_evals must be at least 1, got {self.max_evals}")
        if self.seconds is not None and not (0 < self.seconds < math.inf):  # NaN too
            raise ShardlabError(
                f"budget: seconds must be a positive number, got {self.seconds}",
                field="time_limit",
            )


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a search proved, beyond the plans it evaluated."""

    proven_optimal: bool = False
    proven_infeasible: bool = False
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SearchContext:
    problem: Problem
    evaluator: Evaluator
    budget: Budget
    seed: int
    rng: np.random.Generator

    @property
    def space(self) -> SearchSpace:
        return self.problem.space


@dataclass(frozen=True, kw_only=True)
class SolveResult:
    method: str
    seed: int
    status: Status
    message: str
    plan: Plan | None
    metrics: Metrics | None
    n_evals: int
    wall_s: float
    history: tuple[HistoryPoint, ...]
    facts: dict[str, Any]
    # objective "pareto": the non-dominated plans priced, by the first latency axis
    front: tuple[FrontPoint, ...] = ()

    @property
    def objective(self) -> float:
        return self.metrics.objective if self.metrics is not None else float("-inf")

    def to_dict(self, problem: Problem) -> dict[str, Any]:
        return {
            "method": self.method,
            "seed": self.seed,
            "status": self.status,
            "message": self.message,
            "n_evals": self.n_evals,
            "wall_s": self.wall_s,
            "metrics": self.metrics.to_dict() if self.metrics is not None else None,
            "plan": self.plan.to_dict(problem.model, cluster=problem.cluster.name)
            if self.plan is not None
            else None,
            "history": [list(h) for h in self.history],
            "facts": self.facts,
        }


class Solver(ABC):
    """Base of every method. Subclasses set ``name`` and implement ``_search``."""

    name: ClassVar[str] = ""
    exact: ClassVar[bool] = False  # can prove optimality
    # The search does not shape itself by its budget, so its best after n evaluations
    # is the same in a longer run: a benchmark may read several budgets off one run.
    anytime: ClassVar[bool] = True
    description: ClassVar[str] = ""
    # the method's own options (shardlab.solvers.options); none by default
    Options: ClassVar[type[SolverOptions]] = SolverOptions

    def __init__(self, options: SolverOptions | None = None) -> None:
        """``options``: the method's :attr:`Options` (``get_solver(name, **options)``
        builds them from keywords); None: their defaults."""
        if options is not None and not isinstance(options, type(self).Options):
            raise TypeError(f"{type(self).__name__} takes {type(self).Options.__name__}")
        self.options = options if options is not None else type(self).Options()

    def solve(
        self,
        problem: Problem,
        *,
        budget: Budget | None = None,
        seed: int = 0,
        callback: Callable[[Progress], None] | None = None,
    ) -> SolveResult:
        budget = budget or Budget()
        random.seed(seed)
        rng = np.random.default_rng(seed)
        start = time.perf_counter() if budget.started is None else budget.started
        evaluator = Evaluator(problem, budget.max_evals, budget.seconds, callback, start)
        ctx = SearchContext(problem=problem, evaluator=evaluator, budget=budget, seed=seed, rng=rng)
        outcome = Outcome()
        interrupted = False
        try:
            outcome = self._search(ctx) or Outcome()
        except BudgetExhausted:
            pass
        except KeyboardInterrupt:
            interrupted = True
        wall = time.perf_counter() - start
        return self._result(ctx, outcome, interrupted, wall)

    @abstractmethod
    def _search(self, ctx: SearchContext) -> Outcome | None:
        """Propose plans to ``ctx.evaluator`` until done or the budget runs out."""

    # -- the final check -----------------------------------------------------------

    def _result(
        self, ctx: SearchContext, outcome: Outcome, interrupted: bool, wall: float
    ) -> SolveResult:
        ev = ctx.evaluator
        plan = ev.best_plan()
        metrics = evaluate(ctx.problem, plan, breakdown=False) if plan is not None else None
        status: Status
        message = ""
        if metrics is not None and abs(metrics.objective - ev.best_objective) > 1e-9 * max(
            1.0, abs(metrics.objective)
        ):
            status = "error"
            message = (
                f"the best plan re-evaluates to {metrics.objective} but the search saw "
                f"{ev.best_objective}: the cost model or the evaluator is inconsistent"
            )
        elif interrupted:
            status = "interrupted"
            message = "stopped by the user; the best plan found so far is reported"
        elif metrics is not None and metrics.feasible:
            proven = outcome.proven_optimal or ev.space_exhausted
            status = "optimal" if proven else "feasible"
            if not proven and ev.ran_out_in is not None:
                message = (
                    f"the {ctx.budget.seconds:g} s time limit ran out in {ev.ran_out_in}; "
                    "the best plan so far is reported"
                )
        elif ev.ran_out_in is not None and not outcome.proven_infeasible:
            status = "unknown"
            message = (
                f"no plan yet: the {ctx.budget.seconds:g} s time limit ran out in "
                f"{ev.ran_out_in} after {ev.n_evals:,} evaluations, before any plan met "
                "memory and the SLOs; allow more time"
            )
            plan = ev.least_infeasible_plan()
            metrics = evaluate(ctx.problem, plan, breakdown=False) if plan is not None else None
        else:
            status = "infeasible"
            message = ev.infeasibility_message(
                proven=outcome.proven_infeasible or ev.space_exhausted
            )
            if metrics is not None and not metrics.feasible:
                plan, metrics = ev.least_infeasible_plan(), None
                metrics = evaluate(ctx.problem, plan, breakdown=False) if plan is not None else None
        if plan is not None and metrics is not None:
            plan, metrics = priced(ctx.problem, plan, metrics)
        return SolveResult(
            method=self.name,
            seed=ctx.seed,
            status=status,
            message=message,
            plan=plan,
            metrics=metrics,
            n_evals=ev.n_evals,
            wall_s=wall,
            history=tuple(ev.history),
            facts={
                **outcome.facts,
                **({"stalled": True} if ev.stalled else {}),
                **({"ran_out_in": ev.ran_out_in} if ev.ran_out_in is not None else {}),
            },
            front=ev.front.points() if ev.front is not None else (),
        )
