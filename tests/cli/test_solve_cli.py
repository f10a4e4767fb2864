"""``shardlab solve`` over the serving modes: the baselines beside the chosen plan, the
command's time limit kept all in, and what a mode cannot honour refused up front."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import MARGIN, run_cli

# An engine's space (the free-space comparison applies) on a model and cluster CP-SAT
# proves in seconds in each serving mode.
ENGINE = [
    "--model", "llama-3.1-8b", "--cluster", "h100x2", "--engine", "vllm", "--space", "engine",
]  # fmt: skip


def test_best_with_vs_free_ends_within_its_time_limit_and_reports_the_baselines() -> None:
    """``--vs-free`` was dropped unless serving was agg, and the free space's search ran
    600 s of its own after the command's limit."""
    limit = 20.0
    args = ["solve", *ENGINE, "--serving", "best", "--vs-free", "--time-limit", f"{limit:g}"]
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "shardlab", *args, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=limit + 120,
        env={**os.environ, "COLUMNS": "200"},
    )
    wall = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-2000:]
    assert wall < limit + MARGIN, wall  # start-up is in the limit; the margin is slack
    data = json.loads(done.stdout)
    chosen = data[data["chosen"]]["metrics"]["throughput_tok_s"]
    megatron = data["baseline"]
    assert megatron["method"] == "megatron"
    assert megatron["ratio"] == pytest.approx(chosen / megatron["metrics"]["throughput_tok_s"])
    free = data["free"]
    assert free["space"] == "free" and free["method"] == "cpsat"
    assert free["partial"] == (free["status"] not in ("optimal", "infeasible"))
    if not free["partial"]:  # the free space holds the engine's: at least as good
        assert free["ratio"] == pytest.approx(free["throughput_tok_s"] / chosen)
        assert free["ratio"] >= 1 - 1e-9
    schema = free["plan"]["schema"]
    assert schema.startswith("shardlab.disagg" if data["chosen"] == "disagg" else "shardlab.plan")


def test_disaggregated_serving_prints_both_baselines(capsys, monkeypatch) -> None:
    code, out, err = run_cli(
        ["solve", *ENGINE, "--serving", "disagg", "--vs-free"], capsys, monkeypatch
    )
    assert code == 0, err
    assert "ratio of the disagg plan to the megatron plan:" in out
    assert "free space (every per-operator sharding, disagg serving): cpsat optimal" in out
    assert "free optimum over the vllm plan:" in out


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--serving", "disagg", "--max-evals", "10"], "--max-evals"),
        (["--serving", "best", "--max-evals", "10"], "--max-evals"),
        (["--objective", "pareto", "--vs-free"], "--vs-free"),
        (["--objective", "pareto", "--serving", "best"], "--serving"),
    ],
)
def test_what_a_mode_cannot_honour_is_refused_in_one_line(
    extra: list[str], flag: str, capsys, monkeypatch
) -> None:
    code, out, err = run_cli(["solve", *ENGINE, *extra], capsys, monkeypatch)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and f"(set by {flag})" in err, err
