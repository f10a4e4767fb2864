"""A request-level simulator: one deployment under one traffic, request by request,
iteration by iteration, each engine's scheduler stepping through iterations the cost
model prices (:class:`shardlab.costmodel.IterationCosts`). What the analytic forms give
as one mean, this gives as a distribution (see ``docs/traffic.md``)."""

from shardlab.simulate.deployment import Deployment, Pool
from shardlab.simulate.requests import LATENCIES, STATISTICS, Simulation, Slo, Summary
from shardlab.simulate.run import ROUTERS, PoolCosts, price, simulate, simulate_priced
from shardlab.simulate.schedulers import Holding

__all__ = [
    "LATENCIES",
    "ROUTERS",
    "STATISTICS",
    "Deployment",
    "Holding",
    "Pool",
    "PoolCosts",
    "Simulation",
    "Slo",
    "Summary",
    "price",
    "simulate",
    "simulate_priced",
]
