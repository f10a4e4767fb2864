"""What a solve is asked: :class:`SolveRequest`, every argument of :func:`shardlab.solve`
in one frozen object, checked when it is built.

A request names its *mode*: ``agg``, ``disagg`` or ``best`` (the serving) or
``pareto`` (the objective, over one pool of replicas). Each mode honours some of the
arguments only; a combination it cannot honour is refused here, naming the field,
before any search runs: an option no mode would read is never dropped in silence.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from shardlab.errors import ShardlabError
from shardlab.problems.disagg import Serving, check_disagg, check_serving
from shardlab.problems.problem import Problem
from shardlab.solvers.base import Budget
from shardlab.solvers.certify import TRIES, check_traffic
from shardlab.solvers.options import SolverOptions
from shardlab.solvers.registry import method_options, options_class, solver_class

if TYPE_CHECKING:
    from shardlab.problems.traffic import Traffic

Mode = Literal["agg", "disagg", "best", "pareto"]


def default_budget(method: str) -> Budget:
    """What a method may spend when the caller sets no budget: an exact method runs
    until it proves its optimum or its time runs out; the others evaluate 2,000 plans."""
    return Budget.exact() if solver_class(method).exact else Budget()


def _clocked(budget: Budget) -> Budget:
    """``budget`` with its clock started now, when it has seconds and no start yet."""
    if budget.seconds is None or budget.started is not None:
        return budget
    return dataclasses.replace(budget, started=time.perf_counter())


@dataclass(frozen=True, kw_only=True)
class SolveRequest:
    """One solve's arguments (see :func:`shardlab.solve`), refused at construction when
    its mode cannot honour them all.

    ``problem`` carries the objective asked for; ``budget`` is the command's, all in:
    every search and baseline of the solve reads its one clock (:meth:`clocked`)."""

    problem: Problem
    method: str = "cpsat"
    serving: Serving = "agg"
    budget: Budget
    seed: int = 0
    options: SolverOptions  # the method's own, built (and so checked) once: see ``of``
    baseline: bool = True  # price the Megatron rule's plan beside the result
    vs_free: bool = False  # with an engine's space: CP-SAT over the free space beside it
    # SLOs at a percentile: the traffic the simulator certifies plans under (None: the
    # workload's own) and the most plans the walk tries (shardlab.solvers.certify)
    traffic: Traffic | None = None
    tries: int = TRIES

    @classmethod
    def of(
        cls,
        problem: Problem,
        method: str = "cpsat",
        *,
        serving: str = "agg",
        objective: str | None = None,
        budget: Budget | None = None,
        seed: int = 0,
        options: dict[str, object] | None = None,
        baseline: bool = True,
        vs_free: bool = False,
        traffic: Traffic | None = None,
        tries: int = TRIES,
    ) -> SolveRequest:
        """The request of :func:`shardlab.solve`'s arguments: ``objective`` replaces the
        workload's, a missing budget is the method's default, and a time budget's clock
        starts now unless ``budget.started`` says when it did."""
        budget = _clocked(budget or default_budget(method))
        if objective is not None:
            workload = dataclasses.replace(problem.workload, objective=objective)
            problem = dataclasses.replace(problem, workload=workload)
        return cls(
            problem=problem,
            method=method,
            serving=check_serving(serving),
            budget=budget,
            seed=seed,
            options=method_options(method, options),
            baseline=baseline,
            vs_free=vs_free,
            traffic=traffic,
            tries=tries,
        )

    def __post_init__(self) -> None:
        check_serving(self.serving)
        self._check_options()
        self._check_mode()

    @property
    def mode(self) -> Mode:
        return "pareto" if self.problem.workload.objective == "pareto" else self.serving

    @property
    def free_budget(self) -> Budget:
        """The free-space baseline's budget: what is left of the command's time (its
        clock, started before the search), or an exact method's default when the
        command counts evaluations only."""
        if self.budget.seconds is None:
            return Budget.exact()
        return Budget(max_evals=None, seconds=self.budget.seconds, started=self.budget.started)

    def clocked(self) -> SolveRequest:
        """The request with its time budget's clock started, if nothing started it yet."""
        budget = _clocked(self.budget)
        return self if budget is self.budget else dataclasses.replace(self, budget=budget)

    def _check_options(self) -> None:
        """A request built by hand carries the method's own options type (``of`` builds
        them from a mapping, which checks every key and value)."""
        expected = options_class(self.method)
        if type(self.options) is not expected:
            raise ShardlabError(
                f"method {self.method!r} takes {expected.__name__}, "
                f"not {type(self.options).__name__}",
                field="options",
            )

    def _check_mode(self) -> None:
        w, mode = self.problem.workload, self.mode
        check_traffic(self.problem, self.traffic)
        if isinstance(self.tries, bool) or not isinstance(self.tries, int) or self.tries < 1:
            raise ShardlabError(
                f"tries must be a positive integer, got {self.tries!r}", field="tries"
            )
        if mode == "pareto":
            if self.serving != "agg":
                raise ShardlabError(
                    "the pareto front is searched over one pool of replicas",
                    field="serving",
                    fix="use serving 'agg' with the objective 'pareto'",
                )
            if self.vs_free:
                raise ShardlabError(
                    "the free-space comparison sets one plan's objective against the free "
                    "optimum's; a pareto front has no one objective",
                    field="vs_free",
                    fix="compare with the free space under a scalar objective",
                )
        if self.vs_free and self.problem.space_kind != "engine":
            raise ShardlabError(
                "the free-space comparison measures what an engine's space gives up, but this "
                "problem searches the free space already",
                field="space",
                fix="search the engine's space (space 'engine')",
            )
        if w.rate is not None and (self.serving != "agg" or w.objective != "request_rate"):
            raise ShardlabError(
                f"a rate is served by one pool of replicas here; serving {self.serving!r} "
                f"with objective {w.objective!r} is not",
                field="rate",
                fix="solve with serving 'agg', or size disaggregated pools for the rate with "
                "`shardlab size` (serving disagg)",
            )
        if mode in ("disagg", "best"):
            from shardlab.solvers.cpsat.disagg import check_method

            check_disagg(self.problem)
            check_method(self.method)
            if self.budget.max_evals is not None:
                raise ShardlabError(
                    f"serving {self.serving} proves pools with CP-SAT, whose work is not "
                    f"counted in plans: max_evals {self.budget.max_evals} cannot bound it",
                    field="max_evals",
                    fix="bound it by a time limit instead, or serve aggregated",
                )
