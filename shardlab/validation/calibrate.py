"""Fitting corrections to measurements, judged on rows the fit did not see.

What can be fitted: one factor per kernel class (GEMMs, attention, routed experts,
communication: every kernel of the class is multiplied by it), or one factor shared by
classes tied together (:data:`TIES`: ``shared`` ties all four, an efficiency of the
roofline, the one rows of a single model family can identify), and the engine's fixed
costs, per request (in TTFT) and per iteration (in every round)
(:mod:`shardlab.costmodel.engines`). ``shardlab calibrate`` fits all of them into a
calibration file; ``shardlab calibrate --engines`` fits only the fixed costs, one pair
per engine, into the file shardlab ships (the kernel factors stay 1: those are the
measured kernel tables' to get right).

Each measured row is priced once (:func:`linearize`); its step times split by kernel
class from the per-operator breakdown, and the serving regime's form
(:func:`shardlab.costmodel.regimes.forms`) says how its metric follows from the round,
the prompt and the fixed costs. A row's prediction under any corrections is then a
few multiplications: exact for plans of one pipeline stage, with the stages' balance
kept as priced otherwise.

The fit minimizes a robust loss of the log errors (soft L1 with a scale of 0.2: a row
off by more than about 1.2x counts linearly, so that a few rows whose TTFT is seconds
at a handful of clients cannot set the constants) plus a small pull of each factor
towards 1 (:data:`RIDGE`), with factors in ``[1/5, 5]``; a class of its own that no
row exercises stays at 1.

Judged on held-out rows: every report gives the error of the fit on its own rows
(in-sample) and of each row predicted by a fit that did not see its group, for each
grouping asked for (by model family, by GPU, or each row alone: leave-one-out).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardlab.costmodel import (
    ARRAYS,
    Forms,
    Metrics,
    ServingCosts,
    assemble_plan,
    clients_per_rank,
    degree_tables,
    evaluate,
    evaluate_disagg,
    forms,
    handoff_seconds,
    pool_problems,
    serving_costs,
    tokens,
)
from shardlab.errors import ShardlabError
from shardlab.problems.calibration import KERNEL_CLASSES, Calibration
from shardlab.problems.engines import ENGINES
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.validation import (
    Measurement,
    collective_seconds,
    collective_value,
    measured_disagg,
    measured_plan,
    problem_of,
)
from shardlab.validation.predictions import DERIVED, fittable

RIDGE = 0.05  # weight of (log factor)^2 against a row's loss
FACTOR_RANGE = (0.2, 5.0)
REQUEST_MS_MAX = 2000.0
ITERATION_MS_MAX = 50.0
LOSS_SCALE = 0.2  # soft L1 on log errors: linear beyond about 1.2x
CLASSES = (*KERNEL_CLASSES, "other")
# Which kernel classes share one fitted factor. Rows of one model family exercise the
# classes in nearly fixed proportions, so their factors are not identifiable apart (one
# class's factor offsets another's) and do not carry to another model; one factor for
# every class is an efficiency of the roofline, which does.
TIES: dict[str, tuple[tuple[str, ...], ...]] = {
    "classes": tuple((k,) for k in KERNEL_CLASSES),  # each class its own
    "shared": (KERNEL_CLASSES,),  # one for every class
    "compute": (KERNEL_CLASSES[:-1], KERNEL_CLASSES[-1:]),  # kernels; communication
}
NO_COSTS = ServingCosts(request_ns=0, iteration_ns=0, simulated_request_ns=0,
                        simulated_iteration_ns=0, prefill_first=False)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Linearized:
    """One measured row's prediction as a function of the corrections.

    A latency is ``a_round * (R + i) + a_prompt * S + const + request * r + iteration
    * i`` seconds, with ``R`` and ``S`` the round's and prompt's kernel times (each a
    sum over kernel classes of factor times part), ``r`` and ``i`` the engine's costs
    per request and per iteration; a throughput is ``tokens`` over such a time."""

    measurement: Measurement
    engine: str
    round_parts: np.ndarray  # (class,) seconds at no correction
    prompt_parts: np.ndarray
    a_round: float
    a_prompt: float
    const: float
    request: float
    iteration: float
    tokens: float  # 0: a latency in ms; else the metric is tokens / time
    collective: bool = False

    def predict(self, cal: Calibration) -> float:
        return float(Rows([self]).predict(cal)[0])


def linearize(m: Measurement, timing: str, engine: str) -> Linearized:
    """Price ``m`` once and split its times by kernel class."""
    if m.metric in DERIVED:
        raise ShardlabError(f"{m.id}: {m.metric} is not calibrated; fit its TTFT and TPOT")
    if m.problem is None:
        parts = np.zeros(len(CLASSES))
        parts[CLASSES.index("communication")] = collective_seconds(m, timing, engine)
        zero = np.zeros(len(CLASSES))
        return Linearized(
            measurement=m,
            engine=engine,
            round_parts=parts,
            prompt_parts=zero,
            a_round=1.0,
            a_prompt=0.0,
            const=0.0,
            request=0.0,
            iteration=0.0,
            tokens=0.0,
            collective=True,
        )
    # from no correction at all, not even the GPU's shipped one (a fit replaces it)
    problem, _ = problem_of(m, timing, engine, Calibration(timing=timing))
    if m.disagg is not None:
        plan = measured_disagg(problem, m.disagg)
        prefill, decode = pool_problems(problem, plan)
        both = evaluate_disagg(problem, plan)
        if m.metric == "ttft_ms":
            return _linearized(m, prefill, plan.prefill, both.prefill)
        if m.metric == "tpot_ms":
            return _linearized(m, decode, plan.decode, both.decode)
        raise ShardlabError(f"{m.id}: a disaggregated row's {m.metric} is not calibrated")
    plan = measured_plan(problem, m)
    return _linearized(m, problem, plan, evaluate(problem, plan))


def _linearized(m: Measurement, problem: Problem, plan: Plan, metrics: Metrics) -> Linearized:
    """``metrics`` (with its breakdown) of ``plan`` on ``problem`` as a linear form."""
    d = plan.degrees
    requests_per_rank = np.array([int(assemble_plan(problem, plan)[1].requests_per_rank[0])])
    t = degree_tables(problem, d)
    kinds = [s.kind for s in t.steps]
    parts = np.zeros((len(kinds), len(CLASSES)))
    for si, kind in enumerate(kinds):  # the steps of a workload are of distinct kinds
        for b in metrics.breakdown:
            if b.step != kind:
                continue
            comm = b.comm_ms * 1e-3
            parts[si, CLASSES.index("communication")] += comm
            parts[si, CLASSES.index(b.kernel_class or "other")] += b.time_ms * 1e-3 - comm
    handoff = float(handoff_seconds(problem, d.pp, d.tp))
    prefill_first = serving_costs(problem).prefill_first

    def regime(request_s: float, iteration_s: float) -> Forms:
        costs = dataclasses.replace(  # the forms read only the forms' costs
            NO_COSTS, request_ns=round(request_s * 1e9), iteration_ns=round(iteration_s * 1e9),
            prefill_first=prefill_first,
        )  # fmt: skip
        clients = clients_per_rank(problem, d, requests_per_rank)
        budget = np.array([t.engine.max_tokens])
        return forms(
            problem, kinds, requests_per_rank, clients, budget, handoff, arith=ARRAYS, costs=costs
        )

    # the fixed costs' coefficients: the forms are affine in them (1 s of each apart)
    f, with_request, with_iteration = regime(0, 0), regime(1, 0), regime(0, 1)
    if m.metric in ("ttft_ms", "tpot_ms"):
        name = m.metric.removesuffix("_ms")
        pick: Callable[[Forms], Any] = lambda x: getattr(x, name)  # noqa: E731
        served = 0.0
    else:
        pick = lambda x: x.rate  # noqa: E731
        served = float(
            tokens(problem, d, t.request_range.per_replica, requests_per_rank)[0]
        ) / _per(m, problem)
    form = pick(f)
    if form is None:
        raise ShardlabError(f"{m.id}: {m.metric} is not a latency of its workload")
    zero = np.zeros(len(CLASSES))
    round_parts = parts[f.round_step] if f.round_step is not None else zero
    prompt_parts = parts[f.prompt_step] if f.prompt_step is not None else zero
    if f.prompt_batches:  # balanced stages: the fill and drain of m micro-batches
        m_batches = min(d.pp, int(requests_per_rank[0]))
        prompt_parts = prompt_parts * (1 + (m_batches - 1) / d.pp)
    a_round = _scalar(form.round) if f.round_step is not None else 0.0
    const = _scalar(form.const)
    return Linearized(
        measurement=m,
        engine=problem.engine,
        round_parts=round_parts,
        prompt_parts=prompt_parts,
        a_round=a_round,
        a_prompt=_scalar(form.prompt),
        const=const,
        request=_scalar(pick(with_request).const) - const,
        iteration=a_round + _scalar(pick(with_iteration).const) - const,
        tokens=served,
    )


def _scalar(x: Any) -> float:
    return float(np.asarray(x, dtype=float).reshape(-1)[0])


def _per(m: Measurement, problem: Problem) -> float:
    """What a throughput metric divides the cluster's tokens/s by."""
    if m.metric == "throughput_tok_s_per_gpu":
        return float(problem.cluster.num_gpus)
    if m.metric == "throughput_tok_s_per_node":
        return float(problem.cluster.num_hosts)
    return 1.0


