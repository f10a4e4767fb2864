"""Latency–throughput Pareto fronts over plans and concurrency.

Under a fixed number of requests in flight, throughput and TPOT move together for
most workloads (in flight, throughput is the requests in flight over TPOT), so the
front of the plans alone is often one point: the trade-off a deployment makes is the
concurrency it admits (vLLM's ``max_num_seqs``, the static batch).

In flight the concurrency is a decision of every plan, so one Pareto problem at the
offered load (``--batch``) is the front over (plan, concurrency): every method's
evaluator keeps each plan at every concurrency it can run, and ``cpsat`` proves the
front subproblem by subproblem
(:meth:`~shardlab.solvers.cpsat.CpSatSolver._front_by_subproblem`).

The static schedule runs its batch as given: :func:`solve_front` then solves the
problem at each level of :func:`concurrency_levels` (powers of two up to the
workload's ``batch``), each a Pareto problem of its own, and keeps the non-dominated
points of all levels; every point records the batch it was priced at. The budget is
shared out over the levels, what one level leaves unspent going to the next. With
``cpsat`` every level's front is proven exact (epsilon-constraint sweep, see
:meth:`~shardlab.solvers.cpsat.CpSatSolver._front`), hence so is their merge.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardlab.costmodel import Metrics
from shardlab.errors import ShardlabError
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.solvers.base import Budget, SolveResult, Status
from shardlab.solvers.evaluator import HistoryPoint, Progress
from shardlab.solvers.front import FrontPoint, merge
from shardlab.solvers.megatron import megatron_baseline
from shardlab.solvers.options import SolverOptions
from shardlab.solvers.registry import method_options, solver_class


def levels_of(problem: Problem) -> tuple[int, ...]:
    """The batches a front is solved at: the offered load in flight (the concurrency is
    each plan's own decision), the static batch and the powers of two below it."""
    w = problem.workload
    return (w.batch,) if w.schedule == "inflight" else concurrency_levels(w.batch)


def concurrency_levels(batch: int) -> tuple[int, ...]:
    """``batch`` and the powers of two below it, largest first."""
    levels = {batch}
    n = 1
    while n < batch:
        levels.add(n)
        n *= 2
    return tuple(sorted(levels, reverse=True))


def at_batch(problem: Problem, batch: int) -> Problem:
    w = dataclasses.replace(problem.workload, batch=batch, objective="pareto")
    return dataclasses.replace(problem, workload=w)


@dataclass(frozen=True, kw_only=True)
class FrontResult:
    method: str
    seed: int
    status: Status
    message: str
    front: tuple[FrontPoint, ...]  # by the first latency axis
    megatron: tuple[FrontPoint, ...]  # the Megatron rule's plan at each level that fits
    runs: tuple[tuple[int, SolveResult], ...]  # (batch, result) per level solved
    n_evals: int
    wall_s: float

    @property
    def best(self) -> FrontPoint | None:
        """The point with the highest throughput per GPU."""
        return max(self.front, key=lambda p: p.metrics.throughput_tok_s_per_gpu, default=None)

    # -- as a Result (shardlab.solvers.solution): the front's best point ------------

    @property
    def plan(self) -> Plan | None:
        best = self.best
        return best.plan if best is not None else None

    @property
    def metrics(self) -> Metrics | None:
        best = self.best
        return best.metrics if best is not None else None

    @property
    def objective(self) -> float:
        return self.metrics.objective if self.metrics is not None else float("-inf")

    @property
    def facts(self) -> dict[str, Any]:
        return {}  # each level's facts are in its run

    @property
    def history(self) -> tuple[HistoryPoint, ...]:
        return ()  # one per level, in its run

    def to_dict(self, problem: Problem) -> dict[str, Any]:
        best = self.best
        return {
            "method": self.method,
            "seed": self.seed,
            "status": self.status,
            "message": self.message,
            "n_evals": self.n_evals,
            "wall_s": self.wall_s,
            "plan": best.to_dict(problem)["plan"] if best else None,
            "metrics": best.metrics.to_dict() if best else None,
            "levels": [
                {
                    "batch": b,
                    "status": r.status,
                    "n_evals": r.n_evals,
                    "front_points": len(r.front),
                    "facts": r.facts,
                }
                for b, r in self.runs
            ],
            "pareto": [p.to_dict(problem) for p in self.front],
            "megatron": [p.to_dict(problem) for p in self.megatron],
        }


def solve_front(
    problem: Problem,
    method: str,
    *,
    budget: Budget,
    seed: int = 0,
    options: SolverOptions | None = None,
    callback: Callable[[Progress], None] | None = None,
    levels: tuple[int, ...] | None = None,
    baseline: bool = True,
) -> FrontResult:
    """The front of ``method`` over the concurrency levels of ``problem``'s batch;
    ``options``: the method's (default: its defaults); ``baseline``: with the Megatron
    rule's plan priced at each level."""
    options = options if options is not None else method_options(method)
    levels = levels or levels_of(problem)
    if any(b < 1 for b in levels):
        raise ShardlabError(f"concurrency levels must be positive, got {levels}")
    start = time.perf_counter()
    runs: list[tuple[int, SolveResult]] = []
    points: list[FrontPoint] = []
    megatron: list[FrontPoint] = []
    spent = 0
    status: Status = "optimal"
    for i, batch in enumerate(levels):
        left = len(levels) - i
        evals = None if budget.max_evals is None else max(1, (budget.max_evals - spent) // left)
        seconds = None
        if budget.seconds is not None:
            seconds = (budget.seconds - (time.perf_counter() - start)) / left
            if seconds <= 0:
                status = "feasible"
                break
        sub = at_batch(problem, batch)
        r = solver_class(method)(options).solve(
            sub, budget=Budget(max_evals=evals, seconds=seconds), seed=seed, callback=callback
        )
        runs.append((batch, r))
        spent += r.n_evals
        points += r.front
        base = megatron_baseline(sub) if baseline else None
        if base is not None and base[1].feasible:
            megatron.append(FrontPoint(plan=base[0], metrics=base[1], batch=batch))
        if r.status == "interrupted":
            status = "interrupted"
            break
        if r.status == "error":
            status = "error"
            break
        if r.status != "optimal":
            status = "feasible"
    front = merge(problem, points)
    message = ""
    if status == "interrupted":
        message = "stopped by the user; the front of the levels solved so far is reported"
    elif status == "error":
        message = next(r.message for _, r in runs if r.status == "error")
    elif not front:
        status = "infeasible"
        message = "; ".join(f"batch {b}: {r.message}" for b, r in runs if r.message)
    return FrontResult(
        method=method,
        seed=seed,
        status=status,
        message=message,
        front=front,
        megatron=tuple(megatron),
        runs=tuple(runs),
        n_evals=spent,
        wall_s=time.perf_counter() - start,
    )
