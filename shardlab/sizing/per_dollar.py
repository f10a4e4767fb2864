"""Vidur-Search's question: which instance serves the most requests/s per dollar under
SLOs at a percentile (Vidur's defaults: p90 TTFT <= 2 s, p99 time between tokens <=
200 ms) under Poisson arrivals of a trace's lengths.

Vidur-Search (microsoft/vidur, ``vidur/config_optimizer``) simulates every
configuration of a grid (GPU SKU, tensor and pipeline degrees, scheduler and its chunk
size, batch cap) at rates found by a binary search, and ranks the rows that meet the
SLOs by QPS per dollar: requests/s over (GPUs x $/GPU-hour). Replicas of one instance
add their rates and their prices alike, so that ratio is one instance's; the answer is
an instance, not a count.

Here each GPU type and instance size (:meth:`~shardlab.sizing.size.Sizer.shapes`) runs
the plan CP-SAT proves best for it on the analytic mean (its *mean-model capacity*,
requests/s by Little's law), and its capacity at the percentile SLOs is the largest rate
up to that, to within 2%, at which its simulated percentiles meet them
(:func:`~shardlab.sizing.tail.percentile_capacity`). The ranking is by that capacity
over the instance's $/hour. Every instance is solved and simulated: a ranking by ratio
has no covering whose bounds could prune it.

The claim, exactly: over the listed GPU types and instance sizes, each with the plan
optimal under the analytic model (not every plan: a plan with a lower mean-model
capacity could hold a percentile to a higher rate), the instance whose simulated
capacity per dollar is highest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from shardlab.errors import ShardlabError
from shardlab.problems.plan import Plan
from shardlab.sizing.size import Sizer
from shardlab.sizing.tail import Probe


@dataclass(frozen=True, kw_only=True)
class InstanceValue:
    """One instance (a GPU type and a size): its capacities and what an hour costs."""

    gpu: str
    gpus: int
    price: float  # $/GPU-hour
    plan: Plan | None  # None: no plan fits or meets the SLOs on the mean
    status: str  # the CP-SAT solve's (optimal, infeasible, skipped, ...)
    mean_rate: float  # requests/s, the analytic model's optimum
    rate: float  # requests/s at the percentile SLOs (simulated); mean_rate without them
    solve_s: float  # CP-SAT's seconds for this instance
    simulate_s: float  # the capacity search's simulated seconds
    probes: tuple[Probe, ...] = ()

    @property
    def cost(self) -> float:
        """$/hour of the instance."""
        return self.gpus * self.price

    @property
    def per_dollar(self) -> float:
        """Requests/s per $/hour at the percentile SLOs (Vidur's "QPS per dollar")."""
        return self.rate / self.cost

    @property
    def mean_per_dollar(self) -> float:
        return self.mean_rate / self.cost


@dataclass(frozen=True, kw_only=True)
class PerDollar:
    """Every instance of every listed GPU type, in order of type then size."""

    instances: tuple[InstanceValue, ...]
    seconds: float  # wall seconds of the whole ranking

    @property
    def best(self) -> InstanceValue | None:
        """The most requests/s per dollar; a tie goes to the cheaper hour, then the
        fewer GPUs (None: no instance serves under the SLOs)."""
        serving = [v for v in self.instances if v.rate > 0]
        if not serving:
            return None
        return max(serving, key=lambda v: (v.per_dollar, -v.cost, -v.gpus))


def per_dollar(sizer: Sizer) -> PerDollar:
    """Rank every aggregated instance of ``sizer``'s GPU types and sizes by its capacity
    at the percentile SLOs per dollar (see the module docstring); ``sizer`` needs prices
    and no time limit (every instance is proven)."""
    if sizer.prices is None:
        raise ShardlabError(
            "requests/s per dollar needs each GPU type's price",
            field="prices",
            fix="give a $/GPU-hour for every GPU type (e.g. a100=2.21,h100=4.25)",
        )
    if sizer.time_limit is not None:
        raise ShardlabError(
            "requests/s per dollar solves every instance to its proof",
            field="time_limit",
            fix="drop the time limit",
        )
    start = time.perf_counter()
    caps = sizer.caps
    keys = [("agg", g, n) for g in sizer.accelerators for n in sizer.shapes(g)]
    caps.prefetch(keys)
    found: list[InstanceValue] = []
    for _, gpu, n in keys:
        solved = caps.agg(gpu, n)
        served = caps.served(solved)
        found.append(
            InstanceValue(
                gpu=gpu,
                gpus=n,
                price=sizer.prices[gpu],
                plan=solved.plan,
                status=solved.status,
                # a capacity already searched keeps its mean-model one apart
                mean_rate=solved.rate if solved.mean_rate is None else solved.mean_rate,
                rate=served.rate,
                solve_s=solved.seconds,
                simulate_s=served.seconds - solved.seconds,
                probes=served.probes,
            )
        )
    return PerDollar(instances=tuple(found), seconds=time.perf_counter() - start)
