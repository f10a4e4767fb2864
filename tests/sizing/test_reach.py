"""The bounds ``shardlab size`` refuses and prunes with: each instance shape's ceiling
(its largest CP-SAT subproblem bound) is at least what the shape serves, in every role,
decode layout and handoff; the most a deployment reaches at those ceilings is exact
(held to enumeration); a rate past it is refused with no solve; and pruning by them
changes no answer."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from shardlab.errors import ShardlabError
from shardlab.problems.cluster import builtin_accelerators
from shardlab.problems.problem import Problem
from shardlab.sizing.capacity import Capacities
from shardlab.sizing.reach import most_mix, most_pair
from shardlab.sizing.size import Sizer
from tests.sizing.conftest import small_problem

ACC = builtin_accelerators()


def _brute_mix(kinds: list[tuple[int, float]], max_gpus: int) -> float:
    ranges = [range(max_gpus // g + 1) for g, _ in kinds]
    return max(
        sum(n * c for n, (_, c) in zip(counts, kinds, strict=True))
        for counts in itertools.product(*ranges)
        if sum(n * g for n, (g, _) in zip(counts, kinds, strict=True)) <= max_gpus
    )


@pytest.mark.parametrize("seed", range(20))
def test_the_most_a_mix_reaches_equals_enumeration(seed: int) -> None:
    rng = np.random.default_rng(seed)
    max_gpus = int(rng.integers(1, 24))
    kinds = [(int(rng.choice([1, 2, 4, 8])), float(rng.uniform(0.5, 20))) for _ in range(3)]
    best = np.zeros(max_gpus + 1)
    for g, c in kinds:
        best = most_mix(best, g, c)
    assert best.max() == pytest.approx(_brute_mix(kinds, max_gpus))


@pytest.mark.parametrize("seed", range(40))
def test_the_most_a_pair_of_pools_reaches_equals_enumeration(seed: int) -> None:
    rng = np.random.default_rng(seed)
    max_gpus = int(rng.integers(1, 64))
    pre = (int(rng.choice([1, 2, 4, 8])), float(rng.uniform(0.5, 30)))
    dec = (int(rng.choice([1, 2, 4, 8])), float(rng.uniform(0.5, 30)))
    brute = max(
        (
            min(x * pre[1], y * dec[1])
            for x in range(1, max_gpus + 1)
            for y in range(1, max_gpus + 1)
            if x * pre[0] + y * dec[0] <= max_gpus
        ),
        default=0.0,
    )
    assert most_pair(pre, dec, max_gpus) == pytest.approx(brute)


def _large(model: str) -> Problem:
    return Problem.build(
        model,
        "b200x8",
        "chat",
        engine="trtllm",
        space_kind="engine",
        input_len=1024,
        output_len=256,
        ttft_ms=2000,
        tpot_ms=50,
        rate=1.0,
    )


@pytest.mark.parametrize(
    ("problem", "shapes"),
    [
        pytest.param(small_problem, [("h100", 1), ("h100", 2), ("h200", 4)], id="llama-3.1-8b"),
        pytest.param(lambda: _large("llama-3.1-70b"), [("b200", 1), ("b200", 2)], id="llama70b"),
        pytest.param(lambda: _large("mixtral-8x7b"), [("b200", 1), ("b200", 2)], id="mixtral"),
    ],
)
def test_an_instance_ceiling_bounds_what_it_serves_in_every_role(problem, shapes) -> None:
    """Aggregated, decode (unpinned and in each layout) and prefill (without and with
    each handoff): the ceiling is at least the proven capacity and CP-SAT's optimum."""
    gpus = {g for g, _ in shapes}
    caps = Capacities(problem(), {g: ACC[g] for g in gpus})
    checked = 0
    for g, n in shapes:
        assert caps.ceiling("agg", g, n) >= caps.agg(g, n).bound > 0
        dec_ceiling = caps.ceiling("decode", g, n)
        pre_ceiling = caps.ceiling("prefill", g, n)
        found = [caps.decode(g, n), caps.prefill(g, n, None)]
        for layout in caps.decode_layouts(g, n):
            found.append(caps.decode(g, n, layout))
            found += [caps.prefill(g, n, (other, layout)) for other in gpus]
        for c in found:
            ceiling = dec_ceiling if c.role == "decode" else pre_ceiling
            assert ceiling >= c.bound >= c.rate, (c.label(), c.role, ceiling, c.bound)
            checked += c.rate > 0
    assert checked >= len(shapes) * 2  # pools that serve something were compared


def _sizer(
    bounds: bool = True, prices: dict[str, float] | None = None, serving: str = "best"
) -> Sizer:
    accs = {g: ACC[g] for g in ("h100", "h200")}
    return Sizer(small_problem(), accs, max_gpus=4, bounds=bounds, prices=prices, serving=serving)


def test_a_rate_past_every_bound_is_refused_without_a_solve() -> None:
    sizer = _sizer()
    low, high = sizer.curve([150.0, 200.0])  # below the compute ceiling (242/s)
    assert low.best is None and not low.partial and all(d is None for d in low.by_gpu.values())
    assert "CP-SAT's bounds" in low.proof[0]
    assert high.carried
    with pytest.raises(ShardlabError, match="by CP-SAT's bounds on each of the") as caught:
        raise sizer.why_unserved(150.0)
    assert caught.value.field == "rate"
    assert "max_gpus" in (caught.value.fix or "")
    assert sizer.caps.solves == 0


@pytest.mark.parametrize("serving", ["agg", "best"])
@pytest.mark.parametrize("prices", [None, {"h100": 2.0, "h200": 3.5}])
def test_pruning_by_the_bounds_changes_no_answer(
    prices: dict[str, float] | None, serving: str
) -> None:
    """Mixes that beat the first cover found (33, 47/s priced), disaggregated pairs, a
    rate the bounds leave open and the solves refuse (70/s aggregated), refusals."""
    rates = [2.0, 9.0, 25.0, 33.0, 40.0, 47.0, 60.0, 70.0, 90.0]
    pruned, solved = _sizer(True, prices, serving), _sizer(False, prices, serving)
    for a, b in zip(pruned.curve(rates), solved.curve(rates), strict=True):
        assert not a.partial and not b.partial
        for x, y in [(a.best, b.best), *((a.by_gpu[g], b.by_gpu[g]) for g in b.by_gpu)]:
            assert (x is None) == (y is None), a.rate
            if x is not None and y is not None:
                assert (x.label(), x.mode, x.gpus) == (y.label(), y.mode, y.gpus), a.rate
                assert x.cost == pytest.approx(y.cost) and x.capacity == pytest.approx(y.capacity)
    assert pruned.caps.solves <= solved.caps.solves
    assert math.isfinite(pruned.rate_ceiling())
