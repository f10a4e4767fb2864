"""Solves under SLOs at a percentile: the walk down the analytic ranking that the
simulator certifies (shardlab.solvers.certify)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from shardlab.errors import ShardlabError
from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem
from shardlab.problems.traffic import Arrivals, Lengths, synthetic_traffic
from shardlab.simulate import Deployment, price, simulate, simulate_priced
from shardlab.solvers.certify import floors, least_per_prompt_token, statistic
from shardlab.solvers.registry import available_solvers
from shardlab.solvers.solve import solve
from tests.conftest import DATA_DIR, run_cli

SMALL = dict(engine="vllm", space_kind="engine")


def _problem(**workload: object) -> Problem:
    return Problem.build("llama-3.1-8b", "h100x2", "chat", **SMALL, **workload)  # type: ignore[arg-type]


def _poisson(rate: float, seed: int, n: int = 600, ratio: float = 1.0) -> object:
    return synthetic_traffic(
        requests=n,
        lengths=Lengths(kind="uniform", input_len=2048, output_len=256, range_ratio=ratio),
        arrivals=Arrivals(kind="poisson", rate=rate),
        seed=seed,
    )


# -- the floor: a bound that needs no simulation ---------------------------------------


@pytest.mark.parametrize(
    ("degrees", "rate", "ratio"),
    [
        (Degrees(replicas=2, tp=1), 4.0, 1.0),
        (Degrees(tp=2, etp=2), 12.0, 0.5),
        (Degrees(pp=2), 8.0, 0.2),
    ],
)
def test_every_request_is_at_least_its_floor(degrees: Degrees, rate: float, ratio: float) -> None:
    """The module's argument, checked on the simulator's requests: each TTFT is at least
    its prompt at the least cost per token plus the fixed costs, each TPOT at least one
    lone decode at the shortest prompt; so every percentile is at least the floors'."""
    problem = Problem.build("llama-3.1-8b", "h100x2", "chat", engine="vllm")
    problem = dataclasses.replace(
        problem, workload=dataclasses.replace(problem.workload, input_len=2048, output_len=256)
    )
    plan = problem.space.megatron_plan(degrees)
    dep = Deployment.of_plan(problem, plan)
    traffic = _poisson(rate, seed=3, ratio=ratio)
    priced = price(dep, traffic)
    sim = simulate_priced(dep, priced, traffic, seed=0)
    costs = priced[0].costs
    rho = least_per_prompt_token(costs)  # 0 where measured prefill times dip
    ttft_floor = costs.request_s + costs.iteration_s + rho * traffic.input_len
    assert np.all(sim.ttft_s >= ttft_floor - 1e-9)
    tpot = sim.tpot_s[np.isfinite(sim.tpot_s)]
    low = floors(priced, dep, traffic, {"tpot_ms": 50.0})["tpot_ms"] / 1e3
    assert tpot.size and np.all(tpot >= low - 1e-9)
    for p in (50.0, 90.0, 99.0):
        f = floors(priced, dep, traffic, {"ttft_ms": p})["ttft_ms"]
        assert sim.latency("ttft_ms", statistic(p)) >= f - 1e-6


# -- the walk ----------------------------------------------------------------------------


def test_a_certified_plan_meets_its_percentiles_under_a_fresh_seed() -> None:
    problem = _problem(rate=8, ttft_ms=400, tpot_ms=25, slo_percentile=90)
    s = solve(problem, "cpsat", seed=0)
    cert = s.certificate
    assert cert is not None and cert.certified is not None
    won = cert.certified
    assert won.simulated_ms["ttft_ms"] <= 400 and won.simulated_ms["tpot_ms"] <= 25
    # an independent run: other arrivals, other lengths' draws
    fresh = synthetic_traffic(
        requests=2000,
        lengths=Lengths(kind="fixed", input_len=1024, output_len=256),
        arrivals=Arrivals(kind="poisson", rate=8),
        seed=12345,
    )
    assert isinstance(s.plan, Plan)
    again = simulate(Deployment.of_plan(s.problem, s.plan), fresh, seed=7)
    # a fresh seed moves a percentile by sampling noise; the plan keeps a margin
    assert again.latency("ttft_ms", "p90") <= 400 * 1.1
    assert again.latency("tpot_ms", "p90") <= 25 * 1.1


