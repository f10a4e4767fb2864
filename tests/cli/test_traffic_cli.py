"""``shardlab traffic``: a trace's and a synthetic traffic's summary, and every bad input
refused in one line with status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import refused, run, write

TRACES = Path(__file__).resolve().parent.parent / "data" / "traces"
CONV = str(TRACES / "AzureLLMInferenceTrace_conv.csv.gz")


def _json(argv: list[str], folder: Path) -> dict:
    code, out, err = run(["traffic", *argv, "--format", "json"], folder)
    assert code == 0, err
    return json.loads(out)


def test_the_azure_hour_summarised(tmp_path: Path) -> None:
    code, out, _ = run(["traffic", "--traffic", CONV], tmp_path)
    assert code == 0
    assert "19,366 requests (trace) over 3,502 s, mean rate 5.53/s, CV of gaps 1.09" in out
    assert "│ input  │ 1,020 │ 2,735 │ 4,142 │ 14,050 │ 1,155 │" in out
    data = _json(["--traffic", CONV, "--rate", "20"], tmp_path)
    assert data["requests"] == 19_366 and data["rate"] == pytest.approx(20.0)
    assert data["gap_cv"] == pytest.approx(1.094, abs=0.001)


def test_synthetic_and_closed_loop(tmp_path: Path) -> None:
    data = _json(
        ["--requests", "20000", "--rate", "5", "--arrival", "gamma", "--cv", "2", "--seed", "3"],
        tmp_path,
    )
    assert data["arrival"] == "gamma" and data["requests"] == 20_000
    assert data["rate"] == pytest.approx(5, rel=0.05) and data["gap_cv"] == pytest.approx(
        2, rel=0.1
    )
    loop = _json(
        [
            "--clients",
            "4",
            "--prompts-per-client",
            "3",
            "--input-len",
            "100",
            "--range-ratio",
            "0.5",
        ],
        tmp_path,
    )
    assert (loop["arrival"], loop["requests"], loop["clients"], loop["rate"]) == (
        "closed",
        12,
        4,
        None,
    )
    assert 50 <= loop["input_len"]["p50"] <= 100 and 64 <= loop["output_len"]["p50"] <= 128


def test_a_trace_under_other_arrivals(tmp_path: Path) -> None:
    mooncake = str(TRACES / "mooncake_conversation_head200.jsonl")
    data = _json(["--traffic", mooncake, "--arrival", "poisson", "--rate", "2"], tmp_path)
    assert data["arrival"] == "poisson" and data["requests"] == 200
    assert _json(["--traffic", mooncake, "--clients", "8"], tmp_path)["clients"] == 8


def test_refused_rows_are_listed(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("arrival_s,input_len,output_len\n0,5,5\n1,-5,5\n2,5,5\n")
    code, out, _ = run(["traffic", "--traffic", "t.csv"], tmp_path)
    assert code == 0 and "2 requests" in out
    assert "1 rows refused:" in out and "line 3: input_len must be a positive integer" in out
    data = _json(["--traffic", "t.csv"], tmp_path)
    assert [r["line"] for r in data["refused"]] == [3]


@pytest.mark.parametrize(
    ("argv", "prepare", "says"),
    [
        (
            ["--rate", "0"],
            None,
            "rate (requests/s) must be a positive number, got 0.0 (set by --rate)",
        ),
        (["--rate", "-2"], None, "(set by --rate)"),
        (["--rate", "1", "--cv", "0"], None, "(set by --cv)"),
        (["--rate", "1", "--arrival", "gamma", "--cv", "-1"], None, "(set by --cv)"),
        (["--rate", "1", "--arrival", "weibull"], None, "(set by --arrival)"),
        (["--rate", "1", "--range-ratio", "0"], None, "(set by --range-ratio)"),
        (["--rate", "1", "--requests", "0"], None, "(set by --requests)"),
        (["--traffic", CONV, "--arrival", "gamma", "--rate", "-1"], None, "(set by --rate)"),
        ([], None, "needs a rate"),
        (["--clients", "0"], None, "(set by --clients)"),
        (["--clients", "2", "--rate", "1"], None, "a closed loop has no arrivals"),
        (["--traffic", "absent.csv"], None, "cannot read it"),
        (["--prompts-per-client", "3"], None, "(set by --clients)"),
        (["--clients", "2", "--prompts-per-client", "0"], None, "(set by --prompts-per-client)"),
        (["--clients", "2", "--requests", "5"], None, "(set by --requests)"),
        (["--traffic", CONV, "--requests", "5"], None, "(set by --requests)"),
        (["--traffic", CONV, "--clients", "2", "--prompts-per-client", "3"], None, "its own"),
        (["--traffic", CONV, "--rate", "0"], None, "(set by --rate)"),
        (["--traffic", CONV, "--trace-format", "parquet"], None, "(set by --trace-format)"),
        (["--traffic", "t.csv"], write("t.csv", "a,b\n1,2\n"), "cannot tell its format"),
        (
            ["--traffic", "t.csv"],
            write("t.csv", "arrival_s,input_len\n0,1\n"),
            "line 1: a csv trace needs the columns arrival_s, input_len, output_len; missing "
            "output_len (set by --traffic)",
        ),
        (
            ["--traffic", "t.csv"],
            write("t.csv", "arrival_s,input_len,output_len\n"),
            "no request that can be read (0 refused)",
        ),
        (
            ["--traffic", "t.csv"],
            write("t.csv", "arrival_s,input_len,output_len\n0,x,1\n"),
            "no request that can be read (1 refused; the first: trace 't.csv' line 2: input_len "
            "'x' is not a number)",
        ),
        (
            ["--traffic", "t.jsonl"],
            write(
                "t.jsonl",
                '{"timestamp": 9, "input_length": 1, "output_length": 1}\n' * 1
                + '{"timestamp": 3, "input_length": 1, "output_length": 1}\n',
            ),
            "line 2: timestamp 3 is before line 1's 9",
        ),
    ],
)
def test_bad_input_is_refused_in_one_line(argv: list[str], prepare: object, says: str) -> None:
    assert says in refused(["traffic", *argv], prepare)  # type: ignore[arg-type]
