"""An instance's ceiling is bounded in the sizing's own process (the kernel curves it
builds serve the next instance of the GPU), keeps only the last instance's degree
tables, and equals the bound of forked workers."""

from __future__ import annotations

import pytest

from shardlab.costmodel import forget_tables
from shardlab.costmodel.tables import degree_tables
from shardlab.problems.cluster import builtin_accelerators
from shardlab.sizing.capacity import Capacities
from shardlab.solvers.cpsat import bounds
from tests.sizing.conftest import small_problem

H100 = builtin_accelerators()["h100"]


def _no_fork(*args: object, **kwargs: object) -> None:
    raise AssertionError("a sizing's ceiling was bounded in forked processes")


@pytest.mark.parametrize("role", ["agg", "prefill", "decode"])
def test_a_ceiling_is_bounded_here_and_keeps_the_last_tables(
    role: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bounds, "PARALLEL_FROM", 1)  # any instance would fork
    monkeypatch.setattr(bounds, "_bound_in_processes", _no_fork)
    caps = Capacities(small_problem(), {"h100": H100})
    forget_tables()
    for n in (2, 4):
        assert caps.ceiling(role, "h100", n) > 0
    last = caps._build(role, H100, 4)  # type: ignore[arg-type]
    assert degree_tables.cache_info().currsize <= len(last.space.degree_tuples)


@pytest.mark.parametrize("role", ["agg", "prefill", "decode"])
def test_bounding_here_equals_the_forked_bound(role: str, monkeypatch: pytest.MonkeyPatch) -> None:
    problem = Capacities(small_problem(), {"h100": H100})._build(role, H100, 4)
    bounds._BOUNDED.clear()
    here = bounds.largest_bound(problem)
    bounds._BOUNDED.clear()
    monkeypatch.setattr(bounds, "PARALLEL_FROM", 1)
    assert bounds.largest_bound(problem, workers=2) == here > 0
