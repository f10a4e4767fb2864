"""Load as a rate: what a plan serves per second and the concurrency a rate needs.

**Arrival model.** The closed loop of the cost model's in-flight regime
(:mod:`shardlab.costmodel.regimes`): ``N`` clients, each sending its next request when
the last one finishes, no think time. Little's law on that loop is exact: with ``N``
requests always in the system, each taking the request latency
``L = TTFT + (output_len - 1) * TPOT``, the cluster completes ``X = N / L`` requests
per second. A rate ``R`` is served at the fewest requests in flight whose ``X`` reaches
``R`` (``N = R * L`` at that point): the load the rate implies. Open-loop (Poisson)
arrivals at the same mean queue in bursts above it; this model prices none of that
queueing, so a deployment sized here runs at the mean load with the SLOs met at that
load and no margin for bursts (size for a higher rate to keep one).
The benchmarks engines are measured with run this same closed loop (InferenceX: N
clients, 10 N prompts), so the model is checked there: ``results/serving/report.md``
("Requests/s by Little's law") sets the rate predicted from the cost model's latencies
against the rate the measured latencies give, per row, in-sample and held out.

**Loads below capacity.** A rate ``s`` runs at the fewest requests in flight whose
``X`` reaches ``s``. The cost model's latencies are not monotone in requests in flight
everywhere (the measured kernel tables dip: TPOT up to ~10% lower at a higher batch on
some MoE plans), so a plan that meets the SLOs at its capacity need not meet them at
every lower load. A plan's *servable* capacity is therefore taken over the prefix of
concurrencies that all meet the SLOs (:func:`prefix_capacity`): every rate up to it
runs at a concurrency in that prefix, so it is met by construction, not by assuming
monotonicity. It equals the CP-SAT optimum unless an SLO fails below the optimum's
concurrency (then the gap is reported).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardlab.costmodel.metrics import BatchMetrics, Metrics
from shardlab.costmodel.pricing import evaluate, evaluate_batch
from shardlab.errors import ShardlabError
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem


@dataclass(frozen=True, kw_only=True)
class RateFit:
    """A plan run at the load a rate implies."""

    rate: float  # requests/s offered
    capacity: float  # requests/s the plan serves at its best concurrency under the SLOs
    plan: Plan  # with the requests per rank it runs at for ``rate``
    metrics: Metrics  # at that concurrency

    @property
    def served(self) -> float:
        """Requests/s the plan completes at the concurrency it runs at (>= ``rate``)."""
        return requests_per_second(self.metrics)

    @property
    def utilization(self) -> float:
        return self.rate / self.capacity

    def to_dict(self) -> dict[str, float | int]:
        return {
            "rate_rps": self.rate,
            "capacity_rps": self.capacity,
            "served_rps": self.served,
            "utilization": self.utilization,
            "requests_per_rank": self.metrics.requests_per_rank,
            "requests_in_flight": self.metrics.requests_in_flight,
            "ttft_ms": self.metrics.ttft_ms,
            "tpot_ms": self.metrics.tpot_ms,
            "latency_ms": self.metrics.latency_ms,
        }


def requests_per_second(m: Metrics) -> float:
    """Little's law: requests in flight over the request latency."""
    return m.requests_in_flight / (m.latency_ms / 1e3) if m.latency_ms > 0 else math.inf


def prefix_capacity(
    problem: Problem, plan: Plan, top: int, rate_of: Callable[[BatchMetrics], np.ndarray]
) -> tuple[float, int]:
    """The most ``rate_of`` (requests/s per concurrency) ``plan`` reaches over the
    requests per rank ``1 .. c`` that all meet the SLOs (``c <= top``), and that ``c``
    (0: it fails at 1 already)."""
    cs = np.arange(1, top + 1, dtype=np.int64)
    codes = np.repeat(problem.space.encode(dataclasses.replace(plan, requests_per_rank=None))[None],
                      len(cs), axis=0)  # fmt: skip
    m = evaluate_batch(problem, codes, requests_per_rank=cs)
    bad = np.flatnonzero(~m.feasible)
    last = int(bad[0]) if bad.size else len(cs)  # concurrencies 1..last all meet the SLOs
    if last == 0:
        return 0.0, 0
    rates = rate_of(m)[:last]
    return float(rates.max()), last


def little_rate(m: BatchMetrics) -> np.ndarray:
    """Requests/s of each priced point by Little's law."""
    return m.requests_in_flight / (m.latency_ms / 1e3)


def fit_rate(problem: Problem, plan: Plan, rate: float) -> RateFit:
    """``plan`` (the optimum of ``problem``'s objective request_rate) at the fewest
    requests per rank whose Little rate reaches ``rate`` (where a rate settles),
    every concurrency up to it meeting the SLOs; refused in one line when its
    servable capacity falls short."""
    w = problem.workload
    capacity_plan = dataclasses.replace(plan, requests_per_rank=None)
    best = evaluate(problem, capacity_plan, breakdown=False)
    top = best.requests_per_rank
    capacity, last = prefix_capacity(problem, capacity_plan, top, little_rate)
    if capacity < rate:
        dip = (
            f"; it meets them at {top} requests per rank but not at {last + 1}"
            if best.feasible and last < top
            else ""
        )
        raise ShardlabError(
            f"rate {rate:g} requests/s: {problem.cluster.name} serves at most {capacity:.3g}/s "
            f"of {w.input_len}/{w.output_len} under the SLOs "
            f"({problem.model.name}, {plan.degrees.short()}{dip})",
            field="rate",
            fix="give a lower rate, more GPUs, or let `shardlab size` choose them",
        )
    cs = np.arange(1, last + 1, dtype=np.int64)
    codes = np.repeat(problem.space.encode(capacity_plan)[None], len(cs), axis=0)
    served = little_rate(evaluate_batch(problem, codes, requests_per_rank=cs))
    c = int(cs[int(np.flatnonzero(served >= rate)[0])])
    at = dataclasses.replace(plan, requests_per_rank=c)
    return RateFit(
        rate=rate, capacity=capacity, plan=at, metrics=evaluate(problem, at, breakdown=True)
    )
