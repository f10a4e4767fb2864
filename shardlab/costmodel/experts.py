"""The cost of a MoE block's routed experts: the busiest rank's load, the all-to-all's
messages (counts, dispatch, combine) and the experts' GEMMs."""

from __future__ import annotations

import math

import numpy as np

from shardlab.costmodel import silicon
from shardlab.costmodel.collectives import axis_span
from shardlab.costmodel.constants import ACT_BYTES, EXPERT_SKEW, KERNEL_US
from shardlab.costmodel.context import CostContext, OptionCost
from shardlab.costmodel.steps import Step
from shardlab.problems.operators import OptionSpec
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem


def expert_imbalance(ep: int, mean_load: np.ndarray) -> np.ndarray:
    """Load of the busiest expert-parallel rank over the mean (see constants)."""
    if ep == 1:
        return np.ones_like(mean_load)
    skew = 1.0 + (EXPERT_SKEW - 1.0) * (1.0 - 1.0 / ep)
    return skew * (1.0 + np.sqrt(2.0 * math.log(ep) / np.maximum(mean_load, 1e-9)))


def dispatch_copies(ep: int, top_k: int, num_experts: int) -> float:
    """Copies of a token the all-to-all dispatch sends: one per distinct destination
    rank among its ``top_k`` distinct experts (DeepEP sends a token once per rank),
    expected under uniform routing: ``ep * (1 - C(E - E/ep, k) / C(E, k))``."""
    if ep == 1:
        return 1.0
    local = num_experts // ep
    if num_experts - local < top_k:
        return float(ep)
    miss = math.comb(num_experts - local, top_k) / math.comb(num_experts, top_k)
    return ep * (1.0 - miss)


# Bytes per rank of the count exchange before a dropless dispatch (DeepEP's notify
# step): one int32 per destination rank.
COUNT_BYTES = 4.0


def dispatch_bytes(expert_dtype: str) -> float:
    """Bytes per value dispatched: FP8 when the experts' GEMMs take FP8 inputs (DeepEP's
    FP8 dispatch), else bf16. The combine always returns bf16."""
    return 1.0 if expert_dtype in ("fp8", "fp4") else ACT_BYTES


def alltoall_messages(
    problem: Problem, d: Degrees, group_tokens: np.ndarray
) -> dict[str, np.ndarray]:
    """Per-rank bytes of the expert all-to-all's three exchanges over the ``ep`` axis:
    the token counts (DeepEP's notify step), the dispatch and the combine.

    ``group_tokens``: tokens entering one stage's MoE block over the ``dp_attn`` ranks.
    The cost model prices these messages and the DTensor checks trace them.
    """
    moe = problem.model.moe
    assert moe is not None
    h = problem.model.hidden_size
    sent = group_tokens / d.group * dispatch_copies(d.ep, moe.top_k, moe.num_experts) * h
    return {
        "counts": np.full_like(group_tokens, d.ep * COUNT_BYTES),
        "dispatch": sent * dispatch_bytes(problem.weight_dtype("experts")),
        "combine": sent * ACT_BYTES,
    }


def experts_cost(ctx: CostContext, opt: OptionSpec, step: Step) -> OptionCost:
    m, d = ctx.model, ctx.d
    assert m.moe is not None
    moe = m.moe
    h = m.hidden_size
    group_tokens = ctx.b * step.tokens * d.dp_attn  # tokens entering the stage's MoE block
    mean = group_tokens * moe.top_k / d.ep
    assignments = mean * expert_imbalance(d.ep, mean)
    expert_params = m.expert_params() / d.etp
    local_experts = moe.num_experts / d.ep
    touched = local_experts * (1.0 - (1.0 - moe.top_k / moe.num_experts) ** group_tokens)
    wb = ctx.weight_bytes_per_value("experts")
    width = 2.0 * moe.expert_ffn_size / d.etp + h
    act = assignments * width * ACT_BYTES
    flops = 2.0 * assignments * expert_params
    nbytes = touched * expert_params * wb + act
    compute, memory = ctx.roofline(flops, nbytes, ctx.gemm_rate("experts"))
    kernel_s, source = 3 * KERNEL_US * 1e-6, "roofline"
    if ctx.kernels is not None:
        # The database's expert GEMMs under its own power-law load (they replace the
        # roofline's imbalance factor).
        measured = ctx.kernels.experts(
            hidden=h,
            ffn=moe.expert_ffn_size,
            top_k=moe.top_k,
            num_experts=moe.num_experts,
            ep=d.ep,
            etp=d.etp,
            dp=d.dp_attn,
            dtype=ctx.problem.weight_dtype("experts"),
            alpha=silicon.moe_alpha(m.name),
            tokens_per_dp=ctx.b * step.tokens,
        )
        if measured is not None:
            compute, memory = measured, np.zeros_like(ctx.b)
            kernel_s, source = 0.0, "silicon"
    comm = np.zeros_like(ctx.b)
    buffers = np.zeros_like(ctx.b)
    if opt.name == "alltoall":
        ep_span = axis_span("ep", d, ctx.cluster)
        messages = alltoall_messages(ctx.problem, d, group_tokens)
        for message in messages.values():
            comm = comm + ctx.collective("all_to_all", ep_span, message)
        combine = messages["combine"]
        if d.etp > 1:
            etp_span = axis_span("etp", d, ctx.cluster)
            recv = assignments * h * ACT_BYTES
            comm = comm + ctx.collective("all_gather", etp_span, recv)
            comm = comm + ctx.collective("reduce_scatter", etp_span, recv)
        buffers = 2.0 * np.maximum(combine, assignments * h * ACT_BYTES)
    return OptionCost(
        compute_s=compute,
        memory_s=memory,
        comm_s=comm,
        kernel_s=kernel_s,
        weight_bytes=local_experts * expert_params * wb,
        kv_bytes_per_req=0.0,
        kv_split_tp=False,
        act_bytes=act + buffers,
        source=source,
    )
