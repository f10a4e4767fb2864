"""Measurement rows that state their statistic, their load protocol and their pools:
read, checked row by row, turned into traffic, and kept apart from the analytic means."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from shardlab import ShardlabError
from shardlab.validation import (
    analytic,
    builtin_measurements,
    load_measurements,
    predict,
    predict_all,
)
from shardlab.validation.calibrate import calibrate, linearize
from tests.conftest import DATA_DIR, cli_process

PERCENTILES = DATA_DIR / "percentiles" / "measured_percentiles.csv"
HEADER = (
    "id,model,cluster,tp,phase,schedule,batch,input_len,output_len,metric,statistic,value,"
    "clients,prompts_per_client,length_range,rate,arrival,requests,serving\n"
)
SETUP = "llama-3.1-8b,h100x1,1,request,inflight,8,1000,200"
GOOD = (
    f"m,{SETUP},ttft_ms,mean,80,4,10,0.8,,,,,\n"
    f"m,{SETUP},ttft_ms,p99,150,4,10,0.8,,,,,\n"
    f"m,{SETUP},tpot_ms,median,9,4,10,0.8,,,,,\n"
    f"m,{SETUP},e2e_ms,,2000,4,10,0.8,,,,,\n"
    f"o,{SETUP},ttft_ms,p99.9,300,,,,5,poisson,2000,\n"
    f"g,{SETUP},ttft_ms,P50,120,,,0.5,2,gamma:3,5000,\n"
    f"d,llama-3.1-8b,h100x4,,request,inflight,8,1000,200,tpot_ms,mean,8,8,10,0.8,,,,"
    f"2P(tp=1) + 1D(tp=2)\n"
)


def _file(tmp_path: Path, rows: str) -> Path:
    path = tmp_path / "pct.csv"
    path.write_text(HEADER + rows)
    return path


def test_the_statistic_and_the_load_are_read_onto_each_row(tmp_path: Path) -> None:
    measured = load_measurements(_file(tmp_path, GOOD))
    assert not measured.refused
    stats = [(m.id, m.metric, m.statistic, m.percentile) for m in measured.rows]
    assert stats == [
        ("m", "ttft_ms", "mean", None),
        ("m", "ttft_ms", "p99", 99.0),
        ("m", "tpot_ms", "median", 50.0),
        ("m", "e2e_ms", "mean", None),  # blank: the mean
        ("o", "ttft_ms", "p99.9", 99.9),
        ("g", "ttft_ms", "median", 50.0),  # p50 is the median
        ("d", "tpot_ms", "mean", None),
    ]
    m, o, g = measured.rows[0], measured.rows[4], measured.rows[5]
    assert (m.clients, m.prompts_per_client, m.length_range, m.rate) == (4, 10, 0.8, None)
    assert m.problem is not None and m.problem.workload.clients == 4
    assert (
        m.requests_per_rank == 4 and m.load_label() == "4 clients x 10 prompts, lengths x[0.8, 1]"
    )
    assert (o.rate, o.arrival, o.cv, o.requests, o.length_range) == (
        5.0,
        "poisson",
        None,
        2000,
        1.0,
    )
    assert (g.rate, g.arrival, g.cv, g.requests, g.length_range) == (2.0, "gamma", 3.0, 5000, 0.5)
    assert g.load_label() == "5000 requests, gamma CV 3 at 2/s, lengths x[0.5, 1]"


@pytest.mark.parametrize(
    ("row", "field"),
    [
        (f"b,{SETUP},ttft_ms,max,1,4,10,,,,,,", "statistic 'max'"),
        (f"b,{SETUP},ttft_ms,p0,1,4,10,,,,,,", "a percentile must be in (0, 100)"),
        (f"b,{SETUP},ttft_ms,p100,1,4,10,,,,,,", "a percentile must be in (0, 100)"),
        (f"b,{SETUP},ttft_ms,p150,1,4,10,,,,,,", "a percentile must be in (0, 100)"),
        (f"b,{SETUP},ttft_ms,p99,1,,,,0,,100,", "rate must be > 0"),
        (f"b,{SETUP},ttft_ms,p99,1,,,,-2,poisson,100,", "rate must be > 0"),
        (f"b,{SETUP},ttft_ms,p99,1,,,,2,gamma:0,100,", "arrival 'gamma:0': the CV must be"),
        (f"b,{SETUP},ttft_ms,p99,1,,,,2,gamma:-1,100,", "the CV must be a number > 0"),
        (f"b,{SETUP},ttft_ms,p99,1,,,,2,gamma:x,100,", "the CV must be a number > 0"),
        (f"b,{SETUP},ttft_ms,p99,1,,,,2,gamma,100,", "gamma arrivals state their CV"),
        (f"b,{SETUP},ttft_ms,p99,1,,,,2,weibull,100,", "arrival 'weibull'"),
        (f"b,{SETUP},ttft_ms,p99,1,,,,2,poisson,,", "state how many requests"),
        (f"b,{SETUP},ttft_ms,p99,1,,,,,poisson,100,", "open arrivals need a rate"),
        (f"b,{SETUP},ttft_ms,p99,1,4,,,,,,", "prompts_per_client is blank"),
        (f"b,{SETUP},ttft_ms,p99,1,4,10,,2,,100,", "state one protocol"),
        (f"b,{SETUP},ttft_ms,p99,1,4,10,1.5,,,,", "length_range must be in (0, 1]"),
        (f"b,{SETUP},ttft_ms,p99,1,4.5,10,,,,,", "clients must be a positive integer"),
        (f"b,{SETUP},ttft_ms,p99,1,4,10,,,,,1P+1D", "serving '1P+1D'"),
        (f"b,{SETUP},ttft_ms,p99,1,4,10,,,,,1P(tp=1 xp=2) + 1D(tp=1)", "'xp=2'"),
        (
            "b,llama-3.1-8b,h100x4,,request,inflight,8,1000,200,ttft_ms,p99,1,4,10,,,,,"
            "2P(tp=2) + 1D(tp=2)",
            "the pools use 6 GPUs, the cluster has 4",
        ),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_the_row_and_field(
    tmp_path: Path, row: str, field: str
) -> None:
    measured = load_measurements(_file(tmp_path, GOOD + row + "\n"))
    assert len(measured.rows) == 7  # the good rows are kept
    [refused] = measured.refused
    assert (refused.id, refused.line) == ("b", 9)
    assert refused.reason.startswith("line 9 (b): ") and field in refused.reason
    assert "\n" not in refused.reason


def test_a_closed_loop_rows_traffic_is_its_benchmark(tmp_path: Path) -> None:
    m = load_measurements(_file(tmp_path, GOOD)).rows[0]
    traffic = m.traffic(seed=1)
    assert (traffic.requests, traffic.arrival, traffic.clients) == (40, "closed", 4)
    assert traffic.arrival_s is None
    assert traffic.input_len.min() >= 800 and traffic.input_len.max() <= 1000
    assert traffic.output_len.min() >= 160 and traffic.output_len.max() <= 200
    assert len(set(traffic.input_len.tolist())) > 1  # spread, not fixed
    again, other = m.traffic(seed=1), m.traffic(seed=2)
    assert np.array_equal(again.input_len, traffic.input_len)
    assert not np.array_equal(other.input_len, traffic.input_len)


def test_an_open_rows_traffic_has_its_rate_and_burstiness(tmp_path: Path) -> None:
    rows = load_measurements(_file(tmp_path, GOOD)).rows
    poisson, gamma = rows[4].traffic(), rows[5].traffic()
    assert poisson.requests == 2000 and poisson.arrival == "poisson"
    assert poisson.rate == pytest.approx(5, rel=0.1) and poisson.gap_cv == pytest.approx(1, rel=0.1)
    assert set(poisson.input_len.tolist()) == {1000}  # length_range 1: fixed lengths
    assert gamma.requests == 5000 and gamma.arrival == "gamma"
    assert gamma.rate == pytest.approx(2, rel=0.15) and gamma.gap_cv == pytest.approx(3, rel=0.2)
    assert gamma.input_len.min() >= 500


def test_a_row_without_a_load_has_no_traffic(tmp_path: Path) -> None:
    m = load_measurements(builtin_measurements()).rows[0]
    assert not m.has_load and m.load_label() == ""
    with pytest.raises(ShardlabError, match="states no load"):
        m.traffic()


def test_a_disaggregated_row_is_its_pools(tmp_path: Path) -> None:
    d = load_measurements(_file(tmp_path, GOOD)).rows[6]
    assert d.mode == "disagg" and d.disagg is not None
    assert d.disagg.label() == "2P(1) + 1D(2)"
    assert d.degrees is not None and d.degrees.tp == 2  # the decode pool's
    row = predict(d, "roofline")
    assert row.predicted > 0 and "2P(1) + 1D(2)" in row.description


def test_the_analytic_model_predicts_means_only(tmp_path: Path) -> None:
    rows = load_measurements(_file(tmp_path, GOOD)).rows
    means, others = analytic(rows)
    assert [m.statistic for m in means] == ["mean"] * 3
    assert [m.statistic for m in others] == ["p99", "median", "p99.9", "median"]
    with pytest.raises(ShardlabError, match="no analytic percentile"):
        predict(others[0], "roofline")
    predicted = predict_all("roofline", measurements=rows)
    assert [(r.id, r.metric) for r in predicted] == [
        ("m", "ttft_ms"),
        ("m", "e2e_ms"),
        ("d", "tpot_ms"),
    ]
    ttft, e2e = predicted[0].predicted, predicted[1].predicted
    tpot = predict(dataclasses.replace(rows[0], metric="tpot_ms")).predicted
    assert e2e == pytest.approx(ttft + 199 * tpot)  # a step for each token after the first


def test_calibrate_fits_the_means_of_ttft_and_tpot_only(tmp_path: Path) -> None:
    rows = load_measurements(_file(tmp_path, GOOD)).rows
    fitted = [m for m in rows if m.statistic == "mean" and m.metric != "e2e_ms"]
    assert [(m.id, m.metric) for m in fitted] == [("m", "ttft_ms"), ("d", "tpot_ms")]
    report = calibrate(rows + fitted, "roofline", "trtllm", factors=False)
    assert len(report.rows) == 4  # the percentiles and the E2E row are not fitted
    with pytest.raises(ShardlabError, match="e2e_ms is not calibrated"):
        linearize(rows[3], "roofline", "trtllm")


def test_files_without_the_columns_read_as_before() -> None:
    for m in load_measurements().rows:
        assert (m.statistic, m.mode, m.disagg, m.requests_per_rank) == ("mean", "agg", None, None)
        assert not m.has_load and m.length_range == 1.0


def test_validate_reports_percentile_rows_apart(tmp_path: Path) -> None:
    path = _file(tmp_path, GOOD)
    done = cli_process("validate", "--measurements", str(path), "--out", "v.md", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    line = "4 rows state a median or percentile (median 2, p99 1, p99.9 1): no analytic percentile"
    assert line in " ".join(done.stdout.split())
    body = (tmp_path / "v.md").read_text()
    assert line in body and "roofline: rows 3;" in body  # the 3 means are compared
    only = _file(tmp_path, "\n".join(GOOD.splitlines()[1:3]) + "\n")  # no mean at all
    done = cli_process("validate", "--measurements", str(only), "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert '"statistic": "p99"' in done.stdout and '"summary": {}' in done.stdout


def test_the_committed_inferencex_set_reads_whole() -> None:
    """tests/data/percentiles (SOURCES.md there): every row read, every run a closed
    loop of InferenceX's protocol stating its median and p99 TTFT and TPOT."""
    measured = load_measurements(PERCENTILES)
    assert not measured.refused and len(measured.rows) == 4674
    with PERCENTILES.open() as f:
        assert len(list(csv.DictReader(f))) == 4674
    runs: dict[str, set[tuple[str, str]]] = {}
    for m in measured.rows:
        runs.setdefault(m.id, set()).add((m.metric, m.statistic))
        assert (m.prompts_per_client, m.length_range) == (10, 0.8) and m.clients is not None
        if m.disagg is not None:
            assert m.disagg.num_gpus <= m.cluster.num_gpus
    assert len(runs) == 662
    assert {s for m in measured.rows for s in [m.statistic]} == {"mean", "median", "p90", "p99"}
    need = {(k, s) for k in ("ttft_ms", "tpot_ms") for s in ("median", "p99")}
    assert all(need <= stated for stated in runs.values())
    assert {m.gpu for m in measured.rows} == {"h100", "h200", "b200"}
    assert sum(m.mode == "disagg" for m in measured.rows) > 0
