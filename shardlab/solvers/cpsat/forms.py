"""The regime's forms inside one (degrees, requests) subproblem: exact coefficients for
its CP-SAT model, float ones for the bounds, and the objective a time gives."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
from ortools.sat.python.cp_model import LinearExprT

from shardlab.costmodel import (
    ARRAYS_NS,
    EXACT,
    Exact,
    Form,
    Forms,
    Number,
    Vector,
    basic_times,
    clients_per_rank,
    degree_tables,
    forms,
    handoff_ns,
    in_flight_requests,
    tokens,
)
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem


def subproblem_forms(
    problem: Problem, d: Degrees, requests_per_rank: int, *, floor: bool = False
) -> Forms[Exact]:
    """The regime of subproblem ``(d, requests_per_rank)`` with exact coefficients, times in ns
    (:func:`shardlab.costmodel.regimes.forms`). ``floor``: the least coefficients of
    every subproblem with ``requests_per_rank`` requests or more (the wait for a slot, which
    shrinks as more run, left out; every other coefficient grows with them)."""
    t = degree_tables(problem, d)
    kinds = [s.kind for s in t.steps]
    clients = requests_per_rank if floor else int(clients_per_rank(problem, d, requests_per_rank))
    return forms(
        problem,
        kinds,
        requests_per_rank,
        clients,
        t.engine.max_tokens,
        handoff_ns(problem, d.pp, d.tp),
        arith=EXACT,
    )


def bound_forms(problem: Problem, d: Degrees, requests_per_rank: np.ndarray) -> Forms[Vector]:
    """The regime's forms for several requests per rank at once (float coefficients,
    times in ns): for bounds."""
    t = degree_tables(problem, d)
    kinds = [s.kind for s in t.steps]
    return forms(
        problem,
        kinds,
        requests_per_rank,
        clients_per_rank(problem, d, requests_per_rank),
        np.full(len(requests_per_rank), t.engine.max_tokens),
        float(handoff_ns(problem, d.pp, d.tp)),
        arith=ARRAYS_NS,
    )


def scaled(form: Form[Exact], rnd: LinearExprT, prompt: LinearExprT) -> tuple[LinearExprT, int]:
    """``form`` at CP-SAT expressions as an integer expression, and the factor it is
    scaled by (the least common denominator of its coefficients)."""
    coefficients = [Fraction(form.round), Fraction(form.prompt), Fraction(form.const)]
    scale = math.lcm(*(c.denominator for c in coefficients))
    a, b, c = (int(x * scale) for x in coefficients)
    return a * rnd + b * prompt + c, scale


def integer_weight(form: Form[Exact]) -> int:
    """The sum of ``form``'s coefficients once scaled to integers as :func:`scaled`
    scales them: what a unit of time weighs in CP-SAT's expression of the form."""
    coefficients = [Fraction(form.round), Fraction(form.prompt), Fraction(form.const)]
    scale = math.lcm(*(c.denominator for c in coefficients))
    return sum(abs(int(c * scale)) for c in coefficients)


def step_weights(
    f: Forms[Number], form: Form[Number], n_steps: int
) -> tuple[list[Number | float], Number]:
    """``form`` as a weighted sum of step times plus a constant (exact with one stage,
    where the round and the prompt are their steps' times)."""
    weights: list[Number | float] = [0.0] * n_steps
    const = form.const
    if f.round_step is not None:
        weights[f.round_step] = weights[f.round_step] + form.round
        const = const + form.round * f.iteration
    if f.prompt_step is not None:
        weights[f.prompt_step] = weights[f.prompt_step] + form.prompt
    return weights, const


def chain_weights(problem: Problem, d: Degrees, requests_per_rank: int) -> tuple[np.ndarray, float]:
    """The objective's time in subproblem ``(d, requests_per_rank)`` as step weights and a
    constant (exact with one stage): what the layers' shortest path minimizes."""
    f = subproblem_forms(problem, d, requests_per_rank)
    n_steps = len(degree_tables(problem, d).steps)
    listed, const = step_weights(f, f.time(problem.workload.objective), n_steps)
    return np.array([float(x) for x in listed]), float(const)


def time_function(
    problem: Problem, d: Degrees, requests_per_rank: int
) -> Callable[[list[np.ndarray], list[np.ndarray]], np.ndarray]:
    """The objective's time in subproblem ``(d, requests_per_rank)`` from per-step stage sums and
    maxima (numpy, ns): what a pipeline's shortest path minimizes."""
    f = subproblem_forms(problem, d, requests_per_rank)
    objective = f.time(problem.workload.objective)
    m = min(d.pp, requests_per_rank)
    a, b, c = float(objective.round), float(objective.prompt), float(objective.const)

    def time_of(sums: list[np.ndarray], maxes: list[np.ndarray]) -> np.ndarray:
        rnd, prompt = basic_times(f, m, sums, maxes, np.maximum)
        return a * rnd + b * prompt + c

    return time_of


def objectives(
    problem: Problem, d: Degrees, requests_per_rank: np.ndarray, time_ns: np.ndarray
) -> np.ndarray:
    """The workload's objective (higher is better) for subproblem times in ns."""
    time_ns = np.asarray(time_ns, dtype=float)
    w = problem.workload
    if w.objective == "latency":
        out = -time_ns / 1e6
    elif w.objective == "request_rate":
        per_replica = degree_tables(problem, d).request_range.per_replica
        running = in_flight_requests(problem, d, per_replica, np.asarray(requests_per_rank))
        if w.schedule != "inflight":
            running = np.full_like(running, float(w.batch))
        with np.errstate(divide="ignore"):
            out = running / (time_ns / 1e9)
    else:
        per_replica = degree_tables(problem, d).request_range.per_replica
        served = tokens(problem, d, per_replica, np.asarray(requests_per_rank))
        with np.errstate(divide="ignore"):
            out = served / (time_ns / 1e9)
        if problem.workload.per_gpu:
            out = out / problem.cluster.num_gpus
    return np.where(time_ns <= 0, math.inf, out)


def objective_of(problem: Problem, d: Degrees, requests_per_rank: int, time_ns: float) -> float:
    return float(objectives(problem, d, np.array([requests_per_rank]), np.array([time_ns]))[0])


def time_for(problem: Problem, d: Degrees, requests_per_rank: int, objective: float) -> float:
    """The time in ns at which subproblem ``(d, requests_per_rank)``'s objective equals
    ``objective`` (every objective falls as the time grows: :func:`objectives`);
    inf when no time reaches it."""
    if problem.workload.objective == "latency":
        return -objective * 1e6 if objective < 0 else 0.0
    if objective <= 0:
        return math.inf
    return objective_of(problem, d, requests_per_rank, 1e9) * 1e9 / objective
