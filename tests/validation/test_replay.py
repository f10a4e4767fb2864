"""Measured rows replayed in the simulator (shardlab.validation.replay): each row's
statistic read off a run of its own load through its own deployment, beside the
analytic mean, and the engine costs of a held-out replay fitted without the row's
group."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from shardlab.problems.calibration import Calibration
from shardlab.simulate import Deployment, simulate
from shardlab.validation import load_measurements, predict
from shardlab.validation.held_out import held_out_costs
from shardlab.validation.replay import replay, replayable
from shardlab.validation.replay_report import by_statistic, goals
from tests.cli.conftest import run
from tests.validation.test_protocol import GOOD, _file


def test_each_row_is_its_statistic_of_a_run_of_its_load(tmp_path: Path) -> None:
    rows = load_measurements(_file(tmp_path, GOOD)).rows
    todo = replayable(rows)
    assert {m.id for m in todo} == {"m", "o", "g", "d"}
    out = replay(todo, "silicon", "vllm")
    first = out[0].measurement
    problem = dataclasses.replace(first.problem, timing="silicon", engine="vllm")
    plan = problem.space.megatron_plan(first.degrees)
    sim = simulate(Deployment.of_plan(problem, plan), first.traffic(0))
    by = {(r.measurement.id, r.measurement.metric, r.measurement.statistic): r for r in out}
    assert by[("m", "ttft_ms", "p99")].simulated == pytest.approx(sim.latency("ttft_ms", "p99"))
    assert by[("m", "tpot_ms", "median")].simulated == pytest.approx(
        sim.latency("tpot_ms", "median")
    )
    # the analytic model's mean of the same metric, beside every statistic
    mean = predict(dataclasses.replace(first, statistic="mean"), "silicon", "vllm").predicted
    assert by[("m", "ttft_ms", "p99")].analytic_mean == pytest.approx(mean)
    assert by[("m", "ttft_ms", "mean")].analytic_mean == pytest.approx(mean)
    # a tail is above its median, a run's p99 above its mean
    assert by[("m", "ttft_ms", "p99")].simulated > by[("m", "ttft_ms", "mean")].simulated
    # open arrivals and a disaggregated row run too
    assert by[("o", "ttft_ms", "p99.9")].simulated > 0
    assert by[("d", "tpot_ms", "mean")].simulated > 0
    table = by_statistic(out)
    assert table[("ttft_ms", "p99")]["simulated"]["rows"] == 1


def test_a_calibration_moves_the_fixed_costs_of_a_replay(tmp_path: Path) -> None:
    """The request cost is in every TTFT and nothing else: 100 ms more per request is
    100 ms more on the median TTFT, and leaves TPOT."""
    rows = [m for m in load_measurements(_file(tmp_path, GOOD)).rows if m.id == "m"]
    base = replay(rows, "silicon", "vllm", calibration=lambda m: Calibration(timing="silicon",
                  request_ms=0.0))  # fmt: skip
    more = replay(rows, "silicon", "vllm", calibration=lambda m: Calibration(timing="silicon",
                  request_ms=100.0))  # fmt: skip
    for a, b in zip(base, more, strict=True):
        gap = b.simulated - a.simulated
        if a.measurement.metric in ("ttft_ms", "e2e_ms"):
            assert gap == pytest.approx(100.0)
        else:
            assert gap == pytest.approx(0.0, abs=1e-9)


def test_a_row_too_long_for_its_cache_is_not_simulated_and_says_why(tmp_path: Path) -> None:
    # 70B on two H100: weights leave a few GB of cache per GPU
    long = "x,llama-3.1-70b,h100x2,2,request,inflight,8,60000,1000,ttft_ms,p99,1,2,2,,,,,\n"
    (r,) = replay(replayable(load_measurements(_file(tmp_path, long)).rows), "silicon", "vllm")
    assert r.simulated is None and "not simulated" in r.note and "KV cache" in r.note


@pytest.mark.slow
def test_held_out_costs_are_fitted_without_the_rows_group() -> None:
    """A row's held-out engine costs are a fit on every other family's rows: the same
    numbers as fitting those rows directly, and not the fit on all of them."""
    from shardlab.validation.calibrate import Rows, fit, linearize
    from shardlab.validation.serving_sample import read_sample
    from shardlab.validation.simulated_costs import Replayed0

    sample = read_sample(mode=["agg"], protocol=["inferencex"], gpu=["h100"]).rows
    row = sample[0]
    # replays that leave 10 ms to the row's family and 30 ms to the others
    replayed = [
        Replayed0(measurement=m, engine=m.engine or "", simulated_ms=m.value - gap, slope=1.0)
        for m in sample
        for gap in [(10.0 if m.family == row.family else 30.0) * (m.metric == "ttft_ms")]
    ]
    costs = held_out_costs("family", "silicon", sample=sample, replayed=replayed)
    others = [m for m in sample if m.family != row.family]
    assert others and len(others) < len(sample)
    direct = fit(Rows([linearize(m, "silicon", m.engine) for m in others]), factors=False,
                 per_engine=True)  # fmt: skip
    everyone = fit(Rows([linearize(m, "silicon", m.engine) for m in sample]), factors=False,
                   per_engine=True)  # fmt: skip
    got = costs(row)
    assert got.request_ms == pytest.approx(direct.request_ms[row.engine])
    assert got.request_ms != pytest.approx(everyone.request_ms[row.engine])
    assert f"without family {row.family}" in got.fitted_on
    # the simulator's per-request cost: fitted through it, on the other families too
    assert got.simulated_request_ms == 30.0 and got.simulated_iteration_ms == 0.0


def test_the_goals_say_by_how_much_they_are_missed(tmp_path: Path) -> None:
    rows = replay(replayable(load_measurements(_file(tmp_path, GOOD)).rows), "silicon", "vllm")
    text = "\n".join(goals(rows))
    assert "p99 ttft_ms, median error" in text
    assert ("missed by" in text) or ("met" in text)


def test_validate_replays_and_reports_each_statistic(tmp_path: Path) -> None:
    path = _file(tmp_path, GOOD)
    code, out, err = run(["validate", "--measurements", str(path), "--out", "v.md"], tmp_path)
    assert code == 0, err
    assert "| shipped costs | ttft_ms | p99 | 1 |" in out
    report = (tmp_path / "v.md").read_text()
    assert "## Replayed in the simulator, each statistic apart" in report
    assert (tmp_path / "v.replay.csv").read_text().count("\n") == 1 + len(
        replayable(load_measurements(path).rows)
    )
    code, out, _ = run(
        ["validate", "--measurements", str(path), "--no-replay", "--format", "json"], tmp_path
    )
    assert code == 0 and json.loads(out)["replayed"] == {}
    code, _, err = run(
        ["validate", "--measurements", str(path), "--no-replay", "--hold-out", "gpu"], tmp_path
    )
    assert code == 2 and "drop --no-replay" in err


def test_the_goals_read_a_rows_family_from_its_model(tmp_path: Path) -> None:
    """Rows that name no family are grouped by their model (as the hold-outs group
    them): the per-(family, engine) goal names it."""
    rows = replay(replayable(load_measurements(_file(tmp_path, GOOD)).rows), "silicon", "vllm")
    assert "(llama-3.1-8b, vllm) mean TTFT" in "\n".join(goals(rows))


def test_the_report_names_the_command_with_its_replay_flags(tmp_path: Path) -> None:
    path = _file(tmp_path, GOOD)
    argv = ["validate", "--measurements", str(path), "--no-replay", "--out", "v.md"]
    code, _, err = run(argv, tmp_path)
    assert code == 0, err
    produced = (tmp_path / "v.md").read_text().splitlines()[2]
    assert produced.startswith("Produced by `shardlab validate") and "--no-replay" in produced
