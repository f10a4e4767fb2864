"""Fitting per-kernel-class corrections to measurements, judged by cross-validation.

Each measured row is priced once; its step times split by kernel class (GEMMs,
attention, routed experts, communication, the rest) from the per-operator breakdown.
A calibration multiplies each class and adds a cost per step, so the row's prediction
under any calibration is the scheduling regime's formula over those sums
(:func:`shardlab.costmodel.regimes.timing`): exact for plans of one pipeline stage,
with the stages' balance kept as priced otherwise. The fit minimizes the squared log
errors plus a small pull of each factor towards 1 (:data:`RIDGE`), with factors in
``[1/5, 5]``; classes no row exercises stay at 1. Leave-one-out cross-validation
(each row predicted by a fit on the others) says how well it generalizes.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from shardlab.costmodel import evaluate
from shardlab.costmodel.decompose import requests_per_rank
from shardlab.costmodel.evaluate import at_capacity
from shardlab.costmodel.regimes import timing as regime_timing
from shardlab.costmodel.steps import steps_of
from shardlab.errors import ShardlabError
from shardlab.problems.calibration import KERNEL_CLASSES, Calibration
from shardlab.validation import (
    MODEL_METRICS,
    Measurement,
    collective_seconds,
    collective_value,
    problem_of,
)

RIDGE = 0.05  # weight of (log factor)^2 against a row's (log error)^2
FACTOR_RANGE = (0.2, 5.0)
ITERATION_MS_MAX = 50.0
CLASSES = (*KERNEL_CLASSES, "other")


@dataclass(frozen=True)
class Linearized:
    """One measured row's prediction as a function of a calibration."""

    measurement: Measurement
    parts: np.ndarray  # (step, class) seconds at no calibration; collectives: (1, class)
    base: Any  # what the regime formula needs: (problem, degrees, steps, per_dp, shares)

    def predict(self, cal: Calibration) -> float:
        factors = np.array([*(cal.factor(k) for k in KERNEL_CLASSES), 1.0])
        m = self.measurement
        if m.problem is None:  # one collective: time scales with communication
            return collective_value(m, float(self.parts[0] @ factors))
        problem, degrees, steps, per_dp, shares = self.base
        sums = self.parts @ factors + cal.iteration_ms * 1e-3
        per_replica = -(-problem.workload.batch // degrees.replicas)
        t = regime_timing(
            problem,
            degrees,
            steps,
            per_replica,
            per_dp,
            [np.array([s]) for s in sums],
            [np.array([s * share]) for s, share in zip(sums, shares, strict=True)],
        )
        gpus = problem.cluster.num_gpus
        metrics = SimpleNamespace(
            throughput_tok_s=float(t.throughput[0]),
            throughput_tok_s_per_gpu=float(t.throughput[0]) / gpus,
            ttft_ms=float(t.ttft_s[0]) * 1e3,
            tpot_ms=float(t.tpot_s[0]) * 1e3,
        )
        return float(MODEL_METRICS[m.metric][0](metrics, problem))


def linearize(m: Measurement, timing: str, engine: str) -> Linearized:
    """Price ``m`` once and split its step times by kernel class."""
    if m.problem is None:
        parts = np.zeros((1, len(CLASSES)))
        parts[0, CLASSES.index("communication")] = collective_seconds(m, timing, engine)
        return Linearized(m, parts, None)
    problem, _ = problem_of(m, timing, engine)
    assert m.degrees is not None
    plan = at_capacity(problem, problem.space.megatron_plan(m.degrees))
    metrics = evaluate(problem, plan)
    steps = steps_of(problem.workload)
    parts = np.zeros((len(steps), len(CLASSES)))
    for si, step in enumerate(steps):  # the steps of a workload are of distinct kinds
        for b in metrics.breakdown:
            if b.step != step.kind:
                continue
            comm = b.comm_ms * 1e-3
            parts[si, CLASSES.index("communication")] += comm
            parts[si, CLASSES.index(b.kernel_class or "other")] += b.time_ms * 1e-3 - comm
    # the bottleneck stage's share of a step: balanced stages (exact with one stage)
    shares = np.full(len(steps), 1.0 / plan.degrees.pp)
    per_dp = np.array([requests_per_rank(problem, plan)])
    return Linearized(m, parts, (problem, plan.degrees, steps, per_dp, shares))


def _error(lin: Linearized, cal: Calibration) -> float:
    return math.log(lin.predict(cal) / lin.measurement.value)


def fit(rows: list[Linearized], timing: str, fitted_on: str = "") -> Calibration:
    """The calibration that best explains ``rows`` (see the module docstring)."""
    from scipy.optimize import least_squares

    if not rows:
        raise ShardlabError("calibrate: no rows to fit")
    used = [
        k for i, k in enumerate(KERNEL_CLASSES) if any(float(r.parts[:, i].sum()) > 0 for r in rows)
    ]
    lo, hi = math.log(FACTOR_RANGE[0]), math.log(FACTOR_RANGE[1])

    def calibration(theta: np.ndarray) -> Calibration:
        factors = {k: math.exp(float(x)) for k, x in zip(used, theta, strict=False)}
        return Calibration(**factors, iteration_ms=float(theta[-1]), timing=timing)

    def residuals(theta: np.ndarray) -> np.ndarray:
        cal = calibration(theta)
        errors = [_error(r, cal) for r in rows]
        pull = [math.sqrt(RIDGE) * float(x) for x in theta[:-1]]
        return np.array(errors + pull)

    start = np.zeros(len(used) + 1)
    start[-1] = 0.1  # inside its bounds: a start on a bound stalls the reflective method
    bounds = ([lo] * len(used) + [0.0], [hi] * len(used) + [ITERATION_MS_MAX])
    result = least_squares(residuals, start, bounds=bounds, method="trf")
    return dataclasses.replace(calibration(result.x), fitted_on=fitted_on)


@dataclass(frozen=True)
class Report:
    calibration: Calibration
    before: list[float]  # |predicted / measured - 1| per row, uncalibrated
    after: list[float]  # with the calibration fitted on all rows
    held_out: list[float]  # each row predicted by a fit on the others

    def summary(self) -> dict[str, float]:
        def worst(errors: list[float]) -> float:
            return max(max(1 + e, 1 / (1 + e)) for e in errors)

        return {
            "rows": len(self.before),
            "median_before": statistics.median(abs(e) for e in self.before),
            "median_after": statistics.median(abs(e) for e in self.after),
            "median_cross_validated": statistics.median(abs(e) for e in self.held_out),
            "worst_before": worst(self.before),
            "worst_after": worst(self.after),
            "worst_cross_validated": worst(self.held_out),
        }


def calibrate(
    measurements: list[Measurement], timing: str, engine: str, source: str = "measurements"
) -> Report:
    """Fit on every row, and cross-validate by leaving each row out."""
    rows = [linearize(m, timing, engine) for m in measurements]
    if len(rows) < 3:
        raise ShardlabError(
            f"calibrate: {len(rows)} row(s) in {source}; give at least 3 to fit and check"
        )
    identity = Calibration(timing=timing)

    def rel(lin: Linearized, cal: Calibration) -> float:
        return lin.predict(cal) / lin.measurement.value - 1.0

    cal = fit(rows, timing)
    held_out = []
    for i, row in enumerate(rows):
        held_out.append(rel(row, fit(rows[:i] + rows[i + 1 :], timing)))
    report = Report(
        calibration=cal,
        before=[rel(r, identity) for r in rows],
        after=[rel(r, cal) for r in rows],
        held_out=held_out,
    )
    s = report.summary()
    note = (
        f"{source}: {s['rows']} rows, {timing} timing, {engine}; median |error| "
        f"{s['median_before']:.1%} before, {s['median_after']:.1%} fitted, "
        f"{s['median_cross_validated']:.1%} leave-one-out"
    )
    return dataclasses.replace(report, calibration=dataclasses.replace(cal, fitted_on=note))
