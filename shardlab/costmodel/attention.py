"""The cost of attention and its KV cache: softmax attention (roofline or measured
kernels), linear attention's fixed state, and the KV values a GPU reads per token."""

from __future__ import annotations

import math

import numpy as np

from shardlab.costmodel.constants import ACT_BYTES, ATTENTION_EFFICIENCY, KERNEL_US
from shardlab.costmodel.context import CostContext, OptionCost
from shardlab.costmodel.steps import Step
from shardlab.costmodel.widths import input_width, output_width
from shardlab.problems.dtypes import BYTES_PER_VALUE
from shardlab.problems.model import LayerAttention
from shardlab.problems.operators import OpSpec, OptionSpec


def _kv_values_per_token(ctx: CostContext, opt: OptionSpec, attn: LayerAttention) -> float:
    """KV values per token per layer one GPU reads under ``opt`` (a KV-sharing layer
    reads those of the layer it shares with)."""
    m = ctx.model
    if m.mla is not None:
        return float(m.mla.kv_lora_rank + m.mla.qk_rope_head_dim)
    heads = attn.kv_heads
    if "tp" in opt.weight_axes:
        heads = max(heads / ctx.d.tp, 1.0)
    return 2.0 * heads * attn.head_dim


def attention_cost(
    ctx: CostContext, op: OpSpec, opt: OptionSpec, step: Step, attn: LayerAttention
) -> OptionCost:
    """Softmax attention. A DSA layer reads the ``top_k`` keys its indexer picks; its
    indexer scores every key of the span (FP8, as DeepSeek's and vLLM's kernels do),
    unsplit over tp (vLLM replicates the indexer) and caches its own keys."""
    m = ctx.model
    kv_bytes = BYTES_PER_VALUE[ctx.problem.kv_dtype]
    reqs = ctx.tokens(1.0, opt, whole_requests=True)
    heads = attn.heads / ctx.ways(opt.weight_axes)
    read = attn.read_span
    dec_pairs, pre_pairs = step.pairs(read)
    if m.mla is not None:
        # Decode runs absorbed MLA over the latent; prefill expands per-head K and V.
        dec_dims = 2 * m.mla.kv_lora_rank + m.mla.qk_rope_head_dim
        pre_dims = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim + m.mla.v_head_dim
    else:
        dec_dims = pre_dims = 2 * attn.head_dim
    flops = 2.0 * reqs * heads * (dec_pairs * dec_dims + pre_pairs * pre_dims)
    kv_token = _kv_values_per_token(ctx, opt, attn) * kv_bytes
    cached_token = 0.0 if attn.kv_shared else kv_token
    q_width = ctx.local_width(input_width(op, ctx.problem, attn), opt.inp)
    o_width = ctx.local_width(output_width(op, ctx.problem, attn), opt.out)
    tokens = reqs * step.tokens
    act = tokens * (q_width + o_width) * ACT_BYTES
    nbytes = reqs * (step.kv_read(read) * kv_token + step.tokens * cached_token) + act
    context = ctx.kv_context
    if attn.span.tokens:  # a sliding window or a chunk caches at most its length
        context = min(context, float(attn.span.tokens))
    index_flops = np.zeros_like(ctx.b)
    if attn.indexer:
        dsa = m.dsa
        assert dsa is not None
        idx_dec, idx_pre = step.pairs(attn.span)
        index_flops = 2.0 * reqs * dsa.heads * dsa.head_dim * (idx_dec + idx_pre)
        nbytes = nbytes + reqs * (step.kv_read(attn.span) + step.tokens) * dsa.key_bytes()
        cached_token += dsa.key_bytes()
    kv_split = "tp" in opt.token_axes and ctx.d.tp > 1
    zeros = np.zeros_like(ctx.b)
    measured = None if attn.top_k else _measured_attention(ctx, opt, step, attn, reqs, heads)
    if measured is not None:
        return OptionCost(
            compute_s=measured,
            memory_s=zeros,
            comm_s=zeros,
            kernel_s=0.0,
            weight_bytes=0.0,
            kv_bytes_per_req=context * cached_token,
            kv_split_tp=kv_split,
            act_bytes=act,
            source="silicon",
        )
    rate = ctx.acc.bf16_tflops * 1e12 * ATTENTION_EFFICIENCY
    compute, memory = ctx.roofline(flops, nbytes, rate)
    kernels = 1
    if attn.indexer:
        fp8 = ctx.acc.peak_tflops("fp8") * 1e12 * ATTENTION_EFFICIENCY
        compute = compute + index_flops / fp8
        kernels = 3  # indexer scores, top-k, sparse attention
    return OptionCost(
        compute_s=compute,
        memory_s=memory,
        comm_s=zeros,
        kernel_s=kernels * KERNEL_US * 1e-6,
        weight_bytes=0.0,
        kv_bytes_per_req=context * cached_token,
        kv_split_tp=kv_split,
        act_bytes=act,
    )


