"""The tiny models the check shards: their ``config.json`` dicts, the static-prefill
problems on them, and plans with some operators' options replaced."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Literal

from shardlab.errors import ShardlabError
from shardlab.problems.hf_config import model_from_config
from shardlab.problems.operators import HEAD_OPS, layer_ops
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem

TinyKind = Literal["dense", "moe", "gemma4", "gdn", "kda", "dsa"]


def tiny_config(kind: TinyKind = "dense", *, num_layers: int | None = None) -> dict:
    """A HuggingFace-style ``config.json`` dict of a small model for the check.

    ``dense``: Llama, hidden 64, 8 heads / 4 KV heads of 8, FFN 128, vocab 256.
    ``moe``: Qwen2-MoE of the same attention, layer 0 dense and the others MoE with 8
    experts (top-2, width 32) and a shared expert of width 64.
    ``gemma4``: Gemma 4 of the same widths, sliding and global layers alternating, the
    global ones with 16-dim heads, 2 KV heads and K = V; the last two layers read the
    KV of the two before (``num_layers`` >= 4).
    ``gdn``: Qwen3-Next, gated DeltaNet (4 key / 8 value heads of 8) and gated full
    attention alternating. ``kda``: Kimi-Linear's KDA (8 heads of 8) alternating with
    the GQA attention above. ``dsa``: GLM-5's MLA (8 heads, query latent 32, KV latent
    16) with DSA picking 4 keys, the second layer sharing the first's indexer. Two
    layers by default, four for ``gemma4``.
    """
    if num_layers is None:
        num_layers = 4 if kind == "gemma4" else 2
    common = {
        "num_hidden_layers": num_layers,
        "hidden_size": 64,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 256,
        "torch_dtype": "float32",
    }
    model_type, fields = _KIND_FIELDS.get(kind, _moe)(num_layers)
    return {"model_type": model_type, **common, **fields}


def _dense(num_layers: int) -> tuple[str, dict]:
    return "llama", {}


def _gemma4(num_layers: int) -> tuple[str, dict]:
    return "gemma4_text", {
        "head_dim": 8,
        "global_head_dim": 16,
        "num_global_key_value_heads": 2,
        "attention_k_eq_v": True,
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention"] * (num_layers // 2),
        "num_kv_shared_layers": 2,
        "hidden_size_per_layer_input": 0,
    }


def _gdn(num_layers: int) -> tuple[str, dict]:
    return "qwen3_next", {
        "head_dim": 8,
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "full_attention_interval": 2,
    }


def _dsa(num_layers: int) -> tuple[str, dict]:
    return "glm_moe_dsa", {
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "index_topk": 4,
        "index_n_heads": 2,
        "index_head_dim": 8,
        "indexer_types": ["full"] + ["shared"] * (num_layers - 1),
    }


def _kda(num_layers: int) -> tuple[str, dict]:
    return "kimi_linear", {
        "linear_attn_config": {
            "num_heads": 8,
            "head_dim": 8,
            "short_conv_kernel_size": 4,
            "kda_layers": list(range(1, num_layers + 1, 2)),
            "full_attn_layers": list(range(2, num_layers + 1, 2)),
        },
    }


def _moe(num_layers: int) -> tuple[str, dict]:
    return "qwen2_moe", {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [0],
    }


# Each kind's model type and the config fields it adds to the common ones.
_KIND_FIELDS: dict[str, Callable[[int], tuple[str, dict]]] = {
    "dense": _dense,
    "moe": _moe,
    "gemma4": _gemma4,
    "gdn": _gdn,
    "kda": _kda,
    "dsa": _dsa,
}


def tiny_problem(
    kind: TinyKind = "dense",
    cluster: str = "h100x2",
    *,
    batch: int = 4,
    input_len: int = 8,
    num_layers: int | None = None,
    tie: Literal["kind", "layer"] = "kind",
) -> Problem:
    """A static-prefill problem of :func:`tiny_config` on ``cluster``."""
    model = model_from_config(
        tiny_config(kind, num_layers=num_layers), name=f"tiny-{kind}", source="dtensor_check"
    )
    return Problem.build(model, cluster, "prefill", tie=tie, batch=batch, input_len=input_len)


def override_options(
    problem: Problem,
    plan: Plan,
    layers: dict[str, str] | None = None,
    head: dict[str, str] | None = None,
    *,
    only: Sequence[int] | None = None,
) -> Plan:
    """``plan`` with some operators' options replaced in every layer that has them.

    ``only`` restricts the layer overrides to those layer indices (a per-layer plan:
    build the problem with ``tie="layer"``). Raises if the result is not a valid plan
    of ``problem``'s space.
    """
    layers = layers or {}
    head = head or {}
    m = problem.model
    rows = []
    for i, (kind, opts) in enumerate(zip(m.layer_kinds, plan.layer_options, strict=True)):
        names = [op.name for op in layer_ops(m, kind)]
        new = layers if only is None or i in only else {}
        rows.append(tuple(new.get(n, o) for n, o in zip(names, opts, strict=True)))
    head_opts = tuple(
        head.get(op.name, o) for op, o in zip(HEAD_OPS, plan.head_options, strict=True)
    )
    unknown = set(layers) - {op.name for k in m.kinds for op in layer_ops(m, k)}
    unknown |= set(head) - {op.name for op in HEAD_OPS}
    if unknown:
        raise ShardlabError(f"override_options: unknown operator(s) {', '.join(sorted(unknown))}")
    new = replace(plan, layer_options=tuple(rows), head_options=head_opts)
    problem.space.encode(new)  # raises if the plan is outside the space
    return new
