"""How good a plan is: time, throughput, memory, feasibility, and where they come from.

This package's face is everything a module above it may use: solvers, the CLI and the
experiments import these names from ``shardlab.costmodel``, never from a submodule,
so the cost model's files can be reorganized without touching its callers.
"""

from shardlab.costmodel import silicon
from shardlab.costmodel.arithmetic import assemble
from shardlab.costmodel.collectives import Span, collective_time
from shardlab.costmodel.constants import ACT_BYTES
from shardlab.costmodel.context import CostContext
from shardlab.costmodel.decompose import (
    IntegerTables,
    integer_tables,
    kv_bytes,
    price,
    requests_per_rank,
    time_ns,
)
from shardlab.costmodel.disagg import (
    DisaggMetrics,
    combine,
    evaluate_disagg,
    instance_rate,
    pool_problems,
    with_concurrencies,
)
from shardlab.costmodel.engines import (
    ServingCosts,
    engine_limits,
    serving_constants,
    serving_constants_yaml,
    serving_costs,
)
from shardlab.costmodel.experts import COUNT_BYTES, dispatch_bytes
from shardlab.costmodel.handoff import handoff_ns, handoff_seconds
from shardlab.costmodel.iterations import IterationCosts
from shardlab.costmodel.metrics import (
    VIOLATIONS,
    BatchMetrics,
    ConcurrencyPoints,
    Metrics,
    OpBreakdown,
)
from shardlab.costmodel.modes import ARRAYS, ARRAYS_NS, EXACT, Arith, Exact, Number, Vector
from shardlab.costmodel.pricing import (
    assemble_plan,
    at_capacity,
    evaluate,
    evaluate_batch,
    evaluate_points,
    forget_tables,
    prepare,
    with_concurrency,
)
from shardlab.costmodel.rate import (
    RateFit,
    fit_rate,
    little_rate,
    prefix_capacity,
    requests_per_second,
)
from shardlab.costmodel.regimes import (
    Form,
    Forms,
    basic_times,
    clients_per_rank,
    forms,
    in_flight_requests,
    judge,
    tokens,
)
from shardlab.costmodel.tables import degree_tables
from shardlab.costmodel.trace import collectives_of
from shardlab.costmodel.units import units_of_codes

__all__ = [
    "ACT_BYTES",
    "ARRAYS",
    "ARRAYS_NS",
    "COUNT_BYTES",
    "EXACT",
    "VIOLATIONS",
    "Arith",
    "BatchMetrics",
    "ConcurrencyPoints",
    "CostContext",
    "DisaggMetrics",
    "Exact",
    "Form",
    "Forms",
    "IntegerTables",
    "IterationCosts",
    "Metrics",
    "Number",
    "OpBreakdown",
    "RateFit",
    "ServingCosts",
    "Span",
    "Vector",
    "assemble",
    "assemble_plan",
    "at_capacity",
    "basic_times",
    "clients_per_rank",
    "collective_time",
    "collectives_of",
    "combine",
    "degree_tables",
    "dispatch_bytes",
    "engine_limits",
    "evaluate",
    "evaluate_batch",
    "evaluate_disagg",
    "evaluate_points",
    "fit_rate",
    "forget_tables",
    "forms",
    "handoff_ns",
    "handoff_seconds",
    "in_flight_requests",
    "instance_rate",
    "integer_tables",
    "judge",
    "kv_bytes",
    "little_rate",
    "pool_problems",
    "prefix_capacity",
    "prepare",
    "price",
    "requests_per_rank",
    "requests_per_second",
    "serving_constants",
    "serving_constants_yaml",
    "serving_costs",
    "silicon",
    "time_ns",
    "tokens",
    "units_of_codes",
    "with_concurrencies",
    "with_concurrency",
]
