"""The engine's per-request cost as the simulator sees it, fitted through the simulator.

The shipped per-request cost (``request_ms`` in ``engines.yaml``) is fitted through
the analytic forms, whose closed loop queues a new prompt less than an engine does: the
constant absorbs the queueing they miss (SGLang's: 307 ms). The simulator queues every
prompt behind the iterations under way, so the same constant counts that wait twice
(measured: SGLang H200 TTFT x2.2 on runs no fit saw). Here each measured closed-loop
run of the sample is replayed request by request with no per-request cost, and the
constant is what is left: per engine, the ``r`` that minimizes the median of
``|(simulated + r) / measured - 1|`` over the TTFT rows (the statistic the reports
quote). The constant adds to every request's TTFT, so one replay serves every ``r``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from shardlab.problems.calibration import Calibration
from shardlab.validation.measurements import Measurement
from shardlab.validation.serving_sample import RANGE_RATIO

# Per-request costs tried (ms): the median objective is piecewise linear in ``r``,
# so a fine grid finds its minimum to the grid's step.
GRID_MS = np.arange(0.0, 2000.0, 0.5)


@dataclass(frozen=True, kw_only=True)
class Replayed0:
    """A TTFT row and its replay without the engine's per-request cost."""

    measurement: Measurement
    engine: str
    simulated_ms: float  # TTFT with no per-request cost


def with_load(m: Measurement) -> Measurement:
    """A sample row with the closed loop its workload states (clients x prompts per
    client) as its load, so that the simulator can replay it; an InferenceX run's
    lengths drawn as it draws them (fixed lengths would keep a closed loop's clients
    in lock-step, every prompt of a wave queued behind the others)."""
    assert m.problem is not None
    w = m.problem.workload
    if m.has_load or w.clients is None:
        return m
    return dataclasses.replace(
        m,
        clients=w.clients,
        prompts_per_client=w.prompts_per_client,
        length_range=RANGE_RATIO if m.protocol == "inferencex" else 1.0,
    )


def replay_without_request_cost(
    rows: Sequence[Measurement],
    timing: str = "silicon",
    *,
    iteration_ms: Mapping[str, float] | None = None,
    progress: Callable[[int, int], None] | None = None,
    tables: dict | None = None,
) -> list[Replayed0]:
    """Each aggregated TTFT row of ``rows`` replayed with no per-request cost, and
    per iteration the shipped cost or ``iteration_ms``'s (rows the simulator refuses
    are left out)."""
    from shardlab.validation.replay import replay

    def costs(m: Measurement) -> Calibration:
        engine = m.engine or "trtllm"
        it = None if iteration_ms is None else iteration_ms.get(engine)
        return Calibration(timing=timing, iteration_ms=it, simulated_request_ms=0.0)

    todo = [with_load(m) for m in rows if m.metric == "ttft_ms" and m.disagg is None]
    return [
        Replayed0(measurement=r.measurement, engine=r.engine, simulated_ms=r.simulated)
        for r in replay(todo, timing, calibration=costs, progress=progress, tables=tables)
        if r.simulated is not None
    ]


def fit_request_ms(rows: Sequence[Replayed0]) -> dict[str, float]:
    """Per engine, the per-request cost (ms) whose replay is closest to the measured
    TTFT in median relative error (:data:`GRID_MS`)."""
    fitted = {}
    for engine in sorted({r.engine for r in rows}):
        mine = [r for r in rows if r.engine == engine]
        sim = np.array([r.simulated_ms for r in mine])
        measured = np.array([r.measurement.value for r in mine])
        errors = np.abs((sim[None, :] + GRID_MS[:, None]) / measured[None, :] - 1.0)
        fitted[engine] = float(GRID_MS[int(np.argmin(np.median(errors, axis=1)))])
    return fitted


def errors_of(rows: Sequence[Replayed0], request_ms: Callable[[Replayed0], float]) -> np.ndarray:
    """``|simulated / measured - 1|`` of each row under its per-request cost."""
    return np.array(
        [abs((r.simulated_ms + request_ms(r)) / r.measurement.value - 1.0) for r in rows]
    )


@dataclass(frozen=True, kw_only=True)
class SimulatedFit:
    """Per engine, the per-request cost fitted through the simulator, and the median
    TTFT error of the replays under it: in sample, and with each family's rows under a
    fit that did not see the family."""

    request_ms: dict[str, float]
    rows: dict[str, int]
    in_sample: dict[str, float]
    family_held_out: dict[str, float]
    without: dict[str, float]  # with no per-request cost at all

    def lines(self) -> list[str]:
        """The fit as a Markdown table."""
        out = [
            "| engine | TTFT rows | per request (ms) | median TTFT error: none | fitted "
            "| family held out |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for e in sorted(self.request_ms):
            out.append(
                f"| {e} | {self.rows[e]} | {self.request_ms[e]:.1f} | {self.without[e]:.1%} "
                f"| {self.in_sample[e]:.1%} | {self.family_held_out[e]:.1%} |"
            )
        return out


def fit_through_simulator(rows: Sequence[Replayed0]) -> SimulatedFit:
    """:func:`fit_request_ms` on ``rows``, judged in sample and by family held out."""
    fitted = fit_request_ms(rows)
    by_family: dict[str, dict[str, float]] = {}
    for family in sorted({r.measurement.family for r in rows}):
        by_family[family] = fit_request_ms([r for r in rows if r.measurement.family != family])
    counts, inside, held, none = {}, {}, {}, {}
    for e in fitted:
        mine = [r for r in rows if r.engine == e]
        counts[e] = len(mine)
        inside[e] = float(np.median(errors_of(mine, lambda r: fitted[r.engine])))
        none[e] = float(np.median(errors_of(mine, lambda r: 0.0)))
        held[e] = float(
            np.median(errors_of(mine, lambda r: by_family[r.measurement.family].get(r.engine, 0.0)))
        )
    return SimulatedFit(
        request_ms=fitted, rows=counts, in_sample=inside, family_held_out=held, without=none
    )