class Rows:
    """Linearized rows as arrays, predicted together."""

    def __init__(self, rows: Sequence[Linearized]) -> None:
        self.rows = list(rows)
        self.round_parts = np.array([r.round_parts for r in rows]).reshape(-1, len(CLASSES))
        self.prompt_parts = np.array([r.prompt_parts for r in rows]).reshape(-1, len(CLASSES))
        for name in ("a_round", "a_prompt", "const", "request", "iteration", "tokens"):
            setattr(self, name, np.array([getattr(r, name) for r in rows], dtype=float))
        self.collective = np.array([r.collective for r in rows], dtype=bool)
        self.measured = np.array([r.measurement.value for r in rows], dtype=float)
        self.engine = np.array([ENGINES.index(r.engine) for r in rows], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, index: np.ndarray) -> Rows:
        return Rows([self.rows[i] for i in index])

    def values(
        self, factors: np.ndarray, request_s: np.ndarray, iteration_s: np.ndarray
    ) -> np.ndarray:
        """Each row's metric under kernel ``factors`` (one per :data:`CLASSES`) and
        the fixed costs of each engine (one per :data:`ENGINES`), in seconds."""
        rnd = self.round_parts @ factors
        prompt = self.prompt_parts @ factors
        time = (
            self.a_round * rnd
            + self.a_prompt * prompt
            + self.const
            + self.request * request_s[self.engine]
            + self.iteration * iteration_s[self.engine]
        )
        out = np.where(self.tokens > 0, self.tokens / np.maximum(time, 1e-12), time * 1e3)
        if self.collective.any():
            seconds = self.round_parts[self.collective] @ factors
            out[self.collective] = [
                collective_value(r.measurement, s)
                for r, s in zip(
                    (r for r, c in zip(self.rows, self.collective, strict=True) if c),
                    seconds,
                    strict=True,
                )
            ]
        return out

    def predict(self, cal: Calibration) -> np.ndarray:
        """Each row's metric under a calibration (the shipped fixed costs where it has
        none)."""
        return self.values(*_parameters(cal))


