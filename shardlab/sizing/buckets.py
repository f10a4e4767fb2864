"""Mélange's move: each length bucket of a traffic served by instances of its own.

Mélange (Griggs et al., 2024) showed that which GPU type is cheapest depends on the
request's length: a cheap GPU serves short requests at low cost, long prompts need the
bandwidth and memory of a dear one, so routing by length can cost less than any one
type. Here a traffic's requests are split into ``k`` buckets by prompt length, at the
quantiles of their prompt tokens (each bucket holds about a k-th of the requests), and
each bucket is sized alone by the same covering (:class:`~shardlab.sizing.size.Sizer`):
its own problem at its mean request, its own share of the rate and, under percentile
SLOs, its own requests (their timestamps a thinning of the traffic's). Instances serve
one bucket each, so the buckets' answers are independent and the bucketed deployment's
least cost is the sum of theirs.

The claim: least cost under the cost model among the deployments that serve the
traffic together and those that give each of these ``k`` buckets instances of its own
(each bucket's cover proven as ``size`` proves one). Other bucket boundaries, or a
bucket's requests split between pools of different types by another rule than the
covering's (in proportion to capacity), are not searched.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.problems.problem import Problem
from shardlab.problems.traffic import Traffic
from shardlab.sizing.size import Sizer, Sizing

# Requests a bucket needs at least: its mean request and its share stand for it.
LEAST_REQUESTS = 20


@dataclass(frozen=True, kw_only=True, eq=False)
class Bucket:
    """The requests whose prompts are ``low`` to ``high`` tokens (both included)."""

    low: int
    high: int
    share: float  # of the traffic's requests
    input_len: int  # the bucket's mean request
    output_len: int
    traffic: Traffic  # its requests, in arrival order

    def label(self) -> str:
        return f"prompts {self.low:,}-{self.high:,}"


@dataclass(frozen=True, kw_only=True, eq=False)
class BucketSizing:
    """Each bucket's answer at its share of the rate, and the traffic served together."""

    rate: float
    buckets: tuple[Bucket, ...]
    answers: tuple[Sizing, ...]
    sizers: tuple[Sizer, ...]
    together: Sizing

    @property
    def cost(self) -> float:
        """The bucketed deployment's cost (inf when a bucket has no deployment)."""
        if any(s.best is None for s in self.answers):
            return math.inf
        return sum(s.best.cost for s in self.answers)  # type: ignore[union-attr]

    @property
    def gpus(self) -> int:
        return sum(s.best.gpus for s in self.answers if s.best is not None)

    @property
    def bucketed(self) -> bool:
        """Whether routing by length costs less than serving together."""
        together = self.together.best.cost if self.together.best else math.inf
        return self.cost < together * (1 - 1e-12)

    @property
    def partial(self) -> bool:
        return self.together.partial or any(s.partial for s in self.answers)


def split(traffic: Traffic, k: int) -> tuple[Bucket, ...]:
    """``traffic`` in ``k`` buckets of prompt length at its quantiles (fewer when many
    prompts share a length); refused when a bucket would hold fewer than
    :data:`LEAST_REQUESTS` requests."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ShardlabError(f"buckets must be an integer >= 2, got {k!r}", field="buckets")
    if traffic.arrival == "closed":
        raise ShardlabError(
            f"traffic {traffic.source!r}: a closed loop has no rate to share out by length",
            field="traffic",
        )
    ins = traffic.input_len
    edges = np.unique(np.quantile(ins, np.arange(1, k) / k, method="lower"))
    which = np.searchsorted(edges, ins, side="left")  # bucket j holds (edges[j-1], edges[j]]
    out = []
    for j in range(len(edges) + 1):
        mask = which == j
        n = int(mask.sum())
        if n == 0:
            continue
        if n < LEAST_REQUESTS:
            raise ShardlabError(
                f"traffic {traffic.source!r}: a bucket of {n} requests (fewer than "
                f"{LEAST_REQUESTS}) in {k} buckets",
                field="buckets",
                fix="give fewer buckets, or a traffic of more requests",
            )
        blocks, kept = traffic.prefix_blocks, np.flatnonzero(mask)
        sub = dataclasses.replace(
            traffic,
            input_len=ins[mask],
            output_len=traffic.output_len[mask],
            arrival_s=None if traffic.arrival_s is None else traffic.arrival_s[mask],
            prefix_blocks=None if blocks is None else tuple(blocks[i] for i in kept),
            refused=(),
        )
        low, high = int(ins[mask].min()), int(ins[mask].max())
        out.append(
            Bucket(
                low=low,
                high=high,
                share=n / traffic.requests,
                input_len=max(1, round(float(sub.input_len.mean()))),
                output_len=max(2, round(float(sub.output_len.mean()))),
                traffic=dataclasses.replace(sub, source=f"{traffic.source} [{low}-{high}]"),
            )
        )
    return tuple(out)


def size_by_bucket(
    problem: Problem,
    traffic: Traffic,
    rate: float,
    k: int,
    make: Callable[[Problem, Traffic | None], Sizer],
) -> BucketSizing:
    """The cheapest deployment at ``rate`` serving ``traffic``'s requests together, and
    the cheapest giving each of its ``k`` prompt-length buckets instances of its own;
    ``make(problem, traffic)`` builds a sizer (the traffic: a bucket's requests under
    percentile SLOs, None on the mean)."""
    return curve_by_bucket(problem, traffic, [rate], k, make)[0]


def curve_by_bucket(
    problem: Problem,
    traffic: Traffic,
    rates: Sequence[float],
    k: int,
    make: Callable[[Problem, Traffic | None], Sizer],
) -> list[BucketSizing]:
    """:func:`size_by_bucket` at each of ``rates`` (ascending): one sizer together and
    one per bucket, each a curve over its share of the rates, so that an instance's
    capacity is solved once for every rate."""
    rates = sorted(rates)
    tail = problem.workload.tail
    together = make(problem, traffic if tail else None).curve(rates)
    buckets = split(traffic, k)
    curves, sizers = [], []
    for b in buckets:
        w = dataclasses.replace(problem.workload, input_len=b.input_len, output_len=b.output_len)
        sized = dataclasses.replace(problem, workload=w.at_rate(rates[0] * b.share))
        sizer = make(sized, b.traffic if tail else None)
        curves.append(sizer.curve([r * b.share for r in rates]))
        sizers.append(sizer)
    return [
        BucketSizing(
            rate=rate,
            buckets=buckets,
            answers=tuple(c[i] for c in curves),
            sizers=tuple(sizers),
            together=together[i],
        )
        for i, rate in enumerate(rates)
    ]
