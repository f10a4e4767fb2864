"""Moves on the integer encoding shared by the metaheuristics: every move lands on a
valid plan (values drawn from the validity mask of the plan's degree tuple)."""

from __future__ import annotations

import numpy as np

from shardlab.problems.space import SearchSpace


def random_values(
    space: SearchSpace, degree_idx: np.ndarray, var: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """A uniformly random valid value of ``var[i]`` under degree tuple ``degree_idx[i]``."""
    masks = space.mask_table()[degree_idx, var]  # (n, width)
    scores = rng.random(masks.shape) * masks
    return scores.argmax(axis=1)


def _new_degrees(
    space: SearchSpace, codes: np.ndarray, rng: np.random.Generator, rate: float
) -> np.ndarray:
    """Give each row a new random degree tuple with probability ``rate`` (in place),
    repairing the values it invalidates; return which rows changed."""
    changed = rng.random(len(codes)) < rate
    if changed.any():
        codes[changed, 0] = rng.integers(0, space.num_degree_tuples, int(changed.sum()))
        codes[changed] = space.repair(codes[changed])
    return changed


def mutate(
    space: SearchSpace,
    codes: np.ndarray,
    rng: np.random.Generator,
    *,
    rate: float,
    degree_rate: float,
) -> np.ndarray:
    """Change each variable with probability ``rate`` (the degree tuple with
    ``degree_rate``) to a random valid value; a changed degree tuple repairs the rest."""
    out = codes.copy()
    n, v = out.shape
    _new_degrees(space, out, rng, degree_rate)
    flips = rng.random((n, v - 1)) < rate
    rows, cols = np.nonzero(flips)
    if len(rows):
        cols = cols + 1
        out[rows, cols] = random_values(space, out[rows, 0], cols, rng)
    return out


def one_move(
    space: SearchSpace, codes: np.ndarray, rng: np.random.Generator, *, degree_rate: float
) -> np.ndarray:
    """Change exactly one variable per row (the degree tuple with ``degree_rate``)."""
    out = codes.copy()
    v = out.shape[1]
    new_degree = _new_degrees(space, out, rng, degree_rate)
    rows = np.flatnonzero(~new_degree)
    if len(rows):
        cols = rng.integers(1, v, len(rows))
        out[rows, cols] = random_values(space, out[rows, 0], cols, rng)
    return out
