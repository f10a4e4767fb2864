"""``shardlab size`` and ``solve --rate`` from the command line: answers, files, the
launch of a sized deployment, and every bad input refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.cli.conftest import refused, run

SMALL = [
    "size",
    "--model",
    "llama-3.1-8b",
    "--engine",
    "vllm",
    "--space",
    "engine",
    "--input-len",
    "1024",
    "--output-len",
    "128",
    "--ttft-ms",
    "1000",
    "--tpot-ms",
    "30",
]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--rate", "0"], "positive"),
        (["--rate", "-3"], "positive"),
        (["--rate", "nan"], "finite"),
        (["--rate", "inf"], "finite"),
        (["--rates", "5,0,10"], "positive"),
        (["--rates", "5:1:1"], "below START"),
        (["--rates", "1:10:x1"], "factor"),
        (["--rate", "5", "--rates", "5,10"], "--rate"),
        ([], "--rate"),
        (["--rate", "5", "--price", "b200=5"], "not one of the GPU types"),
        (["--rate", "5", "--gpus", "h100,h200", "--price", "h100=2"], "none for h200"),
        (["--rate", "5", "--price", "h100=0"], "positive"),
        (["--rate", "5", "--price", "h100=nan"], "finite"),
        (["--rate", "5", "--price", "h100=-1"], "positive"),
        (["--rate", "5", "--price", "h100"], "GPU=dollars"),
        (["--rate", "5", "--gpus", "h100,h100"], "twice"),
        (["--rate", "5", "--gpus", "x9"], "unknown GPU"),
        (["--rate", "5", "--serving", "both"], "serving"),
        (["--rate", "5", "--plot", "c.png"], "--rates"),
        (["--rate", "5", "--prefix-reuse", "1"], "(set by --prefix-reuse)"),
    ],
)
def test_bad_sizing_input_is_refused(extra: list[str], says: str) -> None:
    gpus = [] if "--gpus" in extra else ["--gpus", "h100"]
    line = refused([*SMALL, *gpus, "--out", "d.json", *extra])
    assert says in line, line


def test_prefix_reuse_raises_an_instances_capacity(tmp_path: Path) -> None:
    """Half of each prompt cached: the same GPUs serve more requests/s."""
    answers = []
    for reuse in ("0", "0.5"):
        code, out, err = run([*SMALL, "--gpus", "h100", "--rate", "10", "--serving", "agg",
                              "--prefix-reuse", reuse, "--format", "json"], tmp_path)  # fmt: skip
        assert code == 0, err
        answers.append(json.loads(out)["rates"][0]["deployment"])
    plain, reused = answers
    assert reused["gpus"] == plain["gpus"] == 1
    assert reused["capacity_rps"] > 1.1 * plain["capacity_rps"]


def test_a_rate_past_max_gpus_is_refused_naming_the_fix() -> None:
    # below what one H100 computes at its peak (114/s), above what it serves
    line = refused(
        [*SMALL, "--gpus", "h100", "--max-gpus", "1", "--rate", "100", "--out", "d.json"]
    )
    assert "rate 100 requests/s: no deployment of h100 up to 1 GPUs" in line
    assert "max_gpus" in line and "(set by --rate)" in line
    # proven by the instance's CP-SAT bounds alone, the rate they reach named
    assert "by CP-SAT's bounds on each of the 1 instance shapes" in line
    assert "no solve needed" in line and "give a rate of at most" in line


def test_a_rate_past_what_the_gpus_compute_is_refused_unsolved() -> None:
    line = refused([*SMALL, "--gpus", "h100,b200", "--rate", "1e6", "--out", "d.json"])
    assert "256 GPUs of h100, b200 compute at most" in line


def test_an_slo_nothing_meets_is_refused() -> None:
    argv = [*SMALL, "--gpus", "h100", "--max-gpus", "2", "--rate", "1", "--tpot-ms", "0.5"]
    line = refused(argv)
    assert "meets the SLOs" in line and "TPOT <= 0.5 ms" in line


def test_a_time_limit_that_runs_out_before_any_deployment_says_so() -> None:
    # the limit counts from the command's start (here: the test session's import)
    line = refused([*SMALL, "--gpus", "h100", "--rate", "5", "--time-limit", "0.01"])
    assert "no deployment found within the time limit of 0.01 s" in line, line
    assert "h100 agg instances of 1" in line and "(set by --time-limit)" in line


def test_size_writes_a_deployment_launch_runs(tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    argv = [*SMALL, "--gpus", "h100,h200", "--max-gpus", "8", "--rate", "30"]
    argv += ["--price", "h100=2.99,h200=3.79", "--out", str(out), "--format", "json"]
    code, text, err = run(argv, tmp_path)
    assert code == 0, err
    assert err == ""  # stderr not a terminal: no progress display
    data = json.loads(text)
    assert data["status"] == data["rates"][0]["status"] == "proven"
    best = data["rates"][0]["deployment"]
    assert best["capacity_rps"] >= 30
    assert best["cost_per_hour"] == pytest.approx(
        sum(p["gpus"] * p["price_per_gpu_hour"] for p in best["pools"])
    )
    assert json.loads(out.read_text())["rates"][0]["deployment"] == best
    code, text, err = run(
        ["launch", "--plan", str(out), "--engine", "vllm", "--config-dir", str(tmp_path)],
        tmp_path,
    )
    assert code == 0, err
    servers = [line for line in text.splitlines() if line.startswith(("vllm", "CUDA", "VLLM"))]
    assert len(servers) == sum(p["instances"] for p in best["pools"])


def test_a_curve_is_a_table_and_a_plot(tmp_path: Path) -> None:
    argv = [*SMALL, "--gpus", "h100,h200", "--max-gpus", "4", "--serving", "agg"]
    argv += ["--rates", "5:40:x2", "--plot", "c.png", "--out", "c.json"]
    code, text, err = run(argv, tmp_path)
    assert code == 0, err
    assert "GPUs per rate" in text and "h100 only" in text and "cheapest" in text
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    rates = json.loads((tmp_path / "c.json").read_text())["rates"]
    assert [r["rate_rps"] for r in rates] == [5, 10, 20, 40]
    costs = [r["deployment"]["cost_gpus"] if r["deployment"] else math.inf for r in rates]
    assert costs == sorted(costs)  # a higher rate never needs fewer GPUs
    # launch takes one deployment, not a curve
    line = refused(
        ["launch", "--plan", "c.json", "--engine", "vllm"],
        lambda f: (f / "c.json").write_text((tmp_path / "c.json").read_text()),
    )
    assert "one deployment" in line


def test_solve_at_a_rate_records_it(tmp_path: Path) -> None:
    argv = ["solve", "--model", "llama-3.1-8b", "--cluster", "h100x2", "--ttft-ms", "1000"]
    argv += ["--tpot-ms", "30", "--rate", "5", "--out", "p.json", "--format", "json"]
    code, text, err = run(argv, tmp_path)
    assert code == 0, err
    rate = json.loads(text)["rate"]
    assert rate["rate_rps"] == 5 and rate["served_rps"] >= 5 and rate["utilization"] <= 1
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["rate"]["rate_rps"] == 5
    assert plan["requests_per_rank"] == rate["requests_per_rank"]


H100_NODE_OF_4 = """accelerator:
  name: H100 PCIe x4
  bf16_tflops: 756
  fp8_tflops: 1513
  fp4_tflops: 0
  hbm_gb: 80
  hbm_gbps: 2000
  nvlink_gbps: 300
  nvlink_latency_us: 3
  net_gbps: 25
  net_latency_us: 8
num_gpus: 4
gpus_per_node: 4
"""


def test_a_gpu_from_a_cluster_yaml_is_sized_and_launched(tmp_path: Path) -> None:
    (tmp_path / "pcie.yaml").write_text(H100_NODE_OF_4)
    argv = [*SMALL, "--gpus", "h200,pcie.yaml", "--max-gpus", "8", "--rate", "20"]
    argv += ["--price", "h200=3.79,h100-pcie-x4=1.5", "--out", "d.json", "--format", "json"]
    code, text, err = run(argv, tmp_path)
    assert code == 0, err
    data = json.loads(text)
    assert data["gpus"]["h100-pcie-x4"]["accelerator"]["gpus_per_node"] == 4
    assert set(data["rates"][0]["by_gpu"]) == {"h200", "h100-pcie-x4"}
    code, _, err = run(["launch", "--plan", "d.json", "--engine", "vllm"], tmp_path)
    assert code == 0, err
