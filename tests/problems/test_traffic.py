"""Traffic: the committed traces read as they are, synthetic lengths and arrivals that
have the statistics they are asked for, the same requests for the same seed, and every
bad input refused in one line naming the file, the row and the field."""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab.errors import ShardlabError
from shardlab.problems.traces import read_trace
from shardlab.problems.traffic import (
    Arrivals,
    Lengths,
    Traffic,
    closed_loop,
    histogram,
    summarize,
    synthetic_traffic,
)

TRACES = Path(__file__).resolve().parent.parent / "data" / "traces"
CONV = TRACES / "AzureLLMInferenceTrace_conv.csv.gz"
CODE = TRACES / "AzureLLMInferenceTrace_code_head500.csv"
MOONCAKE = TRACES / "mooncake_conversation_head200.jsonl"
VIDUR = TRACES / "vidur_splitwise_conv_head200.csv"


# -- the committed traces --------------------------------------------------------------


def test_the_azure_conversation_hour_reads_as_the_shared_notes_measured() -> None:
    s = summarize(read_trace(CONV))
    assert s.requests == 19_366 and not s.refused
    assert s.span_s == pytest.approx(3501.721937, abs=1e-6)
    assert s.rate == pytest.approx(5.530, abs=0.001)
    assert s.gap_cv == pytest.approx(1.094, abs=0.001)
    assert s.input_len == {"p50": 1020, "p90": 2735, "p99": 4142, "max": 14050, "mean": 1155}
    assert s.output_len == {"p50": 129, "p90": 424, "p99": 601, "max": 1000, "mean": 211}


def test_azure_timestamps_are_read_to_their_seventh_digit() -> None:
    t = read_trace(CODE)
    assert t.requests == 500 and t.arrival == "trace" and t.prefix_blocks is None
    # 18:17:03.9799600 then 18:17:04.0319600: 0.052 s exactly, not float noise of 1e9 s
    assert t.arrival_s[0] == 0.0 and t.arrival_s[1] == 520_000 / 10**7
    assert (t.input_len[0], t.output_len[0]) == (4808, 10)
    assert summarize(t).gap_cv == pytest.approx(14.05, abs=0.01)  # the bursty one


def test_the_seventh_digit_counts(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46,3,4\n2023-11-16 18:15:46.0000003,3,4\n2023-11-16 18:16:47.5,3,4\n"
    )
    assert read_trace(path).arrival_s.tolist() == [0.0, 3e-7, 61.5]


def test_mooncake_reads_milliseconds_and_prefix_blocks() -> None:
    t = read_trace(MOONCAKE)
    assert t.requests == 200 and t.span_s == 72.0
    assert (t.input_len[0], t.output_len[0]) == (6758, 500)
    assert t.prefix_blocks is not None and t.prefix_blocks[1][:3] == (0, 14, 15)
    # one hash id per 512-token block of the prompt
    assert all(len(b) == -(-n // 512) for b, n in zip(t.prefix_blocks, t.input_len, strict=True))


def test_vidur_holds_the_azure_conversation_trace() -> None:
    vidur, azure = read_trace(VIDUR), read_trace(CONV)
    assert vidur.requests == 200
    np.testing.assert_allclose(vidur.arrival_s, azure.arrival_s[:200], atol=1e-6)
    assert (vidur.input_len == azure.input_len[:200]).all()
    assert (vidur.output_len == azure.output_len[:200]).all()


def test_a_plain_csv_and_a_gzipped_one_read_alike(tmp_path: Path) -> None:
    text = "arrival_s,input_len,output_len,note\n10.5,100,20,a\n11,200,30,\n11,50,5,b\n"
    (tmp_path / "t.csv").write_text(text)
    with gzip.open(tmp_path / "t.csv.gz", "wt") as f:
        f.write(text)
    for name in ("t.csv", "t.csv.gz"):
        t = read_trace(tmp_path / name)
        assert t.arrival_s.tolist() == [0.0, 0.5, 0.5]
        assert t.input_len.tolist() == [100, 200, 50] and t.output_len.tolist() == [20, 30, 5]
        # the rate is one over the mean gap: 2 gaps in 0.5 s; the gaps 0.5 and 0
        assert (t.span_s, t.rate, t.gap_cv) == (0.5, 4.0, 1.0)


def test_the_format_can_be_given(tmp_path: Path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [7]}\n')
    with pytest.raises(ShardlabError, match="cannot tell its format"):
        read_trace(path)
    assert read_trace(path, "mooncake").prefix_blocks == ((7,),)


# -- bad traces ------------------------------------------------------------------------


def _refusal(path: Path, text: str, fmt: str | None = None) -> str:
    path.write_text(text)
    with pytest.raises(ShardlabError) as info:
        read_trace(path, fmt)
    assert info.value.field == "traffic"
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("arrival_s,input_len\n0,5\n", "line 1: a csv trace needs the columns"),
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,3\n", "missing GeneratedTokens"),
        ("arrival_s,input_len,output_len\n", "no request"),
        ("arrival_s,input_len,output_len\n0,-4,2\n", "line 2: input_len must be a positive"),
        ("arrival_s,input_len,output_len\n0,4,many\n", "line 2: output_len 'many' is not a num"),
        (
            "arrival_s,input_len,output_len\n1,4,2\n2,4,2\n1.5,4,2\n",
            "line 4: arrival_s '1.5' is before line 3's '2'",
        ),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n3,1,1\n2,1,1\n",
            "line 3: arrived_at '2' is before",
        ),
    ],
)
def test_a_bad_csv_trace_is_refused_in_one_line(tmp_path: Path, text: str, says: str) -> None:
    assert says in _refusal(tmp_path / "t.csv", text)


