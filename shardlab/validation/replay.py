"""Measured rows replayed in the simulator: each row that states its load (a closed
loop, or arrivals at a rate) is run request by request through the deployment it
measured (:mod:`shardlab.simulate`), and its statistic (mean, median, pN) of its
metric read off the run, beside the analytic model's mean of the same metric.

Rows of one setup (the same problem, plan and load) share one run; runs of one plan
share its iteration tables. The tables and the analytic mean come from the same cost
model, under the same timing and calibration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardlab.costmodel import engine_limits, serving_costs
from shardlab.errors import ShardlabError
from shardlab.problems.calibration import KERNEL_CLASSES, Calibration, shipped_for
from shardlab.problems.problem import Problem
from shardlab.simulate import Deployment, Pool, PoolCosts, Simulation, price, simulate_priced
from shardlab.validation.measurements import Measurement
from shardlab.validation.predictions import measured_disagg, predict, problem_of
from shardlab.validation.protocol import INFERENCEX_RUN, Launch, inferencex_trtllm_launch

# The metrics the simulator measures a distribution of.
REPLAYED = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


@dataclass(frozen=True, kw_only=True)
class Replayed:
    """One row: what it measured, what the simulator gives for the same statistic, and
    the analytic model's mean of the metric (None where it has none)."""

    measurement: Measurement
    engine: str  # the row's, or the one asked for where it names none
    simulated: float | None  # None: the run was refused (``note`` says why)
    analytic_mean: float | None
    note: str

    @property
    def ratio(self) -> float | None:
        return None if self.simulated is None else self.simulated / self.measurement.value


def replayable(rows: Sequence[Measurement]) -> list[Measurement]:
    """The rows the simulator can replay: a latency, of a model, under a stated load."""
    return [m for m in rows if m.problem is not None and m.has_load and m.metric in REPLAYED]


def launch_of(m: Measurement) -> Launch | None:
    """How the row's benchmark launched its engine, where the simulator models it:
    InferenceX's aggregated DeepSeek-R1 TensorRT-LLM runs (its own rows, and the
    measured serving sample's InferenceX-protocol rows) as its scripts launch them
    (:func:`shardlab.validation.protocol.inferencex_trtllm_launch`); None for any
    other row (the engine's defaults). Its disaggregated runs go through srt-slurm's
    recipes, not read here."""
    inferencex = m.source.startswith(INFERENCEX_RUN) or m.protocol == "inferencex"
    if not inferencex or m.engine != "trtllm" or m.model_family != "deepseek-v3":
        return None  # the scripts read are DeepSeek-R1's (family deepseek-v3)
    if m.disagg is not None or m.degrees is None or m.clients is None or m.problem is None:
        return None
    w = m.problem.workload
    return inferencex_trtllm_launch(
        gpu=m.gpu,
        weights=w.weight_dtype,
        dp_attn=m.degrees.dp_attn,
        input_len=w.input_len,
        output_len=w.output_len,
        clients=m.clients,
    )


def _deployment(problem: Problem, m: Measurement) -> Deployment:
    if m.disagg is not None:
        return Deployment.of_disagg(problem, measured_disagg(problem, m.disagg))
    assert m.degrees is not None
    return Deployment.of_plan(problem, problem.space.megatron_plan(m.degrees))


def _plain(problem: Problem) -> Problem:
    """What a plan's iteration tables depend on: not the load's batch or clients, nor
    the engine's fixed costs (:meth:`IterationCosts.with_engine_costs` moves them) or
    token budget (:func:`_for_pool` reads it again)."""
    w = dataclasses.replace(
        problem.workload, name="", batch=1, clients=None, ttft_ms=None, tpot_ms=None
    )
    cal = problem.calibration
    if cal is not None:
        cal = dataclasses.replace(
            cal,
            request_ms=None,
            iteration_ms=None,
            simulated_request_ms=None,
            simulated_iteration_ms=None,
            fitted_on="",
            shipped="",  # kept as stripped here, not swapped back for the shipped whole
        )
        # factors of 1 price exactly as none (the shipped costs' tables), where none
        # means none: not on a GPU whose problems take a shipped fit by default
        key = problem.cluster.accelerator.key
        if all(cal.factor(k) == 1.0 for k in KERNEL_CLASSES) and shipped_for(key) is None:
            cal = None
    return dataclasses.replace(problem, workload=w, calibration=cal, max_tokens=None)


