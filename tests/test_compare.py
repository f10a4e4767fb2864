from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_compare_small_suite_writes_its_results(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "shardlab.cli",
        "compare",
        "--suite",
        "small",
        "--methods",
        "random,anneal,genetic",
        "--seeds",
        "2",
        "--max-evals",
        "200",
        "--jobs",
        "2",
        "--results-dir",
        str(tmp_path),
        "--name",
        "ci-small",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "ci-small"
    data = json.loads((out / "results.json").read_text())
    runs = data["runs"]
    instances = {r["instance"] for r in runs}
    assert len(instances) == 7
    # 3 methods x 2 seeds + the megatron baseline, per instance
    assert len(runs) == 7 * (3 * 2 + 1)
    assert all(r["status"] in ("feasible", "optimal") for r in runs), [
        (r["instance"], r["method"], r["message"]) for r in runs if r["status"] == "error"
    ]
    with (out / "results.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(runs)
    summary = (out / "summary.md").read_text()
    for inst in instances:
        assert inst in summary
    for row in data["summary"]:
        assert 0 < row["ratio_to_best"] <= 1 + 1e-9
    png = (out / "convergence.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "ratio to best" in proc.stdout
