"""Sizing under SLOs at a percentile (shardlab.sizing.tail): each instance's capacity is
the largest rate, up to its mean-model capacity, at which its simulated percentiles
meet the SLOs; answers are checked again with a fresh seed."""

from __future__ import annotations

import dataclasses
import json
from functools import cache

import pytest

from shardlab.errors import ShardlabError
from shardlab.problems.cluster import builtin_accelerators
from shardlab.problems.problem import Problem
from shardlab.problems.traffic import Arrivals, Lengths, closed_loop, synthetic_traffic
from shardlab.sizing.size import Sizer, sizing_cluster
from shardlab.sizing.tail import RATE_TOLERANCE, percentile_capacity, simulate_deployment
from shardlab.solvers.certify import tail_slos
from tests.conftest import DATA_DIR, run_cli

ACC = builtin_accelerators()
H100 = {"h100": ACC["h100"]}


def _problem(**slos: object) -> Problem:
    p = Problem.build(
        "llama-3.1-70b", sizing_cluster(H100, 64), "chat", engine="vllm", space_kind="engine",
        **slos,
    )  # type: ignore[arg-type]  # fmt: skip
    return dataclasses.replace(p, workload=p.workload.at_rate(8))


TIGHT = dict(ttft_ms=500, tpot_ms=40, slo_percentile=99)


@cache
def _sized(rate: float = 8.0) -> tuple[Sizer, object]:
    sizer = Sizer(_problem(**TIGHT), H100, serving="agg", max_gpus=64, seed=0)
    return sizer, sizer.size(rate)


def test_the_tail_capacity_is_below_the_mean_models_and_met_there() -> None:
    sizer, _ = _sized()
    c = sizer.caps.served(sizer.caps.agg("h100", 4))
    assert c.mean_rate is not None and 0 < c.rate <= c.mean_rate
    assert c.probes and all(p.met == (p.rate <= c.rate) for p in c.probes), (
        "one percentile grows with the rate: every rate up to the capacity met, above missed"
    )
    assert c.rate < c.mean_rate, "these SLOs were chosen so that the tail costs capacity"
    missed = min(p.rate for p in c.probes if not p.met)
    assert missed - c.rate <= RATE_TOLERANCE * missed + 1e-9


def test_the_capacity_is_bisected_again_the_same() -> None:
    sizer, _ = _sized()
    c = sizer.caps.served(sizer.caps.agg("h100", 4))
    assert c.plan is not None and c.problem is not None and c.mean_rate is not None
    again, probes = percentile_capacity(
        c.problem, c.plan, c.mean_rate, tail_slos(sizer.problem), None, seed=0
    )
    assert again == c.rate and probes == c.probes


@pytest.mark.parametrize("seed", [1, 2])
def test_every_answer_meets_its_percentiles_under_a_fresh_seed(seed: int) -> None:
    sizer, s = _sized()
    assert s.best is not None and s.simulated is not None
    slos = sizer.caps.slos
    assert all(v <= slos[k][0] for k, v in s.simulated.items())
    pools = [(p.role, p.capacity.problem, p.capacity.plan, p.instances, p.capacity.rate)
             for p in s.best.pools]  # fmt: skip
    fresh = simulate_deployment(pools, slos, None, sizer.problem, s.rate, seed)
    assert all(v <= slos[k][0] for k, v in fresh.items()), fresh


def test_on_the_mean_nothing_is_simulated() -> None:
    sizer = Sizer(_problem(ttft_ms=500, tpot_ms=40), H100, serving="agg", max_gpus=64)
    s = sizer.size(8.0)
    assert s.simulated is None and sizer.caps.agg("h100", 4).mean_rate is None


def test_a_trace_is_rescaled_to_each_rate() -> None:
    from shardlab.problems.traces import read_trace

    trace = read_trace(str(DATA_DIR / "traces" / "AzureLLMInferenceTrace_code_head500.csv"), None)
    problem = _problem(ttft_ms=3000, tpot_ms=100, slo_percentile=99)
    sizer = Sizer(problem, H100, serving="agg", max_gpus=64, traffic=trace)
    c = sizer.caps.served(sizer.caps.agg("h100", 8))
    assert c.probes and c.probes[0].rate == c.mean_rate


# -- refusals ----------------------------------------------------------------------------


@cache
def _disagg() -> tuple[Sizer, object]:
    problem = _problem(ttft_ms=1500, tpot_ms=40, slo_percentile=90)
    sizer = Sizer(problem, H100, serving="disagg", max_gpus=64, seed=0)
    return sizer, sizer.size(12.0)


