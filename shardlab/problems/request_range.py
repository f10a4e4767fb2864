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
    max_requests_per_rank: int  # most requests a dp rank is offered
    inflight: bool

    def microbatches(self, requests_per_rank: int | np.ndarray, pp: int) -> np.ndarray:
        return np.minimum(pp, requests_per_rank)

    def b_of(self, requests_per_rank: int | np.ndarray, pp: int) -> np.ndarray:
        """Requests per dp rank in one micro-batch."""
        requests_per_rank = np.asarray(requests_per_rank)
        m = self.microbatches(requests_per_rank, pp)
        return -(-requests_per_rank // m)


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
    requests_per_rank = -(-per_replica // degrees.dp_attn)
    inflight = workload.schedule == "inflight"
    if inflight:
        by_tokens = max(int(max_tokens // round_tokens), 1)
        requests_per_rank = min(requests_per_rank, max_batch, by_tokens)
    return RequestRange(
        per_replica=per_replica, max_requests_per_rank=requests_per_rank, inflight=inflight
    )
