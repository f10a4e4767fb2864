"""Disaggregated serving, searched exactly: the pools' instances and the decode
layout enumerated outside, each instance's plan proven by CP-SAT inside.

The value of a pair of pools (``x`` prefill instances of ``G_p`` GPUs, ``y`` decode
instances of ``G_d``) is the best ``min(x * prefill rate, y * decode rate)`` over a
prefill plan and a decode plan. The two plans meet in one place only: the prefill
instance's TTFT includes the handoff of each prompt's cache, whose time depends on
the decode plan's ``pp`` and ``tp`` (its *layout*; :mod:`shardlab.costmodel.handoff`).
So, per decode layout ``c``, the best pair is the prefill optimum handing off to
``c`` with the decode optimum among plans of layout ``c``, and the pair of pools is
worth the best over its layouts. Every number there is a CP-SAT proof (or a proof
that no plan exists), so the result is the optimum over the joint space:

1. for every instance size, an upper bound on one decode instance's rate (any
   layout) and one prefill instance's (no handoff), each offered the whole load:
   CP-SAT's best subproblem bound, no solve. ``x`` and ``y`` times them bound the
   pools' rates (a handoff only adds to TTFT; a smaller share of the offered load
   only removes plans);
2. the pairs of pools ordered by ``min`` of their two bounds; a pair whose bound
   cannot beat the best pair so far is pruned, and with it every pair after it;
3. a pair: the prefill optimum handing off to the decode optimum's layout; when the
   decode pool is the slower that is the pair's value (no layout decodes faster);
   when the prefill pool is, every other decode layout is tried (a cheaper handoff
   may let the prefill pool do more), skipping those whose prefill optimum cannot
   beat the pair's value so far.

Two shortcuts keep the solves few, both exact: the prefill optimum without a handoff
is the optimum with one whenever it still meets the TTFT SLO with it (it bounds every
plan that hands off); and a pool's optimum at an offered load is its optimum at any
smaller load its plan fits in (the smaller load only removes plans). Pool solves are
kept by problem. ``optimal`` is claimed only when every solve it rests on was proven.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shardlab.costmodel import (
    DisaggMetrics,
    Metrics,
    combine,
    evaluate,
    handoff_seconds,
    pool_problems,
)
from shardlab.errors import ShardlabError
from shardlab.problems.disagg import (
    DisaggPlan,
    check_disagg,
    decode_problem,
    in_one_domain,
    instance_sizes,
    pairs,
    prefill_problem,
)
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.solvers.base import Budget, Status
from shardlab.solvers.cpsat.bounds import subproblems
from shardlab.solvers.evaluator import HistoryPoint, Progress
from shardlab.solvers.front import FrontPoint
from shardlab.solvers.registry import get_solver

# Values this close (relative) are a tie: a pair no better than this is pruned.
ROUNDING = 1e-9

METHODS = ("cpsat",)


def check_method(method: str) -> None:
    """Refuse a method that cannot search disaggregated serving: the pairs of pools are
    enumerated against bounds that hold only for a pool's proven optimum."""
    if method not in METHODS:
        raise ShardlabError(
            "disaggregated serving is searched by cpsat (pools proven, pairs enumerated); "
            f"{method} searches one pool's plan",
            field="method",
            fix="use method cpsat, or aggregated serving",
        )


@dataclass(frozen=True, kw_only=True)
class Pool:
    """One pool problem's solve: its best plan's request rate (0: no plan)."""

    status: str
    plan: Plan | None
    metrics: Metrics | None
    rate: float

    @property
    def proven(self) -> bool:
        return self.status in ("optimal", "infeasible", "skipped")


# A pool that has no problem: too few GPUs for the weights, or no degrees of a layout.
NO_POOL = Pool(status="skipped", plan=None, metrics=None, rate=0.0)


def _offerless(pool: Problem) -> tuple:
    """What identifies a pool problem but for its offered load."""
    return (pool.cluster.num_gpus, pool.workload.phase, pool.handoff, pool.pin)


