"""Widths of the tensors operators produce and read, in values per token."""

from __future__ import annotations

from shardlab.problems.model import LayerAttention
from shardlab.problems.operators import OpSpec
from shardlab.problems.problem import Problem


def output_width(op: OpSpec, problem: Problem, attn: LayerAttention | None = None) -> float:
    """Values per token ``op`` produces; ``attn`` is the layer's mixer (layer ops only)."""
    m = problem.model
    if op.name == "qkv_proj":
        assert attn is not None
        return m.qkv_width(attn)
    if op.name == "attention":
        assert attn is not None
        return m.q_dim(attn)
    if op.name == "ffn_up":
        return m.ffn_size
    if op.name == "shared_up":
        assert m.moe is not None
        return m.moe.shared_ffn_size
    if op.name == "router":
        assert m.moe is not None
        return m.moe.num_experts
    if op.name == "lm_head":
        return 2.0 * m.vocab_size  # fp32 logits: twice the bytes of a bf16 row
    if op.name == "sampler":
        return 0.0
    return m.hidden_size


def input_width(op: OpSpec, problem: Problem, attn: LayerAttention | None = None) -> float:
    m = problem.model
    if op.name == "o_proj":
        assert attn is not None
        return m.q_dim(attn)
    if op.name == "ffn_down":
        return m.ffn_size
    if op.name == "shared_down":
        assert m.moe is not None
        return m.moe.shared_ffn_size
    if op.name == "attention":
        assert attn is not None
        return m.qkv_width(attn)  # reads q, k, v
    if op.name == "sampler":
        return 2.0 * m.vocab_size
    return m.hidden_size