def _for_pool(pc: PoolCosts, pool: Pool) -> PoolCosts:
    """Tables priced for ``pool``'s plain problem (:func:`_plain`), under its own engine
    costs and token budget."""
    c = serving_costs(pool.problem)
    d = pool.plan.degrees
    costs = pc.costs.with_engine_costs(
        c.simulated_request_ns * 1e-9, c.simulated_iteration_ns * 1e-9
    )
    tokens = engine_limits(pool.problem, d.tp, d.pp, d.dp_attn).max_tokens
    return dataclasses.replace(pc, pool=pool, costs=dataclasses.replace(costs, max_tokens=tokens))


def replay(
    rows: Sequence[Measurement],
    timing: str,
    engine: str = "trtllm",
    *,
    calibration: Callable[[Measurement], Calibration | None] | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    tables: dict[tuple, tuple[int | None, tuple[PoolCosts, ...]]] | None = None,
) -> list[Replayed]:
    """Replay each of ``rows`` that states a load (:func:`replayable`) under ``timing``
    (and each row's ``calibration``, default none: the shipped engine costs).
    ``tables``: the plans' iteration tables, kept between calls (they do not depend on
    the engine's fixed costs)."""
    todo = replayable(rows)
    runs: dict[tuple, Simulation | str] = {}
    tables = {} if tables is None else tables
    out: list[Replayed | None] = [None] * len(todo)
    # the most clients first: a plan's tables, priced up to a load's requests in the
    # system, then serve its lighter loads too
    order = sorted(range(len(todo)), key=lambda j: -(todo[j].clients or 1 << 30))
    for done, j in enumerate(order, 1):
        m = todo[j]
        cal = calibration(m) if calibration is not None else None
        problem, note = problem_of(m, timing, m.engine or engine, cal)
        key = (problem, m.disagg, m.degrees, m.clients, m.prompts_per_client, m.rate,
               m.arrival, m.cv, m.requests, m.length_range)  # fmt: skip
        if key not in runs:
            runs[key] = _run(problem, m, tables, seed)
        run = runs[key]
        notes = [x for x in (m.note, note) if x]
        if isinstance(run, str):
            simulated = None
            notes.append(run)
        else:
            simulated = run.latency(m.metric, m.statistic)
        out[j] = Replayed(
            measurement=m,
            engine=problem.engine,
            simulated=simulated,
            analytic_mean=_analytic_mean(m, timing, engine, cal),
            note="; ".join(notes),
        )
        if progress is not None:
            progress(done, len(todo))
    return [r for r in out if r is not None]


def _run(
    problem: Problem,
    m: Measurement,
    tables: dict[tuple, tuple[int | None, tuple[PoolCosts, ...]]],
    seed: int,
) -> Simulation | str:
    """The row's load through its deployment, or why it cannot run."""
    try:
        launch = launch_of(m)
        if launch is not None and launch.max_num_tokens is not None:
            problem = dataclasses.replace(problem, max_tokens=launch.max_num_tokens)
        deployment = _deployment(problem, m)
        if launch is not None:
            deployment = deployment.with_holding(launch.holding)
        traffic = m.traffic(seed)
        w = problem.workload
        # the shortest request any draw of the row's lengths can make: one set of
        # tables for every load of the setup
        r = m.length_range
        shortest = max(1, int(r * w.input_len) + int(r * w.output_len))
        key = (
            tuple((_plain(p.problem), p.plan, p.role, p.instances) for p in deployment.pools),
            shortest,
        )
        most = m.clients  # open arrivals: None, no bound
        held = tables.get(key)
        if held is None or (held[0] is not None and (most is None or most > held[0])):
            plain = Deployment(
                pools=tuple(dataclasses.replace(p, problem=_plain(p.problem))
                            for p in deployment.pools)
            )  # fmt: skip
            tables[key] = (most, price(plain, traffic, shortest=shortest, most=most))
        priced = tuple(
            _for_pool(pc, pool) for pc, pool in zip(tables[key][1], deployment.pools, strict=True)
        )
        return simulate_priced(deployment, priced, traffic, seed=seed)
    except ShardlabError as exc:
        return f"not simulated: {exc}"


def _analytic_mean(
    m: Measurement, timing: str, engine: str, cal: Calibration | None
) -> float | None:
    try:
        return predict(dataclasses.replace(m, statistic="mean"), timing, engine, cal).predicted
    except ShardlabError:
        return None
