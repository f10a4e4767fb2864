"""Mélange's move (shardlab.sizing.buckets): a traffic split by prompt length, each
bucket sized alone by the same covering."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from shardlab.errors import ShardlabError
from shardlab.problems.cluster import builtin_accelerators
from shardlab.problems.problem import Problem
from shardlab.problems.traces import read_trace
from shardlab.problems.traffic import Arrivals, Lengths, closed_loop, synthetic_traffic
from shardlab.sizing.buckets import LEAST_REQUESTS, size_by_bucket, split
from shardlab.sizing.size import Sizer, sizing_cluster
from tests.conftest import DATA_DIR

ACC = builtin_accelerators()
CONV = DATA_DIR / "traces" / "AzureLLMInferenceTrace_conv.csv.gz"


def test_buckets_split_the_requests_by_prompt_length() -> None:
    trace = read_trace(str(CONV), None)
    buckets = split(trace, 3)
    assert len(buckets) == 3
    assert math.isclose(sum(b.share for b in buckets), 1.0)
    assert sum(b.traffic.requests for b in buckets) == trace.requests
    for a, b in itertools.pairwise(buckets):
        assert a.high < b.low  # disjoint, ascending
    for b in buckets:
        assert b.low <= b.traffic.input_len.min() and b.traffic.input_len.max() <= b.high
        assert np.all(np.diff(b.traffic.arrival_s) >= 0)  # a thinning keeps the order
        assert b.input_len == round(float(b.traffic.input_len.mean()))
    # about a third each: the quantiles of the prompt lengths
    assert all(0.25 < b.share < 0.42 for b in buckets)


def test_what_cannot_be_bucketed_is_refused() -> None:
    trace = read_trace(str(CONV), None)
    with pytest.raises(ShardlabError) as e:
        split(trace, 1)
    assert e.value.field == "buckets"
    few = synthetic_traffic(
        requests=2 * LEAST_REQUESTS - 1,
        lengths=Lengths(kind="uniform", input_len=2000, output_len=100, range_ratio=0.1),
        arrivals=Arrivals(kind="poisson", rate=1.0),
    )
    with pytest.raises(ShardlabError, match="fewer than") as e:
        split(few, 2)
    loop = closed_loop(clients=4, prompts_per_client=20, lengths=Lengths())
    with pytest.raises(ShardlabError) as e:
        split(loop, 2)
    assert e.value.field == "traffic"


def test_the_bucketed_cost_is_each_buckets_own_sizing() -> None:
    """Instances serve one bucket each: the bucketed deployment is the sum of the
    buckets sized alone at their shares of the rate, and the answer is the cheaper of it
    and the traffic served together."""
    trace = read_trace(str(CONV), None)
    accs = {g: ACC[g] for g in ("a100", "h100")}
    prices = {"a100": 1.29, "h100": 2.99}
    base = Problem.build(
        "llama-3.1-8b", sizing_cluster(accs, 16), "chat", engine="vllm", space_kind="engine",
        input_len=1000, output_len=200, ttft_ms=1000, tpot_ms=30,
    )  # fmt: skip
    rate = 40.0

    def make(problem: Problem, traffic: object) -> Sizer:
        return Sizer(problem, accs, prices=prices, serving="agg", max_gpus=16)

    got = size_by_bucket(dataclasses.replace(base, workload=base.workload.at_rate(rate)),
                         trace, rate, 2, make)  # fmt: skip
    assert len(got.answers) == 2
    for b, s in zip(got.buckets, got.answers, strict=True):
        w = dataclasses.replace(base.workload, input_len=b.input_len, output_len=b.output_len)
        alone = make(dataclasses.replace(base, workload=w.at_rate(rate * b.share)), None)
        own = alone.size(rate * b.share)
        assert own.best is not None and s.best is not None
        assert math.isclose(own.best.cost, s.best.cost)
    assert math.isclose(got.cost, sum(s.best.cost for s in got.answers))  # type: ignore[union-attr]
    together = got.together.best
    assert together is not None
    assert got.bucketed == (got.cost < together.cost)


def test_cli_sizes_by_bucket_beside_together(
    capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    import json

    from tests.conftest import run_cli

    code, out, err = run_cli(
        [
            "size", "--model", "llama-3.1-8b", "--gpus", "a100,h100", "--price",
            "a100=1.29,h100=2.99", "--engine", "vllm", "--space", "engine", "--traffic",
            str(CONV), "--rate", "40", "--ttft-ms", "1000", "--tpot-ms", "30", "--serving",
            "agg", "--max-gpus", "16", "--buckets", "2", "--format", "json",
        ],
        capsys,
        monkeypatch,
    )  # fmt: skip
    assert code == 0, err
    got = json.loads(out)["by_bucket"]
    assert len(got["buckets"]) == 2
    assert math.isclose(sum(b["rate_rps"] for b in got["buckets"]), 40.0)
    assert got["bucketed"] == (got["bucketed_cost"] < got["together_cost"])
    code, _, err = run_cli(
        ["size", "--model", "llama-3.1-8b", "--gpus", "h100", "--rate", "5", "--buckets", "2"],
        capsys,
        monkeypatch,
    )
    assert code == 2 and "--buckets" in err
