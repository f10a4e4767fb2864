"""The catalog's sizing curve: every GPU has a sourced example price, the tables and
files hold each type alone and all together, and the bench sizes at those prices."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from shardlab.bench import SizingRun, sizing_speed
from shardlab.problems.cluster import builtin_accelerators
from shardlab.problems.workload import RATE_IN_FLIGHT
from shardlab.sizing.catalog import (
    EXAMPLE_PRICES,
    CatalogCurve,
    catalog_gpus,
    example_prices,
    run_catalog,
    size_command,
    size_curve,
)

SMALL = CatalogCurve(model="llama-3.1-8b", rates=(2.0, 8.0))
GPUS = ("h100", "l4")


@pytest.mark.parametrize("gpu", sorted(catalog_gpus()))
def test_every_catalog_gpu_has_one_sourced_example_price(gpu: str) -> None:
    listed = [p for p in EXAMPLE_PRICES if p.name == gpu]
    assert len(listed) == 1
    assert listed[0].usd_per_gpu_hour > 0 and listed[0].source and listed[0].date
    assert example_prices([gpu]) == {gpu: listed[0].usd_per_gpu_hour}


def test_the_catalog_is_every_builtin_gpu_its_engine_runs_on() -> None:
    accs = builtin_accelerators()
    assert catalog_gpus() == tuple(k for k in accs if k != "b60")  # B60: vLLM only
    assert {p.name for p in EXAMPLE_PRICES} == set(catalog_gpus())


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("catalog")
    return out, run_catalog(out, "shardlab compare --suite catalog", curves=[SMALL], gpus=GPUS)


def test_each_rate_has_each_type_alone_and_all_together(written: tuple[Path, list]) -> None:
    out, rows = written
    assert [(r["rate_rps"], r["gpu"]) for r in rows] == [
        (rate, g) for rate in SMALL.rates for g in (*GPUS, "best")
    ]
    for rate in SMALL.rates:
        here = {r["gpu"]: r for r in rows if r["rate_rps"] == rate}
        served = [here[g]["usd_per_hour"] for g in GPUS if here[g]["usd_per_hour"] is not None]
        # all types together cost no more than the cheapest type alone
        assert here["best"]["usd_per_hour"] <= min(served) * (1 + 1e-9)
        for g in GPUS:  # one type alone: its GPUs at its price
            if here[g]["usd_per_hour"] is not None:
                want = here[g]["gpus"] * example_prices([g])[g]
                assert here[g]["usd_per_hour"] == pytest.approx(want)
    with (out / "catalog.csv").open() as f:
        assert len(list(csv.DictReader(f))) == len(rows)


def test_the_report_names_its_command_prices_and_each_curve(written: tuple[Path, list]) -> None:
    out, _ = written
    text = (out / "catalog.md").read_text()
    assert "Produced by `shardlab compare --suite catalog`" in text
    assert size_command(SMALL, GPUS) in text
    for p in EXAMPLE_PRICES:
        if p.name in GPUS:
            assert p.source in text
    answers = json.loads((out / "catalog.json").read_text())
    assert [a["answer"]["model"] for a in answers] == [SMALL.model]
    assert [r["rate_rps"] for r in answers[0]["answer"]["rates"]] == list(SMALL.rates)


def test_a_priced_bench_run_sizes_at_the_example_prices() -> None:
    run = SizingRun(model="llama-3.1-8b", rate=2.0, engine="vllm", priced=True, gpus=GPUS)
    row = sizing_speed(run)
    assert row.gpus == "h100,l4 (vllm, example prices)"
    assert row.answer_gpus is not None and "/h" in row.answer


def test_a_curve_is_sized_as_its_size_command_offers_it() -> None:
    """``shardlab size --rates`` offers the workload at the lowest rate (requests in
    flight bounded by the engine and the KV cache, not the preset's batch)."""
    sizer, answers, _ = size_curve(CatalogCurve(model="llama-3.1-8b", rates=(2.0,)), ("h100",))
    w = sizer.problem.workload
    assert (w.rate, w.objective, w.batch) == (2.0, "request_rate", RATE_IN_FLIGHT)
    assert [s.rate for s in answers] == [2.0]
