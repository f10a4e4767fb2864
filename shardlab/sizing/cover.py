"""The cheapest multiset of instances whose capacities cover a rate, exact.

Given instance kinds ``i`` (a GPU type and shape) with a cost, a GPU count and a
capacity ``X_i`` (requests/s), find counts ``k_i >= 0`` with ``sum k_i X_i >= R`` and
``sum k_i g_i <= max_gpus`` of least ``sum k_i c_i`` (ties: fewer GPUs, then more
capacity). This is Mélange's integer program over GPU types; it is small enough here
(tens of kinds, at most hundreds of instances) for a depth-first branch and bound:

- kinds are taken in order of cost per request/s; a kind never needs more than
  ``ceil(rest / X_i)`` instances (one fewer would not cover the rest by itself and
  anything more is waste);
- the bound at a node is its cost plus the rest of the rate at the best cost per
  request/s of the kinds still open (the linear relaxation), so the search returns
  a proven optimum.

:func:`brute_force` enumerates every count vector: the tests hold :func:`cover` to it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

# Capacities are floats from the cost model; a cover short by this fraction of the rate
# is a cover (the rate itself is given to a few digits).
RATE_TOLERANCE = 1e-9


@dataclass(frozen=True, kw_only=True)
class Kind:
    """One kind of instance: what it costs, its GPUs, what it serves."""

    cost: float
    gpus: int
    capacity: float  # requests/s, > 0


@dataclass(frozen=True, kw_only=True)
class Cover:
    counts: tuple[int, ...]  # per kind, in the order given
    cost: float
    gpus: int
    capacity: float
    nodes: int = 0  # branch-and-bound nodes visited (0: enumeration)

    def key(self) -> tuple[float, int, float]:
        return (self.cost, self.gpus, -self.capacity)


def _covers(capacity: float, rate: float) -> bool:
    return capacity >= rate * (1 - RATE_TOLERANCE)


def _better(a: Cover, b: Cover | None) -> bool:
    if b is None:
        return True
    if not math.isclose(a.cost, b.cost, rel_tol=1e-12, abs_tol=1e-12):
        return a.cost < b.cost
    return (a.gpus, -a.capacity) < (b.gpus, -b.capacity)


def cover(kinds: Sequence[Kind], rate: float, max_gpus: int) -> Cover | None:
    """The least-cost multiset of ``kinds`` covering ``rate`` in ``max_gpus`` GPUs
    (None: none does)."""
    usable = [i for i, k in enumerate(kinds) if k.capacity > 0 and k.gpus <= max_gpus]
    order = sorted(usable, key=lambda i: (kinds[i].cost / kinds[i].capacity, kinds[i].gpus))
    # best cost per request/s among kinds order[j:], for the bound
    tail = [math.inf] * (len(order) + 1)
    for j in range(len(order) - 1, -1, -1):
        k = kinds[order[j]]
        tail[j] = min(tail[j + 1], k.cost / k.capacity)
    counts = [0] * len(kinds)
    best: Cover | None = None
    visited = 0

    def dive(j: int, cost: float, gpus: int, capacity: float) -> None:
        nonlocal best, visited
        visited += 1
        if _covers(capacity, rate):
            found = Cover(counts=tuple(counts), cost=cost, gpus=gpus, capacity=capacity)
            if _better(found, best):
                best = found
            return
        if j == len(order):
            return
        rest = rate - capacity
        if best is not None and cost + rest * tail[j] > best.cost * (1 + 1e-12) + 1e-12:
            return
        i = order[j]
        k = kinds[i]
        most = min(math.ceil(rest / k.capacity * (1 - RATE_TOLERANCE)), (max_gpus - gpus) // k.gpus)
        for n in range(most, -1, -1):
            counts[i] = n
            dive(j + 1, cost + n * k.cost, gpus + n * k.gpus, capacity + n * k.capacity)
        counts[i] = 0

    dive(0, 0.0, 0, 0.0)
    if best is None:
        return None
    return Cover(
        counts=best.counts, cost=best.cost, gpus=best.gpus, capacity=best.capacity, nodes=visited
    )


def brute_force(kinds: Sequence[Kind], rate: float, max_gpus: int) -> Cover | None:
    """Every count vector within ``max_gpus`` GPUs, for the tests (small cases only)."""
    ranges = [range(max_gpus // k.gpus + 1) for k in kinds]
    best: Cover | None = None
    for counts in itertools.product(*ranges):
        gpus = sum(n * k.gpus for n, k in zip(counts, kinds, strict=True))
        if gpus > max_gpus:
            continue
        capacity = sum(n * k.capacity for n, k in zip(counts, kinds, strict=True))
        if not _covers(capacity, rate):
            continue
        cost = sum(n * k.cost for n, k in zip(counts, kinds, strict=True))
        found = Cover(counts=tuple(counts), cost=cost, gpus=gpus, capacity=capacity)
        if _better(found, best):
            best = found
    return best