# Tokens per chunk of the chunked delta-rule scan that linear-attention prefill runs
# (flash-linear-attention's chunk_gated_delta_rule and chunk_kda use 64).
LINEAR_CHUNK = 64


def linear_attention_cost(
    ctx: CostContext, op: OpSpec, opt: OptionSpec, step: Step, attn: LayerAttention
) -> OptionCost:
    """Gated DeltaNet or KDA: per token and value head, the state is read, corrected by
    the delta rule and read out (three ``k_head_dim x v_head_dim`` products); prompt
    tokens also run the intra-chunk products of the chunked scan. A request keeps one
    fixed state, read and written once per step and once per prompt chunk, whatever
    its context; heads (and so the state) split over tp under ``head_sharded``."""
    lin = ctx.model.linear
    assert lin is not None
    ways = ctx.ways(opt.weight_axes)
    reqs = ctx.tokens(1.0, opt, whole_requests=True)
    v_heads = lin.v_heads / ways
    prompt = step.prompt_tokens
    dk, dv = lin.k_head_dim, lin.v_head_dim
    flops = 2.0 * reqs * v_heads * (step.tokens * 3 * dk * dv + prompt * LINEAR_CHUNK * (dk + dv))
    recurrent, conv = lin.state_values()
    state = (recurrent * 4.0 + conv * ACT_BYTES) / ways  # fp32 state, bf16 conv window
    q_width = ctx.local_width(input_width(op, ctx.problem, attn), opt.inp)
    o_width = ctx.local_width(output_width(op, ctx.problem, attn), opt.out)
    act = reqs * step.tokens * (q_width + o_width) * ACT_BYTES
    nbytes = reqs * state * (2.0 + math.ceil(prompt / LINEAR_CHUNK)) + act
    rate = ctx.acc.bf16_tflops * 1e12 * ATTENTION_EFFICIENCY
    compute, memory = ctx.roofline(flops, nbytes, rate)
    kv_split = "tp" in opt.token_axes and ctx.d.tp > 1
    zeros = np.zeros_like(ctx.b)
    # short convolution and the scan: two kernels
    return OptionCost(
        compute_s=compute,
        memory_s=memory,
        comm_s=zeros,
        kernel_s=2 * KERNEL_US * 1e-6,
        weight_bytes=0.0,
        kv_bytes_per_req=state,
        kv_split_tp=kv_split,
        act_bytes=act,
    )


def _measured_attention(
    ctx: CostContext,
    opt: OptionSpec,
    step: Step,
    attn: LayerAttention,
    reqs: np.ndarray,
    heads: float,
) -> np.ndarray | None:
    """Measured attention of ``reqs`` requests per GPU in one step (None: not covered).

    A prefill step runs each request's prompt; a decode step one token per request
    over its mean context.
    The tables hold full and sliding-window kernels: a chunked layer's decode is the
    full kernel over the keys of its chunk, its prefill the sliding kernel of the chunk
    length (which reads up to twice a chunk's pairs: an upper bound).
    """
    if ctx.kernels is None or attn.kv_shared or step.decode_tokens > 1:
        return None  # (the tables time one decode token per request)
    m = ctx.model
    span = attn.span
    kv_heads = attn.kv_heads
    if "tp" in opt.weight_axes:
        kv_heads = max(kv_heads // ctx.d.tp, 1)
    shape = {
        "heads": max(round(heads), 1),
        "kv_heads": kv_heads,
        "head_dim": attn.head_dim,
        "kv_dtype": ctx.problem.kv_dtype,
        "window": span.tokens,
        "mla": m.mla is not None,
    }
    prompt = step.input_len
    if step.kind == "prefill":
        whole = ctx.kernels.attention(context=True, length=prompt, requests=reqs, **shape)
        if not step.cached or whole is None:
            return whole
        # past a cached prefix: the whole prompt's kernel less the prefix's own (the
        # tables measure no prefill over a cached prefix)
        prefix = ctx.kernels.attention(context=True, length=step.cached, requests=reqs, **shape)
        return None if prefix is None else np.maximum(whole - prefix, 0.0)
    decoding = {**shape, "window": span.tokens if span.kind == "sliding" else 0}
    return ctx.kernels.attention(
        context=False, length=step.decode_context(span), requests=reqs, **decoding
    )
