"""Validation against measurements, users' measurement files, and calibration."""

from __future__ import annotations

import csv
import dataclasses
from importlib import resources
from pathlib import Path

import pytest

from shardlab import ShardlabError
from shardlab.problems.calibration import Calibration
from shardlab.validation import (
    against_reference,
    agreement_summary,
    builtin_measurements,
    load_measurements,
    predict,
    predict_all,
    write_report,
)
from shardlab.validation.calibrate import calibrate, linearize
from tests.conftest import DATA_DIR, cli_process

TIMINGS = ("roofline", "silicon")


def test_every_published_row_is_predicted_and_reported(tmp_path: Path) -> None:
    ids = {r["id"] for r in csv.DictReader(builtin_measurements().read_text().splitlines())}
    heard: list[tuple[int, int]] = []
    by_timing = {
        t: predict_all(t, progress=lambda d, n: heard.append((d, n)))
        for t in ("roofline", "silicon")
    }
    n = len(ids)
    assert heard == [(d, n) for d in range(1, n + 1)] * 2  # each row once, per timing
    for rows in by_timing.values():
        assert [r.id for r in rows] == [r.id for r in by_timing["roofline"]]
        assert {r.id for r in rows} == ids
        # A sanity bound, not the accuracy goal (that is results/validation.md): 3x off
        # means a broken mapping or unit, not a modeling error.
        for r in rows:
            assert 1 / 3 < r.ratio < 3, (r.id, r.predicted, r.measured)
    report = tmp_path / "validation.md"
    summaries = write_report(by_timing, "test", "test", path=report)
    body = report.read_text()
    assert all(f"| {i} |" in body for i in ids)
    assert all(0 <= s["median_abs_error"] < 1 for s in summaries.values())


HEADER = "id,model,cluster,tp,dp_attn,ep,phase,schedule,batch,input_len,output_len,weight_dtype,"
USER_CSV = (
    HEADER
    + """metric,value
a,my-model.json,h100x2,2,,,request,inflight,512,1000,200,fp8,throughput_tok_s,3000
b,llama-3.1-8b,h100x1,1,,,decode,static,64,2048,128,,tpot_ms,9.5
c,mixtral-8x7b,h100x4,1,4,4,request,inflight,256,1024,256,,ttft_ms,400
"""
)


def _user_file(tmp_path: Path, text: str = USER_CSV) -> Path:
    models = resources.files("shardlab.problems") / "data" / "models"
    config = (models / "meta-llama--Meta-Llama-3.1-8B.json").read_text()
    (tmp_path / "my-model.json").write_text(config)
    path = tmp_path / "mine.csv"
    path.write_text(text)
    return path


def test_a_users_measurements_are_read_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    rows = load_measurements(_user_file(tmp_path)).rows
    assert [m.id for m in rows] == ["a", "b", "c"]
    a, b, c = rows
    assert a.problem is not None and a.problem.workload.weight_dtype == "fp8"
    assert a.degrees is not None and a.degrees.tp == 2 and a.degrees.etp == 2
    assert c.degrees is not None and (c.degrees.dp_attn, c.degrees.ep, c.degrees.etp) == (4, 4, 1)
    assert b.problem is not None and b.problem.workload.schedule == "static"
    for m in rows:
        row = predict(m, "silicon")
        assert row.predicted > 0 and row.measured == m.value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("id,metric,value\na,tpot_ms,1\n", "missing column"),
        ("id,model,cluster,tp,metric,value\na,llama-3.1-8b,h100x1,1,speed,3\n", "metric 'speed'"),
        ("id,model,cluster,tp,metric,value\na,llama-3.1-8b,h100x1,1,tpot_ms,-1\n", "positive"),
        (
            "id,model,cluster,tp,metric,value\na,llama-3.1-8b,h100x2,1,tpot_ms,1\n",
            "the cluster has 2",
        ),
        ("id,model,cluster,tp,metric,value\na,llama-3.1-8b,h100x1,x,tpot_ms,1\n", "integer"),
        ("id,model,cluster,tp,metric,value\na,,h100x1,1,tpot_ms,1\n", "needs model"),
        ("id,model,cluster,tp,metric,value\n", "no rows"),
        ("id,model,cluster,tp,metric,value\na,x,h100x1,1,tpot_ms,1\n", "no row could be read"),
    ],
)
def test_a_bad_measurements_file_is_refused_in_one_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ShardlabError, match=message) as info:
        load_measurements(path)
    assert "\n" not in str(info.value)


def test_a_file_of_many_rows_reports_the_good_ones_and_refuses_the_bad(tmp_path: Path) -> None:
    """Bad rows anywhere in a file are refused with their line and reason; the others
    are read and predicted."""
    bad = (
        "d,llama-3.1-8b,h100x1,1,,,request,inflight,64,1024,256,,speed,3\n"
        "e,llama-3.1-8b,h100x2,1,,,request,inflight,64,1024,256,,tpot_ms,9\n"
        "f,no-such-model,h100x1,1,,,request,inflight,64,1024,256,,tpot_ms,9\n"
        "g,llama-3.1-8b,h100x1,1,,,request,inflight,64,1024,256,,tpot_ms,-2\n"
    )
    measured = load_measurements(_user_file(tmp_path, USER_CSV + bad))
    assert [m.id for m in measured.rows] == ["a", "b", "c"]
    assert [(x.id, x.line) for x in measured.refused] == [("d", 5), ("e", 6), ("f", 7), ("g", 8)]
    reasons = [x.reason for x in measured.refused]
    assert "metric 'speed'" in reasons[0] and "the cluster has 2" in reasons[1]
    assert "no-such-model" in reasons[2] and "positive" in reasons[3]
    assert all("\n" not in r for r in reasons)
    assert all(predict(m, "silicon").predicted > 0 for m in measured.rows)


