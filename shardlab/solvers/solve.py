"""The one way to solve a problem: :func:`solve`, and :func:`run` behind it.

The CLI's ``solve`` and ``compare`` and the Python API all come through here. A
solve's arguments make a :class:`~shardlab.solvers.request.SolveRequest` (refused
there when its mode cannot honour them); :func:`run` dispatches over the modes, once,
and returns a :class:`~shardlab.solvers.solution.Solution`: the chosen plan and its
metrics, the aggregated and disaggregated results behind the choice, the front when
the objective is ``pareto``, the facts the method proved, and the baselines the chosen
plan is measured against (the Megatron rule's plan; with ``vs_free``, CP-SAT over the
free space in the chosen plan's serving mode). Each baseline is priced once, here,
the way a solve prices its best plan, and the free space's search spends what is left
of the solve's time, no more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from shardlab.costmodel import DisaggMetrics, Metrics, fit_rate
from shardlab.errors import ShardlabError
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.solvers.base import Budget, SolveResult, quality
from shardlab.solvers.certify import TRIES, certify
from shardlab.solvers.evaluator import Progress
from shardlab.solvers.megatron import megatron_baseline
from shardlab.solvers.options import CpSatOptions
from shardlab.solvers.registry import solver_class
from shardlab.solvers.request import SolveRequest
from shardlab.solvers.solution import COMPLETE, Baseline, Result, Solution

if TYPE_CHECKING:  # OR-Tools loads with the disaggregated search only
    from shardlab.problems.traffic import Traffic
    from shardlab.solvers.cpsat.disagg import DisaggResult

Callback = Callable[[Progress], None]


def solve(
    problem: Problem,
    method: str = "cpsat",
    *,
    serving: str = "agg",
    objective: str | None = None,
    budget: Budget | None = None,
    seed: int = 0,
    options: dict[str, object] | None = None,
    callback: Callback | None = None,
    baseline: bool = True,
    vs_free: bool = False,
    traffic: Traffic | None = None,
    tries: int = TRIES,
) -> Solution:
    """Search ``problem`` with ``method`` (see :func:`available_solvers`).

    ``serving``: ``agg`` (one pool of replicas), ``disagg`` (a prefill and a decode
    pool; searched by CP-SAT) or ``best`` (both, the better chosen; a time budget is
    split between them). ``objective`` overrides the workload's (``pareto``: the front
    over plans and concurrency). ``options`` are the method's own (``workers``,
    ``sampler``, ...). ``baseline`` prices the Megatron rule's plan beside the chosen
    plan (with ``pareto``, at each level of the front); ``vs_free`` (an engine-space
    problem) also searches the free space, in the chosen plan's serving mode, on what
    is left of the time budget. A time budget counts from this call (or from
    ``budget.started``): loading the method (PyTorch, for ``rl``) is part of its
    start-up. An argument the mode cannot honour is refused before any search
    (:class:`~shardlab.solvers.request.SolveRequest`).

    With SLOs at a percentile (:meth:`Workload.percentile`), the method ranks plans
    under the SLOs on the analytic mean and the simulator certifies the best one under
    ``traffic`` (None: the workload's own), walking down the ranking for at most
    ``tries`` plans (:mod:`shardlab.solvers.certify`), all on ``budget``; the
    solution's ``certificate`` says what was found.
    """
    request = SolveRequest.of(
        problem,
        method,
        serving=serving,
        objective=objective,
        budget=budget,
        seed=seed,
        options=options,
        baseline=baseline,
        vs_free=vs_free,
        traffic=traffic,
        tries=tries,
    )
    return run(request, callback)


def _certified(request: SolveRequest, callback: Callback | None) -> Solution:
    """The walk of :func:`~shardlab.solvers.certify.certify` over ``request``'s method
    (every solve of it on the request's one clock: a time limit is the walk's), its
    baselines priced once, on the certified plan's ranking problem."""
    request = request.clocked()

    def search(ranking: Problem) -> Solution:
        return run(
            dataclasses.replace(
                request,
                problem=ranking,
                baseline=False,
                vs_free=False,
                traffic=None,
            ),
            callback,
        )

    found, certificate = certify(
        request.problem, search, traffic=request.traffic, tries=request.tries, seed=request.seed
    )
    if found is None:  # the first ranking already served no plan (or not the rate)
        raise ShardlabError(
            certificate.claim,
            field="workload.slo_percentile",
            fix="relax the SLOs or their percentile, lower the rate, or give more GPUs",
        )
    if certificate.certified is not None and (request.baseline or request.vs_free):
        last = dataclasses.replace(request, problem=found.problem, traffic=None)
        found = dataclasses.replace(
            found,
            megatron=_megatron(last.problem, found.result) if request.baseline else None,
            free=_free(last, found.result, found.chosen) if request.vs_free else None,
        )
    return dataclasses.replace(found, certificate=certificate)


def run(request: SolveRequest, callback: Callback | None = None) -> Solution:
    """Solve ``request``: its mode's searches, the better chosen, its baselines (under
    SLOs at a percentile: the walk that certifies a plan in the simulator)."""
    if request.problem.workload.tail:
        return _certified(request, callback)
    request = request.clocked()
    if request.mode == "pareto":
        return _front(request, callback)
    agg = disagg = None
    if request.mode in ("agg", "best"):
        agg = _agg(request, callback)
    if request.mode in ("disagg", "best"):
        disagg = _disagg(request, request.problem, request.budget, callback)
    chosen: Literal["agg", "disagg"] = "agg" if disagg is None else "disagg"
    if (
        agg is not None
        and disagg is not None
        and (disagg.metrics is None or agg.objective > disagg.objective)
    ):
        chosen = "agg"
    solution = Solution(
        problem=request.problem,
        method=request.method,
        seed=request.seed,
        serving=request.serving,
        chosen=chosen,
        agg=agg,
        disagg=disagg,
    )
    problem, result = request.problem, solution.result
    rate = None
    offered = problem.workload.rate
    if offered is not None and isinstance(result.plan, Plan) and result.metrics is not None:
        rate = fit_rate(problem, result.plan, offered) if result.metrics.feasible else None
    return dataclasses.replace(
        solution,
        megatron=_megatron(problem, result) if request.baseline else None,
        free=_free(request, result, chosen) if request.vs_free else None,
        rate=rate,
    )


def _agg(request: SolveRequest, callback: Callback | None) -> SolveResult:
    """The aggregated search; with ``best``, on half the time when there is a limit
    (the disaggregated search has the rest)."""
    budget = request.budget
    if request.mode == "best" and budget.seconds is not None:
        budget = Budget(max_evals=None, seconds=budget.seconds / 2, started=budget.started)
    return solver_class(request.method)(request.options).solve(
        request.problem, budget=budget, seed=request.seed, callback=callback
    )


def _disagg(
    request: SolveRequest, problem: Problem, budget: Budget, callback: Callback | None
) -> DisaggResult:
    from shardlab.solvers.cpsat.disagg import solve_disagg

    workers = request.options.workers if isinstance(request.options, CpSatOptions) else None
    return solve_disagg(
        problem,
        request.method,
        budget=budget,
        seed=request.seed,
        callback=callback,
        workers=workers,
    )


def _megatron(problem: Problem, result: Result) -> Baseline:
    priced = megatron_baseline(problem)
    plan, metrics = priced if priced is not None else (None, None)
    ratio = None
    if result.metrics is not None and metrics is not None and metrics.feasible:
        ratio = quality(result.metrics.objective, metrics.objective)
    return Baseline(
        method="megatron",
        space=problem.space_kind,
        status="feasible" if metrics is not None and metrics.feasible else "infeasible",
        plan=plan,
        metrics=metrics,
        ratio=ratio,
    )


def _free(request: SolveRequest, result: Result, chosen: Literal["agg", "disagg"]) -> Baseline:
    """CP-SAT over the free space in the chosen plan's serving mode, on what is left
    of the request's time: ``partial`` when that ran out before the proof."""
    free_problem = request.problem.with_space("free")
    free: Result
    if chosen == "disagg":
        free = _disagg(request, free_problem, request.free_budget, None)
    else:
        # the free space is CP-SAT's whatever the method: its options carry over from a
        # CP-SAT request only
        options = request.options if isinstance(request.options, CpSatOptions) else CpSatOptions()
        free = solver_class("cpsat")(options).solve(
            free_problem, budget=request.free_budget, seed=request.seed
        )
    # a plan only when it serves: out of time, the search reports its least
    # infeasible plan, which is no reference
    metrics: Metrics | DisaggMetrics | None = free.metrics
    feasible = metrics is not None and metrics.feasible
    ratio = None
    if result.metrics is not None and metrics is not None and feasible:
        ratio = 1 / quality(result.metrics.objective, metrics.objective)
    partial = free.status not in COMPLETE
    return Baseline(
        method="cpsat",
        space="free",
        status=free.status,
        plan=free.plan if feasible else None,
        metrics=metrics if feasible else None,
        ratio=ratio,
        partial=partial,
        message=free.message if partial else "",
    )


def _front(request: SolveRequest, callback: Callback | None) -> Solution:
    from shardlab.solvers.pareto import solve_front

    front = solve_front(
        request.problem,
        request.method,
        budget=request.budget,
        seed=request.seed,
        options=request.options,
        callback=callback,
        baseline=request.baseline,
    )
    return Solution(
        problem=request.problem,
        method=request.method,
        seed=request.seed,
        serving="agg",
        chosen="agg",
        pareto=front,
    )
