"""``shardlab size`` under a time limit: the cheapest deployment found before it runs
out, marked partial with the capacities left unproven, and nothing carried upward from
a rate it did not finish."""

from __future__ import annotations

import math

import pytest

from shardlab.errors import ShardlabError
from shardlab.problems.cluster import builtin_accelerators
from shardlab.problems.problem import Problem
from shardlab.sizing.answer import sizing_json
from shardlab.sizing.size import Sizer, SizingProgress

ACC = builtin_accelerators()


def _sizer(problem: Problem, **given: object) -> Sizer:
    return Sizer(problem, {g: ACC[g] for g in ("h100", "h200")}, max_gpus=4, **given)  # type: ignore[arg-type]


def test_a_limit_that_runs_out_keeps_the_cheapest_found_and_names_what_is_left(
    problem: Problem,
) -> None:
    seen: list[SizingProgress] = []
    sizer: Sizer

    def progress(p: SizingProgress) -> None:
        seen.append(p)
        if p.last is not None:
            sizer.caps.deadline = 0.0  # the limit runs out after the first solve

    sizer = _sizer(problem, time_limit=3600.0, progress=progress)
    (s,) = sizer.curve([3.0])
    first = next(p.last for p in seen if p.last is not None)
    assert first is not None and first.proven and (first.gpu, first.gpus) == ("h100", 1)
    assert sizer.caps.solves == 1  # nothing solved after the limit
    assert s.partial
    assert s.unproven and all(c.status == "unsolved" for c in s.unproven)
    assert "h200 agg instances of 1" in s.left()
    proven = _sizer(problem).size(3.0)
    assert not proven.partial and proven.best is not None
    if s.best is not None:  # what it found serves the rate: never cheaper than the proof
        assert s.best.capacity >= 3.0 * (1 - 1e-9)
        assert s.best.cost >= proven.best.cost * (1 - 1e-12)
    assert [p.solves for p in seen] == sorted(p.solves for p in seen)
    data = sizing_json(sizer, [s])
    assert data["status"] == "partial" and data["rates"][0]["status"] == "partial"
    assert {"gpu": "h200", "gpus": 1, "role": "agg", "status": "unsolved"} in data["rates"][0][
        "unproven"
    ]
    assert sizing_json(sizer, [proven])["rates"][0]["status"] == "proven"


def test_a_rate_left_unfinished_carries_nothing_upward(problem: Problem) -> None:
    sizer = _sizer(problem, time_limit=1e-6)  # runs out before the first solve
    low, high = sizer.curve([2.0, 9.0])
    assert sizer.caps.solves == 0
    for s in (low, high):
        assert s.best is None and s.partial and not s.carried
        assert all(c.status == "unsolved" for c in s.unproven)
    assert "h100 agg instances of 1" in low.left()


@pytest.mark.parametrize("seconds", [0.0, -1.0, math.nan, math.inf])
def test_a_time_limit_must_be_a_positive_number(problem: Problem, seconds: float) -> None:
    with pytest.raises(ShardlabError, match="positive number of seconds") as caught:
        _sizer(problem, time_limit=seconds)
    assert caught.value.field == "time_limit"
