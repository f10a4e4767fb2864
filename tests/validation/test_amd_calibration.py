"""AMD's GPUs: InferenceX's measured runs, the calibrations fitted to them and shipped,
applied by default, and said so in every output."""

from __future__ import annotations

import csv
import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from shardlab import ShardlabError
from shardlab.cli.render import timing_label, timing_source
from shardlab.costmodel import evaluate
from shardlab.problems.calibration import Calibration, shipped_for, shipped_name
from shardlab.problems.cluster import parse_cluster
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from shardlab.validation import load_measurements
from shardlab.validation.calibrate import calibrate
from tests.conftest import DATA_DIR, run_cli

AMD = DATA_DIR / "percentiles" / "measured_percentiles_amd.csv"
BLACKWELL = DATA_DIR / "percentiles" / "measured_percentiles_blackwell.csv"
CALIBRATIONS = Path(__file__).parents[2] / "shardlab" / "data" / "calibrations"


def _runs(path: Path) -> Counter[tuple[str, str, str]]:
    """Runs (not rows) per (cluster's GPU, engine, weights)."""
    seen: dict[str, tuple[str, str, str]] = {}
    for r in csv.DictReader(path.read_text().splitlines()):
        seen[r["id"]] = (r["cluster"].rsplit("x", 1)[0], r["engine"], r["weight_dtype"])
    return Counter(seen.values())


def test_the_amd_runs_are_read_each_on_its_gpu() -> None:
    assert _runs(AMD) == {
        ("mi300x", "sglang", "fp8"): 106,
        ("mi325x", "sglang", "fp8"): 100,
        ("mi355x", "sglang", "fp8"): 109,
        ("mi355x", "sglang", "fp4"): 112,
    }
    measured = load_measurements(AMD)
    assert not measured.refused
    assert {m.gpu for m in measured.rows} == {"mi300x", "mi325x", "mi355x"}
    assert {m.engine for m in measured.rows} == {"sglang"}
    assert {m.statistic for m in measured.rows} == {"mean", "median", "p90", "p99"}
    means = Counter(m.gpu for m in measured.rows if m.statistic == "mean" and m.metric == "tpot_ms")
    assert means == {"mi300x": 25, "mi325x": 19, "mi355x": 40}
    only = load_measurements(AMD, {"gpu": ["mi355x"]})
    assert {m.gpu for m in only.rows} == {"mi355x"} and len(only.rows) < len(measured.rows)
    with pytest.raises(ShardlabError, match="no row on gpu h100"):
        load_measurements(AMD, {"gpu": ["h100"]})


def test_the_rack_scale_and_b300_runs_are_read() -> None:
    runs = _runs(BLACKWELL)
    assert {gpu for gpu, _, _ in runs} == {"b300", "gb200", "gb300"}
    assert sum(runs.values()) == 278
    measured = load_measurements(BLACKWELL)
    assert {m.gpu for m in measured.rows} == {"b300", "gb200", "gb300"}
    # a GB200 deployment is whole hosts of 4 GPUs, not nodes of 8
    gb = [m for m in measured.rows if m.gpu == "gb200"]
    assert all(m.cluster.num_gpus % 4 == 0 for m in gb)
    assert any(m.cluster.num_gpus % 8 for m in gb)


def test_a_problem_on_an_amd_gpu_takes_the_shipped_fit_of_its_generation() -> None:
    problem = Problem.build("deepseek-v3", "mi300xx8", "chat", engine="sglang")
    assert problem.calibration is not None and problem.calibration == shipped_for("mi300x")
    assert shipped_name(problem.calibration) == "amd-cdna3"
    assert shipped_name(shipped_for("mi325x")) == "amd-cdna3"
    assert shipped_name(shipped_for("mi355x")) == "amd-cdna4"
    assert shipped_for("h100") is None
    plan = problem.space.megatron_plan(Degrees(tp=8, etp=8))
    bare = dataclasses.replace(problem, calibration=Calibration())  # no correction at all
    assert evaluate(problem, plan).tpot_ms != pytest.approx(evaluate(bare, plan).tpot_ms)
    # a problem moved to other GPUs (sizing does) takes theirs: none on NVIDIA's
    assert dataclasses.replace(problem, cluster=parse_cluster("h200x8")).calibration is None
    moved = dataclasses.replace(problem, cluster=parse_cluster("mi355xx8"))
    assert shipped_name(moved.calibration) == "amd-cdna4"


def test_a_users_calibration_replaces_the_shipped_one(tmp_path: Path) -> None:
    mine = Calibration(gemm=2.0, fitted_on="my runs")
    path = tmp_path / "mine.yaml"
    path.write_text(mine.to_yaml())
    for given in (mine, path):
        problem = Problem.build(
            "deepseek-v3", "mi355xx8", "chat", engine="sglang", calibration=given
        )
        assert problem.calibration == mine and shipped_name(mine) is None
        # and it stays the user's on any GPU
        assert dataclasses.replace(problem, cluster=parse_cluster("h100x16")).calibration == mine


