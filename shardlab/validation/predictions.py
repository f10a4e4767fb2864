"""Each measurement's prediction: the problem and plan a measured row ran, priced by
the cost model, and how far a set of predictions is off."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from shardlab.costmodel import (
    DisaggMetrics,
    Metrics,
    Span,
    at_capacity,
    collective_time,
    evaluate,
    evaluate_disagg,
    pool_problems,
    silicon,
)
from shardlab.errors import ShardlabError
from shardlab.problems.calibration import Calibration
from shardlab.problems.disagg import DisaggPlan
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.validation.loading import load_measurements
from shardlab.validation.measurements import MODEL_METRICS, Measurement


@dataclass(frozen=True, kw_only=True)
class Row:
    id: str
    description: str
    metric: str
    unit: str
    predicted: float
    measured: float
    note: str
    source: str
    measurement: Measurement | None = field(default=None, compare=False, repr=False)

    @property
    def ratio(self) -> float:
        return self.predicted / self.measured


def problem_of(
    m: Measurement, timing: str, engine: str, calibration: Calibration | None = None
) -> tuple[Problem, str]:
    """The row's problem under ``timing`` (the roofline where nothing is measured), and
    the note that says so."""
    assert m.problem is not None
    used, note = timing, ""
    if timing == "silicon" and not silicon.covers(m.cluster.accelerator.key):
        used, note = "roofline", "no measured kernels: roofline"
    problem = dataclasses.replace(
        m.problem, timing=used, engine=m.engine or engine, calibration=calibration
    )
    return problem, note


def measured_plan(problem: Problem, m: Measurement) -> Plan:
    """The plan a measured row ran: Megatron's options on its degrees, at the requests
    per rank its engine ran (its own, within what the KV cache holds; else every
    offered request the cache holds: "max-throughput" serving)."""
    assert m.degrees is not None
    plan = at_capacity(problem, problem.space.megatron_plan(m.degrees))
    if m.requests_per_rank is not None and plan.requests_per_rank is not None:
        plan = dataclasses.replace(
            plan, requests_per_rank=min(m.requests_per_rank, plan.requests_per_rank)
        )
    return plan


@lru_cache(maxsize=256)
def _priced(problem: Problem, plan: Plan | DisaggPlan) -> Metrics | DisaggMetrics:
    """A measured setup's metrics (its rows, one per metric, share them)."""
    if isinstance(plan, DisaggPlan):
        return evaluate_disagg(problem, plan, breakdown=False)
    return evaluate(problem, plan, breakdown=False)


def predict(
    m: Measurement,
    timing: str = "roofline",
    engine: str = "trtllm",
    calibration: Calibration | None = None,
) -> Row:
    """One measurement and its prediction: a mean's (the analytic model predicts means;
    a row of another statistic is refused, see :func:`analytic`)."""
    if m.statistic != "mean":
        raise ShardlabError(
            f"measurement {m.id!r} is a {m.statistic}: the analytic model predicts means, "
            "it has no analytic percentile",
            field="statistic",
        )
    if m.problem is None:
        return _collective_row(m, timing, engine, calibration)
    problem, used_note = problem_of(m, timing, engine, calibration)
    assert m.degrees is not None
    notes = [x for x in (m.note, used_note) if x]
    w = problem.workload
    desc = m.setup or f"{problem.model.name} on {m.cluster.name}"
    if m.disagg is not None:
        metrics = _priced(problem, measured_disagg(problem, m.disagg))
        desc += f" ({m.disagg.label()})"
    else:
        # measured serving runs what its KV cache holds, not the best concurrency
        metrics = _priced(problem, measured_plan(problem, m))
        desc += f" ({m.degrees.short()})"
    desc += f", {w.schedule} batch {w.batch}, {w.input_len}/{w.output_len}"
    if m.has_load:
        desc += f", {m.load_label()}"
    if not metrics.feasible:
        notes.append("predicted infeasible: " + ", ".join(metrics.violations))
    value = MODEL_METRICS[m.metric][0](metrics, problem)
    return Row(
        id=m.id,
        description=desc,
        metric=m.metric,
        unit=m.unit,
        predicted=value,
        measured=m.value,
        note="; ".join(notes),
        source=m.source,
        measurement=m,
    )


def measured_disagg(problem: Problem, plan: DisaggPlan) -> DisaggPlan:
    """A measured disaggregated deployment's plan, each pool within what its KV cache
    holds."""
    prefill, decode = pool_problems(problem, plan)
    return dataclasses.replace(
        plan,
        prefill=_within_capacity(prefill, plan.prefill),
        decode=_within_capacity(decode, plan.decode),
    )


