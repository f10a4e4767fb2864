"""How good a plan is: time, throughput, memory, feasibility, and where they come from."""

from shardlab.costmodel import silicon
from shardlab.costmodel.evaluate import (
    VIOLATIONS,
    BatchMetrics,
    Metrics,
    OpBreakdown,
    evaluate,
    evaluate_batch,
    evaluate_points,
    prepare,
)

__all__ = [
    "VIOLATIONS",
    "BatchMetrics",
    "Metrics",
    "OpBreakdown",
    "evaluate",
    "evaluate_batch",
    "evaluate_points",
    "prepare",
    "silicon",
]
