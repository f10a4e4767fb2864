"""The engine's per-request cost fitted through the simulator."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from shardlab.problems.calibration import Calibration
from shardlab.validation.replay import replay
from shardlab.validation.serving_sample import read_sample
from shardlab.validation.simulated_costs import (
    Replayed0,
    fit_costs,
    fit_through_simulator,
    replay_without_costs,
    with_load,
)
from tests.cli.conftest import run


def _rows(n: int = 6):
    sample = read_sample(mode=["agg"], protocol=["inferencex"], gpu=["h100"]).rows
    return [m for m in sample if m.family == "llama-3.1"][:n]


def test_a_replay_without_costs_moves_by_them() -> None:
    """The per-request cost adds to every TTFT: a replay under 25 ms a request is the
    replay under none plus 25 ms, row by row; the per-iteration cost moves TPOT by the
    slope the two replays measure (here to within 1%: it moves the scheduling little)."""
    rows = _rows()
    assert rows
    none = replay_without_costs(rows, "silicon")
    assert len(none) == len(rows) and {r.measurement.metric for r in none} == {
        "ttft_ms",
        "tpot_ms",
    }
    assert all(r.slope > 0 for r in none if r.measurement.metric == "tpot_ms")

    def cal(m):
        return Calibration(timing="silicon", simulated_request_ms=25.0, iteration_ms=0.5)

    some = replay([with_load(m) for m in rows], "silicon", calibration=cal)
    for a, b in zip(none, some, strict=True):
        assert b.simulated == pytest.approx(a.at(0.5, 25.0), rel=0.01)
        if a.measurement.metric == "ttft_ms":
            # exactly the request cost apart from the iteration's share
            assert b.simulated - 25.0 == pytest.approx(a.at(0.5), rel=0.01)
    # the sample's rows state their closed loop in their workload
    m = with_load(rows[0])
    assert m.clients == rows[0].problem.workload.clients and m.prompts_per_client == 10
    assert m.length_range == 0.8  # InferenceX's random range ratio


def _fake(values: list[tuple[str, str, str, float, float, float]]) -> list[Replayed0]:
    base = _rows(1)[0]
    return [
        Replayed0(
            measurement=dataclasses.replace(base, family=f, metric=metric, value=measured),
            engine=e,
            simulated_ms=sim,
            slope=slope,
        )
        for e, f, metric, sim, slope, measured in values
    ]


def test_the_fit_finds_the_costs_the_measurements_hold() -> None:
    """Rows measured at the simulated TPOT plus 0.8 ms a step (sglang; vllm 0.2) and
    TTFT plus that plus 40 ms (vllm 7): the fit recovers each to its grid's step, and a
    family held out is judged by the fit of the others."""
    rng = np.random.default_rng(0)
    values = []
    for e, r, it in (("sglang", 40.0, 0.8), ("vllm", 7.0, 0.2)):
        for f in ("a", "b", "c"):
            for sim in rng.uniform(50, 500, size=15):
                slope = float(rng.uniform(1, 3))
                values.append((e, f, "tpot_ms", sim / 20, slope, sim / 20 + slope * it))
                values.append((e, f, "ttft_ms", sim, 2.0, sim + 2.0 * it + r))
    rows = _fake(values)
    request, iteration = fit_costs(rows)
    assert request == pytest.approx({"sglang": 40.0, "vllm": 7.0}, abs=0.5)
    assert iteration == pytest.approx({"sglang": 0.8, "vllm": 0.2}, abs=0.01)
    fit = fit_through_simulator(rows)
    assert fit.in_sample[("sglang", "ttft_ms")] < 0.01
    assert fit.family_held_out[("sglang", "tpot_ms")] < 0.01
    assert fit.without[("sglang", "ttft_ms")] > 0.05
    assert fit.rows[("vllm", "tpot_ms")] == 45
    # no room left: a simulation already above every measurement fits no cost
    over = _fake([("sglang", "a", "ttft_ms", 200.0, 1.0, 100.0)])
    assert fit_costs(over) == ({"sglang": 0.0}, {"sglang": 0.0})


def test_simulate_without_engines_is_refused_in_one_line(tmp_path: Path) -> None:
    code, out, err = run(["calibrate", "--measurements", "aiconfigurator-sample", "--simulate"],
                         tmp_path)  # fmt: skip
    assert code == 2 and out == ""
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "--engines" in lines[0]


@pytest.mark.slow
def test_calibrate_engines_simulate_writes_the_simulators_cost(tmp_path: Path) -> None:
    """From the command line: the engine file holds each engine's cost through the
    simulator beside the forms' own, and the report a table of its errors."""
    import yaml

    code, out, err = run(
        ["calibrate", "--measurements", "aiconfigurator-sample", "--mode", "agg",
         "--protocol", "inferencex", "--gpu", "h100", "--family", "llama-3.1,gpt-oss",
         "--timing", "silicon", "--hold-out", "family", "--engines", "--simulate",
         "--out", "engines.yaml",
         "--report", "fit.md"],
        tmp_path,
    )  # fmt: skip
    assert code == 0, err
    engines = yaml.safe_load((tmp_path / "engines.yaml").read_text())["engines"]
    assert set(engines["vllm"]) == {
        "request_ms",
        "iteration_ms",
        "simulated_request_ms",
        "simulated_iteration_ms",
    }
    assert "--simulate" in (tmp_path / "engines.yaml").read_text().splitlines()[1]
    report = (tmp_path / "fit.md").read_text()
    assert "## The engine costs through the simulator" in report
    v = engines["vllm"]
    line = f"| vllm | {v['simulated_request_ms']:.1f} | {v['simulated_iteration_ms']:.2f} |"
    assert line in report
    assert "| vllm | ttft_ms | 101 |" in report and "| vllm | tpot_ms | 101 |" in report
    assert "ms per iteration in the simulator" in out
