"""What a solve returns: the :class:`Result` every search's result answers, the
:class:`Baseline` a plan is measured against, and the :class:`Solution` that holds them.

Three results answer :class:`Result`: the aggregated search's
:class:`~shardlab.solvers.base.SolveResult`, the disaggregated one's
:class:`~shardlab.solvers.cpsat.disagg.DisaggResult` and the Pareto front's
:class:`~shardlab.solvers.pareto.FrontResult` (its plan and metrics: the front's point
of the highest throughput per GPU). A reader asks the solution, and the solution asks
the result of the mode that was solved.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from shardlab.costmodel import DisaggMetrics, Metrics, RateFit
from shardlab.errors import ShardlabError
from shardlab.problems.disagg import DisaggPlan, Serving
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.solvers.base import SolveResult, Status
from shardlab.solvers.evaluator import HistoryPoint
from shardlab.solvers.front import FrontPoint

if TYPE_CHECKING:  # OR-Tools loads with the disaggregated search only
    from shardlab.solvers.certify import Certificate
    from shardlab.solvers.cpsat.disagg import DisaggResult
    from shardlab.solvers.pareto import FrontResult
    from shardlab.solvers.request import Mode


class Result(Protocol):
    """What every search's result answers (read-only)."""

    @property
    def method(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def status(self) -> Status: ...
    @property
    def message(self) -> str: ...
    @property
    def wall_s(self) -> float: ...
    @property
    def n_evals(self) -> int:
        """Plans evaluated (the disaggregated search: CP-SAT pool solves)."""
        ...

    @property
    def plan(self) -> Plan | DisaggPlan | None: ...
    @property
    def metrics(self) -> Metrics | DisaggMetrics | None: ...
    @property
    def objective(self) -> float:
        """The metrics' objective; ``-inf`` without them."""
        ...

    @property
    def facts(self) -> dict[str, Any]:
        """What the method proved or counted, by name."""
        ...

    @property
    def history(self) -> tuple[HistoryPoint, ...]: ...
    @property
    def front(self) -> tuple[FrontPoint, ...]:
        """The non-dominated plans (objective ``pareto``), by the first latency axis."""
        ...

    def to_dict(self, problem: Problem) -> dict[str, Any]: ...


# A baseline's statuses that are complete answers: a proven optimum, a proof that no
# plan exists, or (the Megatron rule) the rule's plan priced.
COMPLETE: tuple[Status, ...] = ("optimal", "infeasible")


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """A reference plan a solution is measured against, and the solution's ratio to it
    (``quality``: above 1 when the solution is better; the free space's: above 1 when
    the free optimum is). ``partial``: its search stopped before its answer was proven
    (the command's time ran out), ``message`` says where."""

    method: str
    space: str
    status: Status
    plan: Plan | DisaggPlan | None
    metrics: Metrics | DisaggMetrics | None
    ratio: float | None
    partial: bool = False
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class Solution:
    """What :func:`shardlab.solve` returns: the chosen plan and everything behind the
    choice."""

    problem: Problem
    method: str
    seed: int
    serving: Serving
    chosen: Literal["agg", "disagg"]
    agg: SolveResult | None = None
    disagg: DisaggResult | None = None
    pareto: FrontResult | None = None  # for the objective "pareto"
    megatron: Baseline | None = None
    free: Baseline | None = None
    rate: RateFit | None = None  # with a rate: the plan at the load it implies
    # with SLOs at a percentile: the walk that certified the plan in the simulator
    # (its ``problem`` is then the ranking's: the SLOs on the mean at the limits found)
    certificate: Certificate | None = None

    @property
    def mode(self) -> Mode:
        return "pareto" if self.pareto is not None else self.serving

    @property
    def results(self) -> tuple[Result, ...]:
        """Every search's result, in the order they ran."""
        return tuple(r for r in (self.agg, self.disagg, self.pareto) if r is not None)

    @property
    def result(self) -> Result:
        """The chosen result: the front, or the mode's (with ``best``, the better)."""
        chosen = self.pareto or (self.disagg if self.chosen == "disagg" else self.agg)
        assert chosen is not None, "a solution holds the result it chose"
        return chosen

    @property
    def status(self) -> Status:
        statuses = [r.status for r in self.results]
        return "error" if "error" in statuses else self.result.status

    @property
    def message(self) -> str:
        return self.result.message

    @property
    def plan(self) -> Plan | DisaggPlan | None:
        return self.result.plan

    @property
    def metrics(self) -> Metrics | DisaggMetrics | None:
        return self.result.metrics

    @property
    def objective(self) -> float:
        return self.result.objective

    @property
    def facts(self) -> dict[str, Any]:
        return self.result.facts

    @property
    def n_evals(self) -> int:
        return self.result.n_evals

    @property
    def wall_s(self) -> float:
        return sum(r.wall_s for r in self.results)

    @property
    def history(self) -> tuple[HistoryPoint, ...]:
        return self.result.history

    @property
    def front(self) -> tuple[FrontPoint, ...]:
        """The non-dominated plans (objective ``pareto``), by the first latency axis."""
        return self.result.front

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

    def unmet_error(self) -> ShardlabError | None:
        """The error of a solve that found no plan to serve (None when it found one),
        naming the input to change: the time limit when time ran out first."""
        cert = self.certificate
        if cert is not None and cert.certified is None:
            return ShardlabError(
                cert.claim,
                field="workload.slo_percentile",
                fix="relax the SLOs or their percentile, give more GPUs, or walk further (tries)",
            )
        why = self.unmet()
        if why is None:
            return None
        out_of_time = self.status == "unknown"
        if self.serving == "agg":
            return ShardlabError(
                f"{self.method}: {why}", field="time_limit" if out_of_time else None
            )
        where = "no plan in either mode" if self.serving == "best" else "no plan"
        return ShardlabError(
            f"serving {self.serving}: {where}; {why}",
            field="time_limit" if out_of_time else "serving",
        )

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
        serving mode, or both modes with the choice), the baselines beside it."""
        if self.pareto is not None:
            return self.pareto.to_dict(self.problem)
        if self.agg is not None and self.disagg is not None:
            data = {
                "disagg": self.disagg.to_dict(self.problem),
                "agg": self.agg.to_dict(self.problem),
                "chosen": self.chosen,
                "disagg_over_agg": self.disagg_over_agg,
            }
        else:
            data = self.result.to_dict(self.problem)
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
        if self.certificate is not None:
            data["certificate"] = self.certificate.to_dict()
        return data


def plan_label(plan: Plan | DisaggPlan) -> str:
    """A plan in one phrase: its degrees, or its pools."""
    return plan.label() if isinstance(plan, DisaggPlan) else plan.degrees.short()


def _plan_json(problem: Problem, plan: Plan | DisaggPlan | None) -> dict[str, Any] | None:
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
        "partial": b.partial,
        "message": b.message,
        "throughput_tok_s": b.metrics.throughput_tok_s if b.metrics else None,
        "degrees": plan_label(b.plan) if b.plan else None,
        "plan": _plan_json(problem, b.plan),
        "ratio": b.ratio,
    }
