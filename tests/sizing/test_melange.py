"""Mélange's experiment (shardlab.sizing.melange): its length mixes, its traces, its rows
against what ``shardlab size`` answers, and by-bucket curves against one rate at a time."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from shardlab.problems.cluster import builtin_accelerators
from shardlab.problems.problem import Problem
from shardlab.problems.traces import read_trace
from shardlab.sizing.buckets import curve_by_bucket, size_by_bucket
from shardlab.sizing.melange import (
    LLAMA2_CONTEXT,
    PRICES,
    lognormal_buckets,
    mix_traffic,
    mixes,
    size_mix,
    size_mix_tail,
    trace_csv,
)
from shardlab.sizing.melange_report import (
    explanation,
    melange_markdown,
    size_command,
    tail_command,
)
from shardlab.sizing.size import Sizer, sizing_cluster
from tests.conftest import DATA_DIR

ACC = builtin_accelerators()
CONV = DATA_DIR / "traces" / "AzureLLMInferenceTrace_conv.csv.gz"


def _mean(buckets: tuple[tuple[int, int, float], ...], column: int) -> float:
    weights = np.array([b[2] for b in buckets])
    return float(np.dot([b[column] for b in buckets], weights) / weights.sum())


def test_the_mixes_hold_the_published_means() -> None:
    short, long, mixed = mixes()
    # a log-normal's mid-quantiles in 8 steps miss its tail: within 15% of the mean
    assert _mean(short.buckets, 0) == pytest.approx(69.5, rel=0.15)
    assert {o for _, o, _ in short.buckets} == {215}
    assert {o for _, o, _ in long.buckets} == {264}
    # PubMed's prompts fit Llama-2's context with their output
    assert max(i + o for i, o, _ in long.buckets) <= LLAMA2_CONTEXT
    assert _mean(long.buckets, 0) > 2500
    weights = [w for _, _, w in mixed.buckets]
    assert math.isclose(sum(weights[: len(short.buckets)]), 0.8)
    assert math.isclose(sum(weights[len(short.buckets) :]), 0.2)
    steps = lognormal_buckets(100.0, 0.5, 10, n=8)
    assert [i for i, _, _ in steps] == sorted(i for i, _, _ in steps)
    assert lognormal_buckets(100.0, 0.5, 10, n=8, cap=120)[-1][0] == 120


def test_a_mix_trace_reads_back_as_written(tmp_path: Path) -> None:
    traffic = mix_traffic(mixes()[2], requests=300)
    path = tmp_path / "mixed.csv"
    path.write_text(trace_csv(traffic))
    back = read_trace(str(path), None)
    assert np.array_equal(back.input_len, traffic.input_len)
    assert np.array_equal(back.output_len, traffic.output_len)
    assert back.rate == pytest.approx(traffic.rate, rel=1e-6)


def test_a_curve_by_bucket_is_each_rate_sized_alone() -> None:
    """One sizer per bucket over every rate answers as a fresh sizing at each rate."""
    trace = read_trace(str(CONV), None)
    accs = {g: ACC[g] for g in ("a100", "h100")}
    base = Problem.build(
        "llama-3.1-8b", sizing_cluster(accs, 16), "chat", engine="vllm", space_kind="engine",
        input_len=1000, output_len=200, ttft_ms=1000, tpot_ms=30,
    )  # fmt: skip

    def make(problem: Problem, traffic: object) -> Sizer:
        return Sizer(problem, accs, prices=dict(PRICES), serving="agg", max_gpus=16)

    rates = [40.0, 10.0]
    curve = curve_by_bucket(base, trace, rates, 2, make)
    assert [b.rate for b in curve] == [10.0, 40.0]
    for b in curve:
        one = size_by_bucket(
            dataclasses.replace(base, workload=base.workload.at_rate(b.rate)), trace, b.rate, 2,
            make,
        )  # fmt: skip
        assert one.cost == pytest.approx(b.cost)
        assert one.together.best is not None and b.together.best is not None
        assert one.together.best.cost == pytest.approx(b.together.best.cost)
        assert [s.rate for s in one.answers] == pytest.approx([s.rate for s in b.answers])


def test_a_row_is_what_shardlab_size_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The results' claim: every cell is the ``shardlab size`` command written beside it."""
    from tests.conftest import run_cli

    traffic = mix_traffic(mixes()[1], requests=400)
    (tmp_path / "melange").mkdir()
    (tmp_path / "melange" / "long.csv").write_text(trace_csv(traffic))
    rows = size_mix(traffic, 40.0, rates=[16.0])
    (row,) = rows
    args = size_command("long", 40.0, 16.0, out_dir=str(tmp_path)).split()[1:]
    code, out, err = run_cli([*args, "--format", "json"], capsys, monkeypatch)
    assert code == 0, err
    got = json.loads(out)["by_bucket"]
    assert got["together_cost"] == pytest.approx(row["together_cost"])
    assert got["bucketed_cost"] == pytest.approx(row["bucketed_cost"])
    # the mix together is never dearer than a type alone; savings against them
    alone = [row[f"{g}_cost"] for g in PRICES if row[f"{g}_cost"] is not None]
    assert row["together_cost"] <= min(alone) + 1e-9
    assert row["ours_cost"] == min(row["together_cost"], row["bucketed_cost"])
    assert row["saving_vs_best"] == pytest.approx(1 - row["ours_cost"] / min(alone))
    assert row["saving_vs_worst"] == pytest.approx(1 - row["ours_cost"] / max(alone))
    text = melange_markdown(rows, [], [(mixes()[1], traffic)], "test", 1.0)
    assert "| long | 40 | 2-22% |" in text
    assert size_command("long", 40.0, 16.0) in text


