from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import MODEL_DIR

from shardlab import ShardlabError
from shardlab.problems.catalog import CATALOG, load_model
from shardlab.problems.model import load_config_file, model_from_config

# Published totals / active parameters per token, in billions.
PUBLISHED = {
    "meta-llama--Meta-Llama-3.1-8B.json": (8.0, None),
    "meta-llama--Meta-Llama-3.1-70B.json": (70.6, None),
    "meta-llama--Meta-Llama-3.1-405B.json": (405.9, None),
    "mistralai--Mixtral-8x7B-v0.1.json": (46.7, 12.9),
    "mistralai--Mixtral-8x22B-v0.1.json": (141.0, 39.0),
    "Qwen--Qwen3-235B-A22B.json": (235.0, 22.0),
    "deepseek-ai--DeepSeek-V3.json": (671.0, 37.0),
    "moonshotai--Kimi-K2-Instruct.json": (1040.0, 32.0),
    "openai--gpt-oss-120b.json": (117.0, 5.1),
    "Qwen--Qwen3-32B.json": (32.8, None),
}

HF_FILES = sorted(p.name for p in MODEL_DIR.glob("*.json") if not p.name.startswith("shardlab"))


def test_every_shipped_hf_config_is_covered() -> None:
    assert set(HF_FILES) == set(PUBLISHED)


@pytest.mark.parametrize("name", HF_FILES)
def test_parameter_counts_match_published(name: str) -> None:
    model = load_config_file(MODEL_DIR / name)
    total, active = PUBLISHED[name]
    count = model.num_params()
    assert count.total / 1e9 == pytest.approx(total, rel=0.02)
    if active is not None:
        assert count.active / 1e9 == pytest.approx(active, rel=0.02)
    assert count.active <= count.total


def test_architectures_are_read() -> None:
    ds = load_model("deepseek-v3")
    assert ds.mla is not None and ds.mla.kv_lora_rank == 512
    assert ds.layer_kinds[:3] == ("dense",) * 3 and ds.layer_kinds[3:] == ("moe",) * 58
    assert ds.moe is not None and ds.moe.num_shared_experts == 1
    assert ds.weight_dtype == "fp8"
    kimi = load_model("kimi-k2")
    assert kimi.layers_of("dense") == 1 and kimi.moe is not None and kimi.moe.num_experts == 384
    oss = load_model("gpt-oss-120b")
    assert oss.attention_windows[0] == 128 and oss.attention_windows[1] == 0
    assert oss.weight_dtype == "fp4" and oss.quantized_families == ("experts",)
    llama = load_model("llama-3.1-70b")
    assert (llama.num_heads, llama.num_kv_heads, llama.head_dim) == (64, 8, 128)
    assert not llama.is_moe
    qwen = load_model("Qwen/Qwen3-235B-A22B")
    assert qwen.qk_norm and qwen.moe is not None and qwen.moe.top_k == 8


def test_catalog_1_6t_model() -> None:
    model = load_model("moe-1.6t")
    assert model.num_params().total / 1e12 == pytest.approx(1.6, rel=0.02)
    assert {e.name for e in CATALOG} >= {"deepseek-v3", "kimi-k2", "moe-1.6t"}


def test_text_config_wrapper(llama8b_config: dict) -> None:
    wrapped = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "text_config": llama8b_config,
        "vision_config": {"hidden_size": 1024, "model_type": "clip_vision_model"},
    }
    model = model_from_config(wrapped, name="llava", source="llava/config.json")
    direct = model_from_config(llama8b_config, name="llama", source="x")
    assert model.num_params() == direct.num_params()


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"hidden_size": None}, "'hidden_size'"),
        ({"num_hidden_layers": "32"}, "'num_hidden_layers'"),
        ({"num_hidden_layers": -1}, "'num_hidden_layers'"),
        ({"model_type": "mamba"}, "'model_type'"),
        ({"model_type": None}, "'model_type'"),
        ({"num_key_value_heads": 7}, "num_key_value_heads"),
        ({"quantization_config": {"quant_method": "awq"}}, "quant_method"),
        ({"torch_dtype": "int8"}, "'torch_dtype'"),
    ],
)
def test_bad_config_names_file_and_key(
    tmp_path: Path, llama8b_config: dict, change: dict, needle: str
) -> None:
    cfg = {**llama8b_config, **change}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ShardlabError) as info:
        load_config_file(path)
    assert str(path) in str(info.value)
    assert needle in str(info.value)


def test_malformed_json_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ShardlabError, match="not valid JSON"):
        load_config_file(bad)
    with pytest.raises(ShardlabError, match="cannot read"):
        load_config_file(tmp_path / "missing.json")
    with pytest.raises(ShardlabError, match="not in the catalog"):
        load_model("no-such-model")
