"""``shardlab size`` holds its optimality claim against enumeration on small cases:
every deployment of the space (any agg mix, every disaggregated pair of pools and
decode layout) priced from the same instance capacities, the cheapest compared."""

from __future__ import annotations

import math

import pytest

from shardlab.errors import ShardlabError
from shardlab.problems.cluster import builtin_accelerators
from shardlab.sizing.capacity import Capacities
from shardlab.sizing.cover import Kind, brute_force
from shardlab.sizing.size import Sizer
from tests.sizing.conftest import small_problem

ACC = builtin_accelerators()


def _sizer(serving: str, prices: dict[str, float] | None, max_gpus: int = 4) -> Sizer:
    problem = small_problem()
    sizer = Sizer(
        problem,
        {g: ACC[g] for g in ("h100", "h200")},
        prices=prices,
        serving=serving,
        max_gpus=max_gpus,
    )
    # one set of instance capacities for every test here (they do not depend on the
    # serving mode, the prices or the rate)
    sizer.caps = _SHARED.setdefault(max_gpus, sizer.caps)
    return sizer


_SHARED: dict[int, Capacities] = {}


def _enumerate(sizer: Sizer, rate: float, gpus: list[str]) -> float:
    """The least cost of any deployment of ``gpus`` serving ``rate``, by enumeration."""
    caps, best = sizer.caps, math.inf
    price = sizer.prices or dict.fromkeys(sizer.accelerators, 1.0)
    shapes = [(g, n) for g in gpus for n in sizer.shapes(g)]
    if sizer.serving in ("agg", "best"):
        agg = [caps.agg(g, n) for g, n in shapes]
        kinds = [Kind(cost=c.gpus * price[c.gpu], gpus=c.gpus, capacity=c.rate) for c in agg]
        found = brute_force([k for k in kinds if k.capacity > 0], rate, sizer.max_gpus)
        best = min(best, found.cost if found else math.inf)
    if sizer.serving in ("disagg", "best"):
        for dg, dn in shapes:
            for layout in caps.decode_layouts(dg, dn):
                dec = caps.decode(dg, dn, layout)
                if dec.rate <= 0:
                    continue
                for pg, pn in shapes:
                    if ACC[pg].vendor != ACC[dg].vendor:
                        continue
                    pre = caps.prefill(pg, pn, (dg, layout))
                    if pre.rate <= 0:
                        continue
                    x, y = math.ceil(rate / pre.rate), math.ceil(rate / dec.rate)
                    if x * pn + y * dn <= sizer.max_gpus:
                        best = min(best, x * pn * price[pg] + y * dn * price[dg])
    return best


def _cost(d: object) -> float:
    return math.inf if d is None else d.cost  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.parametrize("serving", ["agg", "disagg", "best"])
@pytest.mark.parametrize("prices", [None, {"h100": 2.0, "h200": 3.5}])
def test_size_equals_enumeration(serving: str, prices: dict[str, float] | None) -> None:
    sizer = _sizer(serving, prices)
    for s in sizer.curve([2.0, 9.0, 25.0, 60.0, 400.0]):
        assert not s.partial and not s.unproven  # no limit: every capacity proven
        assert _cost(s.best) == pytest.approx(_enumerate(sizer, s.rate, ["h100", "h200"]))
        for g, d in s.by_gpu.items():
            assert _cost(d) == pytest.approx(_enumerate(sizer, s.rate, [g])), (s.rate, g)
        if s.best is not None:
            assert s.best.capacity >= s.rate * (1 - 1e-9)
            assert s.best.gpus <= sizer.max_gpus


def test_bounds_the_search_prunes_with_hold() -> None:
    """The disaggregated bound: a decode instance pinned to a layout serves at most its
    unpinned optimum, a prefill instance with a handoff at most one without."""
    sizer = _sizer("disagg", None)
    caps = sizer.caps
    for g in ("h100", "h200"):
        for n in sizer.shapes(g):
            free_dec = caps.decode(g, n)
            free_pre = caps.prefill(g, n, None)
            for layout in caps.decode_layouts(g, n):
                assert caps.decode(g, n, layout).bound <= free_dec.bound * (1 + 1e-9)
                for dg in ("h100", "h200"):
                    pre = caps.prefill(g, n, (dg, layout))
                    assert pre.bound <= free_pre.bound * (1 + 1e-9)
                    assert pre.rate <= pre.bound * (1 + 1e-9)


@pytest.mark.slow
def test_a_rate_no_deployment_serves_refuses_every_higher_rate_unsolved() -> None:
    sizer = _sizer("best", None)
    low, high = sizer.curve([400.0, 800.0])
    assert low.best is None and not low.carried
    assert high.best is None and high.carried  # not sized: a lower rate was unserved
    assert all(d is None for d in high.by_gpu.values())
    with pytest.raises(ShardlabError, match="rate 400 requests/s"):
        raise sizer.why_unserved(400.0)


def test_a_prefill_pool_hands_its_cache_only_to_its_own_vendors_gpus() -> None:
    """Mixed aggregated instances of NVIDIA and AMD GPUs sit behind one router; a prefill
    pool of one vendor's GPUs never hands its KV cache to a decode pool of the other's."""
    sizer = Sizer(small_problem(), {g: ACC[g] for g in ("h100", "mi300x")}, serving="disagg")
    assert sizer.disagg(1.0, ["h100"], ["mi300x"]) is None
    assert sizer.disagg(1.0, ["mi300x"], ["h100"]) is None
    same = sizer.disagg(1.0, ["h100", "mi300x"], ["h100", "mi300x"])
    assert same is not None
    assert len({ACC[p.gpu].vendor for p in same.pools}) == 1
