"""Sizing under SLOs at a percentile: an instance's capacity is the largest rate at
which its simulated percentiles meet the SLOs, and the sized deployment is simulated
whole at the rate it serves.

**The capacity.** An instance runs the plan CP-SAT proves best for it with the SLOs on
the analytic mean (its *mean-model capacity* ``C``: the most requests/s by Little's
law). The percentile capacity is searched over rates up to ``C`` (the claim: the
largest rate up to the mean-model capacity, to within :data:`RATE_TOLERANCE`, at which
the instance's simulated percentiles meet the SLOs under the traffic rescaled to that
rate). The search assumes a percentile grows with the rate (more requests queue for
the same plan), so it bisects between the highest rate seen to meet and the lowest
seen to miss; the simulator draws the same requests at every rate (one seed, the
arrivals scaled), so a percentile moves with the rate alone.

**The deployment.** Capacities add over instances as in the mean model; the covering
is unchanged. When the router splits the rate in proportion to capacity, each instance
sees at most its capacity, so each meets the percentiles, and so does the mixture of
their requests (a share P of each instance's requests is under the SLO, so a share P of
all of them is). The deployment is also simulated whole at the rate
(:func:`simulate_deployment`: one least-loaded router, each rank's load counted over its
instance's capacity), and the answer reports its percentiles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from shardlab.costmodel import IterationCosts, forget_tables
from shardlab.errors import ShardlabError
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.problems.traffic import Traffic
from shardlab.simulate import Deployment, Pool, PoolCosts, simulate, simulate_priced
from shardlab.simulate.deployment import Role
from shardlab.solvers.certify import check_traffic, poisson, simulated_percentiles, with_reuse

# The bisection stops when the rates that meet and miss are within this of each other.
RATE_TOLERANCE = 0.02
# Probes at most (a bisection from C to 2% takes six).
_PROBES = 12
# Iteration tables kept for the prefill instances that share a plan (a few MB each).
_KEPT_TABLES = 16
_TABLES: dict[tuple, IterationCosts] = {}


@dataclass(frozen=True, kw_only=True)
class Probe:
    """One simulated rate: each SLO's percentile there and whether all met."""

    rate: float
    percentiles_ms: dict[str, float]
    met: bool


def traffic_at(shape: Traffic | None, problem: Problem, rate: float, seed: int) -> Traffic:
    """The traffic at ``rate`` requests/s: ``shape``'s requests with their arrivals
    rescaled (a trace keeps its burstiness), or, without one, Poisson arrivals of the
    workload's lengths; with the workload's prefix reuse where it states no prefixes
    of its own (:func:`~shardlab.solvers.certify.with_reuse`)."""
    shape = poisson(problem, rate, seed) if shape is None else shape
    return with_reuse(shape.at_rate(rate), problem)


def check_tail(problem: Problem, shape: Traffic | None) -> None:
    """Refuse what a sizing under percentile SLOs cannot simulate: a traffic with no
    rate (a closed loop), or what :func:`~shardlab.solvers.certify.check_traffic`
    refuses."""
    check_traffic(problem, shape)
    if shape is not None and shape.arrival == "closed":
        raise ShardlabError(
            f"traffic {shape.source!r}: a closed loop has no rate to size for",
            field="traffic",
            fix="give a trace with timestamps, or arrivals at a rate",
        )


def _met(found: dict[str, float], slos: dict[str, tuple[float, float]]) -> bool:
    return all(found[k] <= v for k, (v, _) in slos.items())


def percentile_capacity(
    problem: Problem,
    plan: Plan,
    mean_rate: float,
    slos: dict[str, tuple[float, float]],
    shape: Traffic | None,
    *,
    role: Role = "agg",
    sized: Problem | None = None,
    seed: int = 0,
    tolerance: float = RATE_TOLERANCE,
) -> tuple[float, tuple[Probe, ...]]:
    """The largest rate up to ``mean_rate`` found to meet ``slos`` (SLO -> limit,
    percentile) with one instance of ``plan`` on ``problem`` in ``role`` (see the module
    docstring), and the rates probed; ``sized``: the problem whose lengths a traffic
    without ``shape`` takes (default ``problem``)."""
    lengths = sized or problem
    pool = Pool(role=role, problem=problem, plan=plan)
    dep = Deployment(pools=(pool,))
    first = traffic_at(shape, lengths, mean_rate, seed)
    shortest = int((first.input_len + first.output_len).min())
    # a prefill instance is solved once per decode layout it hands off to: the same
    # plan, the same iteration tables
    key = (dataclasses.replace(problem, handoff=None), plan, role, shortest)
    priced = (PoolCosts.of(pool, shortest, costs=_TABLES.get(key)),)
    forget_tables()  # as price() does: the derived problems' tables are gigabytes
    _TABLES[key] = priced[0].costs
    while len(_TABLES) > _KEPT_TABLES:
        del _TABLES[next(iter(_TABLES))]
    probes: list[Probe] = []

    def probe(rate: float) -> bool:
        sim = simulate_priced(dep, priced, traffic_at(shape, lengths, rate, seed), seed=seed)
        found = simulated_percentiles(sim, slos)
        probes.append(Probe(rate=rate, percentiles_ms=found, met=_met(found, slos)))
        return probes[-1].met

    if probe(mean_rate):
        return mean_rate, tuple(probes)
    low, high = 0.0, mean_rate
    rate = mean_rate / 2
    while len(probes) < _PROBES and high - low > tolerance * high:
        if probe(rate):
            low = rate
        else:
            high = rate
        rate = (low + high) / 2
    return low, tuple(probes)


def role_slos(slos: dict[str, tuple[float, float]], role: Role) -> dict[str, tuple[float, float]]:
    """The SLOs one pool answers for: a prefill pool TTFT, a decode pool TPOT and ITL
    (the deployment, simulated whole, answers for all)."""
    own = {
        "agg": ("ttft_ms", "tpot_ms", "itl_ms"),
        "prefill": ("ttft_ms",),
        "decode": ("tpot_ms", "itl_ms"),
    }
    return {k: v for k, v in slos.items() if k in own[role]}


def simulate_deployment(
    pools: Sequence[tuple[Role, Problem, Plan, int, float]],
    slos: dict[str, tuple[float, float]],
    shape: Traffic | None,
    sized: Problem,
    rate: float,
    seed: int,
) -> dict[str, float]:
    """Each percentile SLO's simulated value for ``pools`` (a role, an instance's
    problem, plan, how many, and one instance's capacity) serving the traffic at
    ``rate`` (without ``shape``: of ``sized``'s lengths), one router per pool that
    weighs each rank by its instance's capacity (the covering splits the rate in
    proportion to capacity)."""
    dep = Deployment(
        pools=tuple(
            Pool(
                role=role,
                problem=p,
                plan=plan,
                instances=n,
                weight=capacity / (plan.degrees.replicas * plan.degrees.dp_attn),
            )
            for role, p, plan, n, capacity in pools
            if n
        )
    )
    sim = simulate(dep, traffic_at(shape, sized, rate, seed), seed=seed)
    return simulated_percentiles(sim, slos)
