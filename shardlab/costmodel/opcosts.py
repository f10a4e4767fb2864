"""Roofline cost of one operator option on the busiest GPU of a stage: norms, linear
layers, embeddings and samplers here, attention in :mod:`shardlab.costmodel.attention`,
routed experts in :mod:`shardlab.costmodel.experts`; what they share (and the cost of
redistributing a tensor between two layouts) in :mod:`shardlab.costmodel.context`.

Everything is a function of ``b``, the requests per attention-data-parallel rank in
one micro-batch, and is evaluated for a whole numpy array of ``b`` at once.

Per operator and option (per layer, per micro-batch step)::

    time = max(FLOPs / (peak * gemm_efficiency), bytes / (HBM * hbm_efficiency))
           + kernels * KERNEL_US + communication inside the operator (MoE dispatch)

Tokens on a GPU follow the option's token axes: split over ``dp`` (whole requests),
over ``tp`` too for ``seq_sharded`` (tokens; whole requests for attention), or
gathered over ``dp`` for the ``*_full``/``allgather`` options. Weights on a GPU follow
its weight axes. MLA attention keeps the whole latent cache on every tensor-parallel
rank (it has no KV heads to split); GQA splits KV heads down to one per rank. Each
layer's token mixer (:class:`~shardlab.problems.model.LayerAttention`) sets its own
shapes: under a head split MLA keeps its down-projections (the latent) whole on every
rank and a DSA layer its indexer, which picks the top-k keys attention reads; a
linear-attention layer holds a fixed state per request, split by heads like a KV
cache; a KV-sharing layer reads another layer's cache and holds none.
Measured kernel tables cover full and sliding softmax attention; DSA and linear
layers are timed by the roofline.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from shardlab.costmodel.attention import attention_cost, linear_attention_cost
from shardlab.costmodel.constants import (
    ACT_BYTES,
    KERNEL_US,
)
from shardlab.costmodel.context import CostContext, OptionCost
from shardlab.costmodel.experts import experts_cost
from shardlab.costmodel.silicon import gemm_shape
from shardlab.costmodel.steps import Step
from shardlab.costmodel.widths import input_width, output_width
from shardlab.problems.model import LayerAttention
from shardlab.problems.operators import OpSpec, OptionSpec
from shardlab.problems.problem import Problem


def _params(op: OpSpec, problem: Problem, attn: LayerAttention | None) -> float:
    m = problem.model
    if op.name in ("qkv_proj", "o_proj"):
        assert attn is not None
        return m.qkv_params(attn) if op.name == "qkv_proj" else m.o_params(attn)
    return {
        "ffn_up": m.ffn_up_params,
        "ffn_down": m.ffn_down_params,
        "shared_up": m.shared_up_params,
        "shared_down": m.shared_down_params,
        "router": m.router_params,
        "lm_head": m.lm_head_params,
        "embedding": m.embedding_params,
    }[op.name]()


# -- option costs --------------------------------------------------------------------


def kernel_class(op: OpSpec) -> str | None:
    """The calibration class of an operator's own kernels (None: not calibrated)."""
    if op.family == "kv_cache":
        return "attention"
    if op.family == "experts":
        return "moe"
    if op.family in ("residual", "norm", "embedding", "sampler"):
        return None
    return "gemm"


def option_cost(
    ctx: CostContext, op: OpSpec, opt: OptionSpec, step: Step, attn: LayerAttention | None
) -> OptionCost:
    """The cost of one option, with the problem's calibration applied (each kernel
    class by its factor, the operator's own collectives by the communication factor;
    its fixed costs per iteration and request are the serving regime's). ``attn`` is
    the layer's token mixer (None for the model's ends)."""
    cost = _option_cost(ctx, op, opt, step, attn)
    cal = ctx.problem.calibration
    if cal is None:
        return cost
    cls = kernel_class(op)
    f = cal.factor(cls) if cls is not None else 1.0
    return replace(
        cost,
        compute_s=cost.compute_s * f,
        memory_s=cost.memory_s * f,
        kernel_s=cost.kernel_s * f,
        comm_s=cost.comm_s * cal.communication,
    )