def test_the_explanation_names_the_cells_where_a_mix_wins() -> None:
    row = {
        "mix": "long", "tpot_ms": 40.0, "rate_rps": 16.0, "together": "1 x 1 a100 + 2 x 1 h100",
        "together_saving_vs_best": 0.15, "together_cost": 18.71, "bucketed_cost": 25.87,
    }  # fmt: skip
    tail = {
        "mix": "mixed", "tpot_ms": 40.0, "rate_rps": 32.0, "together": "1 x 1 a100 + 1 x 1 h100",
        "saving_vs_best": 0.24,
    }  # fmt: skip
    text = "\n".join(explanation([row], [tail]))
    assert "long at 40 ms, 16 req/s (1 x 1 a100 + 2 x 1 h100, 15%)" in text
    assert "By bucket is cheapest at: no cell" in text
    assert "1 - 3.67/7.52 = 51%" in text
    assert "mix beats every type alone in: mixed at 40 ms, 32 req/s" in text


def test_at_the_tail_the_mix_holds_its_percentile() -> None:
    """The tail rows: the cheapest mix is never dearer than a type alone, and its
    deployment simulated whole meets the percentile SLO it was sized for."""
    traffic = mix_traffic(mixes()[2], requests=600)
    (row,) = size_mix_tail(traffic, 40.0, rates=[32.0])
    alone = [row[f"{g}_cost"] for g in PRICES if row[f"{g}_cost"] is not None]
    assert row["together_cost"] <= min(alone) + 1e-9
    assert row["simulated_tpot_ms"] is not None and row["simulated_tpot_ms"] <= 40.0
    assert row["saving_vs_best"] == pytest.approx(1 - row["together_cost"] / min(alone))
    assert "--slo-percentile 99 --rates 1,2,4,8,16,32" in tail_command("mixed", 40.0, 99.0)


def test_compare_suite_melange_takes_no_methods(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import run_cli

    code, _, err = run_cli(
        ["compare", "--suite", "melange", "--methods", "random"], capsys, monkeypatch
    )
    assert code == 2 and "methods" in err


def test_the_committed_results_are_reproduced() -> None:
    """results/sizing/melange.md, rendered again from its melange.json and the mixes'
    traces drawn again (same seed): its numbers come from the code, not a hand."""
    results = Path(__file__).parents[2] / "results" / "sizing"
    data = json.loads((results / "melange.json").read_text())
    traffics = [(m, mix_traffic(m)) for m in mixes()]
    for m, t in traffics:
        assert (results / "melange" / f"{m.name}.csv").read_text() == trace_csv(t)
    again = melange_markdown(data["mean"], data["tail"], traffics, data["command"],
                             data["seconds"])  # fmt: skip
    assert again == (results / "melange.md").read_text()


def test_the_tail_never_costs_less_than_the_mean() -> None:
    """An instance's capacity at a percentile is at most its mean-model capacity
    (shardlab.sizing.tail), so no committed cell is cheaper at p99 than on the mean."""
    results = Path(__file__).parents[2] / "results" / "sizing"
    data = json.loads((results / "melange.json").read_text())
    mean = {(r["mix"], r["tpot_ms"], r["rate_rps"]): r for r in data["mean"]}
    assert len(data["tail"]) == len(mean) == 36
    for r in data["tail"]:
        on_mean = mean[(r["mix"], r["tpot_ms"], r["rate_rps"])]
        assert r["together_cost"] >= on_mean["together_cost"] - 1e-9, r
        for g in PRICES:
            assert r[f"{g}_cost"] >= on_mean[f"{g}_cost"] - 1e-9, (g, r)
