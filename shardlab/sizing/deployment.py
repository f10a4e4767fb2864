"""A sized deployment: pools of identical instances, what they cost and serve.

Aggregated, any multiset of instances behind one router that splits the rate over
them in proportion to their capacities; disaggregated, a prefill pool and a decode
pool, every request passing both (:mod:`shardlab.sizing.size` finds the cheapest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from shardlab.costmodel import fit_rate
from shardlab.problems.problem import Problem
from shardlab.sizing.capacity import Capacity

Mode = Literal["agg", "disagg"]
# Costs within this relative distance are equal (prices are given to the cent).
SAME = 1e-12


@dataclass(frozen=True, kw_only=True)
class Pool:
    """``instances`` identical instances of one kind."""

    role: str  # agg, prefill, decode
    capacity: Capacity  # one instance's
    instances: int
    price: float | None  # $/GPU-hour
    gpus_per_node: int

    @property
    def gpu(self) -> str:
        return self.capacity.gpu

    @property
    def gpus(self) -> int:
        return self.instances * self.capacity.gpus

    @property
    def nodes(self) -> int:
        """Nodes it fills (instances within a node pack them, power-of-two sizes)."""
        return -(-self.gpus // self.gpus_per_node)

    @property
    def rate(self) -> float:
        return self.instances * self.capacity.rate

    @property
    def cost(self) -> float:
        return self.gpus * (self.price if self.price is not None else 1.0)

    def label(self) -> str:
        return f"{self.instances} x {self.capacity.gpus} {self.gpu}"

    def to_dict(self, problem: Problem, routed: float) -> dict[str, Any]:
        """As JSON; ``routed``: the requests/s the router sends this pool."""
        c = self.capacity
        plan = c.plan
        at_rate = None
        if self.role == "agg" and plan is not None and c.problem is not None:
            # where each instance settles at its share of the rate
            at_rate = fit_rate(c.problem, plan, routed / self.instances).to_dict()
        return {
            "role": self.role,
            "gpu": self.gpu,
            "instances": self.instances,
            "gpus_per_instance": c.gpus,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "capacity_rps": self.rate,
            "instance_capacity_rps": c.rate,
            "instance_cpsat_optimum_rps": c.bound,
            "routed_rps": routed,
            "at_rate": at_rate,
            "price_per_gpu_hour": self.price,
            "degrees": plan.degrees.short() if plan else None,
            "requests_per_rank": plan.requests_per_rank if plan else None,
            "ttft_ms": c.metrics.ttft_ms if c.metrics else None,
            "tpot_ms": c.metrics.tpot_ms if c.metrics else None,
            "plan": plan.to_dict(problem.model, cluster=f"{self.gpu}x{c.gpus}") if plan else None,
        }


@dataclass(frozen=True, kw_only=True)
class Deployment:
    mode: Mode
    pools: tuple[Pool, ...]

    @property
    def cost(self) -> float:
        return sum(p.cost for p in self.pools)

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def nodes(self) -> int:
        return sum(p.nodes for p in self.pools)

    @property
    def capacity(self) -> float:
        if self.mode == "agg":
            return sum(p.rate for p in self.pools)
        return min(p.rate for p in self.pools)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.gpu for p in self.pools))

    def key(self) -> tuple[float, int, float]:
        return (self.cost, self.gpus, -self.capacity)

    def label(self) -> str:
        if self.mode == "agg":
            return " + ".join(p.label() for p in self.pools)
        pre, dec = self.pools
        return f"prefill {pre.label()}; decode {dec.label()}"

    def routed(self, rate: float, pool: Pool) -> float:
        """Requests/s the router sends ``pool`` at ``rate``: aggregated, a share in
        proportion to capacity; disaggregated, every request passes both pools."""
        return rate * pool.rate / self.capacity if self.mode == "agg" else rate

    def to_dict(self, problem: Problem, priced: bool, rate: float) -> dict[str, Any]:
        return {
            "serving": self.mode,
            "label": self.label(),
            "cost_per_hour" if priced else "cost_gpus": self.cost,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "capacity_rps": self.capacity,
            "utilization": rate / self.capacity,
            "pools": [p.to_dict(problem, self.routed(rate, p)) for p in self.pools],
        }


def better(a: Deployment | None, b: Deployment | None) -> Deployment | None:
    """The cheaper (then fewer GPUs, then more capacity) of two deployments."""
    if a is None or b is None:
        return a or b
    if not math.isclose(a.cost, b.cost, rel_tol=SAME):
        return a if a.cost < b.cost else b
    return a if a.key() <= b.key() else b
