from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli


def test_space_json(capsys, monkeypatch) -> None:
    code, out, _ = run_cli(
        ["space", "--model", "deepseek-v3", "--cluster", "h100x64", "--format", "json"],
        capsys,
        monkeypatch,
    )
    assert code == 0
    data = json.loads(out)
    assert data["total_params"] / 1e9 == pytest.approx(671, rel=0.02)
    assert data["active_params"] / 1e9 == pytest.approx(37, rel=0.02)
    assert data["num_degree_tuples"] > 100
    assert data["log10_space_size_per_layer"] > 100
    assert data["log10_space_size"] == data["log10_space_size_per_kind"]


def test_space_table(capsys, monkeypatch) -> None:
    code, out, _ = run_cli(
        ["space", "--model", "deepseek-v3", "--cluster", "h100x64"], capsys, monkeypatch
    )
    assert code == 0
    assert "degree tuples: 335" in out
    assert "10^" in out


@pytest.mark.parametrize("command", ["models", "clusters", "workloads"])
@pytest.mark.parametrize("fmt", ["table", "json"])
def test_listings(command: str, fmt: str, capsys, monkeypatch) -> None:
    code, out, _ = run_cli([command, "--format", fmt], capsys, monkeypatch)
    assert code == 0
    if fmt == "json":
        assert len(json.loads(out)) >= 4
    else:
        assert out.strip()


def _bad_inputs(tmp: Path) -> list[tuple[list[str], str]]:
    bad_json = tmp / "config.json"
    bad_json.write_text("{oops")
    bad_yaml = tmp / "cluster.yaml"
    bad_yaml.write_text("accelerator: [h100\n")
    return [
        (["space", "--model", "llama-9000"], "not in the catalog"),
        (["space", "--cluster", "z100x8"], "unknown GPU"),
        (["space", "--cluster", "h100x12"], "whole hosts"),
        (["space", "--cluster", "h100x0"], "at least 1"),
        (["space", "--model", str(bad_json)], "not valid JSON"),
        (["space", "--cluster", str(bad_yaml)], "malformed YAML"),
        (["space", "--model", "kimi-k2", "--cluster", "h100x8"], "needs"),
        (["space", "--workload", "nope"], "unknown preset"),
        (["space", "--tie", "diagonal"], "tie"),
    ]


def test_bad_input_exits_2_with_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    for args, needle in _bad_inputs(tmp_path):
        code, _out, err = run_cli(args, capsys, monkeypatch)
        assert code == 2, args
        assert needle in err, (args, err)
        assert err.strip().count("\n") == 0, err
        assert "Traceback" not in err


def test_evaluate_json_and_plan_round_trip(tmp_path: Path, capsys, monkeypatch) -> None:
    args = [
        "evaluate",
        "--model",
        "deepseek-v3",
        "--cluster",
        "h100x64",
        "--tp",
        "8",
        "--dp-attn",
        "8",
        "--format",
        "json",
    ]
    code, out, _ = run_cli(args, capsys, monkeypatch)
    assert code == 0
    data = json.loads(out)
    for key in (
        "feasible",
        "violations",
        "ttft_ms",
        "tpot_ms",
        "throughput_tok_s",
        "throughput_tok_s_per_gpu",
        "memory_gb_per_gpu",
        "num_gpus",
        "plan",
    ):
        assert key in data
    assert data["plan"]["degrees"] == {
        "replicas": 1,
        "pp": 1,
        "tp": 8,
        "dp_attn": 8,
        "ep": 64,
        "etp": 1,
    }
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(data["plan"]))
    code, out2, _ = run_cli(
        [
            "evaluate",
            "--model",
            "deepseek-v3",
            "--cluster",
            "h100x64",
            "--plan",
            str(plan_file),
            "--format",
            "json",
        ],
        capsys,
        monkeypatch,
    )
    assert code == 0
    again = json.loads(out2)
    # the plan JSON carries the concurrency evaluation chose; re-evaluated at it
    assert data["concurrency_chosen"] and not again["concurrency_chosen"]
    assert again["plan"]["requests_per_rank"] == data["plan"]["requests_per_rank"]
    assert again["throughput_tok_s"] == pytest.approx(data["throughput_tok_s"], rel=1e-12)


def test_explain_lists_operators_largest_first(capsys, monkeypatch) -> None:
    code, out, _ = run_cli(
        [
            "explain",
            "--model",
            "llama-3.1-8b",
            "--cluster",
            "h100x2",
            "--tp",
            "2",
            "--format",
            "json",
        ],
        capsys,
        monkeypatch,
    )
    assert code == 0
    rows = [b for b in json.loads(out)["breakdown"] if b["step"] == "decode"]
    assert {"dense.qkv_proj", "dense.ffn_up", "head.lm_head"} <= {b["name"] for b in rows}
    code, out, _ = run_cli(
        ["explain", "--model", "llama-3.1-8b", "--cluster", "h100x2", "--tp", "2"],
        capsys,
        monkeypatch,
    )
    assert code == 0 and "dense.ffn_up" in out and "memory on the fullest GPU" in out


