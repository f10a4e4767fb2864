from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from shardlab.cli import main


def run_cli(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["shardlab", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


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
        (["space", "--cluster", "h100x12"], "whole nodes"),
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
