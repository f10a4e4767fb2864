"""The one way to solve a problem: :func:`solve` and the :class:`Solution` it returns.

The CLI's ``solve`` and ``compare`` and the Python API all come through here. A
solution carries everything a reader of a solve asks for: the chosen plan and its
metrics, the aggregated and disaggregated results behind the choice, the front when
the objective is ``pareto``, the facts the method proved, and the baselines the plan
is measured against (the Megatron rule's plan; with ``vs_free``, CP-SAT over the free
space). Each baseline is priced once, here, the way a solve prices its best plan.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from shardlab.costmodel import DisaggMetrics, Metrics, RateFit, fit_rate
from shardlab.errors import ShardlabError
from shardlab.problems.disagg import DisaggPlan, Serving, check_disagg, check_serving
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.solvers.base import Budget, SolveResult, Status, quality
from shardlab.solvers.evaluator import HistoryPoint, Progress
from shardlab.solvers.front import FrontPoint
from shardlab.solvers.megatron import megatron_baseline
from shardlab.solvers.registry import get_solver, method_options, solver_class


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """A reference plan a solution is measured against, and the solution's ratio to it
    (``quality``: above 1 when the solution is better)."""

    method: str
    space: str
    status: Status
    plan: Plan | None
    metrics: Metrics | None
    ratio: float | None


@dataclass(frozen=True, kw_only=True)
class Solution:
    """What :func:`solve` returns: the chosen plan and everything behind the choice."""

    problem: Problem
    method: str
    seed: int
    serving: Serving
    chosen: Literal["agg", "disagg"]
    agg: SolveResult | None = None
    disagg: Any = None  # solvers.cpsat's DisaggResult (imported lazily: OR-Tools)
    pareto: Any = None  # solvers.pareto's FrontResult, for the objective "pareto"
    megatron: Baseline | None = None
    free: Baseline | None = None
    rate: RateFit | None = None  # with a rate: the plan at the load it implies

    @property
    def _result(self) -> Any:
        if self.pareto is not None:
            return self.pareto
        return self.disagg if self.chosen == "disagg" else self.agg

    @property
    def status(self) -> Status:
        statuses = [r.status for r in (self.agg, self.disagg, self.pareto) if r is not None]
        return "error" if "error" in statuses else self._result.status

    @property
    def message(self) -> str:
        return self._result.message

    def _chosen(self, name: str) -> Any:
        """The chosen result's ``plan`` or ``metrics``: with a front, its point of the
        highest throughput per GPU."""
        if self.pareto is None:
            return getattr(self._result, name)
        best = self.pareto.best
        return getattr(best, name) if best is not None else None

    @property
    def plan(self) -> Plan | DisaggPlan | None:
        return self._chosen("plan")

    @property
    def metrics(self) -> Metrics | DisaggMetrics | None:
        return self._chosen("metrics")

    @property
    def objective(self) -> float:
        return self.metrics.objective if self.metrics is not None else float("-inf")

    @property
    def facts(self) -> dict[str, Any]:
        return getattr(self._result, "facts", {})

    @property
    def n_evals(self) -> int:
        return getattr(self._result, "n_evals", int(self.facts.get("pool_solves", 0)))

    @property
    def wall_s(self) -> float:
        return sum(r.wall_s for r in (self.agg, self.disagg, self.pareto) if r is not None)

    @property
    def history(self) -> tuple[HistoryPoint, ...]:
        return getattr(self._result, "history", ())

    @property
    def front(self) -> tuple[FrontPoint, ...]:
        """The non-dominated plans (objective ``pareto``), by the first latency axis."""
        return self.pareto.front if self.pareto is not None else self._result.front

    @property
    def disagg_over_agg(self) -> float | None:
        """With ``serving="best"``: the disaggregated optimum over the aggregated one."""
        if self.agg is None or self.disagg is None:
            return None
        if self.agg.metrics is None or self.disagg.metrics is None:
            return None
        return self.disagg.metrics.objective / self.agg.metrics.objective

    def unmet(self) -> str | None:
        """Why there is no plan to serve, or None when there is one."""
        results = [r for r in (self.agg, self.disagg) if r is not None]
        if self.pareto is not None or any(
            r.status not in ("unknown", "infeasible") for r in results
        ):
            return None
        # the aggregated search's reason when there is one: it names the SLO
        return results[0].message

    def plan_json(self) -> str:
        """The chosen plan as the JSON ``shardlab evaluate --plan`` and ``launch`` read
        (with a rate: at the concurrency the rate needs, and the rate recorded)."""
        plan = self.rate.plan if self.rate is not None else self.plan
        if plan is None:
            raise ShardlabError(f"{self.method} found no plan to write", field="out")
        problem = self.problem
        data = plan.to_dict(
            problem.model,
            cluster=problem.cluster.name,
            engine=problem.engine,  # what launch checks it is started on
            accelerator=problem.cluster.accelerator.key,
        )
        if self.rate is not None:
            data["rate"] = self.rate.to_dict()
        return json.dumps(data, indent=2)

    def to_dict(self) -> dict[str, Any]:
        """The solution as JSON: the shape depends on what was asked (a front, one
        serving mode, or both modes with the choice)."""
        if self.pareto is not None:
            return self.pareto.to_dict(self.problem)
        if self.serving == "disagg":
            return self.disagg.to_dict(self.problem)
        if self.serving == "best":
            return {
                "disagg": self.disagg.to_dict(self.problem),
                "agg": self.agg.to_dict(self.problem),
                "chosen": self.chosen,
                "disagg_over_agg": self.disagg_over_agg,
            }
        data = self.agg.to_dict(self.problem)
        if self.megatron is not None:
            data["baseline"] = _megatron_json(self.problem, self.megatron)
        if self.free is not None:
            data["free"] = _free_json(self.problem, self.free)
        if self.rate is not None:
            data["rate"] = {
                **self.rate.to_dict(),
                "plan": self.rate.plan.to_dict(
                    self.problem.model, cluster=self.problem.cluster.name
                ),
            }
        return data


def _plan_json(problem: Problem, plan: Plan | None) -> dict[str, Any] | None:
    return plan.to_dict(problem.model, cluster=problem.cluster.name) if plan else None


def _megatron_json(problem: Problem, b: Baseline) -> dict[str, Any]:
    return {
        "method": b.method,
        "metrics": b.metrics.to_dict() if b.metrics is not None else None,
        "plan": _plan_json(problem, b.plan),
        "ratio": b.ratio,
    }


def _free_json(problem: Problem, b: Baseline) -> dict[str, Any]:
    return {
        "method": b.method,
        "space": b.space,
        "status": b.status,
        "throughput_tok_s": b.metrics.throughput_tok_s if b.metrics else None,
        "degrees": b.plan.degrees.short() if b.plan else None,
        "plan": _plan_json(problem, b.plan),
        "ratio": b.ratio,
    }


def default_budget(method: str) -> Budget:
    """What a method may spend when the caller sets no budget: an exact method runs
    until it proves its optimum or its time runs out; the others evaluate 2,000 plans."""
    return Budget.exact() if solver_class(method).exact else Budget()


def solve(
    problem: Problem,
    method: str = "cpsat",
    *,
    serving: Serving = "agg",
    objective: str | None = None,
    budget: Budget | None = None,
    seed: int = 0,
    options: dict[str, object] | None = None,
    callback: Callable[[Progress], None] | None = None,
    baseline: bool = True,
    vs_free: bool = False,
) -> Solution:
    """Search ``problem`` with ``method`` (see :func:`available_solvers`).

    ``serving``: ``agg`` (one pool of replicas), ``disagg`` (a prefill and a decode
    pool; searched by CP-SAT) or ``best`` (both, the better chosen; a time budget is
    split between them). ``objective`` overrides the workload's (``pareto``: the front
    over plans and concurrency). ``options`` are the method's own (``workers``,
    ``sampler``, ...). ``baseline`` prices the Megatron rule's plan beside the result;
    ``vs_free`` (an engine-space problem) also proves the free space's optimum. A time
    budget counts from this call (or from ``budget.started``): loading the method
    (PyTorch, for ``rl``) is part of its start-up.
    """
    serving = check_serving(serving)
    if objective is not None:
        workload = dataclasses.replace(problem.workload, objective=objective)
        problem = dataclasses.replace(problem, workload=workload)
    options = dict(options or {})
    method_options(method, options)  # an unknown method, option or value fails before a search
    if vs_free and problem.space_kind != "engine":
        raise ShardlabError(
            "the free-space comparison measures what an engine's space gives up, but this "
            "problem searches the free space already",
            field="space",
            fix="search the engine's space (space 'engine')",
        )
    if problem.workload.rate is not None and (
        serving != "agg" or problem.workload.objective != "request_rate"
    ):
        raise ShardlabError(
            f"a rate is served by one pool of replicas here; serving {serving!r} with "
            f"objective {problem.workload.objective!r} is not",
            field="rate",
            fix="solve with serving 'agg', or size disaggregated pools for the rate with "
            "`shardlab size` (serving disagg)",
        )
    budget = budget or default_budget(method)
    if budget.seconds is not None and budget.started is None:
        budget = dataclasses.replace(budget, started=time.perf_counter())
    if problem.workload.objective == "pareto":
        return _front(problem, method, budget, seed, options, callback, serving)
    if serving == "agg":
        return _agg(problem, method, budget, seed, options, callback, baseline, vs_free)
    return _served(problem, method, serving, budget, seed, options, callback)


def _agg(
    problem: Problem,
    method: str,
    budget: Budget,
    seed: int,
    options: dict[str, object],
    callback: Callable[[Progress], None] | None,
    baseline: bool,
    vs_free: bool,
) -> Solution:
    result = get_solver(method, **options).solve(
        problem, budget=budget, seed=seed, callback=callback
    )
    megatron = _megatron(problem, result) if baseline else None
    free = _free(problem, result, seed) if vs_free else None
    rate = None
    offered = problem.workload.rate
    if offered is not None and result.plan is not None and result.metrics is not None:
        rate = fit_rate(problem, result.plan, offered) if result.metrics.feasible else None
    return Solution(
        problem=problem,
        method=method,
        seed=seed,
        serving="agg",
        chosen="agg",
        agg=result,
        megatron=megatron,
        free=free,
        rate=rate,
    )


def _megatron(problem: Problem, result: SolveResult) -> Baseline:
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


def _free(problem: Problem, result: SolveResult, seed: int) -> Baseline:
    free = get_solver("cpsat").solve(problem.with_space("free"), budget=Budget.exact(), seed=seed)
    if free.status == "unknown":
        raise ShardlabError(f"the free space's optimum: {free.message}", field="vs_free")
    ratio = None
    if result.metrics is not None and free.metrics is not None and free.metrics.feasible:
        ratio = 1 / quality(result.metrics.objective, free.metrics.objective)
    return Baseline(
        method="cpsat",
        space="free",
        status=free.status,
        plan=free.plan,
        metrics=free.metrics,
        ratio=ratio,
    )


def _served(
    problem: Problem,
    method: str,
    serving: Serving,
    budget: Budget,
    seed: int,
    options: dict[str, object],
    callback: Callable[[Progress], None] | None,
) -> Solution:
    """``disagg``: the disaggregated optimum; ``best``: the aggregated one first (on
    half the time when there is a limit), then the disaggregated, the better chosen."""
    from shardlab.solvers.cpsat.disagg import check_method, solve_disagg

    check_disagg(problem)
    check_method(method)
    agg = None
    if serving == "best":
        half = budget
        if budget.seconds is not None:
            half = Budget(max_evals=None, seconds=budget.seconds / 2, started=budget.started)
        agg = get_solver(method, **options).solve(
            problem, budget=half, seed=seed, callback=callback
        )
    workers = options.get("workers")
    disagg = solve_disagg(
        problem,
        method,
        budget=budget,
        seed=seed,
        callback=callback,
        workers=workers if isinstance(workers, int) else None,
    )
    chosen: Literal["agg", "disagg"] = "disagg"
    if agg is not None and (disagg.metrics is None or agg.objective > disagg.objective):
        chosen = "agg"
    return Solution(
        problem=problem,
        method=method,
        seed=seed,
        serving=serving,
        chosen=chosen,
        agg=agg,
        disagg=disagg,
    )


def _front(
    problem: Problem,
    method: str,
    budget: Budget,
    seed: int,
    options: dict[str, object],
    callback: Callable[[Progress], None] | None,
    serving: Serving,
) -> Solution:
    from shardlab.solvers.pareto import solve_front

    if serving != "agg":
        raise ShardlabError(
            "the pareto front is searched over one pool of replicas",
            field="serving",
            fix="use serving 'agg' with the objective 'pareto'",
        )
    front = solve_front(
        problem, method, budget=budget, seed=seed, options=options, callback=callback
    )
    return Solution(
        problem=problem, method=method, seed=seed, serving="agg", chosen="agg", pareto=front
    )
