from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardlab import ShardlabError
from shardlab.problems.catalog import CATALOG, load_model
from shardlab.problems.hf_config import load_config_file, model_from_config
from shardlab.problems.model import FULL, AttentionSpan
from tests.conftest import MODEL_DIR

# Model cards' totals and active parameters per token, in billions, and whether the
# card's active figure includes the input embedding (OpenAI says gpt-oss's does not;
# DeepSeek's, Kimi-K2's, GLM-5's and MiniMax-M2's round from the count without it:
# 36.6 -> "37B", 31.7 -> "32B", 40.1 -> "40B", 10.4 -> "10B", where the count with it
# rounds to 38, 33, 41 and 11). Qwen3-30B-A3B's 3.3B is the count with it (3.35).
# Text models only: Llama 4's 109B and Gemma 3's 27B include their vision encoders
# (about 1B and 0.4B), GLM-4.5's 355B its MTP layer.
# Card figures (billions): total, active (None: not checked) and what the card counts:
# every weight ("all"), all but the input embedding ("no input embedding"), or neither
# embedding matrix ("no embeddings").
PUBLISHED: dict[str, tuple[float, float | None, str]] = {
    "meta-llama--Meta-Llama-3.1-8B.json": (8.0, None, "all"),
    "meta-llama--Meta-Llama-3.1-70B.json": (70.6, None, "all"),
    "meta-llama--Meta-Llama-3.1-405B.json": (405.9, None, "all"),
    "mistralai--Mixtral-8x7B-v0.1.json": (46.7, 12.9, "all"),
    "mistralai--Mixtral-8x22B-v0.1.json": (141.0, 39.0, "all"),
    "Qwen--Qwen3-235B-A22B.json": (235.0, 22.0, "all"),
    "deepseek-ai--DeepSeek-V3.json": (671.0, 37.0, "no input embedding"),
    "moonshotai--Kimi-K2-Instruct.json": (1040.0, 32.0, "no input embedding"),
    "openai--gpt-oss-120b.json": (117.0, 5.1, "no input embedding"),
    "Qwen--Qwen3-32B.json": (32.8, None, "all"),
    "Qwen--Qwen3-8B.json": (8.2, None, "all"),
    "Qwen--Qwen3-30B-A3B.json": (30.5, 3.3, "all"),
    "meta-llama--Llama-4-Scout-17B-16E-Instruct.json": (109.0, 17.0, "all"),
    "meta-llama--Llama-4-Maverick-17B-128E-Instruct.json": (400.0, 17.0, "all"),
    "google--gemma-3-27b-it.json": (27.0, None, "all"),
    # GLM-4.5's "32B active": the count is 32.9B without the embedding, 33.6B with it;
    # the card does not say what it counts, so its active figure is not checked.
    "zai-org--GLM-4.5.json": (355.0, None, "no input embedding"),
    # GLM-5's "40B active" is 39.9B without both embedding matrices (40.8B without the
    # input embedding, 41.8B with it; DSA's indexers are 0.7B of it).
    "zai-org--GLM-5.json": (744.0, 40.0, "no embeddings"),
    "MiniMaxAI--MiniMax-M2.json": (230.0, 10.0, "no input embedding"),
    "deepseek-ai--DeepSeek-V3.2.json": (671.0, 37.0, "no input embedding"),
    "google--gemma-4-26B-A4B.json": (25.2, 3.8, "all"),
    # "80B in total and 3B activated", "79B non-embedding": 79.7B counted, 79.1B without
    # both embedding matrices. The "3B" is the A3B of the name: 3.25B without both
    # embedding matrices, 3.9B with them; not checked.
    "Qwen--Qwen3-Next-80B-A3B-Instruct.json": (80.0, None, "all"),
    # "48B total, 3B activated": 49.1B counted, 48.4B without both embedding matrices;
    # active 3.5B with them, 2.7B without: the "3B" is not checked.
    "moonshotai--Kimi-Linear-48B-A3B-Instruct.json": (48.0, None, "no embeddings"),
}

