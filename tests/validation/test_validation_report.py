"""shardlab.validation's report and summary: numbers from rows, files only where asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardlab.errors import ShardlabError
from shardlab.problems.cluster import parse_cluster
from shardlab.validation import (
    Measurement,
    MeasurementSet,
    Row,
    collective_value,
    summarize,
    write_report,
)


def _row(rid: str, predicted: float, measured: float, note: str = "") -> Row:
    return Row(
        id=rid,
        description=f"setup {rid}",
        metric="tpot_ms",
        unit="ms",
        predicted=predicted,
        measured=measured,
        note=note,
        source="test",
    )


ROWS = [_row("a", 10.0, 10.0), _row("b", 12.0, 10.0), _row("c", 5.0, 20.0, "odd")]


def test_summarize_counts_rows_by_how_far_off_they_are() -> None:
    s = summarize(ROWS)
    assert s["rows"] == 3 and s["within_25pct"] == 2
    assert s["median_abs_error"] == pytest.approx(0.2)
    assert (s["worst_id"], s["worst_factor"]) == ("c", pytest.approx(4.0))
    assert (s["beyond_1_5x"], s["beyond_2x"]) == (1, 1)


def test_the_report_is_written_only_where_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    by_timing = {"roofline": ROWS, "silicon": [_row(r.id, r.measured, r.measured) for r in ROWS]}
    summaries = write_report(by_timing, "test", "mine.csv")
    assert list(tmp_path.iterdir()) == []
    assert summaries["silicon"]["median_abs_error"] == 0.0
    path = tmp_path / "deep" / "v.md"
    assert write_report(by_timing, "test", "mine.csv", path=path) == summaries
    text = path.read_text()
    assert "Produced by `test` from `mine.csv`" in text
    assert "| c | setup c | tpot_ms (ms) | 20.0 | 5.0 | 0.25 | 20.0 | 1.00 | odd | test |" in text


def test_a_collective_rows_value_is_bus_bandwidth_or_latency() -> None:
    def m(metric: str) -> Measurement:
        return Measurement(
            id="c", metric=metric, value=1.0, unit="", setup="", note="", source="",
            cluster=parse_cluster("h100x8"), problem=None, degrees=None, message_bytes=8 * 10**9,
        )  # fmt: skip

    # a ring all-reduce over 8 GPUs moves 2 * 7/8 of the message
    assert collective_value(m("allreduce_busbw_gbps"), 1.0) == pytest.approx(14.0)
    assert collective_value(m("allreduce_latency_us"), 2e-6) == pytest.approx(2.0)


def test_a_collective_row_is_an_all_reduce_over_its_clusters_gpus() -> None:
    """Over two 8-GPU boards the ring moves 2 * 15/16 of the message, and the time is
    the two-level one (each board, then the network between them)."""
    from shardlab.validation import collective_seconds

    def m(cluster: str) -> Measurement:
        return Measurement(
            id="c", metric="allreduce_busbw_gbps", value=1.0, unit="", setup="", note="",
            source="", cluster=parse_cluster(cluster), problem=None, degrees=None,
            message_bytes=16 * 10**9,
        )  # fmt: skip

    import numpy as np

    from shardlab.costmodel import Span, collective_time

    assert collective_value(m("h100x16"), 1.0) == pytest.approx(30.0)
    one, two = (collective_seconds(m(c), "roofline", "trtllm") for c in ("h100x8", "h100x16"))
    boards = Span(size=16, local=8)
    nbytes = np.array(16e9)
    assert two == pytest.approx(
        float(collective_time("all_reduce", boards, nbytes, parse_cluster("h100x16")))
    )
    assert two > one


def test_a_set_with_no_readable_row_is_refused() -> None:
    with pytest.raises(ShardlabError, match="no row could be read"):
        MeasurementSet(source="x.csv", rows=[])