def test_a_plan_that_fails_is_cut_and_the_claim_counts_it() -> None:
    """A p99 TTFT the busiest plans miss: the walk cuts their degree tuples (the rate's
    load is the same at every concurrency) and certifies a later one."""
    problem = Problem.build(
        "llama-3.1-70b", "h100x8", "chat", **SMALL, rate=10, ttft_ms=250, tpot_ms=40,
        slo_percentile=99,
    )  # type: ignore[arg-type]  # fmt: skip
    s = solve(problem, "cpsat", seed=0)
    cert = s.certificate
    assert cert is not None
    assert cert.failed, "this SLO was chosen so the best analytic plan misses it"
    assert all(a.cut == "degrees" for a in cert.failed)
    assert cert.certified is not None
    cut = {a.label for a in cert.failed}
    assert cert.certified.label not in cut
    assert f"{len(cert.failed)} better plan" in cert.claim
    import json

    # no SLO on the mean here (none meets it): JSON says null, not Infinity
    assert "Infinity" not in json.dumps(s.to_dict())
    # ranked best first: every failed plan's analytic objective is at least the winner's
    assert all(a.objective >= cert.certified.objective - 1e-9 for a in cert.failed)


def test_without_a_percentile_nothing_is_simulated() -> None:
    problem = _problem(rate=8, ttft_ms=400, tpot_ms=25)
    s = solve(problem, "cpsat", seed=0)
    assert s.certificate is None


def test_same_seed_same_walk() -> None:
    problem = _problem(rate=20, ttft_ms=150, tpot_ms=15, slo_percentile=99)
    a, b = (solve(problem, "cpsat", seed=4) for _ in range(2))
    assert a.certificate == b.certificate and a.plan == b.plan


@pytest.mark.parametrize("method", available_solvers())
def test_every_method_walks(method: str) -> None:
    """Any registered method ranks: the walk certifies what it finds."""
    if method == "rl":
        pytest.importorskip("torch")
    problem = _problem(rate=6, ttft_ms=1000, tpot_ms=40, slo_percentile=90)
    from shardlab.solvers.base import Budget

    budget = None if method == "cpsat" else Budget(max_evals=60)
    s = solve(problem, method, seed=0, budget=budget, baseline=False)
    assert s.certificate is not None and s.certificate.certified is not None


def test_nothing_certified_says_so() -> None:
    problem = _problem(rate=30, ttft_ms=60, tpot_ms=5, slo_percentile=99)
    with pytest.raises(ShardlabError) as e:
        s = solve(problem, "cpsat", seed=0)
        if (err := s.unmet_error()) is not None:
            raise err
    assert e.value.field == "workload.slo_percentile"
    assert "simulated p99" in e.value.message


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0, 100, -5, 150.0])
def test_a_percentile_outside_0_100_is_refused(p: float) -> None:
    with pytest.raises(ShardlabError) as e:
        _problem(ttft_ms=100, slo_percentile=p)
    assert e.value.field == "workload.slo_percentile"


def test_a_percentile_needs_an_slo() -> None:
    with pytest.raises(ShardlabError, match="none is given"):
        _problem(slo_percentile=90)
    with pytest.raises(ShardlabError) as e:
        _problem(ttft_ms=100, tpot_percentile=99)
    assert e.value.field == "workload.tpot_percentile"


def test_the_per_slo_percentile_overrides() -> None:
    w = _problem(ttft_ms=2000, tpot_ms=200, slo_percentile=90, tpot_percentile=99).workload
    assert (w.percentile("ttft_ms"), w.percentile("tpot_ms")) == (90, 99)
    assert "p90 TTFT <= 2000 ms" in w.describe() and "p99 TPOT <= 200 ms" in w.describe()
    mean = w.on_the_mean(ttft_ms=100.0)
    assert not mean.tail and mean.ttft_ms == 100 and mean.tpot_ms == 200


def test_what_the_simulator_cannot_run_is_refused() -> None:
    problem = Problem.build(
        "deepseek-v3", "h200x16", "chat", ttft_ms=2000, slo_percentile=90, draft_tokens=1,
        acceptance=0.7, engine="sglang",
    )  # fmt: skip
    with pytest.raises(ShardlabError) as e:
        solve(problem, "cpsat")
    assert e.value.field == "workload.draft_tokens"


def test_static_batches_have_no_percentile() -> None:
    with pytest.raises(ShardlabError) as e:
        _problem(ttft_ms=100, slo_percentile=90, schedule="static")
    assert e.value.field == "workload.slo_percentile"


