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


def min_sum(domains: Sequence[int], factors: Sequence[Factor]) -> np.ndarray:
    """The least total cost for each instance (the trailing axis of every table)."""
    factors = list(factors)
    remaining = set(range(len(domains)))

    def scope(v: int) -> list[int]:
        return sorted({u for vs, _ in factors if v in vs for u in vs} - {v})

    while remaining:
        v = min(remaining, key=lambda v: (math.prod(domains[u] for u in scope(v)), v))
        axes = [*scope(v), v]
        joined = [f for f in factors if v in f[0]]
        factors = [f for f in factors if v not in f[0]]
        total = sum(_expand(vs, table, axes) for vs, table in joined)
        factors.append((tuple(axes[:-1]), np.asarray(total).min(axis=len(axes) - 1)))
        remaining.discard(v)
    return sum(table for _, table in factors)
