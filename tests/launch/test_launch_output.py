"""What ``shardlab launch`` says besides the commands: the plan's degrees mapped to each
engine's flags, and which engine a plan file was made for (a mismatch refused unless
forced)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardlab.launch.servers import build_launch
from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem
from tests.conftest import run_cli
from tests.launch.test_launch import CASES, runnable_plan

# The mapping of an attention-DP plan, engine by engine: vLLM's TP is the attention TP
# with one engine core per DP rank; SGLang's and TensorRT-LLM's TP is the stage's group.
DP_MAPPING = {
    "vllm": "plan pp=1 tp=1 dp_attn=8 ep=8 etp=1 -> --tensor-parallel-size 1 "
    "--data-parallel-size 8 --enable-expert-parallel",
    "sglang": "plan pp=1 tp=1 dp_attn=16 ep=16 etp=1 -> --tp-size 16 --dp-size 16 "
    "--enable-dp-attention --enable-dp-lm-head --ep-size 16",
    "trtllm": "plan pp=1 tp=1 dp_attn=8 ep=8 etp=1 -> --tp_size 8 --pp_size 1 --ep_size 8, "
    "enable_attention_dp: true, moe_expert_parallel_size: 8, moe_tensor_parallel_size: 1 "
    "(extra-llm-api-config.yaml)",
}


@pytest.mark.parametrize("engine", sorted(DP_MAPPING))
def test_the_degrees_map_to_the_engines_flags(engine: str) -> None:
    found = next(
        r for c in CASES if c[2].dp_attn > 1 and (r := runnable_plan(engine, *c)) is not None
    )
    launch = build_launch(*found, model_path="m")
    (line,) = launch.degree_flags
    assert line == DP_MAPPING[engine]
    flags = line.split(" -> ")[1].split(", ")[0]
    for c in launch.commands:  # the flags shown are the ones the commands carry
        assert flags in " ".join(c.argv)


def test_launch_prints_the_mapping_per_pool(tmp_path: Path, capsys, monkeypatch) -> None:
    problem = Problem.build("llama-3.1-70b", "h100x16", engine="sglang", space_kind="engine")
    plan = problem.space.megatron_plan(Degrees(pp=2, tp=8, etp=8))
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json(problem.model, cluster="h100x16"))
    code, out, err = run_cli(
        ["launch", "--plan", str(path), "--engine", "sglang"], capsys, monkeypatch
    )
    assert code == 0, err
    assert out.splitlines()[1] == "plan pp=2 tp=8 dp_attn=1 -> --tp-size 8 --pp-size 2"


def _solved(tmp_path: Path, capsys, monkeypatch, engine: str) -> Path:
    path = tmp_path / f"{engine}.json"
    code, _, err = run_cli(
        ["solve", "--model", "llama-3.1-8b", "--cluster", "h100x8", "--engine", engine,
         "--space", "engine", "--method", "megatron", "--out", str(path)], capsys, monkeypatch,
    )  # fmt: skip
    assert code == 0, err
    return path


def test_a_plan_records_its_engine_and_launch_holds_it_to_it(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    path = _solved(tmp_path, capsys, monkeypatch, "sglang")
    data = json.loads(path.read_text())
    assert data["engine"] == "sglang" and data["accelerator"] == "h100"
    code, out, err = run_cli(["launch", "--plan", str(path)], capsys, monkeypatch)
    assert code == 0 and "with sglang" in out  # the engine it was made for
    code, out, err = run_cli(
        ["launch", "--plan", str(path), "--engine", "vllm"], capsys, monkeypatch
    )
    assert code == 2 and not out and len(err.strip().splitlines()) == 1
    assert "made for engine sglang, not vllm" in err and "--force-engine" in err
    code, out, err = run_cli(
        ["launch", "--plan", str(path), "--engine", "vllm", "--force-engine"],
        capsys, monkeypatch,
    )  # fmt: skip
    assert code == 0 and "vllm serve" in out
    assert "launched on vllm, but" in out and "was made for sglang" in out
    # the deployment targets too
    code, _, err = run_cli(
        ["launch", "--plan", str(path), "--engine", "vllm", "--target", "llm-d"],
        capsys, monkeypatch,
    )  # fmt: skip
    assert code == 2 and "made for engine sglang" in err


def test_a_plan_file_without_its_engine_still_reads(tmp_path: Path, capsys, monkeypatch) -> None:
    path = _solved(tmp_path, capsys, monkeypatch, "vllm")
    data = json.loads(path.read_text())
    del data["engine"], data["accelerator"]
    problem = Problem.build("llama-3.1-8b", "h100x8")
    assert Plan.from_dict(data, problem.model).degrees.num_gpus == 8
    path.write_text(json.dumps(data))
    code, _, err = run_cli(["launch", "--plan", str(path)], capsys, monkeypatch)
    assert code == 2 and "does not record the engine" in err and "--engine" in err
    code, out, _ = run_cli(["launch", "--plan", str(path), "--engine", "vllm"], capsys, monkeypatch)
    assert code == 0 and "does not record its engine" in out


def test_a_sized_deployment_holds_its_engine(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "d.json"
    code, _, err = run_cli(
        ["size", "--model", "llama-3.1-8b", "--engine", "sglang", "--gpus", "h100",
         "--max-gpus", "4", "--rate", "5", "--serving", "agg", "--out", str(out)],
        capsys, monkeypatch,
    )  # fmt: skip
    assert code == 0, err
    code, _, err = run_cli(["launch", "--plan", str(out), "--engine", "vllm"], capsys, monkeypatch)
    assert code == 2 and "made for engine sglang, not vllm" in err
    code, text, err = run_cli(["launch", "--plan", str(out)], capsys, monkeypatch)
    assert code == 0 and "sglang.launch_server" in text
