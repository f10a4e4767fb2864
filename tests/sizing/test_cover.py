"""The covering knapsack is exact: it equals enumeration of every count vector."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab.sizing.cover import Kind, brute_force, cover

KINDS = st.lists(
    st.builds(
        Kind,
        cost=st.sampled_from([1.0, 2.0, 2.99, 3.79, 4.0, 8.0, 11.96, 30.32]),
        gpus=st.sampled_from([1, 2, 4, 8]),
        capacity=st.floats(0.1, 40.0, allow_nan=False),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(KINDS, st.floats(0.05, 120.0, allow_nan=False), st.sampled_from([1, 4, 8, 16, 24]))
def test_cover_equals_enumeration(kinds: list[Kind], rate: float, max_gpus: int) -> None:
    exact, truth = cover(kinds, rate, max_gpus), brute_force(kinds, rate, max_gpus)
    assert (exact is None) == (truth is None)
    if exact is not None and truth is not None:
        assert exact.cost == pytest.approx(truth.cost, rel=1e-12)
        assert exact.gpus == truth.gpus
        assert exact.capacity >= rate * (1 - 1e-9)
        used = sum(n * k.gpus for n, k in zip(exact.counts, kinds, strict=True))
        assert used == exact.gpus <= max_gpus


def test_a_mix_of_types_beats_either_alone() -> None:
    # Mélange's point: a cheap slow kind topped up by a dear fast one
    slow, fast = Kind(cost=1.0, gpus=1, capacity=10.0), Kind(cost=3.0, gpus=1, capacity=40.0)
    mix = cover([slow, fast], 45.0, 16)
    assert mix is not None and mix.counts == (1, 1) and mix.cost == 4.0


def test_nothing_covers_past_the_gpu_budget() -> None:
    assert cover([Kind(cost=1.0, gpus=4, capacity=1.0)], 3.0, 8) is None
