"""The least sum of unary and pairwise costs over joint discrete choices, exactly.

``min over x of  sum_v unary[v][x_v] + sum_(u, v) pairwise[u, v][x_u, x_v]``, solved by
variable elimination (each step removes the variable whose elimination makes the
smallest new table) rather than by enumerating the product of the domains: the
operators of a layer have 2-8 options each, and the product reaches 10^4-10^5 joint
choices per layer kind, while their graph (a residual hub, a chain through attention,
a triangle at the MoE router) keeps every table at three variables or fewer. Every
table carries a trailing axis of independent instances (CP-SAT's bounds: one per
batch size), minimized column by column. With integer-valued costs the result equals
enumeration exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Factor = tuple[tuple[int, ...], np.ndarray]  # (variables, table over them + instances)


def _expand(variables: tuple[int, ...], table: np.ndarray, axes: list[int]) -> np.ndarray:
    """``table`` with one axis per entry of ``axes`` (size 1 where it does not depend)."""
    order = sorted(range(len(variables)), key=lambda i: axes.index(variables[i]))
    table = np.transpose(table, [*order, len(variables)])
    held = {variables[i]: table.shape[j] for j, i in enumerate(order)}
    return table.reshape([held.get(a, 1) for a in axes] + [table.shape[-1]])


def _eliminate(
    domains: Sequence[int], factors: Sequence[Factor], *, choices: bool = True
) -> tuple[np.ndarray, list[tuple[int, list[int], np.ndarray]]]:
    """The least total per instance, and (``choices``) each eliminated variable's best
    value as a table over the variables it was eliminated against, in elimination
    order."""
    factors = list(factors)
    remaining = set(range(len(domains)))
    steps: list[tuple[int, list[int], np.ndarray]] = []

    def scope(v: int) -> list[int]:
        return sorted({u for vs, _ in factors if v in vs for u in vs} - {v})

    while remaining:
        v = min(remaining, key=lambda v: (math.prod(domains[u] for u in scope(v)), v))
        axes = [*scope(v), v]
        joined = [f for f in factors if v in f[0]]
        factors = [f for f in factors if v not in f[0]]
        total = np.asarray(sum(_expand(vs, table, axes) for vs, table in joined))
        if choices:
            steps.append((v, axes[:-1], total.argmin(axis=len(axes) - 1)))
        factors.append((tuple(axes[:-1]), total.min(axis=len(axes) - 1)))
        remaining.discard(v)
    return sum(table for _, table in factors), steps


def min_sum(domains: Sequence[int], factors: Sequence[Factor]) -> np.ndarray:
    """The least total cost for each instance (the trailing axis of every table)."""
    return _eliminate(domains, factors, choices=False)[0]


def argmin_sum(domains: Sequence[int], factors: Sequence[Factor]) -> tuple[int, list[int]]:
    """The least total cost of one instance (tables without the trailing axis) and a
    choice of every variable reaching it (back-substitution in reverse order)."""
    total, steps = _eliminate(domains, [(vs, np.asarray(t)[..., None]) for vs, t in factors])
    choice: dict[int, int] = {}
    for v, scope, best in reversed(steps):
        choice[v] = int(best[(*(choice[u] for u in scope), 0)])
    return int(np.asarray(total).reshape(-1)[0]), [choice[v] for v in range(len(domains))]
