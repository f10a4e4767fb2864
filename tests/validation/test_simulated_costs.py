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
    fit_request_ms,
    fit_through_simulator,
    replay_without_request_cost,
    with_load,
)
from tests.cli.conftest import run


def _rows(n: int = 6):
    sample = read_sample(mode=["agg"], protocol=["inferencex"], gpu=["h100"]).rows
    ttft = [m for m in sample if m.metric == "ttft_ms" and m.family == "llama-3.1"]
    return ttft[:n]


def test_a_replay_without_the_request_cost_is_the_replay_less_it() -> None:
    """The per-request cost adds to every TTFT: a replay under a cost of 25 ms is the
    replay under none, plus 25 ms, row by row; so one replay serves every cost tried."""
    rows = _rows()
    assert rows
    none = replay_without_request_cost(rows, "silicon")
    assert len(none) == len(rows)

    def cal(m):
        return Calibration(timing="silicon", simulated_request_ms=25.0)

    some = replay([with_load(m) for m in rows], "silicon", calibration=cal)
    for a, b in zip(none, some, strict=True):
        assert b.simulated == pytest.approx(a.simulated_ms + 25.0, abs=1e-6)
    # the sample's rows state their closed loop in their workload
    m = with_load(rows[0])
    assert m.clients == rows[0].problem.workload.clients and m.prompts_per_client == 10
    assert m.length_range == 0.8  # InferenceX's random range ratio


def _fake(values: list[tuple[str, str, float, float]]) -> list[Replayed0]:
    base = _rows(1)[0]
    return [
        Replayed0(
            measurement=dataclasses.replace(base, family=f, value=measured),
            engine=e,
            simulated_ms=sim,
        )
        for e, f, sim, measured in values
    ]


def test_the_fit_finds_the_constant_the_measurements_hold() -> None:
    """Rows measured at the simulated TTFT plus 40 ms (sglang) and 7 ms (vllm): the fit
    recovers each to the grid's step, and a family held out is judged by the fit of
    the others."""
    rng = np.random.default_rng(0)
    values = []
    for e, r in (("sglang", 40.0), ("vllm", 7.0)):
        for f in ("a", "b", "c"):
            for sim in rng.uniform(50, 500, size=15):
                values.append((e, f, float(sim), float(sim + r)))
    rows = _fake(values)
    assert fit_request_ms(rows) == pytest.approx({"sglang": 40.0, "vllm": 7.0}, abs=0.5)
    fit = fit_through_simulator(rows)
    assert fit.in_sample["sglang"] < 0.01 and fit.family_held_out["sglang"] < 0.01
    assert fit.without["sglang"] > 0.05
    assert fit.rows == {"sglang": 45, "vllm": 45}
    # no room left: a simulation already above every measurement fits no cost
    over = _fake([("sglang", "a", 200.0, 100.0), ("sglang", "b", 300.0, 250.0)])
    assert fit_request_ms(over) == {"sglang": 0.0}


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
    assert set(engines["vllm"]) == {"request_ms", "iteration_ms", "simulated_request_ms"}
    assert "--simulate" in (tmp_path / "engines.yaml").read_text().splitlines()[1]
    report = (tmp_path / "fit.md").read_text()
    assert "## The per-request cost through the simulator" in report
    assert f"| vllm | 101 | {engines['vllm']['simulated_request_ms']:.1f} |" in report
    assert "ms per request in the simulator" in out