def test_disaggregated_pools_are_sized_by_their_own_percentiles() -> None:
    """A prefill pool answers for TTFT (simulated alone: each request ends as its cache
    arrives), a decode pool for TPOT (prompts cached); the deployment, simulated whole,
    for both, under a fresh seed too."""
    sizer, s = _disagg()
    assert s.best is not None and s.best.mode == "disagg" and s.simulated is not None
    pre, dec = s.best.pools
    for pool, slo in ((pre, "ttft_ms"), (dec, "tpot_ms")):
        c = pool.capacity
        assert c.mean_rate is not None and c.rate <= c.mean_rate
        assert c.probes and all(set(p.percentiles_ms) == {slo} for p in c.probes)
    slos = sizer.caps.slos
    assert all(v <= slos[k][0] for k, v in s.simulated.items()), s.simulated
    pools = [(p.role, p.capacity.problem, p.capacity.plan, p.instances, p.capacity.rate)
             for p in s.best.pools]  # fmt: skip
    fresh = simulate_deployment(pools, slos, None, sizer.problem, s.rate, 3)
    assert all(v <= slos[k][0] for k, v in fresh.items()), fresh


def test_a_closed_loop_has_no_rate_to_size() -> None:
    loop = closed_loop(clients=8, prompts_per_client=2, lengths=Lengths())
    with pytest.raises(ShardlabError) as e:
        Sizer(_problem(**TIGHT), H100, serving="agg", traffic=loop)
    assert e.value.field == "traffic"


def test_a_traffic_without_a_percentile_is_refused() -> None:
    poisson = synthetic_traffic(
        requests=10, lengths=Lengths(), arrivals=Arrivals(kind="poisson", rate=1.0)
    )
    with pytest.raises(ShardlabError) as e:
        Sizer(_problem(ttft_ms=500), H100, serving="agg", traffic=poisson)
    assert e.value.field == "traffic"


# -- the CLI -----------------------------------------------------------------------------


def test_cli_sizes_a_trace_at_its_own_rate(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    trace = str(DATA_DIR / "traces" / "AzureLLMInferenceTrace_code_head500.csv")
    code, out, err = run_cli(
        [
            "size", "--model", "llama-3.1-8b", "--gpus", "h100", "--engine", "vllm",
            "--space", "engine", "--traffic", trace, "--ttft-ms", "3000", "--tpot-ms", "100",
            "--slo-percentile", "99", "--serving", "agg", "--max-gpus", "8", "--format", "json",
        ],
        capsys,
        monkeypatch,
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["traffic"].endswith("AzureLLMInferenceTrace_code_head500.csv")
    (answer,) = data["rates"]
    assert answer["rate_rps"] > 0 and answer["simulated_ms"]["ttft_ms"] <= 3000
    pool = answer["deployment"]["pools"][0]
    assert pool["instance_capacity_rps"] <= pool["instance_mean_model_rps"]


def test_cli_refuses_a_closed_loop_to_size(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    trace = str(DATA_DIR / "traces" / "AzureLLMInferenceTrace_code_head500.csv")
    code, _, err = run_cli(
        ["size", "--model", "llama-3.1-8b", "--gpus", "h100", "--rate", "5", "--ttft-ms", "500",
         "--slo-percentile", "90", "--traffic", trace, "--arrival", "poisson", "--cv", "0"],
        capsys,
        monkeypatch,
    )  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and "coefficient" in err


def test_an_instance_too_small_for_the_longest_request_serves_none() -> None:
    """The Azure code excerpt's longest requests (7,461 tokens) do not fit a 2-GPU H100
    instance's KV cache of Llama-3.1-70B: that instance serves none of the traffic, and
    the sizing goes on with the larger ones (it stopped at the first such instance)."""
    from shardlab.problems.traces import read_trace

    trace = read_trace(str(DATA_DIR / "traces" / "AzureLLMInferenceTrace_code_head500.csv"), None)
    problem = Problem.build(
        "llama-3.1-70b", sizing_cluster(H100, 16), "chat", engine="trtllm",
        space_kind="engine", ttft_ms=3000, tpot_ms=100, slo_percentile=99, rate=2.0,
        input_len=round(float(trace.input_len.mean())),
        output_len=round(float(trace.output_len.mean())),
    )  # fmt: skip
    sizer = Sizer(problem, H100, serving="agg", max_gpus=16, traffic=trace)
    small = sizer.caps.served(sizer.caps.agg("h100", 2))
    assert small.mean_rate and small.mean_rate > 0 and small.rate == 0
    assert "does not fit" in small.why and sizer.caps.too_long == small.why
    s = sizer.size(2.0)  # it stopped here, on the first such instance
    larger = [sizer.caps.served(sizer.caps.agg("h100", n)) for n in (4, 8)]
    assert all(c.rate > 0 and "does not fit" not in c.why for c in larger)
    assert s.best is None or all(p.capacity.gpus > 2 for p in s.best.pools)