@dataclass(frozen=True, kw_only=True)
class DisaggResult:
    method: str
    seed: int
    status: Status
    message: str
    plan: DisaggPlan | None
    metrics: DisaggMetrics | None
    wall_s: float
    facts: dict[str, Any] = field(default_factory=dict)
    # every pair of pools evaluated: (G_prefill, x, G_decode, y, bound, value), req/s
    pairs: tuple[tuple[int, int, int, int, float, float], ...] = ()

    @property
    def objective(self) -> float:
        return self.metrics.objective if self.metrics is not None else -math.inf

    # -- as a Result (shardlab.solvers.solution) -------------------------------------

    @property
    def n_evals(self) -> int:
        """Its evaluations: the pools' CP-SAT solves."""
        return int(self.facts.get("pool_solves", 0))

    @property
    def history(self) -> tuple[HistoryPoint, ...]:
        return ()  # the pools' solves keep none

    @property
    def front(self) -> tuple[FrontPoint, ...]:
        return ()  # throughput only: no front

    def to_dict(self, problem: Problem) -> dict[str, Any]:
        return {
            "serving": "disagg",
            "method": self.method,
            "seed": self.seed,
            "status": self.status,
            "message": self.message,
            "wall_s": self.wall_s,
            "metrics": self.metrics.to_dict() if self.metrics is not None else None,
            "plan": self.plan.to_dict(problem.model, cluster=problem.cluster.name)
            if self.plan is not None
            else None,
            "pairs": [
                {
                    "prefill_gpus_per_instance": gp,
                    "prefill_instances": x,
                    "decode_gpus_per_instance": gd,
                    "decode_instances": y,
                    "bound_req_s": b,
                    "value_req_s": v,
                }
                for gp, x, gd, y, b, v in self.pairs
            ],
            "facts": self.facts,
        }


class _OutOfTime(Exception):
    pass