def test_dense_model_accepts_consistent_expert_flags(capsys, monkeypatch) -> None:
    base = ["evaluate", "--model", "llama-3.1-8b", "--cluster", "h100x8", "--format", "json"]
    code, out, _ = run_cli([*base, "--tp", "4", "--ep", "2", "--etp", "2"], capsys, monkeypatch)
    assert code == 0
    assert json.loads(out)["plan"]["degrees"]["ep"] == 1
    code, _, err = run_cli([*base, "--tp", "4", "--ep", "3"], capsys, monkeypatch)
    assert code == 2 and "ep" in err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--tp", "3"], "does not divide"),
        (["--tp", "8", "--pp", "2", "--replicas", "2"], "use 32 GPUs"),
        (["--plan", "/nonexistent/plan.json"], "cannot read the plan"),
        (["--plan", "x.json", "--tp", "8"], "either --plan"),
    ],
)
def test_evaluate_bad_degrees_exit_2(extra: list[str], needle: str, capsys, monkeypatch) -> None:
    code, _, err = run_cli(
        ["evaluate", "--model", "llama-3.1-70b", "--cluster", "h100x8", *extra], capsys, monkeypatch
    )
    assert code == 2, err
    assert needle in err


def test_solve_json_with_method_options(tmp_path: Path, capsys, monkeypatch) -> None:
    out_file = tmp_path / "plan.json"
    args = [
        "solve",
        "--method",
        "optuna",
        "--sampler",
        "random",
        "--max-evals",
        "20",
        "--model",
        "llama-3.1-8b",
        "--cluster",
        "h100x2",
        "--format",
        "json",
        "--out",
        str(out_file),
    ]
    code, out, _ = run_cli(args, capsys, monkeypatch)
    assert code == 0
    data = json.loads(out)
    for key in (
        "method",
        "seed",
        "status",
        "n_evals",
        "wall_s",
        "metrics",
        "plan",
        "history",
        "baseline",
    ):
        assert key in data
    assert data["n_evals"] <= 20 and data["baseline"]["method"] == "megatron"
    assert json.loads(out_file.read_text())["schema"] == "shardlab.plan/1"
    code, _, err = run_cli(["solve", "--method", "random", "--sampler", "tpe"], capsys, monkeypatch)
    assert code == 2 and "option 'sampler' does not apply" in err and "(set by --sampler)" in err


def test_train_policy_then_solve_from_it(tmp_path: Path, capsys, monkeypatch) -> None:
    policy = tmp_path / "policy.pt"
    code, out, err = run_cli(
        ["train-policy", "--suite", "llama8b-h100x2-chat", "--evals", "40", "--out", str(policy)],
        capsys,
        monkeypatch,
    )
    assert code == 0, err
    assert policy.exists() and "wrote" in out and "40 evals" in err
    assert not list(tmp_path.glob(".*tmp*"))
    args = ["solve", "--method", "rl", "--policy", str(policy), "--model", "llama-3.1-8b"]
    args += ["--cluster", "h100x2", "--max-evals", "60", "--seed", "4", "--format", "json"]
    runs = []
    for _ in range(2):
        code, out, err = run_cli(args, capsys, monkeypatch)
        assert code == 0, err
        runs.append(json.loads(out))
    assert runs[0]["plan"] == runs[1]["plan"] and runs[0]["n_evals"] <= 60
    code, _, err = run_cli(
        ["solve", "--method", "cpsat", "--policy", str(policy)], capsys, monkeypatch
    )
    assert code == 2 and "option 'policy' does not apply" in err and "(set by --policy)" in err
    code, _, err = run_cli(
        ["solve", "--method", "rl", "--policy", str(tmp_path / "missing.pt")], capsys, monkeypatch
    )
    assert code == 2 and "missing.pt" in err and len(err.strip().splitlines()) == 1


def test_bench_evaluator_writes_its_table_with_its_command(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    out_file = tmp_path / "speed.md"
    args = ["bench", "evaluator", "--instances", "llama8b-h100x2-chat", "--repeats", "2"]
    code, _, err = run_cli([*args, "--out", str(out_file)], capsys, monkeypatch)
    assert code == 0 and "llama8b-h100x2-chat" in err
    text = out_file.read_text()
    assert f"`shardlab {' '.join(args)} --out {out_file}`" in text
    assert "Best of 2 repeats" in text
    row = next(line for line in text.splitlines() if line.startswith("| llama8b-h100x2-chat"))
    cells = [c.strip().replace(",", "") for c in row.strip("|").split("|")[1:]]
    assert len(cells) == 9 and all(float(c) > 0 for c in cells)


def test_bench_solves_times_each_command_beside_a_baseline_tree(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    import shardlab
    from shardlab import bench

    tree = str(Path(shardlab.__file__).resolve().parents[1])
    monkeypatch.setattr(bench, "SOLVE_RUNS", (("tiny", ("--model", "llama-3.1-8b")),))
    out_file = tmp_path / "solves.md"
    args = ["bench", "solves", "--baseline", tree, "--out", str(out_file)]
    code, _, err = run_cli(args, capsys, monkeypatch)
    assert code == 0, err
    row = next(line for line in out_file.read_text().splitlines() if line.startswith("| tiny"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # the same code on both sides: the same proven optimum
    assert cells[3] == cells[7] == "optimal" and cells[4] == cells[8] != "-"
    code, _, err = run_cli(["bench", "solves", "--baseline", str(tmp_path)], capsys, monkeypatch)
    assert code == 2 and "not a shardlab source tree" in err