def _parameters(cal: Calibration) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from shardlab.costmodel import serving_constants

    factors = np.array([*(cal.factor(k) for k in KERNEL_CLASSES), 1.0])
    shipped = serving_constants()
    request = np.array(
        [shipped[e]["request_ms"] if cal.request_ms is None else cal.request_ms for e in ENGINES]
    )
    iteration = np.array(
        [
            shipped[e]["iteration_ms"] if cal.iteration_ms is None else cal.iteration_ms
            for e in ENGINES
        ]
    )
    return factors, request * 1e-3, iteration * 1e-3


@dataclass(frozen=True, kw_only=True)
class Fitted:
    """Corrections found by a fit: kernel factors, and fixed costs per engine (ms)."""

    factors: dict[str, float]
    request_ms: dict[str, float]
    iteration_ms: dict[str, float]

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        factors = np.array([*(self.factors.get(k, 1.0) for k in KERNEL_CLASSES), 1.0])
        request = np.array([self.request_ms.get(e, 0.0) for e in ENGINES]) * 1e-3
        iteration = np.array([self.iteration_ms.get(e, 0.0) for e in ENGINES]) * 1e-3
        return factors, request, iteration

    def values(self, rows: Rows) -> np.ndarray:
        return rows.values(*self.arrays())


def tied(tie: str) -> tuple[tuple[str, ...], ...]:
    """The groups of kernel classes that share a factor under ``tie``."""
    if tie not in TIES:
        raise ShardlabError(f"calibrate: tie {tie!r} is not one of {', '.join(TIES)}", field="tie")
    return TIES[tie]


