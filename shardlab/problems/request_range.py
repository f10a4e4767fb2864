"""The requests one attention-data-parallel rank of a plan may run, and how they form
micro-batches: a fact of the workload, the degrees and the engine's limits, which the
cost model prices and exact search enumerates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.problems.plan import Degrees
from shardlab.problems.workload import Workload


@dataclass(frozen=True, kw_only=True)
class RequestRange:
    """How a replica's requests are spread: per dp rank, in micro-batches."""

    per_replica: int  # requests a replica is offered
    per_dp_max: int  # most requests a dp rank is offered
    inflight: bool

    def microbatches(self, per_dp: int | np.ndarray, pp: int) -> np.ndarray:
        return np.minimum(pp, per_dp)

    def b_of(self, per_dp: int | np.ndarray, pp: int) -> np.ndarray:
        """Requests per dp rank in one micro-batch."""
        per_dp = np.asarray(per_dp)
        m = self.microbatches(per_dp, pp)
        return -(-per_dp // m)


def request_range(
    workload: Workload,
    degrees: Degrees,
    *,
    max_batch: int,
    max_tokens: int,
    round_tokens: float,
) -> RequestRange:
    """The workload's batch over the replicas and dp ranks. In flight, a dp rank holds
    at most what its engine takes per iteration: its max batch (``max_batch``), and the
    requests whose tokens per round (``round_tokens`` each) fit its ``max_tokens``."""
    per_replica = -(-workload.batch // degrees.replicas)
    per_dp = -(-per_replica // degrees.dp_attn)
    inflight = workload.schedule == "inflight"
    if inflight:
        by_tokens = max(int(max_tokens // round_tokens), 1)
        per_dp = min(per_dp, max_batch, by_tokens)
    return RequestRange(per_replica=per_replica, per_dp_max=per_dp, inflight=inflight)
