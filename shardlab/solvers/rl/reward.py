"""The reward of a plan: log of its objective relative to the Megatron plan's.

Feasible: ``max(log(objective / reference), -feasible_floor)`` (for latency objectives,
whose objective is ``-latency``, ``log(reference_latency / latency)``), so a plan as
good as Megatron's scores 0 and twice as fast scores ``log 2``. Infeasible:
``-infeasible_base - infeasible_scale * log1p(excess)`` where ``excess`` is the
evaluator's summed relative miss (memory over HBM, TTFT and TPOT over their SLOs),
recovered from the fitness ``-1e18 * (1 + excess)``. The reference is the objective of
the plan the ``megatron`` solver picks; when that plan is infeasible, the best feasible
objective seen so far (rewards then move as the search improves). numpy only.
"""

from __future__ import annotations

import numpy as np

from shardlab.costmodel import evaluate_batch
from shardlab.problems.problem import Problem
from shardlab.solvers.evaluator import INFEASIBLE, fitness
from shardlab.solvers.megatron import megatron_candidates
from shardlab.solvers.rl.config import RLConfig


def excess_of(fit: np.ndarray) -> np.ndarray:
    """Relative miss of infeasible rows (0 for feasible ones), read off their fitness."""
    fit = np.asarray(fit, dtype=np.float64)
    return np.where(fit <= INFEASIBLE, fit / INFEASIBLE - 1.0, 0.0)


def rewards(fit: np.ndarray, reference: float | None, config: RLConfig) -> np.ndarray:
    """Reward of each fitness value (see the module docstring)."""
    fit = np.asarray(fit, dtype=np.float64)
    feasible = fit > INFEASIBLE
    penalty = -config.infeasible_base - config.infeasible_scale * np.log1p(excess_of(fit))
    if reference is None or reference == 0:
        ratio = np.ones_like(fit)
    elif reference > 0:
        ratio = np.where(feasible, fit, 1.0) / reference
    else:  # -latency: shorter latency is better
        ratio = reference / np.where(feasible, fit, reference)
    good = np.maximum(np.log(np.maximum(ratio, 1e-30)), -config.feasible_floor)
    return np.where(feasible, good, penalty)


def rank_rewards(fit: np.ndarray, elite_fit: np.ndarray, config: RLConfig) -> np.ndarray:
    """Reward by rank: the share of the elite history's plans a feasible plan beats (a
    tie counts half), so 1 is a new best and 0 is below every elite plan; infeasible
    plans keep :func:`rewards`' penalty, below every feasible one."""
    fit = np.asarray(fit, dtype=np.float64)
    elite_fit = np.asarray(elite_fit, dtype=np.float64)
    if len(elite_fit):
        beats = (fit[:, None] > elite_fit[None, :]).mean(axis=1)
        ties = (fit[:, None] == elite_fit[None, :]).mean(axis=1)
        share = beats + 0.5 * ties
    else:
        share = np.ones_like(fit)
    feasible = fit > INFEASIBLE
    return np.where(feasible, share, rewards(fit, None, config))


def megatron_codes(problem: Problem) -> np.ndarray:
    """Encodings of the Megatron plans, in the order the ``megatron`` rule tries them."""
    space = problem.space
    rows = [space.encode(space.megatron_plan(d)) for d in megatron_candidates(problem)]
    return np.array(rows, dtype=np.int64).reshape(-1, space.n_vars)


def megatron_reference(problem: Problem) -> float | None:
    """Objective of the plan the ``megatron`` solver picks, or None when it is infeasible
    (priced directly, not through an evaluator: for the environment)."""
    codes = megatron_codes(problem)
    if not len(codes):
        return None
    m = evaluate_batch(problem, codes)
    for i in range(len(codes)):
        if not m.memory_violation[i]:
            return float(m.objective[i]) if m.feasible[i] else None
    return None


def fitness_of(problem: Problem, codes: np.ndarray) -> np.ndarray:
    """Fitness of encodings, exactly as the evaluator computes it."""
    return fitness(problem, evaluate_batch(problem, np.atleast_2d(codes)))
