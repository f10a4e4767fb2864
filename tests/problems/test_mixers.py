"""Token mixers beyond one attention shape: Gemma 4's per-kind heads (K = V, KV shared
across layers, the MoE block), DSA sparse attention, gated DeltaNet and KDA linear
attention. Each end to end on a tiny instance, and its counts and memory by hand."""

from __future__ import annotations

import pytest

from shardlab import Problem, ShardlabError
from shardlab.costmodel import evaluate
from shardlab.costmodel.tables import degree_tables
from shardlab.problems.catalog import load_model
from shardlab.problems.hf_config import model_from_config
from shardlab.problems.plan import Degrees
from shardlab.solvers import Budget, solve

BASE = {
    "hidden_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 4096,
    "intermediate_size": 1024,
}
GEMMA4 = {
    **BASE,
    "model_type": "gemma4_text",
    "global_head_dim": 128,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,
    "sliding_window": 512,
    "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    "hidden_size_per_layer_input": 0,
}
KV_SHARED = {
    **GEMMA4,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "num_kv_shared_layers": 2,
}
GDN = {
    **BASE,
    "model_type": "qwen3_next",
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
}
MLA = {
    "kv_lora_rank": 128,
    "q_lora_rank": 256,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
}
KDA = {
    **BASE,
    **MLA,
    "model_type": "kimi_linear",
    "q_lora_rank": None,
    "linear_attn_config": {
        "num_heads": 8,
        "head_dim": 64,
        "short_conv_kernel_size": 4,
        "kda_layers": [1, 2, 3],
        "full_attn_layers": [4],
    },
}
DSA = {
    **BASE,
    **MLA,
    "model_type": "deepseek_v32",
    "index_topk": 1024,
    "index_n_heads": 4,
    "index_head_dim": 64,
}
KINDS = {"gemma4": GEMMA4, "kv-shared": KV_SHARED, "gdn": GDN, "kda": KDA, "dsa": DSA}


def _load(cfg: dict):
    return model_from_config(cfg, name="tiny", source="tiny/config.json")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_mixer_end_to_end_cpsat_equals_exhaustive(kind: str) -> None:
    model = _load(KINDS[kind])
    assert model.num_params().total > 0
    problem = Problem.build(model, "h100x2", "chat", input_len=8192, output_len=256)
    exact = solve(problem, "cpsat", budget=Budget(max_evals=None, seconds=300))
    truth = solve(problem, "exhaustive", budget=Budget(max_evals=None))
    assert exact.status == truth.status == "optimal"
    assert exact.metrics.objective == pytest.approx(truth.metrics.objective, rel=1e-4)
    assert exact.metrics == evaluate(problem, exact.plan)


def _kv_per_request(model, input_len: int) -> dict[str, float]:
    """Resident KV (or state) bytes per request of each mixer's attention operator under
    its canonical (replicated) option."""
    problem = Problem.build(model, "h100x1", "chat", input_len=input_len, output_len=256)
    t = degree_tables(problem, Degrees())
    index = [op.name for op in t.ops[t.classes[0][0]]].index("attention")
    return {a.short(): float(t.op_kv[c, index, 0]) for c, (_, a) in enumerate(t.classes)}


def test_a_linear_layer_keeps_a_fixed_state_a_full_layer_a_growing_cache() -> None:
    model = _load(GDN)
    short, long = _kv_per_request(model, 1024), _kv_per_request(model, 65536)
    lin = model.linear
    assert lin is not None and lin.kind == "gated_deltanet"
    # fp32 recurrent state (8 value heads of 64 x 64) and bf16 conv window (3 x conv_dim)
    state = 8 * 64 * 64 * 4 + 3 * (2 * 4 * 64 + 8 * 64) * 2
    assert short["linear"] == long["linear"] == state
    # A full layer caches K and V of 2 heads of 64 in bf16 for every token it holds.
    assert long["full"] / short["full"] == pytest.approx((65536 + 127.5) / (1024 + 127.5))


def test_gated_deltanet_and_kda_layers_count_their_weights() -> None:
    gdn = _load(GDN)
    a = gdn.attention_layers[0]
    kd, vd, h = 4 * 64, 8 * 64, 512
    conv = (2 * kd + vd) * 4
    assert gdn.qkv_params(a) == h * (2 * kd + 2 * vd) + h * 16 + conv + 16 + 64
    assert gdn.o_params(a) == vd * h
    kda = _load(KDA)
    a = kda.attention_layers[0]
    p = 8 * 64
    expected = 3 * p * h + 3 * p * 4 + (64 * h + p * 64 + p + 8) + 8 * h + (64 * h + p * 64) + 64
    assert kda.qkv_params(a) == expected and kda.o_params(a) == p * h
    assert kda.mla is not None and not kda.attention_layers[3].linear


