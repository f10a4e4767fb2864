from __future__ import annotations

from pathlib import Path

import pytest

from shardlab import ShardlabError
from shardlab.problems.cluster import builtin_accelerators, load_cluster_yaml, parse_cluster
from shardlab.problems.problem import Problem
from shardlab.problems.workload import PRESETS, Workload, get_workload


def test_builtin_accelerators_have_datasheet_numbers() -> None:
    accs = builtin_accelerators()
    assert set(accs) >= {"h100", "h200", "b200", "a100"}
    h100 = accs["h100"]
    assert (h100.bf16_tflops, h100.fp8_tflops, h100.hbm_gb, h100.hbm_gbps) == (989, 1979, 80, 3350)
    assert accs["a100"].peak_tflops("fp8") == accs["a100"].bf16_tflops  # no FP8 tensor cores
    assert accs["b200"].peak_tflops("fp4") == 9000
    assert accs["h100"].peak_tflops("fp4") == 989  # mxfp4 weights are upcast on Hopper


def test_cluster_spec() -> None:
    c = parse_cluster("h100x64")
    assert (c.num_gpus, c.gpus_per_node, c.num_hosts) == (64, 8, 8)
    assert parse_cluster("H200x4").num_hosts == 1


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("z100x8", "unknown GPU"),
        ("h100x12", "whole hosts"),
        ("h100x0", "at least 1"),
        ("h100", "GPUxCOUNT"),
    ],
)
def test_bad_cluster_spec(spec: str, needle: str) -> None:
    with pytest.raises(ShardlabError, match=needle):
        parse_cluster(spec)


def test_cluster_yaml(tmp_path: Path) -> None:
    good = tmp_path / "c.yaml"
    good.write_text("accelerator: h200\nnum_gpus: 16\n")
    assert load_cluster_yaml(good).num_hosts == 2
    custom = tmp_path / "custom.yaml"
    custom.write_text(
        "accelerator:\n  name: My GPU\n  bf16_tflops: 500\n  fp8_tflops: 1000\n"
        "  fp4_tflops: 0\n  hbm_gb: 96\n  hbm_gbps: 4000\n  nvlink_gbps: 400\n"
        "  nvlink_latency_us: 3\n  net_gbps: 50\n  net_latency_us: 10\nnum_gpus: 8\n"
    )
    assert parse_cluster(str(custom)).accelerator.hbm_gb == 96
    for text, needle in [
        ("accelerator: [h100\n", "malformed YAML"),
        ("accelerator: h100\n", "num_gpus"),
        ("accelerator: h100\nnum_gpus: 8\ncolor: red\n", "unknown keys"),
        ("accelerator: h100\nnum_gpus: eight\n", "integer"),
        ("accelerator: {name: x}\nnum_gpus: 8\n", "misses"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ShardlabError, match=needle):
            load_cluster_yaml(bad)


def test_workload_presets_and_overrides() -> None:
    assert {"chat", "long-context", "batch-offline"} <= set(PRESETS)
    chat = get_workload("chat")
    assert (chat.input_len, chat.output_len) == (1024, 256)
    w = chat.with_overrides(batch=8, tpot_ms=30.0, input_len=None)
    assert (w.batch, w.tpot_ms, w.input_len) == (8, 30.0, 1024)
    with pytest.raises(ShardlabError, match="phase"):
        Workload(phase="train")  # type: ignore[arg-type]
    with pytest.raises(ShardlabError, match="batch"):
        chat.with_overrides(batch=0)
    with pytest.raises(ShardlabError, match="unknown field"):
        chat.with_overrides(colour="red")
    with pytest.raises(ShardlabError, match="weight dtype"):
        chat.with_overrides(weight_dtype="int3")
    with pytest.raises(ShardlabError, match="unknown preset"):
        get_workload("nope")


def test_precision_defaults_follow_the_config() -> None:
    ds = Problem.build("deepseek-v3", "h100x64")
    assert ds.weight_dtype("experts") == "fp8" and ds.weight_dtype("embedding") == "bf16"
    oss = Problem.build("gpt-oss-120b", "h100x8")
    assert oss.weight_dtype("experts") == "fp4" and oss.weight_dtype("attention") == "bf16"
    forced = Problem.build("gpt-oss-120b", "h100x8", weight_dtype="fp8", kv_dtype="fp8")
    assert forced.weight_dtype("attention") == "fp8" and forced.kv_dtype == "fp8"
    assert Problem.build("deepseek-v3", "h100x64", weight_dtype="bf16").weight_bytes() > (
        ds.weight_bytes() * 1.9
    )


def test_model_larger_than_cluster_is_refused() -> None:
    with pytest.raises(ShardlabError, match=r"needs .* GB for its weights"):
        Problem.build("kimi-k2", "h100x8")