def _within_capacity(problem: Problem, plan: Plan) -> Plan:
    held = at_capacity(problem, dataclasses.replace(plan, requests_per_rank=None)).requests_per_rank
    if plan.requests_per_rank is None or held is None:
        return plan
    return dataclasses.replace(plan, requests_per_rank=min(plan.requests_per_rank, held))


def collective_seconds(m: Measurement, timing: str, engine: str) -> float:
    """Seconds of a collective row's all-reduce over its cluster's GPUs, uncalibrated
    (measured where the tables have the group inside one NVLink domain)."""
    c = m.cluster
    key, ranks = c.accelerator.key, c.num_gpus
    nbytes = np.array(float(m.message_bytes or 0))
    measured = None
    if timing == "silicon" and silicon.covers(key) and ranks <= c.domain_size:
        kernels = silicon.kernels(key, engine)
        measured = kernels.collective("all_reduce", ranks, nbytes, nccl=True)
    if measured is None:
        local = math.gcd(ranks, c.domain_size)  # whole domains, or one domain's share
        measured = collective_time("all_reduce", Span(size=ranks, local=local), nbytes, c)
    return float(measured)


def collective_value(m: Measurement, seconds: float) -> float:
    """A collective row's metric from its all-reduce's seconds (bus bandwidth counts the
    2(n-1)/n of the message a ring over the cluster's n GPUs moves)."""
    if m.metric == "allreduce_busbw_gbps":
        n = m.cluster.num_gpus
        return 2 * (n - 1) / n * float(m.message_bytes or 0) / seconds / 1e9
    return seconds * 1e6


def _collective_row(
    m: Measurement, timing: str, engine: str, calibration: Calibration | None
) -> Row:
    seconds = collective_seconds(m, timing, engine)
    if calibration is not None:
        seconds *= calibration.communication
    value = collective_value(m, seconds)
    return Row(
        id=m.id,
        description=m.setup or f"all-reduce on {m.cluster.name}",
        metric=m.metric,
        unit=m.unit,
        predicted=value,
        measured=m.value,
        note=m.note,
        source=m.source,
    )


def predict_all(
    timing: str = "roofline",
    engine: str = "trtllm",
    measurements: list[Measurement] | None = None,
    calibration: Calibration | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Row]:
    """Every mean measured predicted with ``timing``; rows on an accelerator the measured
    tables do not cover are predicted by the roofline (and say so). Rows of another
    statistic (a median, a percentile) are left out: the analytic model has no
    percentile (:func:`analytic`). ``progress(done, total)`` hears of each row
    predicted."""
    given = measurements if measurements is not None else load_measurements().rows
    rows, _ = analytic(given)
    predicted: list[Row] = []
    for m in rows:
        predicted.append(predict(m, timing, engine, calibration))
        if progress is not None:
            progress(len(predicted), len(rows))
    return predicted


def analytic(measurements: list[Measurement]) -> tuple[list[Measurement], list[Measurement]]:
    """The rows the analytic model predicts (means), and the others (medians and
    percentiles: no analytic percentile; the simulator replays their load)."""
    means = [m for m in measurements if m.statistic == "mean"]
    return means, [m for m in measurements if m.statistic != "mean"]


DERIVED = ("e2e_ms", "itl_ms")  # latencies that follow from TTFT and TPOT


def fittable(measurements: list[Measurement]) -> list[Measurement]:
    """The rows a calibration fits: means (the analytic model has no percentile), of
    anything but :data:`DERIVED` (fitted through the TTFT and TPOT they follow from)."""
    return [m for m in analytic(measurements)[0] if m.metric not in DERIVED]


def summarize(rows: list[Row]) -> dict[str, Any]:
    errors = [abs(r.ratio - 1.0) for r in rows]
    worst = max(rows, key=lambda r: max(r.ratio, 1 / r.ratio))
    return {
        "rows": len(rows),
        "median_abs_error": statistics.median(errors),
        "within_25pct": sum(e <= 0.25 for e in errors),
        "worst_id": worst.id,
        "worst_factor": max(worst.ratio, 1 / worst.ratio),
        "beyond_2x": sum(max(r.ratio, 1 / r.ratio) > 2 for r in rows),
        "beyond_1_5x": sum(max(r.ratio, 1 / r.ratio) >= 1.5 for r in rows),
    }