def test_qwen3_next_gates_its_attention_and_its_shared_expert() -> None:
    model = load_model("qwen3-next-80b-a3b")
    full = model.attention_layers[3]
    assert not full.linear and all(a.linear for a in model.attention_layers[:3])
    # q_proj doubles as the output gate; per-head q and k norms.
    assert model.qkv_params(full) == 2048 * (2 * 16 * 256 + 2 * 2 * 256) + 2 * 256
    assert model.moe is not None and model.moe.shared_gate
    assert model.router_params() == 2048 * 512 + 2048


def test_gemma4_global_layers_have_their_own_heads_and_take_v_from_k() -> None:
    model = _load(GEMMA4)
    sliding, full = model.attention_layers[0], model.attention_layers[3]
    assert (sliding.head_dim, sliding.kv_heads, sliding.k_eq_v) == (64, 2, False)
    assert (full.head_dim, full.kv_heads, full.k_eq_v) == (128, 1, True)
    h = 512
    # q and k only (no v_proj); per-head q and k norms of the layer's head dim.
    assert model.qkv_params(full) == h * (8 * 128 + 128) + 2 * 128
    assert model.qkv_params(sliding) == h * (8 * 64 + 2 * 2 * 64) + 2 * 64
    # Both K and V are cached, at the global layer's shapes.
    assert model.kv_cache_values_per_token(full) == 2 * 1 * 128
    assert model.q_dim(full) == 8 * 128


def test_gemma4_moe_block_runs_the_dense_mlp_next_to_the_experts() -> None:
    model = load_model("gemma-4-26b-a4b")
    assert set(model.layer_kinds) == {"moe"} and model.moe is not None
    moe = model.moe
    assert (moe.num_experts, moe.top_k, moe.expert_ffn_size) == (128, 8, 704)
    assert (moe.num_shared_experts, moe.shared_ffn_size) == (1, 2112)
    assert model.norms_per_layer == 7 and moe.router_scale
    assert model.router_params() == 2816 * 128 + 2816 + 128


def test_kv_sharing_layers_cache_nothing_and_stay_on_their_store_stage() -> None:
    model = _load(KV_SHARED)
    shared = [a.kv_shared for a in model.attention_layers]
    assert shared == [False, False, True, True]
    kv = _kv_per_request(model, 8192)
    assert kv["sliding 512 shared KV"] == kv["full shared KV"] == 0.0
    assert kv["sliding 512"] > 0 and kv["full"] > 0
    consumer = model.attention_layers[2]
    assert model.qkv_params(consumer) == 512 * 8 * 64 + 64  # q_proj and q_norm only
    problem = Problem.build(model, "h100x8", "chat")
    assert {d.pp for d in problem.space.degree_tuples} == {1}
    with pytest.raises(ShardlabError, match="tie options per layer kind"):
        _ = Problem.build(model, "h100x2", "chat", tie="layer").space


def test_dsa_reads_its_top_k_and_caches_its_indexer_keys() -> None:
    sparse = _load(DSA)
    dense = _load({k: v for k, v in DSA.items() if not k.startswith("index_")})
    a = sparse.attention_layers[0]
    assert a.indexer and a.top_k == 1024 and sparse.dsa is not None
    # Indexer weights: wq_b from the query latent, wk, its LayerNorm and weights_proj.
    indexer = 4 * 64 * 256 + 64 * 512 + 2 * 64 + 4 * 512
    assert sparse.qkv_params(a) == dense.qkv_params(dense.attention_layers[0]) + indexer
    # The indexer caches 64 FP8 values and one fp32 scale per token per layer.
    long_s, long_d = _kv_per_request(sparse, 65536), _kv_per_request(dense, 65536)
    held = 65536 + 127.5
    assert long_s["full top-1024"] - long_d["full"] == pytest.approx(held * (64 + 4))
    for name, model in (("sparse", sparse), ("dense", dense)):
        problem = Problem.build(model, "h100x1", "chat", input_len=65536, output_len=256)
        plan = problem.space.megatron_plan(problem.space.degree_tuples[0])
        m = evaluate(problem, plan)
        if name == "sparse":
            sparse_tpot = m.tpot_ms
        else:
            # At a 64k context, reading 1,024 keys beats reading all of them.
            assert sparse_tpot < m.tpot_ms


