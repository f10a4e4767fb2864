"""Layers read by structure: attention spans (full, sliding, chunked), dense and MoE
layers interleaved, shared experts; each end to end on a tiny instance."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardlab import Problem, ShardlabError
from shardlab.costmodel import evaluate, evaluate_batch
from shardlab.costmodel.steps import Step, attended, causal_pairs, kv_context
from shardlab.problems.catalog import load_model
from shardlab.problems.hf_config import load_config_file, model_from_config
from shardlab.problems.model import FULL, AttentionSpan
from shardlab.solvers import Budget, solve
from tests.conftest import MODEL_DIR

# A Llama-4-shaped toy: chunked RoPE layers, one global NoPE layer in four.
TINY_LLAMA4 = {
    "model_type": "llama4_text",
    "hidden_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 4096,
    "intermediate_size": 256,
    "intermediate_size_mlp": 1024,
    "attention_chunk_size": 1024,
    "no_rope_layers": [1, 1, 1, 0],
}


def _tiny(**change: object) -> dict:
    return {k: v for k, v in {**TINY_LLAMA4, **change}.items() if v is not None}


def _load(cfg: dict):
    return model_from_config(cfg, name="tiny", source="tiny/config.json")


# -- attention spans -------------------------------------------------------------------


@given(
    length=st.integers(1, 3000),
    tokens=st.integers(1, 700),
    kind=st.sampled_from(["sliding", "chunked"]),
)
def test_pairs_and_contexts_count_the_keys_each_token_sees(
    length: int, tokens: int, kind: str
) -> None:
    span = AttentionSpan(kind=kind, tokens=tokens)  # type: ignore[arg-type]
    positions = np.arange(length)
    # Chunked: the tokens of its own chunk, itself included.
    keys = np.minimum(positions + 1, tokens) if kind == "sliding" else positions % tokens + 1
    assert causal_pairs(length, span) == keys.sum()
    assert np.array_equal(attended(positions + 1.0, span), keys)
    assert causal_pairs(length, FULL) == length * (length + 1) / 2
    assert causal_pairs(length, span) <= causal_pairs(length, FULL)


def test_a_decode_token_reads_at_most_its_span() -> None:
    step = Step(kind="decode", tokens=1.0, logits=1.0, input_len=8192, output_len=256)
    full = step.decode_context(FULL)
    assert full == pytest.approx(8192 + 128)
    assert step.decode_context(AttentionSpan(kind="sliding", tokens=1024)) == 1024
    # Chunked: positions 8193..8447 sit in the 9th chunk of 1024, 1..255 tokens into it.
    assert step.decode_context(AttentionSpan(kind="chunked", tokens=1024)) == pytest.approx(128)


def test_a_chunked_layer_caches_its_chunk_and_costs_less_than_a_full_one() -> None:
    chunked = _load(_tiny(no_rope_layers=[1, 1, 1, 1]))
    full = _load(_tiny(attention_chunk_size=None, no_rope_layers=None))
    assert set(chunked.attention_spans) == {AttentionSpan(kind="chunked", tokens=1024)}
    assert set(full.attention_spans) == {FULL}
    plans, problem = [], None
    for model in (chunked, full):
        problem = Problem.build(model, "h100x1", "chat", input_len=8192, output_len=256)
        plans.append(evaluate(problem, problem.space.megatron_plan(problem.space.degree_tuples[0])))
    c, f = plans
    per_request = [m.kv_cache_gb / m.requests_in_flight for m in plans]
    # KV per request: the chunk (1024) against the context a request holds on average.
    assert problem is not None
    ratio = 1024 / kv_context(problem.workload)
    assert per_request[0] / per_request[1] == pytest.approx(ratio, rel=1e-6)
    assert c.tpot_ms < f.tpot_ms and c.ttft_ms < f.ttft_ms


def test_explain_shows_kv_memory_per_attention_kind() -> None:
    problem = Problem.build("llama-4-scout", "h100x8", "chat", input_len=65536, output_len=1024)
    degrees = next(d for d in problem.space.degree_tuples if d.pp == 1 and d.tp == 4)
    plan = problem.space.megatron_plan(degrees)
    rows = {r.name: r for r in evaluate(problem, plan).breakdown if r.step == "prefill"}
    full, chunked = rows["moe.attention (full)"], rows["moe.attention (chunked 8192)"]
    assert (full.layers, chunked.layers) == (12, 36)
    per_layer = (chunked.kv_gb / 36) / (full.kv_gb / 12)
    assert per_layer == pytest.approx(8192 / kv_context(problem.workload), rel=1e-6)


@pytest.mark.parametrize(
    ("change", "spans"),
    [
        ({"no_rope_layers": []}, ["chunked 1024"] * 3 + ["full"]),  # the interval fallback
        (
            {"layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 64},
            ["sliding 64", "full"] * 2,
        ),
        (
            {
                "model_type": "gemma3_text",
                "attention_chunk_size": None,
                "no_rope_layers": None,
                "sliding_window": 32,
                "sliding_window_pattern": 2,
            },
            ["sliding 32", "full"] * 2,
        ),
        (
            {"attention_chunk_size": None, "no_rope_layers": None, "sliding_window": 16},
            ["sliding 16"] * 4,  # Mistral-style: every layer slides
        ),
        (
            {
                "model_type": "gemma2",
                "attention_chunk_size": None,
                "no_rope_layers": None,
                "sliding_window": 16,
            },
            ["sliding 16", "full"] * 2,  # Gemma 2 alternates by default
        ),
    ],
)
def test_attention_pattern_keys(change: dict, spans: list[str]) -> None:
    assert [s.short() for s in _load(_tiny(**change)).attention_spans] == spans


# -- FFN layers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "kinds"),
    [
        ({"interleave_moe_layer_step": 2}, "dmdm"),
        ({"interleave_moe_layer_step": 1}, "mmmm"),
        ({"moe_layers": [0, 3]}, "mddm"),
        ({"mlp_layer_types": ["dense", "sparse", "sparse", "dense"]}, "dmmd"),
        ({"first_k_dense_replace": 1}, "dmmm"),
        ({"decoder_sparse_step": 2, "mlp_only_layers": [3]}, "dmdd"),
        ({}, "mmmm"),
    ],
)
def test_moe_placement_keys(change: dict, kinds: str) -> None:
    cfg = _tiny(num_local_experts=4, num_experts_per_tok=1, **change)
    model = _load(cfg)
    assert "".join(k[0] for k in model.layer_kinds) == kinds


def test_llama4_layers_count_their_shared_expert_and_two_widths() -> None:
    model = _load(_tiny(num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2))
    moe = model.moe
    assert moe is not None and (moe.num_experts, moe.top_k, moe.expert_ffn_size) == (4, 1, 256)
    assert (moe.num_shared_experts, moe.shared_ffn_size, model.ffn_size) == (1, 256, 1024)
    h, v = 512, 4096
    attn = h * (8 + 2 + 2) * 64 + 8 * 64 * h + 2 * h  # q, k, v, o; two norms; no qk weights
    dense = 3 * h * 1024
    moe_layer = h * 4 + 3 * h * 256 + 4 * 3 * h * 256  # router, shared expert, experts
    active_moe = h * 4 + 3 * h * 256 + 1 * 3 * h * 256
    count = model.num_params()
    assert count.total == 4 * attn + 2 * dense + 2 * moe_layer + h + 2 * v * h
    assert count.active == 4 * attn + 2 * dense + 2 * active_moe + h + 2 * v * h
    assert count.embedding == v * h and count.active_compute == count.active - v * h


def test_tied_embeddings_count_once() -> None:
    untied, tied = _load(_tiny()), _load(_tiny(tie_word_embeddings=True))
    assert untied.num_params().total - tied.num_params().total == 4096 * 512
    assert tied.num_params().embedding == 0


# -- end to end ------------------------------------------------------------------------


def test_chunked_layers_end_to_end_cpsat_equals_exhaustive() -> None:
    model = _load(_tiny())
    problem = Problem.build(model, "h100x2", "chat", input_len=8192, output_len=256)
    exact = solve(problem, "cpsat", budget=Budget(max_evals=None, seconds=300))
    truth = solve(problem, "exhaustive", budget=Budget(max_evals=None))
    assert exact.status == truth.status == "optimal"
    assert exact.metrics.objective == pytest.approx(truth.metrics.objective, rel=1e-4)
    assert exact.metrics == evaluate(problem, exact.plan)


def test_interleaved_moe_end_to_end_cpsat_is_never_beaten() -> None:
    # Two layer kinds put exhaustive enumeration out of reach (1.1e9 plans on two GPUs):
    # CP-SAT's proven optimum is checked against 20,000 sampled plans and Megatron's.
    model = _load(_tiny(num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2))
    problem = Problem.build(model, "h100x2", "chat", input_len=8192, output_len=256)
    exact = solve(problem, "cpsat", budget=Budget(max_evals=None, seconds=300))
    assert exact.status == "optimal" and exact.metrics == evaluate(problem, exact.plan)
    space = problem.space
    rows = np.concatenate(
        [
            space.sample(20_000, seed=0),
            np.stack([space.encode(space.megatron_plan(d)) for d in space.degree_tuples]),
        ]
    )
    m = evaluate_batch(problem, rows)
    best = m.objective[m.feasible].max()
    assert best <= exact.metrics.objective * (1 + 1e-4)


# -- reading by structure --------------------------------------------------------------


def test_an_unknown_model_type_with_standard_keys_loads_with_a_notice() -> None:
    model = _load(_tiny(model_type="brand_new_lm"))
    assert model.notices and "'brand_new_lm' is not a known family" in model.notices[0]
    assert len(model.notices[0].splitlines()) == 1
    assert _load(_tiny()).notices == ()


def test_the_cli_prints_the_notice_on_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from shardlab.cli import app

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_tiny(model_type="brand_new_lm")))
    r = CliRunner().invoke(app, ["space", "--model", str(path), "--cluster", "h100x1"])
    assert r.exit_code == 0, r.output
    notices = [line for line in r.stderr.splitlines() if line.startswith("notice:")]
    assert len(notices) == 1 and "brand_new_lm" in notices[0]


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"layer_types": ["linear_attention", "full_attention"] * 2}, "'layer_types'"),
        ({"layer_types": ["full_attention"] * 3}, "'layer_types'"),
        ({"linear_attn_config": {"kda_layers": [1]}}, "'num_heads'"),
        ({"linear_attn_config": {"kda_layers": [9]}}, "'linear_attn_config'"),
        ({"linear_attn_config": [1]}, "'linear_attn_config'"),
        ({"linear_num_value_heads": 32}, "'linear_num_key_heads'"),
        ({"num_kv_shared_layers": 9}, "'num_kv_shared_layers'"),
        ({"hidden_size_per_layer_input": 256}, "'hidden_size_per_layer_input'"),
        ({"use_double_wide_mlp": True}, "'use_double_wide_mlp'"),
        ({"index_topk": 64}, "'index_topk'"),
        ({"no_rope_layers": [1, 0]}, "'no_rope_layers'"),
        ({"num_local_experts": 4, "num_experts_per_tok": 8}, "'num_experts_per_tok'"),
        ({"num_local_experts": 4, "num_experts_per_tok": 1, "moe_layers": [9]}, "'moe_layers'"),
        (
            {"num_local_experts": 4, "num_experts_per_tok": 1, "mlp_layer_types": ["x"] * 4},
            "'mlp_layer_types'",
        ),
        ({"max_position_embeddings": 0}, "'max_position_embeddings'"),
        ({"model_type": 7}, "'model_type'"),
    ],
)
def test_structural_refusals_name_the_key_in_one_line(change: dict, key: str) -> None:
    with pytest.raises(ShardlabError) as info:
        _load(_tiny(**change))
    message = str(info.value)
    assert key in message and len(message.splitlines()) == 1


def test_text_config_must_be_an_object() -> None:
    with pytest.raises(ShardlabError, match="'text_config'"):
        model_from_config({"model_type": "x", "text_config": "x"}, name="x", source="x")


# The families the issue lists that load today, each from its shipped config.json.
NEW_FAMILIES = {
    "llama-4-scout": ("moe", "chunked"),
    "llama-4-maverick": ("dense", "chunked"),
    "gemma-3-27b": ("dense", "sliding"),
    "glm-4.5": ("moe", "full"),
    "glm-5": ("moe", "full"),
    "minimax-m2": ("moe", "full"),
    "deepseek-v3.2": ("moe", "full"),
    "gemma-4-26b-a4b": ("moe", "sliding"),
    "qwen3-next-80b-a3b": ("moe", "full"),
    "kimi-linear-48b-a3b": ("moe", "full"),
}


@pytest.mark.parametrize("name", sorted(NEW_FAMILIES))
def test_current_families_load_and_price(name: str) -> None:
    model = load_model(name)
    kind, span = NEW_FAMILIES[name]
    assert kind in model.layer_kinds and span in {s.kind for s in model.attention_spans}
    problem = Problem.build(model, "h200x16", "chat")
    plan = problem.space.megatron_plan(problem.space.degree_tuples[-1])
    assert evaluate(problem, plan).throughput_tok_s > 0


def test_gemma4_with_per_layer_embeddings_is_refused_naming_the_key(tmp_path: Path) -> None:
    # Gemma 4 E2B/E4B feed every layer a per-layer embedding: not modeled yet.
    path = tmp_path / "gemma4-e2b.json"
    path.write_text(json.dumps(_tiny(model_type="gemma4_text", hidden_size_per_layer_input=256)))
    with pytest.raises(ShardlabError, match="'hidden_size_per_layer_input'"):
        load_config_file(path)


def test_catalog_files_say_where_they_come_from() -> None:
    for path in MODEL_DIR.glob("*.json"):
        cfg = json.loads(path.read_text())
        if path.name in NEW_SOURCED:
            assert cfg.get("_source"), path.name


NEW_SOURCED = {
    "meta-llama--Llama-4-Scout-17B-16E-Instruct.json",
    "meta-llama--Llama-4-Maverick-17B-128E-Instruct.json",
    "google--gemma-3-27b-it.json",
    "zai-org--GLM-4.5.json",
    "zai-org--GLM-5.json",
    "MiniMaxAI--MiniMax-M2.json",
    "deepseek-ai--DeepSeek-V3.2.json",
    "Qwen--Qwen3-8B.json",
    "Qwen--Qwen3-30B-A3B.json",
    "google--gemma-4-26B-A4B.json",
    "Qwen--Qwen3-Next-80B-A3B-Instruct.json",
    "moonshotai--Kimi-Linear-48B-A3B-Instruct.json",
}