def fit(
    rows: Rows, *, factors: bool = True, tie: str = "classes", per_engine: bool = False
) -> Fitted:
    """The corrections that best explain ``rows`` (see the module docstring):
    ``factors``: kernel factors too (else 1), one per group of classes that ``tie``
    names in :data:`TIES` (a group's factor holds for each of its classes, even one no
    row exercises); ``per_engine``: fixed costs per engine (else one pair for every
    row's engine)."""
    from scipy.optimize import least_squares

    if not len(rows):
        raise ShardlabError("calibrate: no rows to fit")
    groups = tied(tie)
    exercised = {
        k
        for i, k in enumerate(KERNEL_CLASSES)
        if (rows.round_parts[:, i] + rows.prompt_parts[:, i]).any()
    }
    used = [g for g in groups if exercised & set(g)] if factors else []
    engines = sorted({ENGINES[e] for e in rows.engine}) if per_engine else ["all"]
    request_on = bool(rows.request.any())
    iteration_on = bool(rows.iteration.any())
    n_f, n_e = len(used), len(engines)

    def unpack(theta: np.ndarray) -> Fitted:
        factor = {k: math.exp(float(x)) for g, x in zip(used, theta[:n_f], strict=True) for k in g}
        at = n_f
        req = np.zeros(n_e)
        if request_on:
            req, at = theta[at : at + n_e], at + n_e
        it = theta[at : at + n_e] if iteration_on else np.zeros(n_e)
        names = ENGINES if engines == ["all"] else engines
        index = [0] * len(names) if engines == ["all"] else list(range(n_e))
        return Fitted(
            factors=factor,
            request_ms={e: float(req[i]) for e, i in zip(names, index, strict=True)},
            iteration_ms={e: float(it[i]) for e, i in zip(names, index, strict=True)},
        )

    def residuals(theta: np.ndarray) -> np.ndarray:
        errors = np.log(np.maximum(unpack(theta).values(rows), 1e-12) / rows.measured)
        return np.concatenate([errors, math.sqrt(RIDGE) * theta[:n_f]])

    lo, hi = math.log(FACTOR_RANGE[0]), math.log(FACTOR_RANGE[1])
    start = [0.0] * n_f
    low, high = [lo] * n_f, [hi] * n_f
    if request_on:  # starts inside the bounds: a start on a bound stalls the method
        start += [1.0] * n_e
        low, high = low + [0.0] * n_e, high + [REQUEST_MS_MAX] * n_e
    if iteration_on:
        start += [0.1] * n_e
        low, high = low + [0.0] * n_e, high + [ITERATION_MS_MAX] * n_e
    result = least_squares(
        residuals,
        np.array(start),
        bounds=(low, high),
        method="trf",
        loss="soft_l1",
        f_scale=LOSS_SCALE,
    )
    return unpack(result.x)


def held_out(rows: Rows, groups: Sequence[str], fitter: Callable[[Rows], Fitted]) -> np.ndarray:
    """Each row predicted by a fit on the rows of every other group."""
    labels = np.asarray(groups)
    out = np.empty(len(rows))
    for g in dict.fromkeys(labels.tolist()):
        test = np.flatnonzero(labels == g)
        train = np.flatnonzero(labels != g)
        if not len(train):
            raise ShardlabError(f"calibrate: every row is in group {g!r}; nothing to fit on")
        out[test] = fitter(rows.take(train)).values(rows.take(test))
    return out


# -- what a fit is judged by ---------------------------------------------------------------

GROUPINGS: dict[str, Callable[[Measurement], str]] = {
    "row": lambda m: f"{m.id}/{m.metric}",
    "family": lambda m: m.model_family or m.id,
    "gpu": lambda m: m.gpu,
    "engine": lambda m: m.engine or "",
}


def groups_of(rows: Rows, grouping: str) -> list[str]:
    if grouping not in GROUPINGS:
        raise ShardlabError(
            f"hold-out grouping {grouping!r} is not one of {', '.join(GROUPINGS)}",
            field="hold_out",
        )
    return [GROUPINGS[grouping](r.measurement) for r in rows.rows]