def test_glm5_layers_share_the_indexer_as_indexer_types_say() -> None:
    pattern = ["full", "shared", "shared", "full"]
    model = _load({**DSA, "model_type": "glm_moe_dsa", "indexer_types": pattern})
    assert [a.indexer for a in model.attention_layers] == [True, False, False, True]
    assert all(a.top_k == 1024 for a in model.attention_layers)
    with pytest.raises(ShardlabError, match="'indexer_types'"):
        _load({**DSA, "indexer_types": ["shared", "full", "full", "full"]})
    freq = _load({**DSA, "index_topk_freq": 2, "index_skip_topk_offset": 1})
    assert [a.indexer for a in freq.attention_layers] == [True, False, True, False]


# -- multi-token prediction and speculative decoding -------------------------------------

MTP = {**DSA, "num_nextn_predict_layers": 1}


@pytest.mark.parametrize(
    ("k", "a", "tokens"), [(0, None, 1.0), (1, 0.0, 1.0), (2, 0.5, 1.75), (3, 1.0, 4.0)]
)
def test_a_speculative_step_advances_by_the_expected_accepted_tokens(
    k: int, a: float | None, tokens: float
) -> None:
    from shardlab.problems.workload import Workload

    w = Workload(draft_tokens=k, acceptance=a)
    assert w.accepted_per_step == pytest.approx(tokens)


def test_mtp_layers_are_counted_apart_and_held_when_they_draft() -> None:
    model = _load(MTP)
    count = model.num_params()
    assert model.mtp_layers == 1 and count.mtp > 0
    assert count.total == _load(DSA).num_params().total  # cards leave MTP out
    off = Problem.build(model, "h100x1", "chat", input_len=8192, output_len=256)
    on = Problem.build(
        model, "h100x1", "chat", input_len=8192, output_len=256, draft_tokens=1, acceptance=0.0
    )
    plan = off.space.megatron_plan(off.space.degree_tuples[0])
    m_off, m_on = evaluate(off, plan), evaluate(on, plan)
    # Nothing accepted: every step verifies two tokens and drafts one for one token.
    assert m_on.weights_gb > m_off.weights_gb and m_on.tpot_ms > m_off.tpot_ms
    good = Problem.build(
        model, "h100x1", "chat", input_len=8192, output_len=256, draft_tokens=1, acceptance=0.9
    )
    assert evaluate(good, plan).tpot_ms < m_off.tpot_ms


@pytest.mark.parametrize("schedule", ["inflight", "static"])
def test_speculative_decoding_end_to_end_cpsat_equals_exhaustive(schedule: str) -> None:
    problem = Problem.build(
        _load(MTP),
        "h100x2",
        "chat",
        input_len=8192,
        output_len=256,
        schedule=schedule,
        batch=16,
        draft_tokens=2,
        acceptance=0.7,
    )
    exact = solve(problem, "cpsat", budget=Budget(max_evals=None, seconds=300))
    truth = solve(problem, "exhaustive", budget=Budget(max_evals=None))
    assert exact.status == truth.status == "optimal"
    assert exact.metrics.objective == pytest.approx(truth.metrics.objective, rel=1e-4)
    assert exact.metrics == evaluate(problem, exact.plan)


@pytest.mark.parametrize(
    ("model", "change", "message"),
    [
        (MTP, {"draft_tokens": 2}, "needs acceptance"),
        (MTP, {"draft_tokens": 2, "acceptance": 1.5}, "acceptance"),
        (MTP, {"draft_tokens": -1}, "draft_tokens"),
        (MTP, {"draft_tokens": 1, "acceptance": 0.7, "phase": "prefill"}, "prefill"),
        (DSA, {"draft_tokens": 1, "acceptance": 0.7}, "num_nextn_predict_layers"),
    ],
)
def test_speculative_settings_are_refused_in_one_line(
    model: dict, change: dict, message: str
) -> None:
    with pytest.raises(ShardlabError, match=message) as info:
        Problem.build(_load(model), "h100x1", "chat", **change)
    assert len(str(info.value).splitlines()) == 1
