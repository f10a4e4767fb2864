"""Min-sum elimination equals enumeration: the least sum and a choice reaching it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab.solvers.cpsat.minsum import Factor, argmin_sum, min_sum


def brute_force(domains: list[int], factors: list[Factor]) -> np.ndarray:
    """The least total per instance by enumerating every joint choice."""
    best = None
    for x in itertools.product(*(range(n) for n in domains)):
        total = sum(table[tuple(x[v] for v in vs)] for vs, table in factors)
        best = total if best is None else np.minimum(best, total)
    return np.asarray(best)


def total_of(choice: list[int], factors: list[Factor]) -> int:
    return int(sum(table[tuple(choice[v] for v in vs)] for vs, table in factors))


@st.composite
def problems(draw: st.DrawFn, instances: int) -> tuple[list[int], list[Factor]]:
    """A graph of up to five variables: every variable a unary table, some pairs and
    sometimes a triple (the MoE router's triangle); integer costs."""
    n = draw(st.integers(1, 5))
    domains = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    scopes: list[tuple[int, ...]] = [(v,) for v in range(n)]
    pairs = list(itertools.combinations(range(n), 2))
    if pairs:
        scopes += draw(st.lists(st.sampled_from(pairs), max_size=4, unique=True))
    if n >= 3 and draw(st.booleans()):
        scopes.append(tuple(draw(st.permutations(range(n)))[:3]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    factors: list[Factor] = []
    for vs in scopes:
        shape = (*(domains[v] for v in vs), instances)
        factors.append((vs, rng.integers(0, 1000, size=shape)))
    return domains, factors


@settings(max_examples=150, deadline=None)
@given(problems(instances=3))
def test_min_sum_is_the_least_total_of_every_instance(case) -> None:
    domains, factors = case
    assert np.array_equal(min_sum(domains, factors), brute_force(domains, factors))


@settings(max_examples=150, deadline=None)
@given(problems(instances=1))
def test_argmin_sum_reaches_the_least_total(case) -> None:
    domains, factors = case
    one = [(vs, table[..., 0]) for vs, table in factors]
    least, choice = argmin_sum(domains, one)
    assert least == int(brute_force(domains, factors)[0])
    assert len(choice) == len(domains)
    assert all(0 <= c < n for c, n in zip(choice, domains, strict=True))
    assert total_of(choice, one) == least


def test_a_pairwise_cost_overrides_the_unary_best() -> None:
    """The unary tables prefer (0, 0); the pair makes that joint choice dear: the
    answer must weigh the pair, which choosing each variable alone would not."""
    unary0 = np.array([0, 5])
    unary1 = np.array([0, 5])
    pair = np.array([[100, 1], [1, 100]])
    least, choice = argmin_sum([2, 2], [((0,), unary0), ((1,), unary1), ((0, 1), pair)])
    assert least == 6 and choice in ([0, 1], [1, 0])


def test_pair_scopes_in_either_order_mean_the_same() -> None:
    """A table over (1, 0) is indexed by variable 1 first."""
    pair = np.array([[0, 9, 9], [9, 9, 0]])  # (x1 in 2, x0 in 3): (0, 0) or (1, 2) cost 0
    unary0 = np.array([5, 5, 0])
    least, choice = argmin_sum([3, 2], [((0,), unary0), ((1, 0), pair)])
    assert (least, choice) == (0, [2, 1])


@pytest.mark.parametrize("instances", [1, 4])
def test_instances_are_minimized_column_by_column(instances: int) -> None:
    rng = np.random.default_rng(0)
    factors: list[Factor] = [
        ((0,), rng.integers(0, 50, (3, instances))),
        ((0, 1), rng.integers(0, 50, (3, 2, instances))),
    ]
    got = min_sum([3, 2], factors)
    assert got.shape == (instances,)
    for i in range(instances):
        column = [(vs, t[..., i : i + 1]) for vs, t in factors]
        assert got[i] == brute_force([3, 2], column)[0]