HF_FILES = sorted(p.name for p in MODEL_DIR.glob("*.json") if not p.name.startswith("shardlab"))


def test_every_shipped_hf_config_is_covered() -> None:
    assert set(HF_FILES) == set(PUBLISHED)


@pytest.mark.parametrize("name", HF_FILES)
def test_parameter_counts_match_published(name: str) -> None:
    model = load_config_file(MODEL_DIR / name)
    total, active, counts = PUBLISHED[name]
    count = model.num_params()
    unembedded = model.embedding_params() + model.lm_head_params()
    counted_total = count.total - (unembedded if counts == "no embeddings" else 0)
    assert counted_total / 1e9 == pytest.approx(total, rel=0.02)
    if active is not None:
        counted = {
            "all": count.active,
            "no input embedding": count.active_compute,
            "no embeddings": count.active - unembedded,
        }[counts]
        # Cards round active figures to whole billions ("10B"), small ones to tenths.
        assert counted / 1e9 == pytest.approx(active, abs=0.5 if active >= 10 else 0.1)
    assert count.active_compute <= count.active <= count.total


def test_active_parameters_include_the_input_embedding() -> None:
    # The examples: Qwen3-8B's card says 8.2B, Qwen3-30B-A3B's 3.3B active.
    assert load_model("qwen3-8b").num_params().active / 1e9 == pytest.approx(8.19, abs=0.01)
    moe = load_model("qwen3-30b-a3b").num_params()
    assert moe.active / 1e9 == pytest.approx(3.35, abs=0.01)
    assert moe.active_compute / 1e9 == pytest.approx(3.04, abs=0.01)


def test_architectures_are_read() -> None:
    ds = load_model("deepseek-v3")
    assert ds.mla is not None and ds.mla.kv_lora_rank == 512
    assert ds.layer_kinds[:3] == ("dense",) * 3 and ds.layer_kinds[3:] == ("moe",) * 58
    assert ds.moe is not None and ds.moe.num_shared_experts == 1
    assert ds.weight_dtype == "fp8"
    kimi = load_model("kimi-k2")
    assert kimi.layers_of("dense") == 1 and kimi.moe is not None and kimi.moe.num_experts == 384
    oss = load_model("gpt-oss-120b")
    assert oss.attention_spans[0] == AttentionSpan(kind="sliding", tokens=128)
    assert oss.attention_spans[1] == FULL
    assert oss.weight_dtype == "fp4" and oss.quantized_families == ("experts",)
    llama = load_model("llama-3.1-70b")
    assert (llama.num_heads, llama.num_kv_heads, llama.head_dim) == (64, 8, 128)
    assert not llama.is_moe
    qwen = load_model("Qwen/Qwen3-235B-A22B")
    assert qwen.qk_norm == "head" and qwen.moe is not None and qwen.moe.top_k == 8


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
        ({"num_attention_heads": None}, "'num_attention_heads'"),
        ({"vocab_size": 0}, "'vocab_size'"),
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


@pytest.mark.parametrize("model_type", ["mamba_like", None])
def test_an_unknown_or_missing_model_type_is_read_by_structure(
    llama8b_config: dict, model_type: str | None
) -> None:
    cfg = {k: v for k, v in {**llama8b_config, "model_type": model_type}.items() if v}
    model = model_from_config(cfg, name="x", source="x/config.json")
    direct = model_from_config(llama8b_config, name="x", source="x/config.json")
    assert model.num_params() == direct.num_params() and len(model.notices) == 1
    assert "not a known family" in model.notices[0]


def test_malformed_json_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ShardlabError, match="not valid JSON"):
        load_config_file(bad)
    with pytest.raises(ShardlabError, match="cannot read"):
        load_config_file(tmp_path / "missing.json")
    with pytest.raises(ShardlabError, match="not in the catalog"):
        load_model("no-such-model")
