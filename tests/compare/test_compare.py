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


def test_budgets_read_anytime_runs_and_rerun_the_others(tmp_path: Path) -> None:
    from shardlab.compare import run_comparison, summarize
    from shardlab.compare.report import summary_markdown
    from shardlab.problems.suite import get_suite
    from shardlab.solvers import Budget, solve

    inst = get_suite("llama70b-h100x4-chat")
    results = run_comparison(
        inst, ["random", "anneal"], 1, max_evals=300, seconds=None, jobs=1, budgets=[60, 300]
    )
    by = {(r["method"], r["budget"]): r for r in results}
    assert set(by) == {
        ("random", 60),
        ("random", 300),
        ("anneal", 60),
        ("anneal", 300),
        ("megatron", None),
    }
    # random ran once (at 300) and is read at 60; anneal, whose schedule spans its
    # budget, ran at each budget
    assert by[("random", 60)]["task_max_evals"] == 300
    assert by[("anneal", 60)]["task_max_evals"] == 60
    short = solve(inst[0].problem(), "random", budget=Budget(max_evals=60), seed=0)
    assert by[("random", 60)]["objective"] == pytest.approx(short.metrics.objective, rel=1e-12)
    rows = summarize(results)
    text = summary_markdown("t", "shardlab compare ...", rows)
    assert "| budget |" in text and "random @60" in text and "anneal @300" in text


def test_methods_with_options_run_as_their_own_rows(tmp_path: Path, capsys, monkeypatch) -> None:
    from shardlab.cli import main

    def run(methods: str) -> tuple[int, str]:
        args = ["compare", "--suite", "llama8b-h100x2-chat", "--seeds", "1", "--max-evals"]
        args += ["30", "--jobs", "1", "--results-dir", str(tmp_path), "--name", "opts"]
        monkeypatch.setattr(sys, "argv", ["shardlab", *args, "--methods", methods])
        try:
            main()
        except SystemExit as exc:
            return int(exc.code or 0), capsys.readouterr().err
        return 0, capsys.readouterr().err

    methods = "optuna,optuna:sampler=random:warm_start=none,optuna:encoding=class"
    code, err = run(methods)
    assert code == 0, err
    runs = json.loads((tmp_path / "opts" / "results.json").read_text())["runs"]
    by = {r["method"]: r for r in runs}
    assert set(by) == {*methods.split(","), "megatron"}
    assert by["optuna"]["facts"]["sampler"] == "tpe"
    assert by["optuna"]["facts"]["warm_start_trials"] == 4
    assert by["optuna:sampler=random:warm_start=none"]["facts"]["sampler"] == "random"
    assert by["optuna:sampler=random:warm_start=none"]["facts"]["warm_start_trials"] == 0
    assert by["optuna:encoding=class"]["facts"]["encoding"] == "class"
    for bad, why in (
        ("optuna:sampler", "METHOD:KEY=VALUE"),
        ("optuna:flavour=x", "option 'flavour' does not apply to method 'optuna'"),
        ("optuna:sampler=bogus", "sampler 'bogus'"),
        ("annealing", "unknown method"),
    ):
        code, err = run(bad)
        assert code == 2 and why in err and "Traceback" not in err, (bad, err)
