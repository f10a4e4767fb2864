"""The most any deployment could serve, from the instances' bounds alone (no solve).

Every instance shape's capacity is at most its ceiling, its largest CP-SAT subproblem
bound (:meth:`~shardlab.sizing.capacity.Capacities.ceiling`). Capacity adds over the
instances of a deployment (:mod:`shardlab.sizing.size`), so its capacity is at most:

- aggregated: the most the ceilings of a multiset of instances within ``max_gpus``
  GPUs add up to: an unbounded knapsack, exact by dynamic programming over GPUs;
- disaggregated: over every pair of a prefill kind ``P`` and a decode kind ``D``, the
  most ``min(x P, y D)`` with ``x gP + y gD <= max_gpus`` and ``x, y >= 1``: ``x P``
  grows with ``x`` and the decode pool's share shrinks, so the best is where they cross.

When that is below a rate, no deployment serves it, proven by bounds before any solve:
the claim then reads "by CP-SAT's bounds on every instance shape", not "solved".
Such a deployment also needs ``rate / per_gpu`` GPUs or more, ``per_gpu`` the best
ceiling per GPU (aggregated ``B / g``; a pair ``1 / (gP / P + gD / D)``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.sizing.capacity import Capacity
from shardlab.sizing.cover import RATE_TOLERANCE

if TYPE_CHECKING:
    from shardlab.sizing.size import Sizer


@dataclass(frozen=True, kw_only=True)
class Reach:
    """Requests/s no deployment exceeds by the bounds (0: no instance of the mode)."""

    agg: float = 0.0
    disagg: float = 0.0
    per_gpu: float = 0.0  # requests/s per GPU, any deployment
    shapes: int = 0  # instance shapes bounded

    @property
    def most(self) -> float:
        return max(self.agg, self.disagg)

    def serves(self, rate: float) -> bool:
        """Whether the bounds leave ``rate`` possible (False: proven unservable)."""
        return self.most >= rate * (1 - RATE_TOLERANCE)


def most_mix(best: np.ndarray, gpus: int, capacity: float) -> np.ndarray:
    """``best`` (the most capacity within each GPU count ``0..max_gpus``) once
    instances of ``gpus`` GPUs and ``capacity`` each may be added, any number of them:
    within each residue of the GPU count modulo ``gpus``, ``t`` more instances add
    ``t * capacity``, a running maximum."""
    n = len(best)
    rows = -(-n // gpus)
    padded = np.full(rows * gpus, -np.inf)
    padded[:n] = best
    grid = padded.reshape(rows, gpus)
    step = np.arange(rows)[:, None] * capacity
    grid = np.maximum.accumulate(grid - step, axis=0) + step
    return grid.reshape(-1)[:n]


def most_pair(pre: tuple[int, float], dec: tuple[int, float], max_gpus: int) -> float:
    """The most ``min(x P, y D)`` of ``x >= 1`` prefill instances of ``(gP, P)`` and
    ``y >= 1`` decode instances of ``(gD, D)`` within ``max_gpus`` GPUs."""
    (gp, p), (gd, d) = pre, dec
    if p <= 0 or d <= 0 or gp + gd > max_gpus:
        return 0.0

    def decode(x: int) -> float:
        return (max_gpus - x * gp) // gd * d

    if p > decode(1):
        return decode(1)  # more prefill instances only leave less room for decode
    lo, hi = 1, (max_gpus - gd) // gp  # lo: x P <= decode(x) holds
    while lo < hi:  # the last x where it still holds
        mid = (lo + hi + 1) // 2
        if mid * p <= decode(mid):
            lo = mid
        else:
            hi = mid - 1
    last = (max_gpus - gd) // gp
    return max(lo * p, decode(lo + 1) if lo < last else 0.0)


class _Bounds:
    """The reach of a growing set of instance ceilings, updated one shape at a time."""

    def __init__(self, max_gpus: int) -> None:
        self.max_gpus = max_gpus
        self.mix = np.zeros(max_gpus + 1)
        self.per_gpu = 0.0
        self.agg = 0.0
        self.disagg = 0.0
        self.pre: list[tuple[int, float]] = []
        self.dec: list[tuple[int, float]] = []
        self.shapes = 0

    def add_agg(self, gpus: int, ceiling: float) -> None:
        if ceiling <= 0 or gpus > self.max_gpus:
            return
        if math.isinf(ceiling):
            self.agg = self.per_gpu = math.inf
            return
        self.mix = most_mix(self.mix, gpus, ceiling)
        self.agg = max(self.agg, float(self.mix.max()))
        self.per_gpu = max(self.per_gpu, ceiling / gpus)

    def add_pool(self, role: str, gpus: int, ceiling: float) -> None:
        if ceiling <= 0 or gpus > self.max_gpus:
            return
        if math.isinf(ceiling):
            self.disagg = self.per_gpu = math.inf
            return
        kind = (gpus, ceiling)
        pairs = (
            [(kind, d) for d in self.dec] if role == "prefill" else [(p, kind) for p in self.pre]
        )
        (self.pre if role == "prefill" else self.dec).append(kind)
        for p, d in pairs:
            self.disagg = max(self.disagg, most_pair(p, d, self.max_gpus))
            self.per_gpu = max(self.per_gpu, 1 / (p[0] / p[1] + d[0] / d[1]))

    def reach(self) -> Reach:
        return Reach(agg=self.agg, disagg=self.disagg, per_gpu=self.per_gpu, shapes=self.shapes)


def reach(
    sizer: Sizer, gpus: Iterable[str], modes: Sequence[str], enough: float = math.inf
) -> Reach:
    """The most a deployment of ``gpus``' instances in ``modes`` (agg, disagg) could
    serve by the bounds; smallest shapes first (the cheapest to bound), stopping once
    it reaches ``enough`` (then only a lower estimate of the reach: enough to say the
    bounds do not refuse that rate)."""
    caps = sizer.caps
    b = _Bounds(sizer.max_gpus)
    roles = ["agg"] * ("agg" in modes) + ["prefill", "decode"] * ("disagg" in modes)
    shapes = sorted((n, gpu) for gpu in gpus for n in sizer.shapes(gpu))
    for i, (n, g) in enumerate(shapes):
        sizer.ahead(("ceiling", role, gpu, m) for m, gpu in shapes[i:] for role in roles)
        b.shapes += 1
        if "agg" in modes:
            b.add_agg(n, caps.ceiling("agg", g, n))
        if "disagg" in modes:
            b.add_pool("prefill", n, caps.ceiling("prefill", g, n))
            b.add_pool("decode", n, caps.ceiling("decode", g, n))
        if max(b.agg, b.disagg) >= enough * (1 - RATE_TOLERANCE):
            break
    return b.reach()


def why_unserved(sizer: Sizer, rate: float) -> ShardlabError:
    """Why no deployment serves ``rate``: past what ``max_gpus`` GPUs compute, past
    what the bounds of every instance shape allow, an SLO no instance meets, or a rate
    past what the solved instances serve."""
    if rate > (ceiling := sizer.rate_ceiling()):
        return ShardlabError(
            f"rate {rate:g} requests/s: {sizer.max_gpus} GPUs of "
            f"{', '.join(sizer.accelerators)} compute at most {ceiling:.4g} "
            f"requests/s of {sizer.problem.model.name} at their peak",
            field="rate",
            fix="give a lower rate or allow more GPUs (max_gpus)",
        )
    w = sizer.problem.workload
    slos = ", ".join(
        f"{name} <= {value:g} ms"
        for name, value in (("TTFT", w.ttft_ms), ("TPOT", w.tpot_ms))
        if value is not None
    )
    types = ", ".join(sizer.accelerators)
    no_instance = ShardlabError(
        f"no instance of {types} up to {sizer.max_gpus} GPUs meets the SLOs "
        f"({slos or 'none'}) for {sizer.problem.model.name} at "
        f"{w.input_len}/{w.output_len}",
        field="slo",
        fix="relax the TTFT/TPOT SLOs, or allow faster GPUs or more of them (max_gpus)",
    )
    modes = sizer.modes()
    bounded = reach(sizer, sizer.accelerators, modes)
    if bounded.most <= 0:
        return no_instance
    if not bounded.serves(rate):
        parts = {"agg": ("aggregated", bounded.agg), "disagg": ("disaggregated", bounded.disagg)}
        each = ", ".join(f"{parts[m][0]} {parts[m][1]:.4g}/s" for m in modes)
        least = math.ceil(rate / bounded.per_gpu * (1 - RATE_TOLERANCE))
        return ShardlabError(
            f"rate {rate:g} requests/s: no deployment of {types} up to {sizer.max_gpus} GPUs "
            f"serves it under the SLOs: by CP-SAT's bounds on each of the "
            f"{bounded.shapes} instance shapes, none serves more than {bounded.most:.4g}/s "
            f"({each}; no solve needed)",
            field="rate",
            fix=f"give a rate of at most {bounded.most:.4g}, or allow more GPUs (max_gpus): "
            f"at their best bound per GPU ({bounded.per_gpu:.3g}/s) these instances need "
            f"{least} GPUs or more",
        )
    kinds = [
        c for g in sizer.accelerators for n in sizer.shapes(g) for c in _role_caps(sizer, g, n)
    ]

    def serves(role: str) -> bool:
        return any(c.rate > 0 for c in kinds if c.role == role)

    if not (serves("agg") or (serves("prefill") and serves("decode"))):
        return no_instance
    agg = [(sizer.max_gpus // c.gpus) * c.rate for c in kinds if c.role == "agg"]
    most = (
        f" (aggregated instances of one kind serve at most {max(agg):.3g}/s there)"
        if agg and max(agg) > 0
        else ""
    )
    return ShardlabError(
        f"rate {rate:g} requests/s: no deployment of {types} up to {sizer.max_gpus} GPUs "
        f"serves it under the SLOs{most}",
        field="rate",
        fix="give a lower rate or allow more GPUs (max_gpus)",
    )


def _role_caps(sizer: Sizer, gpu: str, n: int) -> list[Capacity]:
    roles = []
    if sizer.serving in ("agg", "best"):
        roles.append(sizer.caps.agg(gpu, n))
    if sizer.serving in ("disagg", "best"):
        roles += [sizer.caps.decode(gpu, n), sizer.caps.prefill(gpu, n, None)]
    return roles
