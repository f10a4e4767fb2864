"""Roofline cost of one operator option on the busiest GPU of a stage, and the cost of
redistributing a tensor between two layouts.

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
from dataclasses import dataclass, replace

import numpy as np

from shardlab.costmodel import silicon
from shardlab.costmodel.collectives import Span, axis_span, collective_time
from shardlab.costmodel.constants import (
    ACT_BYTES,
    ATTENTION_EFFICIENCY,
    EXPERT_SKEW,
    GEMM_EFFICIENCY,
    HBM_EFFICIENCY,
    KERNEL_US,
)
from shardlab.costmodel.silicon import Kernels, gemm_shape
from shardlab.costmodel.steps import Step, kv_context
from shardlab.problems.dtypes import BYTES_PER_VALUE
from shardlab.problems.model import LayerAttention
from shardlab.problems.operators import OpSpec, OptionSpec
from shardlab.problems.placements import REPLICATE, Layout, redistribute
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem


@dataclass(frozen=True)
class OptionCost:
    """Cost of one operator option per layer and micro-batch; arrays are over ``b``."""

    compute_s: np.ndarray  # FLOP-bound time
    memory_s: np.ndarray  # HBM-bound time
    comm_s: np.ndarray  # communication inside the operator (MoE dispatch and combine)
    kernel_s: float
    weight_bytes: float  # resident per GPU
    kv_bytes_per_req: float  # resident KV cache per GPU per request (its whole context)
    kv_split_tp: bool  # the requests' KV is split over tp (seq_sharded attention)
    act_bytes: np.ndarray  # activation workspace per GPU
    source: str = "roofline"  # or "silicon": measured kernel times (compute_s holds them)
    draft_s: np.ndarray | float = 0.0  # the sampler's: speculative decoding's draft passes

    @property
    def time_s(self) -> np.ndarray:
        return (
            np.maximum(self.compute_s, self.memory_s) + self.kernel_s + self.comm_s + self.draft_s
        )


class CostContext:
    """Shapes and rates shared by every option cost of one degree tuple."""

    def __init__(self, problem: Problem, degrees: Degrees, b: np.ndarray) -> None:
        self.problem = problem
        self.model = problem.model
        self.cluster = problem.cluster
        self.acc = problem.cluster.accelerator
        self.d = degrees
        self.b = b.astype(float)
        self.hbm_rate = self.acc.hbm_gbps * 1e9 * HBM_EFFICIENCY
        self.kv_context = kv_context(problem.workload)
        self.kernels: Kernels | None = None
        if problem.timing == "silicon" and silicon.covers(self.acc.key):
            # (an accelerator the database lacks is timed by the roofline throughout)
            self.kernels = silicon.kernels(self.acc.key, problem.engine)

    def collective(self, kind: str, group: Span, nbytes: np.ndarray) -> np.ndarray:
        """Seconds of one collective: measured inside a node where the database has the
        group size, else the alpha-beta model (uncalibrated: callers scale)."""
        if self.kernels is not None and group.nodes == 1 and group.size > 1:
            measured = self.kernels.collective(kind, group.size, nbytes)
            if measured is not None:
                return measured
        return collective_time(kind, group, nbytes, self.cluster)

    # -- rates -------------------------------------------------------------------

    def gemm_rate(self, family: str) -> float:
        dtype = self.problem.weight_dtype(family)
        peak = self.acc.peak_tflops(dtype)
        fmt = dtype if peak != self.acc.bf16_tflops else "bf16"
        return peak * 1e12 * GEMM_EFFICIENCY[fmt]

    def weight_bytes_per_value(self, family: str) -> float:
        return BYTES_PER_VALUE[self.problem.weight_dtype(family)]

    # -- how work divides ----------------------------------------------------------

    def ways(self, axes: tuple[str, ...]) -> int:
        return math.prod(self.d.axis_size(a) for a in axes)

    def tokens(
        self, per_req: float, opt: OptionSpec, *, whole_requests: bool = False
    ) -> np.ndarray:
        """Tokens (or requests, with ``per_req=1``) on the busiest GPU for this option."""
        if "dp" not in opt.token_axes:  # gathered over the dp axis
            return self.b * per_req * self.d.dp_attn
        if "tp" not in opt.token_axes or self.d.tp == 1:
            return self.b * per_req
        if whole_requests:
            return np.ceil(self.b / self.d.tp) * per_req
        return np.ceil(self.b * per_req / self.d.tp)

    def local_width(self, width: float, layout: Layout) -> float:
        """Feature width held per GPU under ``layout`` (split where it is Shard(hid))."""
        for axis, p in zip(("dp", "tp"), layout, strict=True):
            if p.kind == "S" and p.dim == "hid":
                width /= self.d.axis_size(axis)
        return width

    def roofline(
        self, flops: np.ndarray, nbytes: np.ndarray, rate: float
    ) -> tuple[np.ndarray, np.ndarray]:
        return flops / rate, nbytes / self.hbm_rate

    # -- redistribution --------------------------------------------------------------

    def redistribution_steps(
        self, src: Layout, dst: Layout, full_bytes: np.ndarray
    ) -> list[tuple[str, str, np.ndarray]]:
        """The collectives DTensor issues to turn ``src`` into ``dst``, in order.

        Each is ``(kind, mesh axis, per-rank message bytes)`` with the message as in
        :mod:`shardlab.costmodel.collectives`; ``full_bytes`` is the whole tensor of
        the stage (all dp ranks). As DTensor's ``redistribute`` does: shards of one
        tensor dimension over both axes nest tp inside dp, so changing the dp placement
        from or to the dimension tp shards first gathers tp and works on the
        tp-times larger buffer;
        reductions come first, then all-to-alls, then gathers, tp before dp.
        """
        local = np.array(full_bytes, dtype=float)
        for axis, p in zip(("dp", "tp"), src, strict=True):
            if p.kind == "S":
                local = local / self.d.axis_size(axis)
        steps: list[tuple[str, str, np.ndarray]] = []
        cur = list(src)
        # tp shards inside dp: a dp change touching the tensor dim tp shards undoes tp first
        nested = cur[1].kind == "S" and cur[1] in (cur[0], dst[0])
        if nested and cur[0] != dst[0] and self.d.tp > 1:
            local = local * self.d.tp
            steps.append(("all_gather", "tp", local))
            cur[1] = REPLICATE
        order = {"reduce_scatter": 0, "all_reduce": 1, "all_to_all": 2, "all_gather": 3}
        todo = []
        for i, (axis, a, c) in enumerate(zip(("dp", "tp"), cur, dst, strict=True)):
            kind = redistribute(a, c)
            if kind is not None and self.d.axis_size(axis) > 1:
                axis_rank = -i if kind == "all_gather" else i  # gathers: tp before dp
                todo.append((order[kind], axis_rank, axis, kind))
        for _, _, axis, kind in sorted(todo):
            n = self.d.axis_size(axis)
            if kind == "all_gather":
                local = local * n
                steps.append((kind, axis, local))
            else:
                steps.append((kind, axis, local))
                if kind == "reduce_scatter":
                    local = local / n
        return steps

    def redistribution_s(self, src: Layout, dst: Layout, full_bytes: np.ndarray) -> np.ndarray:
        """Time of :meth:`redistribution_steps`."""
        total = np.zeros_like(np.asarray(full_bytes, dtype=float))
        for kind, axis, message in self.redistribution_steps(src, dst, full_bytes):
            group = axis_span(axis, self.d, self.cluster)
            total = total + self.collective(kind, group, message)
        return total * self.communication_factor

    @property
    def communication_factor(self) -> float:
        cal = self.problem.calibration
        return 1.0 if cal is None else cal.communication


# -- widths of the tensors operators produce (values per token) ------------------------


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
        return OptionCost(zeros, zeros, zeros, 0.0, 0.0, 0.0, False, zeros)
    if op.family == "norm":
        return _norm_cost(ctx, op, opt, step)
    if op.family == "kv_cache":
        assert attn is not None
        if attn.linear:
            return _linear_attention_cost(ctx, op, opt, step, attn)
        return _attention_cost(ctx, op, opt, step, attn)
    if op.family == "experts":
        return _experts_cost(ctx, opt, step)
    if op.family == "embedding":
        return _embedding_cost(ctx, op, opt, step)
    if op.family == "sampler":
        rows = ctx.tokens(step.logits, opt)
        vocab = ctx.model.vocab_size
        nbytes = rows * vocab * 4.0
        return OptionCost(
            zeros, nbytes / ctx.hbm_rate, zeros, 2 * KERNEL_US * 1e-6, 0.0, 0.0, False, nbytes
        )
    return _linear_cost(ctx, op, opt, step, attn)


def _norm_cost(ctx: CostContext, op: OpSpec, opt: OptionSpec, step: Step) -> OptionCost:
    h = ctx.model.hidden_size
    tokens = ctx.tokens(step.tokens, opt)
    nbytes = 4.0 * tokens * h * ACT_BYTES + h * 2.0  # read x and residual, write both
    zeros = np.zeros_like(ctx.b)
    return OptionCost(
        zeros,
        nbytes / ctx.hbm_rate,
        zeros,
        KERNEL_US * 1e-6,
        h * 2.0,
        0.0,
        False,
        2.0 * tokens * h * ACT_BYTES,
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
            return OptionCost(measured, zeros, zeros, 0.0, wbytes, 0.0, False, act, "silicon")
    compute, memory = ctx.roofline(2.0 * tokens * params, wbytes + act, ctx.gemm_rate(op.family))
    kernels = 2 if op.family == "router" else 1  # the router adds a top-k kernel
    return OptionCost(compute, memory, zeros, kernels * KERNEL_US * 1e-6, wbytes, 0.0, False, act)


def _embedding_cost(ctx: CostContext, op: OpSpec, opt: OptionSpec, step: Step) -> OptionCost:
    h = ctx.model.hidden_size
    tokens = ctx.tokens(step.tokens, opt)
    wbytes = math.ceil(_params(op, ctx.problem, None) / ctx.ways(opt.weight_axes)) * 2.0
    act = 2.0 * tokens * h * ACT_BYTES  # gather rows, write them
    zeros = np.zeros_like(ctx.b)
    return OptionCost(zeros, act / ctx.hbm_rate, zeros, KERNEL_US * 1e-6, wbytes, 0.0, False, act)


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


def _attention_cost(
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
            measured, zeros, zeros, 0.0, 0.0, context * cached_token, kv_split, act, "silicon"
        )
    rate = ctx.acc.bf16_tflops * 1e12 * ATTENTION_EFFICIENCY
    compute, memory = ctx.roofline(flops, nbytes, rate)
    kernels = 1
    if attn.indexer:
        fp8 = ctx.acc.peak_tflops("fp8") * 1e12 * ATTENTION_EFFICIENCY
        compute = compute + index_flops / fp8
        kernels = 3  # indexer scores, top-k, sparse attention
    return OptionCost(
        compute,
        memory,
        zeros,
        kernels * KERNEL_US * 1e-6,
        0.0,
        context * cached_token,
        kv_split,
        act,
    )


# Tokens per chunk of the chunked delta-rule scan that linear-attention prefill runs
# (flash-linear-attention's chunk_gated_delta_rule and chunk_kda use 64).
LINEAR_CHUNK = 64


def _linear_attention_cost(
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
    return OptionCost(compute, memory, zeros, 2 * KERNEL_US * 1e-6, 0.0, state, kv_split, act)


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
    over its mean context; a mixed round both, its prompts being ``reqs / output_len``
    whole prompts (the prefill share of a request per round, as the steps define it).
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
        return ctx.kernels.attention(context=True, length=prompt, requests=reqs, **shape)
    decoding = {**shape, "window": span.tokens if span.kind == "sliding" else 0}
    decode = ctx.kernels.attention(
        context=False, length=step.decode_context(span), requests=reqs, **decoding
    )
    if decode is None or step.kind == "decode":
        return decode
    one = ctx.kernels.attention(context=True, length=prompt, requests=np.ones(1), **shape)
    return None if one is None else decode + one[0] * reqs / step.output_len


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


def _experts_cost(ctx: CostContext, opt: OptionSpec, step: Step) -> OptionCost:
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
        compute,
        memory,
        comm,
        kernel_s,
        local_experts * expert_params * wb,
        0.0,
        False,
        act + buffers,
        source,
    )