class DisaggSearch:
    """The exact search of one problem (see the module docstring)."""

    def __init__(
        self,
        problem: Problem,
        budget: Budget,
        seed: int,
        callback: Callable[[Progress], None] | None,
        workers: int | None = None,
    ) -> None:
        self.problem = problem
        self.budget = budget
        self.seed = seed
        self.callback = callback
        self.workers = workers
        self.start = time.perf_counter() if budget.started is None else budget.started
        self.pools: dict[Problem, Pool] = {}
        # pool problems but for their offered load -> (offer, solve) of each solved
        self.offers: dict[tuple, list[tuple[int, Pool]]] = {}
        self.phase = "starting"
        self.best_rate = 0.0

    # -- pools ---------------------------------------------------------------------

    def left(self) -> float | None:
        if self.budget.seconds is None:
            return None
        left = self.budget.seconds - (time.perf_counter() - self.start)
        if left <= 0:
            raise _OutOfTime
        return left

    def _report(self, inner: Progress | None = None) -> None:
        if self.callback is None:
            return
        phase = self.phase if inner is None else f"{self.phase}: {inner.phase}"
        w = self.problem.workload
        best = self.best_rate * w.output_len if self.best_rate else None
        self.callback(
            Progress(
                evals=len(self.pools),
                max_evals=None,
                seconds=time.perf_counter() - self.start,
                best=best,
                phase=phase,
            )
        )

    def _rate(self, pool: Problem, throughput: float) -> float:
        """Requests per second of one instance of ``pool`` at ``throughput`` tokens/s."""
        w = self.problem.workload
        per_request = w.input_len if pool.workload.phase == "prefill" else w.output_len - 1
        return throughput / per_request

    def _check(self) -> None:
        self.left()

    def bound(self, pool: Problem, what: str) -> float:
        """An upper bound on one instance's request rate: CP-SAT's best subproblem
        bound (its relaxation, no solve)."""
        self.phase = f"bounding the {what}"
        self._report()
        subs, _ = subproblems(pool, self._check)
        return self._rate(pool, subs[0].bound) if subs else 0.0

    def _reused(self, pool: Problem) -> Pool | None:
        """The solve of the same pool offered more requests, when its plan holds no
        more than ``pool`` offers: the optimum over fewer plans that still holds it."""
        offer = pool.workload.batch
        for other, kept in self.offers.get(_offerless(pool), ()):
            if other < offer:
                continue
            if kept.status == "infeasible":  # no plan at a larger load: none at this one
                return kept
            if kept.status != "optimal" or kept.plan is None:
                continue
            assert kept.metrics is not None
            if kept.metrics.requests_in_flight <= offer:
                m = evaluate(pool, kept.plan)
                return Pool(
                    status=kept.status,
                    plan=kept.plan,
                    metrics=m,
                    rate=self._rate(pool, m.throughput_tok_s),
                )
        return None

    def solve_pool(self, pool: Problem, what: str) -> Pool:
        kept = self.pools.get(pool) or self._reused(pool)
        if kept is not None:
            self.pools[pool] = kept
            return kept
        self.phase = what
        self._report()
        left = self.left()
        options = {"workers": self.workers} if self.workers else {}
        r = get_solver("cpsat", **options).solve(
            pool,
            budget=Budget(max_evals=None, seconds=left) if left is not None else Budget.exact(),
            seed=self.seed,
            callback=self._report if self.callback is not None else None,
        )
        if r.status == "interrupted":
            raise KeyboardInterrupt
        feasible = r.metrics is not None and r.metrics.feasible
        rate = self._rate(pool, r.metrics.throughput_tok_s) if r.metrics and feasible else 0.0
        result = Pool(
            status=r.status,
            plan=r.plan if feasible else None,
            metrics=r.metrics if feasible else None,
            rate=rate,
        )
        self.pools[pool] = result
        self.offers.setdefault(_offerless(pool), []).append((pool.workload.batch, result))
        return result

    def decode(self, gpus: int, instances: int, layout: tuple[int, int] | None = None) -> Pool:
        where = f"decode instance of {gpus} GPUs (1 of {instances})" + (
            f", pp {layout[0]} x tp {layout[1]}" if layout else ""
        )
        try:
            pool = decode_problem(self.problem, gpus, instances, layout=layout)
        except ShardlabError:  # the model does not fit, or no degrees of that layout
            return NO_POOL
        return self.solve_pool(pool, where)

    def prefill(
        self, gpus: int, instances: int, layout: tuple[int, int] | None, one_domain: bool
    ) -> Pool:
        """A prefill instance handing off to decode ranks of ``layout`` (None: no
        handoff, the optimum that bounds every handoff's)."""
        pp, tp = layout or (1, 1)
        try:
            pool = prefill_problem(
                self.problem, gpus, instances, decode_pp=pp, decode_tp=tp, one_domain=one_domain
            )
        except ShardlabError:
            return NO_POOL
        if layout is None:
            pool = dataclasses.replace(pool, handoff=None)
        where = f"prefill instance of {gpus} GPUs (1 of {instances})" + (
            f" handing off to pp {pp} x tp {tp}" if layout else ", no handoff"
        )
        return self.solve_pool(pool, where)

    def prefill_to(
        self, gpus: int, instances: int, layout: tuple[int, int], one_domain: bool
    ) -> Pool:
        """A prefill instance handing off to ``layout``: the optimum without a handoff
        when it still meets the TTFT SLO with this one (it bounds every plan that
        hands off, so it is their optimum), else a solve of its own."""
        free = self.prefill(gpus, instances, None, one_domain)
        if free.plan is None:
            return free  # no plan without a handoff: none with one
        try:
            pool = prefill_problem(
                self.problem,
                gpus,
                instances,
                decode_pp=layout[0],
                decode_tp=layout[1],
                one_domain=one_domain,
            )
        except ShardlabError:
            return NO_POOL
        m = evaluate(pool, free.plan)
        if m.feasible:
            return Pool(
                status=free.status,
                plan=free.plan,
                metrics=m,
                rate=self._rate(pool, m.throughput_tok_s),
            )
        return self.prefill(gpus, instances, layout, one_domain)

    def decode_bound(self, gpus: int) -> float:
        try:
            pool = decode_problem(self.problem, gpus, 1)
        except ShardlabError:
            return 0.0
        return self.bound(pool, f"decode instance of {gpus} GPUs")

    def prefill_bound(self, gpus: int) -> float:
        try:
            pool = prefill_problem(
                self.problem, gpus, 1, decode_pp=1, decode_tp=1, one_domain=False
            )
        except ShardlabError:
            return 0.0
        return self.bound(
            dataclasses.replace(pool, handoff=None), f"prefill instance of {gpus} GPUs"
        )

    def layouts(self, gpus: int, instances: int) -> list[tuple[int, int]]:
        try:
            space = decode_problem(self.problem, gpus, instances).space
        except ShardlabError:
            return []
        return sorted({(d.pp, d.tp) for d in space.degree_tuples})

    # -- pairs -----------------------------------------------------------------------

    def pair(self, gp: int, x: int, gd: int, y: int) -> tuple[float, Pool, Pool]:
        """The best (rate, prefill instance, decode instance) of one pair of pools."""
        one = in_one_domain(self.problem.cluster, x * gp + y * gd)
        # Offered the whole load, an instance can run every plan it can run offered a
        # share: no plan then, none for any count of these instances.
        if self.decode(gd, 1).plan is None or self.prefill(gp, 1, None, one).plan is None:
            return 0.0, NO_POOL, NO_POOL
        d = self.decode(gd, y)
        if d.plan is None:
            return 0.0, NO_POOL, NO_POOL
        first = (d.plan.degrees.pp, d.plan.degrees.tp)
        p = self.prefill_to(gp, x, first, one)
        value, best = min(x * p.rate, y * d.rate), (p, d)
        if x * p.rate >= y * d.rate:
            return value, *best  # the decode pool is the slower: no layout does better
        for layout in self.layouts(gd, y):
            if layout == first:
                continue
            pc = self.prefill_to(gp, x, layout, one)
            if x * pc.rate <= value * (1 + ROUNDING):
                continue
            dc = self.decode(gd, y, layout)
            if min(x * pc.rate, y * dc.rate) > value * (1 + ROUNDING):
                value, best = min(x * pc.rate, y * dc.rate), (pc, dc)
        return value, *best

    def run(self) -> DisaggResult:
        problem = self.problem
        cluster = problem.cluster
        sizes = instance_sizes(cluster)
        candidates = pairs(cluster)
        facts: dict[str, Any] = {"instance_sizes": list(sizes), "pairs": len(candidates)}
        evaluated: list[tuple[int, int, int, int, float, float]] = []
        best: tuple[float, tuple[int, int, int, int], Pool, Pool] | None = None
        complete = False
        interrupted = False
        try:
            decode_ub = {g: self.decode_bound(g) for g in sizes}
            prefill_ub = {g: self.prefill_bound(g) for g in sizes}
            order = sorted(
                (
                    (min(x * prefill_ub[gp], y * decode_ub[gd]), gp, x, gd, y)
                    for gp, x, gd, y in candidates
                ),
                key=lambda c: (-c[0], c[1] * c[2] + c[3] * c[4], c[1:]),
            )
            facts["pruned_pairs"] = 0
            for i, (bound, gp, x, gd, y) in enumerate(order):
                if bound <= 0 or (best is not None and bound <= best[0] * (1 + ROUNDING)):
                    facts["pruned_pairs"] = len(order) - i
                    break
                self.phase = f"pair {i + 1} of {len(order)}: {x}P({gp}) + {y}D({gd})"
                value, p, d = self.pair(gp, x, gd, y)
                evaluated.append((gp, x, gd, y, bound, value))
                better = best is None or value > best[0] * (1 + ROUNDING)
                if value > 0 and better:
                    best = (value, (gp, x, gd, y), p, d)
                    self.best_rate = value
            complete = True
        except _OutOfTime:
            facts["ran_out_in"] = self.phase
        except KeyboardInterrupt:
            interrupted = True
        facts["evaluated_pairs"] = len(evaluated)
        facts["pool_solves"] = sum(1 for pool in self.pools.values() if pool.status != "skipped")
        proven = complete and all(pool.proven for pool in self.pools.values())
        plan = metrics = None
        if best is not None:
            _, (gp, x, gd, y), p, d = best
            assert p.plan is not None and d.plan is not None
            plan = DisaggPlan(
                prefill=p.plan, prefill_instances=x, decode=d.plan, decode_instances=y
            )
            # priced as evaluate_disagg prices it: each instance on its own problem
            prefill_pool, _ = pool_problems(problem, plan)
            assert p.metrics is not None and d.metrics is not None
            deg = plan.prefill.degrees
            metrics = combine(
                problem,
                plan,
                p.metrics,
                d.metrics,
                float(handoff_seconds(prefill_pool, deg.pp, deg.tp)),
            )
        return self._result(plan, metrics, facts, evaluated, complete, proven, interrupted)

    def _result(
        self,
        plan: DisaggPlan | None,
        metrics: DisaggMetrics | None,
        facts: dict[str, Any],
        evaluated: list[tuple[int, int, int, int, float, float]],
        complete: bool,
        proven: bool,
        interrupted: bool,
    ) -> DisaggResult:
        status: Status
        message = ""
        if interrupted:
            status = "interrupted"
            message = "stopped by the user; the best pair of pools so far is reported"
        elif metrics is not None:
            status = "optimal" if proven else "feasible"
            if not complete:
                message = (
                    f"not proven: the {self.budget.seconds:g} s time limit ran out in "
                    f"{self.phase}; the best pair of pools so far is reported"
                )
            elif not proven:
                message = "not proven: a pool's CP-SAT solve ran out of time"
        elif complete and proven:
            status = "infeasible"
            message = (
                "no pair of pools meets memory and the SLOs (instances too small for the "
                "weights, or TTFT or TPOT out of reach); relax the SLOs or serve aggregated"
            )
        else:
            status = "unknown"
            message = f"no plan yet: the time limit ran out in {self.phase}; allow more time"
        return DisaggResult(
            method="cpsat",
            seed=self.seed,
            status=status,
            message=message,
            plan=plan,
            metrics=metrics,
            wall_s=time.perf_counter() - self.start,
            facts=facts,
            pairs=tuple(evaluated),
        )


def solve_disagg(
    problem: Problem,
    method: str = "cpsat",
    *,
    budget: Budget | None = None,
    seed: int = 0,
    callback: Callable[[Progress], None] | None = None,
    workers: int | None = None,
) -> DisaggResult:
    """The best disaggregated plan of ``problem`` (see the module docstring)."""
    check_method(method)
    check_disagg(problem)
    budget = budget or Budget.exact()
    if budget.seconds is not None and budget.started is None:
        budget = dataclasses.replace(budget, started=time.perf_counter())
    return DisaggSearch(problem, budget, seed, callback, workers).run()
