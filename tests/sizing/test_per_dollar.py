"""Vidur-Search's question (shardlab.sizing.per_dollar): every instance of each GPU type
and size ranked by its capacity at the percentile SLOs per $/hour."""

from __future__ import annotations

import dataclasses
import json
from functools import cache

import pytest

from shardlab.errors import ShardlabError
from shardlab.problems.cluster import builtin_accelerators
from shardlab.problems.problem import Problem
from shardlab.sizing.per_dollar import InstanceValue, PerDollar, per_dollar
from shardlab.sizing.size import Sizer, sizing_cluster
from tests.conftest import run_cli

ACC = builtin_accelerators()
TYPES = {"a100": ACC["a100"], "h100": ACC["h100"]}
# Vidur-Search's dashboard defaults, with TTFT tightened so that the tail costs capacity
SLOS = dict(ttft_ms=300, ttft_percentile=90, itl_ms=200, itl_percentile=99)
PRICES = {"a100": 2.21, "h100": 4.25}


def _problem(**slos: object) -> Problem:
    p = Problem.build(
        "llama-3.1-8b", sizing_cluster(TYPES, 2), "chat", engine="vllm", space_kind="engine",
        input_len=1024, output_len=128, **slos,
    )  # type: ignore[arg-type]  # fmt: skip
    return dataclasses.replace(p, workload=p.workload.at_rate(1.0))


@cache
def _ranked(prices: tuple[tuple[str, float], ...] = tuple(PRICES.items())) -> PerDollar:
    sizer = Sizer(_problem(**SLOS), TYPES, prices=dict(prices), serving="agg", max_gpus=2)
    return per_dollar(sizer)


def test_every_instance_is_ranked_by_its_simulated_capacity_per_dollar() -> None:
    ranked = _ranked()
    assert [(v.gpu, v.gpus) for v in ranked.instances] == [
        ("a100", 1), ("a100", 2), ("h100", 1), ("h100", 2),
    ]  # fmt: skip
    # the same capacities, searched apart by a sizer of their own
    alone = Sizer(_problem(**SLOS), TYPES, prices=PRICES, serving="agg", max_gpus=2)
    for v in ranked.instances:
        c = alone.caps.served(alone.caps.agg(v.gpu, v.gpus))
        assert v.rate == pytest.approx(c.rate) and v.mean_rate == pytest.approx(c.mean_rate)
        assert 0 < v.rate <= v.mean_rate
        assert v.cost == pytest.approx(v.gpus * PRICES[v.gpu])
        assert v.per_dollar == pytest.approx(v.rate / v.cost)
    assert any(v.rate < v.mean_rate for v in ranked.instances), "the tail costs capacity here"
    best = ranked.best
    assert best is not None and best.per_dollar == max(v.per_dollar for v in ranked.instances)


def test_the_price_decides_the_best_instance() -> None:
    """A GPU type made dear enough loses the ranking; the capacities stay."""
    cheap_a100 = _ranked((("a100", 0.5), ("h100", 4.25))).best
    cheap_h100 = _ranked((("a100", 2.21), ("h100", 0.5))).best
    assert cheap_a100 is not None and cheap_a100.gpu == "a100"
    assert cheap_h100 is not None and cheap_h100.gpu == "h100"


def _value(gpu: str, gpus: int, price: float, rate: float) -> InstanceValue:
    return InstanceValue(
        gpu=gpu, gpus=gpus, price=price, plan=None, status="optimal", mean_rate=rate,
        rate=rate, solve_s=0.0, simulate_s=0.0,
    )  # fmt: skip


def test_a_tie_goes_to_the_cheaper_hour_and_no_server_is_no_answer() -> None:
    two = _value("h100", 2, 4.0, 8.0)
    one = _value("h100", 1, 4.0, 4.0)  # the same requests/s per $/h at half the hour
    assert PerDollar(instances=(two, one), seconds=0.0).best is one
    none = _value("a100", 1, 2.0, 0.0)
    assert PerDollar(instances=(none,), seconds=0.0).best is None


def test_it_needs_prices_and_every_proof() -> None:
    problem = _problem(**SLOS)
    with pytest.raises(ShardlabError) as unpriced:
        per_dollar(Sizer(problem, TYPES, serving="agg", max_gpus=2))
    assert unpriced.value.field == "prices"
    timed = Sizer(problem, TYPES, prices=PRICES, serving="agg", max_gpus=2, time_limit=60)
    with pytest.raises(ShardlabError) as limited:
        per_dollar(timed)
    assert limited.value.field == "time_limit"


ARGS = [
    "size", "--per-dollar", "--model", "llama-3.1-8b", "--gpus", "a100,h100",
    "--max-gpus", "2", "--engine", "vllm", "--space", "engine",
    "--input-len", "1024", "--output-len", "128",
]  # fmt: skip


def test_the_cli_prints_the_ranking_as_json(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # SLOs on the mean: no simulation, the capacities the analytic model's
    args = [*ARGS, "--price", "a100=2.21,h100=4.25", "--ttft-ms", "2000", "--format", "json"]
    code, out, err = run_cli(args, capsys, monkeypatch)
    assert code == 0, err
    data = json.loads(out)
    rows = data["instances"]
    assert [(r["gpu"], r["gpus"]) for r in rows] == [
        ("a100", 1), ("a100", 2), ("h100", 1), ("h100", 2),
    ]  # fmt: skip
    assert all(r["rps"] == r["mean_model_rps"] for r in rows)
    top = max(rows, key=lambda r: r["rps_per_dollar"])
    assert data["best"] == {"gpu": top["gpu"], "gpus": top["gpus"]}


@pytest.mark.parametrize(
    ("extra", "word"),
    [
        ([], "--price"),
        (["--price", "a100=2.21,h100=4.25", "--rate", "5"], "--rate"),
        (["--price", "a100=2.21,h100=4.25", "--serving", "disagg"], "aggregated"),
    ],
)
def test_the_cli_refuses_what_a_ranking_does_not_take(
    extra: list[str],
    word: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, err = run_cli([*ARGS, *extra], capsys, monkeypatch)
    assert code == 2 and word in err
