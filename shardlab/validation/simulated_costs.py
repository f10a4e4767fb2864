"""The engine's fixed costs as the simulator sees them, fitted through the simulator.

The shipped costs per request and per iteration (``request_ms``, ``iteration_ms`` in
``engines.yaml``) are fitted through the analytic forms, whose closed loop queues a new
prompt less than an engine does and whose round has no prefill batch stalling the
decodes: the constants absorb what the forms miss (SGLang's: 307 ms a request, 1.08
ms an iteration). The simulator queues every prompt and stalls the decodes itself, so
the same constants count that time twice (SGLang's TPOT 1.07-1.17x, its H200 TTFT
1.8x on runs no fit saw). Here each measured closed loop of the sample is replayed
request by request with no per-request cost, at two per-iteration costs (0 and
:data:`STEP_MS`), and the costs are what is left, per engine:

- per iteration, the ``i`` that minimizes the median of
  ``|(tpot(0) + i * slope) / measured - 1|`` over the TPOT rows, ``slope`` each row's
  TPOT per millisecond of iteration cost between the two replays (linear: every
  iteration carries the cost once; the scheduling it moves is second order);
- per request, the ``r`` that minimizes the same median over the TTFT rows at that
  ``i``: the constant adds to every request's TTFT.

The median relative error is the statistic the reports quote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from shardlab.problems.calibration import Calibration
from shardlab.validation.measurements import Measurement
from shardlab.validation.serving_sample import RANGE_RATIO

# Costs tried (ms): the median objective is piecewise linear in each, so a fine grid
# finds its minimum to the grid's step.
REQUEST_GRID_MS = np.arange(0.0, 2000.0, 0.5)
ITERATION_GRID_MS = np.arange(0.0, 10.0, 0.01)
# The second replay's per-iteration cost (ms).
STEP_MS = 1.0
METRICS = ("ttft_ms", "tpot_ms")


@dataclass(frozen=True, kw_only=True)
class Replayed0:
    """A TTFT or TPOT row, and its replay with no engine costs: the value, and how
    much it grows per millisecond of per-iteration cost."""

    measurement: Measurement
    engine: str
    simulated_ms: float  # with no per-request and no per-iteration cost
    slope: float = 0.0  # ms of the metric per ms of per-iteration cost

    def at(self, iteration_ms: float, request_ms: float = 0.0) -> float:
        """The simulated value under these costs (the request cost is TTFT's only)."""
        value = self.simulated_ms + self.slope * iteration_ms
        return value + request_ms if self.measurement.metric == "ttft_ms" else value


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


def replay_without_costs(
    rows: Sequence[Measurement],
    timing: str = "silicon",
    *,
    progress: Callable[[int, int], None] | None = None,
    tables: dict | None = None,
) -> list[Replayed0]:
    """Each aggregated TTFT and TPOT row of ``rows`` replayed with no engine costs and
    with :data:`STEP_MS` per iteration (rows the simulator refuses are left out)."""
    from shardlab.validation.replay import replay

    todo = [with_load(m) for m in rows if m.metric in METRICS and m.disagg is None]
    tables = {} if tables is None else tables  # one pricing of each plan for both
    runs = []
    for i, it in enumerate((0.0, STEP_MS)):

        def costs(m: Measurement, it: float = it) -> Calibration:
            return Calibration(timing=timing, iteration_ms=it, simulated_request_ms=0.0)

        done = (lambda d, n, i=i: progress(i * n + d, 2 * n)) if progress else None
        runs.append(replay(todo, timing, calibration=costs, progress=done, tables=tables))
    return [
        Replayed0(
            measurement=a.measurement,
            engine=a.engine,
            simulated_ms=a.simulated,
            slope=(b.simulated - a.simulated) / STEP_MS,
        )
        for a, b in zip(*runs, strict=True)
        if a.simulated is not None and b.simulated is not None
    ]


def _best(
    grid: np.ndarray, rows: Sequence[Replayed0], base: np.ndarray, slope: np.ndarray
) -> float:
    """The cost on ``grid`` whose values ``base + slope * cost`` are closest to the
    rows' measurements in median relative error."""
    measured = np.array([r.measurement.value for r in rows])
    values = base[None, :] + slope[None, :] * grid[:, None]
    errors = np.abs(values / measured[None, :] - 1.0)
    return float(grid[int(np.argmin(np.median(errors, axis=1)))])


def fit_costs(rows: Sequence[Replayed0]) -> tuple[dict[str, float], dict[str, float]]:
    """Per engine, the per-iteration cost (ms) whose replays are closest to the
    measured TPOT in median relative error, then the per-request cost (ms) closest
    to the measured TTFT at it: ``(request_ms, iteration_ms)``. An engine with no rows
    of a metric keeps 0 for that cost."""
    request, iteration = {}, {}
    for engine in sorted({r.engine for r in rows}):
        tpot = [r for r in rows if r.engine == engine and r.measurement.metric == "tpot_ms"]
        ttft = [r for r in rows if r.engine == engine and r.measurement.metric == "ttft_ms"]
        it = 0.0
        if tpot:
            base = np.array([r.simulated_ms for r in tpot])
            slope = np.array([r.slope for r in tpot])
            it = _best(ITERATION_GRID_MS, tpot, base, slope)
        req = 0.0
        if ttft:
            at_it = np.array([r.at(it) for r in ttft])
            req = _best(REQUEST_GRID_MS, ttft, at_it, np.ones(len(ttft)))
        request[engine], iteration[engine] = req, it
    return request, iteration


def errors_of(
    rows: Sequence[Replayed0], costs: Callable[[Replayed0], tuple[float, float]]
) -> np.ndarray:
    """``|simulated / measured - 1|`` of each row under its ``(request_ms,
    iteration_ms)``."""
    out = []
    for r in rows:
        request_ms, iteration_ms = costs(r)
        out.append(abs(r.at(iteration_ms, request_ms) / r.measurement.value - 1.0))
    return np.array(out)


@dataclass(frozen=True, kw_only=True)
class SimulatedFit:
    """Per engine, the costs fitted through the simulator, and per metric the median
    error of the replays: with no engine costs, fitted (in sample), and with each
    family's rows under a fit that did not see the family."""

    request_ms: dict[str, float]
    iteration_ms: dict[str, float]
    rows: dict[tuple[str, str], int]  # (engine, metric)
    without: dict[tuple[str, str], float]
    in_sample: dict[tuple[str, str], float]
    family_held_out: dict[tuple[str, str], float]

    def lines(self) -> list[str]:
        """The fit as Markdown tables."""
        out = [
            "| engine | per request (ms) | per iteration (ms) |",
            "|---|---:|---:|",
            *(
                f"| {e} | {self.request_ms[e]:.1f} | {self.iteration_ms[e]:.2f} |"
                for e in sorted(self.request_ms)
            ),
            "",
            "| engine | metric | rows | median error: no engine costs | fitted | family held out |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for key in sorted(self.rows):
            out.append(
                f"| {key[0]} | {key[1]} | {self.rows[key]} | {self.without[key]:.1%} "
                f"| {self.in_sample[key]:.1%} | {self.family_held_out[key]:.1%} |"
            )
        return out


def fit_through_simulator(rows: Sequence[Replayed0]) -> SimulatedFit:
    """:func:`fit_costs` on ``rows``, judged in sample and by family held out."""
    request, iteration = fit_costs(rows)
    by_family = {
        family: fit_costs([r for r in rows if r.measurement.family != family])
        for family in sorted({r.measurement.family for r in rows})
    }

    def held(r: Replayed0) -> tuple[float, float]:
        req, it = by_family[r.measurement.family]
        return req.get(r.engine, 0.0), it.get(r.engine, 0.0)

    counts, none, inside, out = {}, {}, {}, {}
    for key in sorted({(r.engine, r.measurement.metric) for r in rows}):
        mine = [r for r in rows if (r.engine, r.measurement.metric) == key]
        counts[key] = len(mine)
        none[key] = float(np.median(errors_of(mine, lambda r: (0.0, 0.0))))
        inside[key] = float(
            np.median(errors_of(mine, lambda r: (request[r.engine], iteration[r.engine])))
        )
        out[key] = float(np.median(errors_of(mine, held)))
    return SimulatedFit(
        request_ms=request,
        iteration_ms=iteration,
        rows=counts,
        without=none,
        in_sample=inside,
        family_held_out=out,
    )