def test_a_bad_mooncake_trace_is_refused_in_one_line(tmp_path: Path) -> None:
    late = '{"timestamp": 5, "input_length": 1, "output_length": 1}\n'
    early = '{"timestamp": 4, "input_length": 1, "output_length": 1}\n'
    assert "line 2: timestamp 4 is before line 1's 5" in _refusal(
        tmp_path / "t.jsonl", late + early
    )
    assert "no request" in _refusal(tmp_path / "t.jsonl", "not json\n")


def test_an_unreadable_timestamp_names_its_line(tmp_path: Path) -> None:
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 25:00:00.1,3,4\n"
    message = _refusal(tmp_path / "t.csv", text)
    assert "line 2: TIMESTAMP '2023-11-16 25:00:00.1' is not a time" in message


def test_bad_rows_are_refused_by_line_and_the_rest_kept(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    rows = ["0,10,1", "1,x,1", "2,20,2", "3,30,-1", "4,40,4", "5,,5"]
    path.write_text("arrival_s,input_len,output_len\n" + "\n".join(rows) + "\n")
    t = read_trace(path)
    assert t.input_len.tolist() == [10, 20, 40]
    assert [r.line for r in t.refused] == [3, 5, 7]
    assert "line 3: input_len 'x' is not a number" in t.refused[0].reason
    assert "line 5: output_len must be a positive integer" in t.refused[1].reason
    assert "line 7: input_len is missing" in t.refused[2].reason
    assert summarize(t).refused == t.refused


def test_a_mooncake_line_that_is_not_an_object_is_refused_alone(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    good = '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}'
    bad_ids = '{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": ["a"]}'
    path.write_text(f"{good}\n[1, 2]\n\n{bad_ids}\n{good}\n")
    t = read_trace(path)
    assert t.requests == 2 and [r.line for r in t.refused] == [2, 4]
    assert "hash_ids must be a list of integers" in t.refused[1].reason


# -- synthetic traffic -----------------------------------------------------------------


def test_poisson_gaps_have_mean_one_over_the_rate_and_cv_one() -> None:
    t = synthetic_traffic(
        requests=50_000, lengths=Lengths(), arrivals=Arrivals(kind="poisson", rate=4.0), seed=1
    )
    gaps = np.diff(t.arrival_s)
    assert t.arrival_s[0] == 0 and gaps.mean() == pytest.approx(0.25, rel=0.02)
    assert t.gap_cv == pytest.approx(1.0, abs=0.02) and t.rate == pytest.approx(4.0, rel=0.02)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_arrivals_have_the_cv_asked_for(cv: float) -> None:
    t = synthetic_traffic(
        requests=100_000,
        lengths=Lengths(),
        arrivals=Arrivals(kind="gamma", rate=10.0, cv=cv),
        seed=2,
    )
    assert t.gap_cv == pytest.approx(cv, rel=0.05) and t.rate == pytest.approx(10.0, rel=0.05)


def test_uniform_lengths_stay_in_their_range_and_reach_both_ends() -> None:
    lengths = Lengths(kind="uniform", input_len=1000, output_len=100, range_ratio=0.8)
    t = synthetic_traffic(
        requests=20_000, lengths=lengths, arrivals=Arrivals(kind="poisson", rate=1.0)
    )
    assert (t.input_len.min(), t.input_len.max()) == (800, 1000)
    assert (t.output_len.min(), t.output_len.max()) == (80, 100)
    assert t.input_len.mean() == pytest.approx(900, rel=0.01)


def test_histogram_weights_are_recovered() -> None:
    lengths = histogram([(100, 10, 1.0), (1000, 100, 3.0), (5000, 500, 0.0)])
    t = synthetic_traffic(
        requests=40_000, lengths=lengths, arrivals=Arrivals(kind="poisson", rate=1.0), seed=3
    )
    share = (t.input_len == 1000).mean()
    assert share == pytest.approx(0.75, abs=0.01)
    assert set(zip(t.input_len.tolist(), t.output_len.tolist(), strict=True)) == {
        (100, 10),
        (1000, 100),
    }


def test_a_closed_loop_has_no_times_but_its_clients() -> None:
    t = closed_loop(clients=8, prompts_per_client=10, lengths=Lengths())
    assert t.requests == 80 and t.arrival_s is None and t.clients == 8
    assert t.rate is None and t.gap_cv is None and t.span_s is None
    with pytest.raises(ShardlabError, match="no arrival times to rescale") as info:
        t.at_rate(2.0)
    assert info.value.field == "rate"


def test_a_trace_at_another_rate_keeps_its_burstiness() -> None:
    trace = read_trace(CONV)
    faster = trace.at_rate(20.0)
    assert faster.rate == pytest.approx(20.0, rel=1e-12)
    assert faster.gap_cv == pytest.approx(trace.gap_cv, rel=1e-9)
    assert (faster.input_len == trace.input_len).all()


def test_a_traces_lengths_under_other_arrivals() -> None:
    trace = read_trace(MOONCAKE)
    t = trace.with_arrivals(Arrivals(kind="poisson", rate=2.0), seed=4)
    assert t.arrival == "poisson" and (t.input_len == trace.input_len).all()
    assert t.prefix_blocks == trace.prefix_blocks


def test_the_same_seed_gives_the_same_requests() -> None:
    def draw(seed: int) -> Traffic:
        return synthetic_traffic(
            requests=500,
            lengths=Lengths(kind="uniform", input_len=2000, output_len=200, range_ratio=0.5),
            arrivals=Arrivals(kind="gamma", rate=3.0, cv=2.0),
            seed=seed,
        )

    a, b, c = draw(7), draw(7), draw(8)
    assert (a.arrival_s == b.arrival_s).all() and (a.input_len == b.input_len).all()
    assert (a.output_len == b.output_len).all()
    assert not (a.arrival_s == c.arrival_s).all()


def test_a_traffic_cannot_be_changed() -> None:
    t = closed_loop(clients=2, prompts_per_client=2, lengths=Lengths())
    with pytest.raises(ValueError, match="read-only"):
        t.input_len[0] = 5


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Arrivals(kind="poisson", rate=0.0), "rate"),
        (lambda: Arrivals(kind="poisson", rate=-1.0), "rate"),
        (lambda: Arrivals(kind="gamma", rate=float("nan")), "rate"),
        (lambda: Arrivals(kind="gamma", rate=1.0, cv=0.0), "cv"),
        (lambda: Arrivals(kind="gamma", rate=1.0, cv=-2.0), "cv"),
        (lambda: Arrivals(kind="poisson"), "rate"),
        (lambda: Arrivals(kind="closed"), "clients"),
        (lambda: Arrivals(kind="closed", clients=0), "clients"),
        (lambda: Lengths(kind="uniform", range_ratio=0.0), "range_ratio"),
        (lambda: Lengths(kind="uniform", range_ratio=1.5), "range_ratio"),
        (lambda: Lengths(input_len=0), "input_len"),
        (lambda: histogram([]), "buckets"),
        (lambda: histogram([(10, 1, 0.0)]), "buckets"),
        (lambda: histogram([(10, 1, -1.0)]), "buckets"),
        (lambda: read_trace(CONV).at_rate(0.0), "rate"),
        (
            lambda: closed_loop(clients=2, prompts_per_client=0, lengths=Lengths()),
            "prompts_per_client",
        ),
    ],
)
def test_a_bad_option_is_refused_naming_its_field(make: object, field: str) -> None:
    with pytest.raises(ShardlabError) as info:
        make()  # type: ignore[operator]
    assert info.value.field == field and "\n" not in str(info.value)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    n=st.integers(1, 5000),
    ratio=st.floats(0.01, 1.0),
    requests=st.integers(1, 200),
    seed=st.integers(0, 2**32 - 1),
)
def test_uniform_lengths_are_within_the_range(
    n: int, ratio: float, requests: int, seed: int
) -> None:
    lengths = Lengths(kind="uniform", input_len=n, output_len=n, range_ratio=ratio)
    ins, outs = lengths.sample(requests, np.random.default_rng(seed))
    low = max(int(n * ratio), 1)
    assert ((ins >= low) & (ins <= n)).all() and ((outs >= low) & (outs <= n)).all()


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    rate=st.floats(1e-3, 1e4),
    cv=st.floats(0.1, 10.0),
    target=st.floats(1e-3, 1e4),
    seed=st.integers(0, 2**32 - 1),
)
def test_rescaled_arrivals_have_the_rate_and_keep_the_cv(
    rate: float, cv: float, target: float, seed: int
) -> None:
    t = synthetic_traffic(
        requests=50, lengths=Lengths(), arrivals=Arrivals(kind="gamma", rate=rate, cv=cv), seed=seed
    )
    if t.rate is None:  # every gap rounded to 0
        return
    moved = t.at_rate(target)
    assert np.all(np.diff(moved.arrival_s) >= 0)
    assert moved.rate == pytest.approx(target, rel=1e-9)
    assert moved.gap_cv == pytest.approx(t.gap_cv, rel=1e-6)