def test_the_outputs_say_the_timing_is_a_calibrated_roofline_and_name_the_fit() -> None:
    amd = Problem.build("deepseek-v3", "mi325xx8", "chat", engine="sglang")
    label = timing_label(amd)
    assert label.startswith("roofline-calibrated timing")
    assert "no measured kernels of mi325x" in label and "amd-cdna3" in label
    assert timing_source("mi355x") == "roofline-calibrated (amd-cdna4)"
    assert timing_source("h100") == "silicon" and timing_source("l4") == "roofline"
    mine = dataclasses.replace(amd, calibration=Calibration(gemm=2.0))
    assert timing_label(mine) == "roofline timing (no measured kernels of mi325x), calibrated"
    nvidia = Problem.build("deepseek-v3", "h100x16", "chat")
    assert timing_label(nvidia) == "silicon timing (trtllm measurements)"


@pytest.mark.parametrize(
    ("name", "gpus", "rows"),
    [("amd-cdna3", ["mi300x", "mi325x"], 88), ("amd-cdna4", ["mi355x"], 80)],
)
def test_the_shipped_fits_are_what_calibrate_writes_from_the_committed_runs(
    name: str, gpus: list[str], rows: int
) -> None:
    """Each shipped fit, re-fitted from the committed runs with one factor shared by
    every kernel class: a fit starts from no correction, not from the GPU's shipped one
    (else each re-fit would move it)."""
    index = yaml.safe_load((CALIBRATIONS / "defaults.yaml").read_text())
    assert index == {"mi300x": "amd-cdna3.yaml", "mi325x": "amd-cdna3.yaml",
                     "mi355x": "amd-cdna4.yaml"}  # fmt: skip
    measured = load_measurements(AMD, {"gpu": gpus}).rows
    report = calibrate(measured, "roofline", "sglang", hold_out=("row",), tie="shared")
    shipped = Calibration.load(CALIBRATIONS / f"{name}.yaml")
    # to the fit's own accuracy: least_squares stops at its default tolerances, where
    # another numpy or BLAS moves the factors by ~1e-6 (found by CI) and a stop at
    # 1e-15 moves iteration_ms by 2e-4; a stale or hand-edited fit is further off
    for key in ("gemm", "attention", "moe", "communication", "request_ms", "iteration_ms"):
        assert getattr(report.calibration, key) == pytest.approx(getattr(shipped, key), rel=1e-3)
    assert f"{','.join(gpus)}: {rows} rows, roofline timing, sglang" in shipped.fitted_on
    assert "kernel factors tied shared" in shipped.fitted_on


def test_a_shipped_file_given_by_the_user_is_theirs_on_any_gpu(tmp_path: Path) -> None:
    """Read from shardlab's own file, the CDNA 3 fit given for an MI355X stays the one
    given (the held-out check does this), not swapped for the MI355X's shipped fit."""
    given = Calibration.load(CALIBRATIONS / "amd-cdna3.yaml")
    assert given == shipped_for("mi300x") and shipped_name(given) is None
    problem = Problem.build("deepseek-v3", "mi355xx8", "chat", engine="sglang", calibration=given)
    assert problem.calibration is given
    assert "shipped" not in given.to_yaml()
    path = tmp_path / "claims.yaml"
    path.write_text("gemm: 1.0\nshipped: amd-cdna3\n")
    with pytest.raises(ShardlabError, match="unknown keys shipped"):
        Calibration.load(path)


def test_clusters_and_evaluate_say_it_on_the_command_line(capsys, monkeypatch) -> None:
    code, out, _ = run_cli(["clusters", "--format", "json"], capsys, monkeypatch)
    timing = {c["key"]: c["timing"] for c in json.loads(out)}
    assert code == 0 and timing["mi300x"] == "roofline-calibrated (amd-cdna3)"
    assert timing["b200"] == "silicon"
    argv = ["evaluate", "--model", "deepseek-v3", "--cluster", "mi355xx8", "--engine", "sglang"]
    code, out, _ = run_cli([*argv, "--tp", "8"], capsys, monkeypatch)
    assert code == 0
    assert "roofline-calibrated timing (no measured kernels of mi355x" in " ".join(out.split())
    assert "calibration amd-cdna4" in " ".join(out.split())


def test_a_replay_prices_an_amd_row_under_the_factors_it_is_given() -> None:
    """Factors of 1 are no correction on an AMD GPU too: the replay's tables are not
    priced under the shipped fit's factors (which "no calibration" means there)."""
    from shardlab.validation.replay import _plain

    costs_only = Calibration(iteration_ms=1.0, simulated_request_ms=0.0)
    amd = Problem.build("deepseek-v3", "mi300xx8", "chat", engine="sglang", calibration=costs_only)
    plain = _plain(amd).calibration
    assert plain is not None and plain.factor("gemm") == 1.0 and plain.request_ms is None
    shipped = _plain(Problem.build("deepseek-v3", "mi300xx8", "chat", engine="sglang"))
    assert shipped.calibration is not None and shipped.calibration.request_ms is None
    assert shipped.calibration.gemm == shipped_for("mi300x").gemm  # type: ignore[union-attr]
    nvidia = Problem.build("deepseek-v3", "h200x8", "chat", calibration=costs_only)
    assert _plain(nvidia).calibration is None  # the shipped costs' tables, shared
