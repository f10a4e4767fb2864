"""The engines' registry and the rules every capability model shares."""

from __future__ import annotations

import pytest

from shardlab.errors import ShardlabError
from shardlab.problems.catalog import load_model
from shardlab.problems.cluster import parse_cluster
from shardlab.problems.degrees import enumerate_degrees
from shardlab.problems.engines import CAPABILITIES, ENGINES, capability
from shardlab.problems.engines.base import Capability, block_split
from shardlab.problems.plan import Degrees


def test_the_registry_holds_one_model_per_engine() -> None:
    assert tuple(CAPABILITIES) == ENGINES == ("trtllm", "vllm", "sglang")
    for name in ENGINES:
        cap = capability(name)
        assert isinstance(cap, Capability) and cap.engine == name and cap.version


def test_an_unknown_engine_is_refused_with_its_field() -> None:
    with pytest.raises(ShardlabError) as info:
        capability("tgi")
    assert info.value.field == "engine"
    assert "--" not in str(info.value) and "vllm" in str(info.value)


def test_an_engine_that_runs_nothing_names_the_engine_field() -> None:
    model, cluster = load_model("llama-3.1-8b"), parse_cluster("h100x8")
    # only degree tuples vLLM refuses: attention data parallel of a dense model
    refused = tuple(d for d in enumerate_degrees(model, cluster) if d.dp_attn > 1)
    with pytest.raises(ShardlabError) as info:
        capability("vllm").configs(model, cluster, refused)
    assert info.value.field == "engine" and "dense model" in str(info.value)


def test_block_split_refuses_partial_fp8_blocks() -> None:
    model = load_model("deepseek-v3")  # 128-row fp8 blocks, 18,432-wide dense FFN
    assert model.weight_block == 128
    assert block_split(model, Degrees(tp=8, etp=8), {"ffn_up": "column"}) is None
    why = block_split(model, Degrees(tp=64, etp=64), {"ffn_up": "column"})  # 288 rows
    assert why is not None and "fp8 blocks" in why
    assert block_split(load_model("llama-3.1-8b"), Degrees(tp=3, etp=3), {}) is None