def _option_cost(
    ctx: CostContext, op: OpSpec, opt: OptionSpec, step: Step, attn: LayerAttention | None
) -> OptionCost:
    zeros = np.zeros_like(ctx.b)
    if op.family == "residual":
        # Residual adds are fused into the next norm (vLLM's fused_add_rms_norm).
        return OptionCost(
            compute_s=zeros,
            memory_s=zeros,
            comm_s=zeros,
            kernel_s=0.0,
            weight_bytes=0.0,
            kv_bytes_per_req=0.0,
            kv_split_tp=False,
            act_bytes=zeros,
        )
    if op.family == "norm":
        return _norm_cost(ctx, op, opt, step)
    if op.family == "kv_cache":
        assert attn is not None
        if attn.linear:
            return linear_attention_cost(ctx, op, opt, step, attn)
        return attention_cost(ctx, op, opt, step, attn)
    if op.family == "experts":
        return experts_cost(ctx, opt, step)
    if op.family == "embedding":
        return _embedding_cost(ctx, op, opt, step)
    if op.family == "sampler":
        rows = ctx.tokens(step.logits, opt)
        vocab = ctx.model.vocab_size
        nbytes = rows * vocab * 4.0
        return OptionCost(
            compute_s=zeros,
            memory_s=nbytes / ctx.hbm_rate,
            comm_s=zeros,
            kernel_s=2 * KERNEL_US * 1e-6,
            weight_bytes=0.0,
            kv_bytes_per_req=0.0,
            kv_split_tp=False,
            act_bytes=nbytes,
        )
    return _linear_cost(ctx, op, opt, step, attn)


def _norm_cost(ctx: CostContext, op: OpSpec, opt: OptionSpec, step: Step) -> OptionCost:
    h = ctx.model.hidden_size
    tokens = ctx.tokens(step.tokens, opt)
    nbytes = 4.0 * tokens * h * ACT_BYTES + h * 2.0  # read x and residual, write both
    zeros = np.zeros_like(ctx.b)
    return OptionCost(
        compute_s=zeros,
        memory_s=nbytes / ctx.hbm_rate,
        comm_s=zeros,
        kernel_s=KERNEL_US * 1e-6,
        weight_bytes=h * 2.0,
        kv_bytes_per_req=0.0,
        kv_split_tp=False,
        act_bytes=2.0 * tokens * h * ACT_BYTES,
    )


def _linear_cost(
    ctx: CostContext, op: OpSpec, opt: OptionSpec, step: Step, attn: LayerAttention | None
) -> OptionCost:
    per_req = step.logits if op.family == "lm_head" else step.tokens
    tokens = ctx.tokens(per_req, opt)
    ways = ctx.ways(opt.weight_axes)
    params = _params(op, ctx.problem, attn) / ways
    if op.name == "qkv_proj" and attn is not None:
        # MLA's latent and the DSA indexer stay whole on every rank: every head reads them.
        whole = ctx.model.qkv_unsplit_params(attn)
        params += whole - whole / ways
    wbytes = params * ctx.weight_bytes_per_value(op.family)
    width_in = ctx.local_width(input_width(op, ctx.problem, attn), opt.inp)
    width_out = ctx.local_width(output_width(op, ctx.problem, attn), opt.out)
    act = tokens * (width_in + width_out) * ACT_BYTES
    zeros = np.zeros_like(ctx.b)
    if ctx.kernels is not None:
        n, k = gemm_shape(params, width_in)
        dtype = ctx.problem.weight_dtype(op.family)
        measured = ctx.kernels.gemm(n, k, dtype, tokens)
        if measured is not None:
            return OptionCost(
                compute_s=measured,
                memory_s=zeros,
                comm_s=zeros,
                kernel_s=0.0,
                weight_bytes=wbytes,
                kv_bytes_per_req=0.0,
                kv_split_tp=False,
                act_bytes=act,
                source="silicon",
            )
    compute, memory = ctx.roofline(2.0 * tokens * params, wbytes + act, ctx.gemm_rate(op.family))
    kernels = 2 if op.family == "router" else 1  # the router adds a top-k kernel
    return OptionCost(
        compute_s=compute,
        memory_s=memory,
        comm_s=zeros,
        kernel_s=kernels * KERNEL_US * 1e-6,
        weight_bytes=wbytes,
        kv_bytes_per_req=0.0,
        kv_split_tp=False,
        act_bytes=act,
    )


def _embedding_cost(ctx: CostContext, op: OpSpec, opt: OptionSpec, step: Step) -> OptionCost:
    h = ctx.model.hidden_size
    tokens = ctx.tokens(step.tokens, opt)
    wbytes = math.ceil(_params(op, ctx.problem, None) / ctx.ways(opt.weight_axes)) * 2.0
    act = 2.0 * tokens * h * ACT_BYTES  # gather rows, write them
    zeros = np.zeros_like(ctx.b)
    return OptionCost(
        compute_s=zeros,
        memory_s=act / ctx.hbm_rate,
        comm_s=zeros,
        kernel_s=KERNEL_US * 1e-6,
        weight_bytes=wbytes,
        kv_bytes_per_req=0.0,
        kv_split_tp=False,
        act_bytes=act,
    )