def test_a_traffic_without_a_percentile_is_refused() -> None:
    with pytest.raises(ShardlabError) as e:
        solve(_problem(rate=5, ttft_ms=400), "cpsat", traffic=_poisson(5.0, 0))  # type: ignore[arg-type]
    assert e.value.field == "traffic"


# -- the CLI -----------------------------------------------------------------------------


def test_cli_prints_the_claim(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    code, out, err = run_cli(
        [
            "solve", "--model", "llama-3.1-8b", "--cluster", "h100x2", "--engine", "vllm",
            "--space", "engine", "--rate", "8", "--ttft-ms", "400", "--tpot-ms", "25",
            "--slo-percentile", "90",
        ],
        capsys,
        monkeypatch,
    )  # fmt: skip
    assert code == 0, err
    assert "certified: best under the analytic model" in out
    assert "simulated p90 TTFT" in out and "p90 TTFT <= 400 ms" in out


def test_cli_takes_a_trace(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    trace = str(DATA_DIR / "traces" / "AzureLLMInferenceTrace_code_head500.csv")
    code, out, err = run_cli(
        [
            "solve", "--model", "llama-3.1-8b", "--cluster", "h100x2", "--engine", "vllm",
            "--space", "engine", "--traffic", trace, "--ttft-ms", "3000", "--tpot-ms", "100",
            "--slo-percentile", "99", "--format", "json",
        ],
        capsys,
        monkeypatch,
    )  # fmt: skip
    assert code == 0, err
    import json

    data = json.loads(out)
    cert = data["certificate"]
    assert cert["certified"] and "AzureLLMInferenceTrace_code_head500.csv" in cert["traffic"]
    # the analytic model prices the trace's mean request at the trace's rate
    assert data["rate"]["rate_rps"] > 0


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--ttft-ms", "400", "--slo-percentile", "100"], "slo_percentile"),
        (["--slo-percentile", "90"], "slo_percentile"),
        (["--traffic", "nope.csv", "--ttft-ms", "400", "--slo-percentile", "90"], "nope.csv"),
        (["--traffic", "x.csv", "--input-len", "10"], "--input-len"),
    ],
)
def test_cli_refuses_in_one_line(
    args: list[str], field: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    code, _, err = run_cli(
        ["solve", "--model", "llama-3.1-8b", "--cluster", "h100x2", "--rate", "5", *args],
        capsys,
        monkeypatch,
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and field in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("model", "cluster", "tokens", "said"),
    [
        ("llama-3.1-8b", "h100x2", 200_000, "past llama-3.1-8b's context"),
        ("qwen3-8b", "h100x1", 41_000, "past qwen3-8b.s context"),
    ],
)
def test_a_trace_the_plan_cannot_hold_is_refused(
    model: str, cluster: str, tokens: int, said: str
) -> None:
    problem = Problem.build(model, cluster, "chat", **SMALL, rate=1, ttft_ms=20_000,
                            slo_percentile=90)  # type: ignore[arg-type]  # fmt: skip
    long = synthetic_traffic(
        requests=20,
        lengths=Lengths(kind="fixed", input_len=tokens, output_len=64),
        arrivals=Arrivals(kind="poisson", rate=1),
    )
    with pytest.raises(ShardlabError, match=said) as e:
        solve(problem, "cpsat", traffic=long)
    assert e.value.field == "traffic"


def test_explain_gives_the_simulated_percentiles_beside_the_means(
    capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path
) -> None:
    plan = str(tmp_path / "plan.json")
    base = ["--model", "llama-3.1-8b", "--cluster", "h100x2", "--engine", "vllm"]
    code, _, err = run_cli(
        ["solve", *base, "--space", "engine", "--out", plan], capsys, monkeypatch
    )
    assert code == 0, err
    tail = ["--rate", "8", "--ttft-ms", "400", "--tpot-ms", "25", "--slo-percentile", "90"]
    code, out, err = run_cli(["explain", *base, "--plan", plan, *tail], capsys, monkeypatch)
    assert code == 0, err
    assert "simulated under the workload" in out and "p90 TTFT" in out
    assert "p90 TTFT <= 400 ms" in out  # the problem as asked
    code, out, err = run_cli(
        ["evaluate", *base, "--plan", plan, *tail, "--format", "json"], capsys, monkeypatch
    )
    assert code == 0, err
    import json

    got = json.loads(out)["percentiles"]
    assert set(got["simulated_ms"]) == {"ttft_ms", "tpot_ms"}
    assert got["floor_ms"]["tpot_ms"] <= got["simulated_ms"]["tpot_ms"]


def test_compare_records_each_methods_certificate(
    capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path
) -> None:
    import json

    code, _, err = run_cli(
        [
            "compare", "--model", "llama-3.1-8b", "--cluster", "h100x2", "--engine", "vllm",
            "--space", "engine", "--rate", "8", "--ttft-ms", "400", "--tpot-ms", "25",
            "--slo-percentile", "90", "--methods", "cpsat,random", "--seeds", "1",
            "--max-evals", "50", "--jobs", "1", "--results-dir", str(tmp_path),
        ],
        capsys,
        monkeypatch,
    )  # fmt: skip
    assert code == 0, err
    (runs,) = tmp_path.glob("*/runs.jsonl")
    records = [json.loads(line)["run"] for line in runs.read_text().splitlines()]
    assert {"cpsat", "random"} <= {r["method"] for r in records}
    assert all(r["certificate"]["certified"] for r in records)
    # under a trace: each run certified under it, the runs named by it
    trace = str(DATA_DIR / "traces" / "AzureLLMInferenceTrace_code_head500.csv")
    code, _, err = run_cli(
        [
            "compare", "--model", "llama-3.1-8b", "--cluster", "h100x2", "--engine", "vllm",
            "--space", "engine", "--traffic", trace, "--ttft-ms", "3000", "--tpot-ms", "100",
            "--slo-percentile", "99", "--methods", "cpsat", "--seeds", "1", "--jobs", "1",
            "--results-dir", str(tmp_path / "trace"),
        ],
        capsys,
        monkeypatch,
    )  # fmt: skip
    assert code == 0, err
    (runs,) = (tmp_path / "trace").glob("*/runs.jsonl")
    records = [json.loads(line)["run"] for line in runs.read_text().splitlines()]
    cpsat = next(r for r in records if r["method"] == "cpsat")
    assert "AzureLLMInferenceTrace_code_head500.csv" in cpsat["certificate"]["traffic"]
    assert "@AzureLLMInferenceTrace_code_head500.csv-500" in cpsat["instance"]


def test_a_gap_between_tokens_is_an_slo_at_a_percentile_only() -> None:
    """Vidur's TBT: every gap between two tokens. On the mean it is the TPOT; at a
    percentile the simulator's token gaps judge it, and the ranking bounds the mean
    TPOT by it."""
    with pytest.raises(ShardlabError) as e:
        _problem(itl_ms=200)
    assert e.value.field == "workload.itl_ms"
    w = _problem(ttft_ms=2000, ttft_percentile=90, itl_ms=200, itl_percentile=99).workload
    assert w.tail and w.percentile("itl_ms") == 99 and w.percentile("tpot_ms") is None
    assert w.on_the_mean().tpot_ms == 200 and w.on_the_mean(itl_ms=150.0).tpot_ms == 150
    problem = _problem(rate=8, ttft_ms=2000, ttft_percentile=90, itl_ms=200, itl_percentile=99)
    s = solve(problem, "cpsat", seed=0)
    cert = s.certificate
    assert cert is not None and cert.certified is not None
    assert set(cert.slos) == {"ttft_ms", "itl_ms"}
    won = cert.certified
    assert won.floor_ms["itl_ms"] <= won.simulated_ms["itl_ms"] <= 200
    assert "simulated p99 ITL <= 200 ms" in cert.claim and "mean TPOT <= 200 ms" in cert.claim


def test_on_the_mean_a_trace_gives_the_workload_its_mean_request_only(
    capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """`solve --traffic` with SLOs on the mean: the trace's mean lengths and rate, no
    simulation (it was refused: the traffic reached the solve unasked)."""
    import json

    trace = str(DATA_DIR / "traces" / "AzureLLMInferenceTrace_code_head500.csv")
    code, out, err = run_cli(
        ["solve", "--model", "llama-3.1-8b", "--cluster", "h100x2", "--engine", "vllm",
         "--space", "engine", "--traffic", trace, "--ttft-ms", "3000", "--format", "json"],
        capsys,
        monkeypatch,
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert "certificate" not in data
    assert data["rate"]["rate_rps"] == pytest.approx(2.14346, rel=1e-4)