def test_the_calibrated_cost_model_is_the_linearized_fit() -> None:
    """Applying a calibration through the cost model gives what the fit optimized."""
    cal = Calibration(
        gemm=1.3, attention=0.7, moe=1.5, communication=1.2, iteration_ms=0.8, request_ms=20.0
    )
    for m in load_measurements().rows:
        if m.problem is None or m.degrees is None or m.degrees.pp != 1:
            continue
        for timing in ("roofline", "silicon"):
            lin = linearize(m, timing, "trtllm")
            want = predict(m, timing, "trtllm", dataclasses.replace(cal, timing=timing))
            assert lin.predict(cal) == pytest.approx(want.predicted, rel=1e-6), (m.id, timing)


def test_calibrate_recovers_known_corrections_and_cross_validates() -> None:
    """Measurements made by a known calibration are explained by the fit, and each left
    out row is predicted from the others."""
    truth = Calibration(gemm=1.25, attention=0.8, communication=1.1, iteration_ms=1.0)
    published = [
        m for m in load_measurements().rows if m.problem is not None and m.problem.model.moe is None
    ]
    made = [
        dataclasses.replace(m, value=predict(m, "silicon", "trtllm", truth).predicted)
        for m in published
    ]
    heard: list[tuple[int, int]] = []
    report = calibrate(
        made, "silicon", "trtllm", "synthetic", progress=lambda d, n: heard.append((d, n))
    )
    assert heard == [(d, len(made)) for d in range(1, len(made) + 1)]
    s = report.summary()
    assert s["median_before"] > 0.1
    assert s["median_after"] < 0.02 and s["median_cross_validated"] < 0.05
    got = report.calibration
    assert got.gemm == pytest.approx(truth.gemm, rel=0.1)
    assert "leave-one-out" in got.fitted_on and got.timing == "silicon"


def test_calibration_file_round_trip_and_refusals(tmp_path: Path) -> None:
    cal = Calibration(gemm=1.1, iteration_ms=0.5, timing="silicon", fitted_on="x")
    path = tmp_path / "cal.yaml"
    path.write_text(cal.to_yaml())
    assert Calibration.load(path) == cal
    path.write_text("gemm: -1\n")
    with pytest.raises(ShardlabError, match="gemm must be a positive factor"):
        Calibration.load(path)
    path.write_text("speed: 2\n")
    with pytest.raises(ShardlabError, match="unknown keys speed"):
        Calibration.load(path)


# 20-32 s on two loaded cores: validate, calibrate and a re-validation end to end
@pytest.mark.slow
def test_cli_validate_calibrate_and_apply_on_a_users_file(tmp_path: Path) -> None:
    path = _user_file(tmp_path)
    done = cli_process("validate", "--measurements", str(path), "--out", "v.md", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "silicon: median |error|" in done.stdout
    assert (tmp_path / "v.md").read_text().count("\n| ") >= 4
    before = sorted(p.name for p in tmp_path.iterdir())
    done = cli_process(
        "calibrate", "--measurements", str(path), "--timing", "silicon", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "leave-one-out" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing asked, none written
    done = cli_process(
        "calibrate", "--measurements", str(path), "--timing", "silicon", "--out", "cal.yaml",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "cal.yaml").exists()
    done = cli_process(
        "evaluate", "--model", "llama-3.1-8b", "--cluster", "h100x1", "--tp", "1",
        "--timing", "silicon", "--calibration", "cal.yaml", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "silicon timing (trtllm measurements), calibrated" in " ".join(done.stdout.split())
    done = cli_process("validate", "--measurements", str(path), "--format", "json", cwd=tmp_path)
    assert done.returncode == 0 and not (tmp_path / "validation.md").exists()
    done = cli_process("validate", "--measurements", "missing.csv", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1


def test_silicon_agrees_with_aiconfigurator_better_than_the_roofline() -> None:
    """tests/data/aiconfigurator_agg.csv (made by tests/data/make_aiconfigurator_agg.py):
    measured kernels bring TPOT and throughput closer to the estimator built on the same
    tables. The exact medians are in results/aiconfigurator.md."""
    grid = DATA_DIR / "aiconfigurator_agg.csv"
    medians = {t: agreement_summary(against_reference(grid, t, every=5)) for t in TIMINGS}
    assert medians["silicon"]["tpot_ms"] < medians["roofline"]["tpot_ms"]
    assert medians["silicon"]["tokens_s"] < medians["roofline"]["tokens_s"]
    assert medians["silicon"]["tpot_ms"] < 0.15 and medians["silicon"]["tokens_s"] < 0.15