BAD_LENGTHS = st.sampled_from(["", "x", "-3", "0", "2.5", "nan", "inf"])


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    rows=st.lists(
        st.tuples(
            st.floats(0, 100, allow_nan=False),
            st.one_of(st.integers(1, 10**6).map(str), BAD_LENGTHS),
            st.one_of(st.integers(1, 10**4).map(str), BAD_LENGTHS),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_each_row_is_kept_or_refused_by_its_line(rows: list[tuple[float, str, str]]) -> None:
    rows = [(t, i, o) for t, (_, i, o) in zip(sorted(r[0] for r in rows), rows, strict=True)]

    def ok(text: str) -> bool:
        return text.isdigit() and int(text) > 0

    good = [(t, int(i), int(o)) for t, i, o in rows if ok(i) and ok(o)]
    bad_lines = [n for n, (_, i, o) in enumerate(rows, start=2) if not (ok(i) and ok(o))]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.csv"
        path.write_text(
            "arrival_s,input_len,output_len\n" + "".join(f"{t!r},{i},{o}\n" for t, i, o in rows)
        )
        if not good:
            with pytest.raises(ShardlabError, match="no request that can be read"):
                read_trace(path)
            return
        t = read_trace(path)
    assert [r.line for r in t.refused] == bad_lines
    assert t.input_len.tolist() == [i for _, i, _ in good]
    assert t.output_len.tolist() == [o for _, _, o in good]
    np.testing.assert_allclose(t.arrival_s, [s - good[0][0] for s, _, _ in good])