def errors(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """How far predictions are from measurements: median |predicted / measured - 1|,
    the median ratio, and the shares off by 1.5x and 2x or more."""
    ratio = np.asarray(predicted, dtype=float) / np.asarray(measured, dtype=float)
    off = np.maximum(ratio, 1 / ratio)
    n = len(ratio)
    return {
        "rows": n,
        "median_abs_error": float(np.median(np.abs(ratio - 1))) if n else math.nan,
        "median_ratio": float(np.median(ratio)) if n else math.nan,
        "within_15pct": int((np.abs(ratio - 1) <= 0.15).sum()),
        "beyond_1_5x": int((off >= 1.5).sum()),
        "beyond_2x": int((off >= 2).sum()),
    }


@dataclass(frozen=True, kw_only=True)
class Report:
    """A fit and how well it explains its rows and the rows it did not see."""

    calibration: Calibration
    fitted: Fitted
    rows: Rows
    before: list[float]  # |predicted / measured - 1| per row: the shipped model
    after: list[float]  # with the corrections fitted on all rows (in-sample)
    held_out: list[float]  # each row by a fit without its group (the first grouping)
    held_out_by: Mapping[str, list[float]]  # per grouping
    tie: str = "classes"  # which kernel classes shared a factor (TIES)

    @property
    def held_out_name(self) -> str:
        first = next(iter(self.held_out_by))
        return "leave-one-out" if first == "row" else f"each {first} held out"

    def by_metric(self, relative: Sequence[float]) -> dict[str, dict[str, float]]:
        """Errors (relative, one per row) summarized per metric."""
        metrics = np.array([lin.measurement.metric for lin in self.rows.rows])
        ratio = 1.0 + np.asarray(relative, dtype=float)
        return {
            metric: errors(ratio[metrics == metric], np.ones(int((metrics == metric).sum())))
            for metric in dict.fromkeys(metrics.tolist())
        }

    def held_out_summary(self, grouping: str) -> dict[str, dict[str, float]]:
        return self.by_metric(self.held_out_by[grouping])

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
    measurements: list[Measurement],
    timing: str,
    engine: str,
    source: str = "measurements",
    *,
    hold_out: Sequence[str] = ("row",),
    factors: bool = True,
    tie: str = "classes",
    per_engine: bool = False,
    linearized: Rows | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Report:
    """Fit on every row, and judge each row by a fit on the groups it is not in (each
    grouping of ``hold_out``; ``row``: leave-one-out); ``tie``: which kernel classes
    share a factor (:data:`TIES`). ``progress(done, total)`` hears
    of each row priced (the slow part: one cost-model run per row), on the rows :func:`fittable`."""
    tied(tie)  # before the slow pricing
    measurements = fittable(measurements)
    if linearized is not None:
        rows = linearized
    else:
        priced: list[Linearized] = []
        for m in measurements:
            priced.append(linearize(m, timing, engine))
            if progress is not None:
                progress(len(priced), len(measurements))
        rows = Rows(priced)
    if len(rows) < 3:
        raise ShardlabError(
            f"calibrate: {len(rows)} row(s) in {source}; give at least 3 to fit and check"
        )

    def fitter(part: Rows) -> Fitted:
        return fit(part, factors=factors, tie=tie, per_engine=per_engine)

    fitted = fitter(rows)
    shipped = rows.predict(Calibration(timing=timing))
    by: dict[str, list[float]] = {}
    for grouping in hold_out:
        predicted = held_out(rows, groups_of(rows, grouping), fitter)
        by[grouping] = list(predicted / rows.measured - 1.0)
    after = fitted.values(rows)
    report = Report(
        calibration=Calibration(timing=timing),
        fitted=fitted,
        rows=rows,
        before=list(shipped / rows.measured - 1.0),
        after=list(after / rows.measured - 1.0),
        held_out=by[hold_out[0]],
        held_out_by=by,
        tie=tie,
    )
    s = report.summary()
    name = {"row": "leave-one-out"}.get(hold_out[0], f"each {hold_out[0]} held out")
    note = (
        f"{source}: {s['rows']} rows, {timing} timing, {engine}"
        + (f", kernel factors tied {tie}" if factors and tie != "classes" else "")
        + "; median |error| "
        f"{s['median_before']:.1%} before, {s['median_after']:.1%} fitted, "
        f"{s['median_cross_validated']:.1%} {name}"
    )
    request = set(fitted.request_ms.values())
    iteration = set(fitted.iteration_ms.values())
    cal = Calibration(
        **fitted.factors,
        request_ms=request.pop() if rows.request.any() and len(request) == 1 else None,
        iteration_ms=iteration.pop() if rows.iteration.any() and len(iteration) == 1 else None,
        timing=timing,
        fitted_on=note,
    )
    return dataclasses.replace(report, calibration=cal)
