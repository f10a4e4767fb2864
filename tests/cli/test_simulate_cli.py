"""``shardlab simulate``: a plan from ``solve`` under the committed Azure excerpt and
under a closed loop, its per-request CSV and figure, and bad input refused in one line
with status 2."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.cli.conftest import refused, run

TRACES = Path(__file__).resolve().parent.parent / "data" / "traces"
CODE = str(TRACES / "AzureLLMInferenceTrace_code_head500.csv")
MOONCAKE = str(TRACES / "mooncake_conversation_head200.jsonl")


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("plan")
    argv = ["solve", "--model", "llama-3.1-8b", "--cluster", "h100x2", "--engine", "vllm",
            "--space", "engine", "--method", "cpsat", "--out", "plan.json"]  # fmt: skip
    code, _, err = run(argv, folder)
    assert code == 0, err
    return folder / "plan.json"


def test_an_azure_excerpt_on_a_solved_plan(plan_file: Path, tmp_path: Path) -> None:
    argv = ["simulate", "--plan", str(plan_file), "--traffic", CODE, "--slo-ttft-ms", "500",
            "--out", "requests.csv", "--plot", "cdf.png"]  # fmt: skip
    code, out, err = run(argv, tmp_path)
    assert code == 0, err
    assert "500 requests on 1 x 2 h100 (replicas 2, tp 1) on vllm" in out
    for metric in ("ttft", "tpot", "itl", "e2e"):
        assert f"│ {metric}" in out
    assert "goodput" in out and "SLO met: ttft_ms" in out
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert len(rows) == 500
    assert all(float(r["first_token_s"]) >= float(r["arrival_s"]) for r in rows)
    assert (tmp_path / "cdf.png").read_bytes()[:4] == b"\x89PNG"


def test_a_closed_loop_in_json_is_the_same_run_for_the_same_seed(
    plan_file: Path, tmp_path: Path
) -> None:
    argv = ["simulate", "--plan", str(plan_file), "--clients", "64", "--prompts-per-client",
            "5", "--input-len", "2000", "--output-len", "200", "--range-ratio", "0.8",
            "--statistics", "mean,p95", "--format", "json"]  # fmt: skip
    runs = []
    for _ in range(2):
        code, out, err = run(argv, tmp_path)
        assert code == 0, err
        runs.append(json.loads(out))
    one, two = runs
    assert one["summary"] == two["summary"]
    s = one["summary"]
    assert s["requests"] == 320 and set(s["ttft_ms"]) == {"mean", "p95"}
    assert s["ttft_ms"]["p95"] >= s["ttft_ms"]["mean"] > 0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--router", "random"], "router 'random' is not one of least, round-robin"),
        (["--statistics", "mean,p100"], "statistic 'p100'"),
        (["--statistics", "p0"], "statistic 'p0'"),
        (["--slo-ttft-ms", "0"], "SLO ttft_ms 0.0: must be > 0"),
        (["--rate", "-1", "--requests", "5"], "(set by --rate)"),
        (["--cv", "0", "--rate", "1"], "(set by --cv)"),
        (["--clients", "1", "--input-len", "4000000"], "max_position_embeddings"),
        (["--clients", "1", "--prefix-reuse", "1"], "prefix_reuse must be a number in [0, 1)"),
        (["--clients", "1", "--prefix-reuse", "-0.5"], "(set by --prefix-reuse)"),
    ],
)
def test_bad_input_is_refused_in_one_line(plan_file: Path, argv: list[str], says: str) -> None:
    assert says in refused(["simulate", "--plan", str(plan_file), *argv])


def test_a_mooncake_trace_finds_its_prefixes_unless_told_otherwise(
    plan_file: Path, tmp_path: Path
) -> None:
    """Its hash ids by default; --prefix-reuse F a shared prefix instead; 0 none."""
    base = ["simulate", "--plan", str(plan_file), "--traffic", MOONCAKE, "--rate", "0.2",
            "--out", "requests.csv"]  # fmt: skip
    code, out, err = run(base, tmp_path)
    assert code == 0, err
    assert "% of prompt tokens found (blocks of 512 tokens)" in out
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert sum(int(r["cached_tokens"]) for r in rows) > 0
    code, out, err = run([*base, "--prefix-reuse", "0.5", "--format", "json"], tmp_path)
    assert code == 0, err
    assert 0.4 < json.loads(out)["summary"]["prefix_hit_rate"] < 0.5
    code, out, err = run([*base, "--prefix-reuse", "0", "--format", "json"], tmp_path)
    assert code == 0, err
    assert "prefix_hit_rate" not in json.loads(out)["summary"]
    assert "cached_tokens" not in (tmp_path / "requests.csv").read_text().splitlines()[0]


def test_a_plan_that_is_not_one_is_refused(tmp_path: Path) -> None:
    assert "not valid JSON" in refused(
        ["simulate", "--plan", "p.json", "--clients", "2"], lambda d: (d / "p.json").write_text("{")
    )


def test_a_sized_deployment_serves_the_rate_it_was_sized_for(tmp_path: Path) -> None:
    """``size --out`` in, its pools run: at the rate it was sized for, under its TTFT
    SLO, every request is served and the median meets the SLO (the sizing holds means:
    a tail may not)."""
    argv = ["size", "--model", "llama-3.1-8b", "--engine", "vllm", "--gpus", "h100",
            "--max-gpus", "4", "--rate", "5", "--serving", "agg", "--input-len", "1024",
            "--output-len", "128", "--ttft-ms", "1000", "--out", "d.json"]  # fmt: skip
    code, _, err = run(argv, tmp_path)
    assert code == 0, err
    argv = ["simulate", "--plan", "d.json", "--rate", "5", "--requests", "1000",
            "--input-len", "1024", "--output-len", "128", "--format", "json"]  # fmt: skip
    code, out, err = run(argv, tmp_path)
    assert code == 0, err
    s = json.loads(out)["summary"]
    assert s["requests"] == 1000
    assert s["request_rate"] == pytest.approx(5.0, rel=0.1)
    assert s["ttft_ms"]["median"] < 1000


def test_a_disaggregated_plan_runs_its_two_pools(tmp_path: Path) -> None:
    argv = ["solve", "--model", "llama-3.1-8b", "--cluster", "h100x2", "--engine", "trtllm",
            "--space", "engine", "--serving", "disagg", "--out", "d.json"]  # fmt: skip
    code, _, err = run(argv, tmp_path)
    assert code == 0, err
    argv = ["simulate", "--plan", "d.json", "--rate", "4", "--requests", "300",
            "--input-len", "2000", "--output-len", "200"]  # fmt: skip
    code, out, err = run(argv, tmp_path)
    assert code == 0, err
    assert "1 x 1 h100 prefill (tp 1) + 1 x 1 h100 decode (tp 1) on trtllm" in out
