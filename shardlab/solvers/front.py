"""Pareto fronts: throughput per GPU against the workload's latency axes.

A plan's point is ``(throughput per GPU, *latency axes)`` (see
:attr:`~shardlab.problems.workload.Workload.latency_axes`), the first maximized and
the others minimized. Only feasible plans (memory, and the user's SLOs when given)
have points. The front of a set of plans is the plans no other plan dominates; of
plans with identical points the first priced is kept, so a front is deterministic.

:class:`Front` accumulates the front of every plan the evaluator prices when the
workload's objective is ``pareto``, in flight at every concurrency the plan can run
(:func:`~shardlab.costmodel.evaluate_points`); every method therefore
reports the front of the plans it tried, and the methods that search the front itself
(``optuna``'s multi-objective study, ``cpsat``'s exact front) report a better one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardlab.costmodel import BatchMetrics, ConcurrencyPoints, Metrics, evaluate
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem

CHUNK = 512  # plans merged into a front at a time


@dataclass(frozen=True, kw_only=True)
class FrontPoint:
    plan: Plan
    metrics: Metrics
    batch: int  # the workload's batch (most requests in flight) the point was priced at

    def to_dict(self, problem: Problem) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "plan": self.plan.to_dict(problem.model, cluster=problem.cluster.name),
            "metrics": self.metrics.to_dict(),
        }


def axes(problem: Problem) -> tuple[str, ...]:
    """Metric names of a point: throughput per GPU, then the latency axes."""
    return ("throughput_tok_s_per_gpu", *problem.workload.latency_axes)


def minimized(problem: Problem, m: BatchMetrics | Metrics | ConcurrencyPoints) -> np.ndarray:
    """``(n, k)`` points in minimization form (throughput negated)."""
    cols = [-np.atleast_1d(np.asarray(m.throughput_tok_s_per_gpu, dtype=float))]
    cols += [np.atleast_1d(np.asarray(getattr(m, a), dtype=float)) for a in axes(problem)[1:]]
    return np.stack(cols, axis=1)


def merge(problem: Problem, points: list[FrontPoint]) -> tuple[FrontPoint, ...]:
    """The non-dominated points of ``points`` (first of equals kept), sorted like
    :meth:`Front.points`."""
    if not points:
        return ()
    values = np.concatenate([minimized(problem, p.metrics) for p in points])
    keep = np.flatnonzero(nondominated(values))
    order = keep[np.lexsort((values[keep, 0], values[keep, 1]))]
    return tuple(points[i] for i in order)


def nondominated(values: np.ndarray) -> np.ndarray:
    """Which rows of ``(n, k)`` minimization points no other row dominates; of
    identical rows only the first counts."""
    v = np.asarray(values, dtype=float)
    no_worse = (v[:, None, :] <= v[None, :, :]).all(axis=2)  # [i, j]: i no worse than j
    better = (v[:, None, :] < v[None, :, :]).any(axis=2)
    dominated = (no_worse & better).any(axis=0)
    same = no_worse & no_worse.T
    repeated = np.triu(same, k=1).any(axis=0)
    return ~dominated & ~repeated


def dominates(problem: Problem, a: Metrics, b: Metrics, *, rtol: float = 0.0) -> bool:
    """Whether ``a`` dominates ``b`` by more than ``rtol`` (relative) on some axis
    while no worse than ``b`` within ``rtol`` on every axis."""
    va, vb = minimized(problem, a)[0], minimized(problem, b)[0]
    slack = rtol * np.abs(vb)
    return bool(np.all(va <= vb + slack) and np.any(va < vb - slack))


def dominated_by(front: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Which rows of ``values`` some row of ``front`` dominates or equals (minimization)."""
    out = np.zeros(len(values), dtype=bool)
    if len(front) == 0:
        return out
    step = max(1, (1 << 22) // (len(front) * values.shape[1]))
    for i in range(0, len(values), step):
        v = values[i : i + step, None, :]
        out[i : i + step] = (front[None, :, :] <= v).all(axis=2).any(axis=1)
    return out


class Front:
    """The non-dominated feasible points among everything added so far: plans (codes)
    at a concurrency each (in flight, every concurrency a plan can run is a point)."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.codes = np.zeros((0, problem.space.n_vars), dtype=np.int64)
        self.requests_per_rank = np.zeros(0, dtype=np.int64)
        self.values = np.zeros((0, len(axes(problem))))

    def __len__(self) -> int:
        return len(self.codes)

    def add(self, codes: np.ndarray, points: ConcurrencyPoints) -> None:
        """Add the points of ``codes`` (:func:`~shardlab.costmodel.evaluate_points`)."""
        new_codes, new_rank = codes[points.row], points.requests_per_rank
        new_values = minimized(self.problem, points)
        fresh = ~dominated_by(self.values, new_values)
        new_codes, new_rank, new_values = new_codes[fresh], new_rank[fresh], new_values[fresh]
        # In chunks: the pairwise test is quadratic, the front stays small.
        for i in range(0, len(new_codes), CHUNK):
            codes = np.concatenate([self.codes, new_codes[i : i + CHUNK]])
            ranks = np.concatenate([self.requests_per_rank, new_rank[i : i + CHUNK]])
            values = np.concatenate([self.values, new_values[i : i + CHUNK]])
            keep = nondominated(values)
            self.codes, self.requests_per_rank, self.values = codes[keep], ranks[keep], values[keep]

    def points(self) -> tuple[FrontPoint, ...]:
        """The front as plans and metrics, by the first latency axis (then throughput)."""
        order = np.lexsort((self.values[:, 0], self.values[:, 1]))
        out = []
        for i in order:
            plan = self.problem.space.decode(self.codes[i])
            if self.problem.workload.schedule == "inflight":
                plan = dataclasses.replace(plan, requests_per_rank=int(self.requests_per_rank[i]))
            out.append(
                FrontPoint(
                    plan=plan,
                    metrics=evaluate(self.problem, plan),
                    batch=self.problem.workload.batch,
                )
            )
        return tuple(out)
