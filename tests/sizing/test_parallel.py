"""``shardlab size --jobs N``: the GPU types' searches and the instance bounds side by
side give the answer, and every capacity, that one process gives."""

from __future__ import annotations

import sys

import pytest

from shardlab.errors import ShardlabError
from shardlab.problems.cluster import builtin_accelerators
from shardlab.sizing.size import Sizer
from tests.compare.test_resume import _FakeRay
from tests.sizing.conftest import small_problem

ACC = builtin_accelerators()


def _sizer(jobs: int, **given: object) -> Sizer:
    accs = {g: ACC[g] for g in ("h100", "h200")}
    return Sizer(small_problem(), accs, max_gpus=4, jobs=jobs, **given)  # type: ignore[arg-type]


def _answers(sizer: Sizer, rates: list[float]) -> list[tuple]:
    return [
        (
            s.rate,
            s.partial,
            *(
                None if d is None else (d.label(), d.cost, d.gpus, d.capacity)
                for d in (s.best, *s.by_gpu.values())
            ),
        )
        for s in sizer.curve(rates)
    ]


@pytest.mark.parametrize("prices", [None, {"h100": 2.0, "h200": 3.5}])
def test_two_jobs_give_the_answer_of_one(prices: dict[str, float] | None) -> None:
    rates = [2.0, 25.0, 33.0, 60.0, 90.0]  # agg, a priced mix, disagg, refused
    one, two = _sizer(1, prices=prices), _sizer(2, prices=prices)
    assert _answers(two, rates) == _answers(one, rates)
    assert two.caps.solves == one.caps.solves  # nothing solved that one job would not
    mine = {k: v for k, v in two.caps.items()}
    for key, value in one.caps.items():
        other = mine[key]
        if isinstance(value, float):
            assert other == value, key
        else:
            assert (other.rate, other.bound, other.status) == (
                value.rate,
                value.bound,
                value.status,
            ), key


def test_a_refusal_with_two_jobs_solves_nothing() -> None:
    sizer = _sizer(2)
    (s,) = sizer.curve([150.0])
    assert s.best is None and "CP-SAT's bounds" in s.proof[0]
    assert sizer.caps.solves == 0


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"jobs": 0}, "jobs"),
        ({"jobs": 1, "executor": "spark"}, "executor"),
        ({"jobs": 2, "address": "10.0.0.1:6379"}, "address"),
    ],
)
def test_where_searches_run_is_checked(given: dict[str, object], field: str) -> None:
    with pytest.raises(ShardlabError) as caught:
        Sizer(small_problem(), {"h100": ACC["h100"]}, **given)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_on_ray_the_searches_are_its_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's API run in this process (the fake of the compare tests): the GPU types'
    searches go to the cluster given, and the answer is one process's."""
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    rates = [25.0, 60.0]
    ray = _sizer(2, executor="ray", address="head:6379")
    assert _answers(ray, rates) == _answers(_sizer(1), rates)
    assert fake.inits and set(fake.inits) == {"head:6379"}
    assert sum("kept" in r for r in fake.results) == 2 * len(rates)  # h100's and h200's
