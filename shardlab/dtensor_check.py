"""Run a plan under PyTorch DTensor and compare its collectives with the cost model's.

The cost model prices every redistribution between two operators as the collective
DTensor's ``redistribute`` would issue (:mod:`shardlab.problems.placements`). This module
checks that claim by execution, on CPU with the gloo backend:

1. :class:`TinyTransformer` is a scaled-down transformer in plain torch built from a
   :class:`~shardlab.problems.model.Model` (embedding, RMSNorm, GQA attention, SwiGLU
   FFN, MoE router + experts + shared expert, LM head; float32). Every operator of
   :mod:`shardlab.problems.operators` is one sub-module, so a plan's option maps onto it.
2. :func:`apply_plan` shards it with ``parallelize_module`` over a ``(dp, tp)``
   ``DeviceMesh``. Activations are ``[batch, seq, hidden]`` DTensors: ``S(tok)`` is
   ``Shard(0)`` (whole requests), ``S(hid)`` is ``Shard(-1)``, ``R`` is ``Replicate()``,
   ``P`` is ``Partial()``. Each operator receives its input in its option's ``inp``
   layout and produces its ``out`` layout; between a producer and a consumer the model
   calls ``DTensor.redistribute`` -- one call per edge of ``layer_edges``/``HEAD_EDGES``
   (and residual -> residual between layers), named like the cost model's trace.
   Two sets of styles exist:

   - ``styles="mesh"`` (default, any plan): :class:`OptionParallel`, a
     ``ParallelStyle`` that generalizes ``ColwiseParallel``/``RowwiseParallel``/
     ``SequenceParallel`` to the 2-D mesh (torch's own styles accept only a 1-D mesh).
     Weights become 2-D DTensors placed as the option says; linears, norms and the
     embedding run through DTensor's sharding propagation, which must produce the
     option's ``out`` layout without communicating (checked).
   - ``styles="torch"`` (plans whose operators all keep requests split over ``dp``,
     i.e. no ``column_full``/``row_full``/``allgather``): torch's own
     ``ColwiseParallel``/``RowwiseParallel``/``SequenceParallel``/
     ``PrepareModuleInputOutput`` on the 1-D ``mesh["tp"]``; each dp rank serves its own
     requests, as in torchtitan.

   Attention and the sampler compute on local shards (``PrepareModuleInputOutput``
   style). Expert routing cannot be written as a DTensor placement: the ``alltoall``
   option is an explicit DeepEP-style exchange with ``all_to_all_single`` (from
   ``torch.distributed``) over the ``ep = dp * tp`` ranks (``etp = 1``), three calls
   per MoE layer as the cost model prices them: the rows per destination rank
   (``counts``, int32), the hidden states with each row's routing ids and weights in
   extra columns (``dispatch``, one row per token and destination rank) and the
   weighted sums back (``combine``); ``allgather`` gathers every token on every rank
   (a DTensor redistribution) and returns ``Partial`` sums.
3. :func:`run_check` / :func:`run_checks` start one process per rank, run one
   static-prefill forward pass under ``CommDebugMode`` (extended to record each
   collective's size and the edge it belongs to), and compare with
   :func:`shardlab.costmodel.trace.collectives_of`: outputs against the unsharded
   model, collective counts by kind, and per edge the sequence of ``(kind, mesh axis,
   elements)``.
4. :func:`check_redistributions` redistributes a DTensor between every layout pair a
   valid plan can put on an edge, on torch's fake process group (one process, any
   mesh shape, no data moved), against ``CostContext.redistribution_steps``.

Units: the cost model counts bf16 activations (``ACT_BYTES = 2``) while the check runs
float32, so predicted elements are ``bytes / ACT_BYTES``; the logits edge is priced at
width ``2 * vocab`` (fp32 logits in bf16 units), so there it is ``bytes / (2 *
ACT_BYTES)``. The MoE count exchange is priced at ``COUNT_BYTES`` per count and runs
on int32 counts, so there it is ``bytes / COUNT_BYTES`` values. Observed elements: the
all-reduce tensor, the all-gather output, the reduce-scatter input, the all-to-all
input buffer -- the cost model's message conventions -- averaged over ranks; of the
MoE dispatch buffer only the hidden columns, not the routing columns the cost model
does not price. The dispatch and combine sizes depend on the routing: the cost model
prices their expectation under uniform routing, and they are compared within the
sampling noise of one forward pass (:func:`routing_rtol`).

DTensor on a CPU mesh replaces ``Shard(a) -> Shard(b)`` (an all-to-all on CUDA) by an
all-gather followed by a local chunk, because its code assumes gloo has no all-to-all.
gloo does have it, so by default the check routes that redistribution through
DTensor's own all-to-all op (``torch.ops._dtensor.shard_dim_alltoall``, what CUDA
runs); ``cpu_alltoall_fallback=True`` keeps the stock CPU behaviour.

Not modelled by the reference model (they change no collective): RoPE, biases, QK
norms, attention sinks, sliding windows, MLA (refused), pipeline stages (``pp = 1``).
Nothing in the solver or the CLI imports this module.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from shardlab.errors import ShardlabError
from shardlab.problems.model import Model, model_from_config
from shardlab.problems.operators import (
    HEAD_OPS,
    TOKEN_IDS_LAYOUT,
    OptionSpec,
    layer_edges,
    layer_ops,
)
from shardlab.problems.placements import MESH_AXES, Layout, layout_str
from shardlab.problems.placements import Placement as PlanPlacement
from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem

Styles = Literal["mesh", "torch"]

# Models larger than this are not "scaled down": refuse rather than allocate gigabytes.
MAX_PARAMS = 20_000_000

# float32 comparison of the sharded and the unsharded logits (values are O(1)).
ATOL = 1e-4
RTOL = 1e-4

# Sizes that do not depend on the routing must match exactly (up to float rounding).
EXACT_RTOL = 1e-9

# The MoE dispatch and combine move one row per (token, destination rank): how many
# depends on the routing. The cost model prices the expectation under uniform routing
# (``dispatch_copies``, exact), so one forward pass's size (mean over ranks) is a sample
# whose noise the comparison must allow: ROUTING_Z standard errors of the mean copies
# per token (see routing_rtol). The standard error assumes independent tokens, which
# understates the spread: a random router favours some experts in every batch. Over
# seeds 0-99 of the tiny MoE configs (128 tokens, top-2 of 8) the sample mean spread
# 1.45x (ep=2) and 1.27x (ep=4) the independent-token value, centred on the prediction
# (mean deviation -0.06 % and -0.13 %), hence ROUTING_OVERDISPERSION. With these the
# tolerance is 12.5 % at ep=2 and 7.5 % at ep=4: three standard deviations of the
# measured spread, no allowance for bias (there is none left to allow for).
ROUTED = ("experts dispatch", "experts combine")
ROUTING_Z = 3.0
ROUTING_OVERDISPERSION = 1.5

# The count exchange before the dispatch sends one value of this type per destination
# rank; the cost model prices it as COUNT_BYTES per value (checked in predicted_calls).
COUNT_DTYPE = torch.int32

# How worker processes start. Importing torch.distributed.tensor takes ~5 s of CPU, so
# "forkserver" (default) imports it once in a server that has run no torch kernel and
# forks every worker from there; "spawn" imports it in every worker; "fork" copies the
# caller (fastest, but unsafe if the caller has started OpenMP threads).
START_METHOD = os.environ.get("SHARDLAB_DTENSOR_START", "forkserver")


# -- tiny configs ----------------------------------------------------------------------


def tiny_config(kind: Literal["dense", "moe"] = "dense", *, num_layers: int = 2) -> dict:
    """A HuggingFace-style ``config.json`` dict of a small model for the check.

    ``dense``: Llama, hidden 64, 8 heads / 4 KV heads of 8, FFN 128, vocab 256.
    ``moe``: Qwen2-MoE of the same attention, layer 0 dense and the others MoE with 8
    experts (top-2, width 32) and a shared expert of width 64.
    """
    common = {
        "num_hidden_layers": num_layers,
        "hidden_size": 64,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 256,
        "torch_dtype": "float32",
    }
    if kind == "dense":
        return {"model_type": "llama", **common}
    return {
        "model_type": "qwen2_moe",
        **common,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [0],
    }


def tiny_problem(
    kind: Literal["dense", "moe"] = "dense",
    cluster: str = "h100x2",
    *,
    batch: int = 4,
    input_len: int = 8,
    num_layers: int = 2,
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


# -- placements -------------------------------------------------------------------------


def torch_placement(p: PlanPlacement) -> Any:
    """Our placement as a DTensor placement on ``[batch, seq, features]`` activations."""
    if p.kind == "R":
        return Replicate()
    if p.kind == "P":
        return Partial()
    return Shard(0) if p.dim == "tok" else Shard(-1)


def _same_placement(actual: Any, expected: PlanPlacement, ndim: int) -> bool:
    if expected.kind == "R":
        return isinstance(actual, Replicate)
    if expected.kind == "P":
        return isinstance(actual, Partial)  # _MaskPartial (vocab-parallel embedding) too
    if not isinstance(actual, Shard):
        return False
    dim = actual.dim % ndim
    return dim == 0 if expected.dim == "tok" else dim == ndim - 1


def _layout_str(placements: Sequence[Any]) -> str:
    return "(" + ", ".join(str(p) for p in placements) + ")"


# -- what is being recorded -------------------------------------------------------------


class _Where:
    """The edge or operator the running code belongs to (read by the recorder)."""

    label = "setup"
    axis: str | None = None  # set around explicit collectives (the MoE dispatch)
    priced_columns: int | None = None  # only this many leading columns are priced


@contextlib.contextmanager
def _explicit(label: str, axis: str, *, priced_columns: int | None = None) -> Iterator[None]:
    """Label the explicit collectives issued inside (the MoE exchange) for the recorder.

    ``priced_columns``: the payload is ``[rows, columns]`` and only its first
    ``priced_columns`` columns are what the cost model prices (the dispatch carries the
    routing metadata in extra columns); the recorder counts ``rows * priced_columns``.
    """
    old = (_Where.label, _Where.axis, _Where.priced_columns)
    _Where.label, _Where.axis, _Where.priced_columns = label, axis, priced_columns
    try:
        yield
    finally:
        _Where.label, _Where.axis, _Where.priced_columns = old


def _kind_of(op_name: str) -> str:
    name = op_name.rsplit(".", 1)[-1]
    if "all_reduce" in name or name.startswith("allreduce"):
        return "all_reduce"
    if "all_gather" in name or name.startswith("allgather"):
        return "all_gather"
    if "reduce_scatter" in name:
        return "reduce_scatter"
    if "all_to_all" in name or "alltoall" in name:
        return "all_to_all"
    return name


@dataclass(frozen=True)
class _Seen:
    where: str
    kind: str
    axis: str
    elements: int
    dtype: str


class _Recorder(CommDebugMode):
    """``CommDebugMode`` that also records each collective's size, group and edge."""

    def __init__(self, axis_of_group: dict[str, str]) -> None:
        super().__init__()
        self.axis_of_group = axis_of_group
        self.seen: list[_Seen] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = self.get_total_counts()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is not NotImplemented and self.get_total_counts() > before:
            self.seen.append(self._describe(func, args))
        return out

    def _describe(self, func: Any, args: tuple) -> _Seen:
        name = str(func._overloadpacket)
        kind = _kind_of(name)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        # c10d ops take (output, input, ...); functional collectives (input, ...).
        payload = tensors[1] if name.startswith("c10d.") and len(tensors) >= 2 else tensors[0]
        elements = payload.numel()
        if _Where.priced_columns is not None:  # leading columns only (see _explicit)
            elements = elements // payload.shape[-1] * _Where.priced_columns
        group = next((a for a in reversed(args) if isinstance(a, str)), None)
        if kind == "all_gather":
            size = next(a for a in args if isinstance(a, int) and not isinstance(a, bool))
            elements *= size  # the cost model's all-gather message is the gathered output
        axis = _Where.axis or self.axis_of_group.get(str(group), f"group {group}")
        return _Seen(_Where.label, kind, axis, int(elements), str(payload.dtype))


# -- the reference model ----------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class SwiGLUUp(nn.Module):
    """Gate and up projections of a SwiGLU FFN and the activation (``ffn_up``)."""

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, width, bias=False)
        self.up = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.gate(x)) * self.up(x)


class Attention(nn.Module):
    """Causal GQA attention on the fused QKV projection's output (no weights).

    The QKV features are laid out in ``groups`` consecutive groups, each holding
    ``heads / groups`` query heads and their ``kv_heads / groups`` key and value heads,
    so that a ``Shard(-1)`` slice over ``groups`` ranks is a set of whole heads. Any
    number of whole groups may arrive (replicated, head-sharded, token-sharded).
    """

    def __init__(self, heads: int, kv_heads: int, head_dim: int, groups: int) -> None:
        super().__init__()
        if heads % groups or kv_heads % groups:
            raise ShardlabError(
                f"attention: {heads} heads / {kv_heads} KV heads do not split into {groups} groups"
            )
        self.hq, self.hkv, self.hd = heads // groups, kv_heads // groups, head_dim
        self.per_group = (self.hq + 2 * self.hkv) * head_dim

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        b, s, width = qkv.shape
        g = width // self.per_group
        parts = qkv.view(b, s, g, self.per_group)
        q, k, v = parts.split([self.hq * self.hd, self.hkv * self.hd, self.hkv * self.hd], -1)

        def heads(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.reshape(b, s, g * n, self.hd).transpose(1, 2)

        o = F.scaled_dot_product_attention(
            heads(q, self.hq),
            heads(k, self.hkv),
            heads(v, self.hkv),
            is_causal=True,
            enable_gqa=True,
        )
        return o.transpose(1, 2).reshape(b, s, g * self.hq * self.hd)


class Sampler(nn.Module):
    """Reads the logits in its layout and returns them (sampling itself is local)."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


@dataclass
class _ExpertSharding:
    option: str  # alltoall | allgather
    ep: int
    etp: int
    rank: int  # rank inside the stage group (dp major, tp minor)
    layer: int


class Experts(nn.Module):
    """Routed SwiGLU experts (Mixtral-style top-k softmax over the chosen logits)."""

    def __init__(self, num_experts: int, top_k: int, hidden: int, width: int) -> None:
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.w_gate = nn.Parameter(torch.empty(num_experts, width, hidden))
        self.w_up = nn.Parameter(torch.empty(num_experts, width, hidden))
        self.w_down = nn.Parameter(torch.empty(num_experts, hidden, width))
        self.sharding: _ExpertSharding | None = None

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top, idx = logits.topk(self.top_k, dim=-1)
        return top.softmax(-1), idx

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Local expert ``e`` (an index into the local weights) on rows ``x``."""
        return (F.silu(x @ self.w_gate[e].T) * (x @ self.w_up[e].T)) @ self.w_down[e].T

    def _contributions(self, x: torch.Tensor, logits: torch.Tensor, first: int) -> torch.Tensor:
        """Sum over a token's chosen experts that are local (``first``.. onward)."""
        shape = x.shape
        x2, lg = x.reshape(-1, shape[-1]), logits.reshape(-1, self.num_experts)
        w, idx = self.route(lg)
        out = torch.zeros_like(x2)
        for e in range(self.w_gate.shape[0]):
            rows, slots = torch.nonzero(idx == first + e, as_tuple=True)
            if len(rows):
                y = self.expert(e, x2[rows]) * w[rows, slots, None]
                out.index_add_(0, rows, y)
        return out.view(shape)

    def forward(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        s = self.sharding
        if s is None:
            return self._contributions(x, logits, 0)
        local = self.w_gate.shape[0]
        if s.option == "allgather":
            # Every rank sees every token and adds its own experts' (slices') share.
            return self._contributions(x, logits, (s.rank // s.etp) * local)
        return self._alltoall(x, logits, s)

    def _alltoall(self, x: torch.Tensor, logits: torch.Tensor, s: _ExpertSharding) -> torch.Tensor:
        """DeepEP-style dispatch: a token goes once to each rank owning one of its experts.

        Three ``all_to_all_single`` calls, as ``collectives_of`` predicts:

        - ``experts counts``: rows per destination rank, one ``COUNT_DTYPE`` (int32)
          value per rank (DeepEP's notify step before a dropless dispatch);
        - ``experts dispatch``: one row per (token, destination rank) holding the hidden
          state followed by ``2 * top_k`` routing columns (the local expert ids, -1
          where the expert lives elsewhere, and their weights), which DeepEP sends
          inside the same dispatch kernel. The recorder counts only the ``hidden``
          columns (``priced_columns``): the cost model does not price the routing
          metadata, small next to the hidden rows;
        - ``experts combine``: each row's weighted sum over the receiver's experts
          back to its sender, which adds them up.
        """
        shape = x.shape
        h = shape[-1]
        x2 = x.reshape(-1, h)
        n_tok, k = x2.shape[0], self.top_k
        w, idx = self.route(logits.reshape(-1, self.num_experts))
        local = self.w_gate.shape[0]
        dest = idx // local  # rank of each chosen expert
        hit = torch.zeros(s.ep, n_tok, dtype=torch.bool)
        hit[dest, torch.arange(n_tok).unsqueeze(1).expand(-1, k)] = True
        pair_rank, pair_tok = torch.nonzero(hit, as_tuple=True)  # grouped by rank
        mine = dest[pair_tok] == pair_rank.unsqueeze(1)
        ids = torch.where(mine, idx[pair_tok] - (pair_rank * local).unsqueeze(1), -1)
        weights = torch.where(mine, w[pair_tok], 0.0)
        # Local expert ids (< num_experts) are exact in the float buffer.
        send = torch.cat([x2[pair_tok], ids.to(x2.dtype), weights], 1)
        send_counts = torch.bincount(pair_rank, minlength=s.ep).to(COUNT_DTYPE)
        recv_counts = torch.empty_like(send_counts)
        where = f"layer{s.layer}: experts"
        with _explicit(f"{where} counts", "ep"):
            dist.all_to_all_single(recv_counts, send_counts)
        send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
        recv = send.new_empty(sum(recv_splits), h + 2 * k)
        with _explicit(f"{where} dispatch", "ep", priced_columns=h):
            dist.all_to_all_single(recv, send, recv_splits, send_splits)
        recv_x = recv[:, :h]
        recv_ids, recv_w = recv[:, h : h + k].round().long(), recv[:, h + k :]
        out = torch.zeros_like(recv_x)
        for e in range(local):
            rows, slots = torch.nonzero(recv_ids == e, as_tuple=True)
            if len(rows):
                out.index_add_(0, rows, self.expert(e, recv_x[rows]) * recv_w[rows, slots, None])
        back = x2.new_empty(send.shape[0], h)
        with _explicit(f"{where} combine", "ep"):
            dist.all_to_all_single(back, out, send_splits, recv_splits)
        y = torch.zeros_like(x2)
        y.index_add_(0, pair_tok, back)
        return y.view(shape)


class Block(nn.Module):
    """One decoder layer; its children are named after the cost model's operators."""

    def __init__(self, model: Model, index: int, groups: int) -> None:
        super().__init__()
        m = model
        h = m.hidden_size
        self.index = index
        self.kind = m.layer_kinds[index]
        self.attn_norm = RMSNorm(h)
        self.qkv_proj = nn.Linear(h, (m.num_heads + 2 * m.num_kv_heads) * m.head_dim, bias=False)
        self.attention = Attention(m.num_heads, m.num_kv_heads, m.head_dim, groups)
        self.o_proj = nn.Linear(m.q_dim, h, bias=False)
        self.ffn_norm = RMSNorm(h)
        if self.kind == "dense":
            self.ffn_up = SwiGLUUp(h, m.ffn_size)
            self.ffn_down = nn.Linear(m.ffn_size, h, bias=False)
        else:
            assert m.moe is not None
            moe = m.moe
            self.router = nn.Linear(h, moe.num_experts, bias=False)
            self.experts = Experts(moe.num_experts, moe.top_k, h, moe.expert_ffn_size)
            if moe.shared_ffn_size:
                self.shared_up = SwiGLUUp(h, moe.shared_ffn_size)
                self.shared_down = nn.Linear(moe.shared_ffn_size, h, bias=False)
        self.plan: _PlanState | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = _Edges(self.plan, self.index)
        x = e.into_residual(x)
        h = e.run("attn_norm", self.attn_norm, e("residual", "attn_norm", x))
        h = e.run("qkv_proj", self.qkv_proj, e("attn_norm", "qkv_proj", h))
        h = e.run("attention", self.attention, e("qkv_proj", "attention", h))
        h = e.run("o_proj", self.o_proj, e("attention", "o_proj", h))
        x = x + e("o_proj", "residual", h)
        h = e.run("ffn_norm", self.ffn_norm, e("residual", "ffn_norm", x))
        if self.kind == "dense":
            f = e.run("ffn_up", self.ffn_up, e("ffn_norm", "ffn_up", h))
            f = e.run("ffn_down", self.ffn_down, e("ffn_up", "ffn_down", f))
            return x + e("ffn_down", "residual", f)
        r = e.run("router", self.router, e("ffn_norm", "router", h))
        y = e.run("experts", self.experts, e("ffn_norm", "experts", h), e("router", "experts", r))
        out = x + e("experts", "residual", y)
        if hasattr(self, "shared_up"):
            s = e.run("shared_up", self.shared_up, e("ffn_norm", "shared_up", h))
            s = e.run("shared_down", self.shared_down, e("shared_up", "shared_down", s))
            out = out + e("shared_down", "residual", s)
        return out


class TinyTransformer(nn.Module):
    """The reference model; ``forward(ids [batch, seq]) -> logits [batch, 1, vocab]``.

    As in the cost model's prefill step, only each request's last position goes
    through the final norm, the LM head and the sampler. ``groups`` is the QKV head
    grouping (see :class:`Attention`): the tensor-parallel degree the model will be
    sharded over. Weights depend only on ``seed`` (QKV rows are regrouped, not redrawn).
    """

    def __init__(self, model: Model, *, groups: int = 1, seed: int = 0) -> None:
        super().__init__()
        if model.mla is not None:
            raise ShardlabError(f"{model.name}: MLA attention is not implemented by the check")
        self.model = model
        self.groups = groups
        h = model.hidden_size
        self.embedding = nn.Embedding(model.vocab_size, h)
        self.layers = nn.ModuleList(Block(model, i, groups) for i in range(model.num_layers))
        self.final_norm = RMSNorm(h)
        self.lm_head = nn.Linear(h, model.vocab_size, bias=False)
        self.sampler = Sampler()
        self.plan: _PlanState | None = None
        n = sum(p.numel() for p in self.parameters())
        if n > MAX_PARAMS:
            raise ShardlabError(
                f"{model.name}: {n:,} parameters; the check wants a scaled-down model "
                f"(at most {MAX_PARAMS:,}; see tiny_config)"
            )
        self._init(seed)

    @torch.no_grad()
    def _init(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name == "embedding.weight":
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
        m = self.model
        for block in self.layers:
            w = block.qkv_proj.weight
            w.copy_(_group_qkv_rows(w, m.num_heads, m.num_kv_heads, m.head_dim, self.groups))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = _Edges(self.plan, None)
        x = e.run("embedding", self.embedding, e.head("token_ids", "embedding", ids))
        label = "embedding"
        for block in self.layers:
            if block.plan is not None:
                block.plan.entering_from = label
            x = block(x)
            label = f"layer{block.index}.residual"
        _Where.label = "select last position"
        x = x[:, -1:, :]
        h = e.run("final_norm", self.final_norm, e.head("layers.last", "final_norm", x))
        h = e.run("lm_head", self.lm_head, e.head("final_norm", "lm_head", h))
        return e.run("sampler", self.sampler, e.head("lm_head", "sampler", h))


def _group_qkv_rows(w: torch.Tensor, heads: int, kv: int, hd: int, groups: int) -> torch.Tensor:
    """Reorder ``[q; k; v]`` rows into ``groups`` groups of ``[q_g; k_g; v_g]``."""
    q, k, v = w.split([heads * hd, kv * hd, kv * hd])
    parts = []
    for g in range(groups):
        for t, n in ((q, heads), (k, kv), (v, kv)):
            per = n // groups * hd
            parts.append(t[g * per : (g + 1) * per])
    return torch.cat(parts)


# -- applying a plan --------------------------------------------------------------------


@dataclass
class _PlanState:
    """What a sharded model needs at run time: the mesh and every operator's option."""

    mesh: DeviceMesh  # (dp, tp) for styles="mesh", the 1-D tp mesh for styles="torch"
    axes: tuple[str, ...]
    layers: list[dict[str, OptionSpec]]
    head: dict[str, OptionSpec]
    styles: Styles
    entering_from: str = "embedding"

    def placements(self, layout: Layout) -> list[Any]:
        return [
            torch_placement(p) for a, p in zip(MESH_AXES, layout, strict=True) if a in self.axes
        ]


class _Edges:
    """Redistribution between operators, named like ``collectives_of``'s calls."""

    def __init__(self, state: _PlanState | None, layer: int | None) -> None:
        self.s = state
        self.layer = layer

    def _opt(self, name: str) -> OptionSpec:
        assert self.s is not None
        if self.layer is None or name in self.s.head:
            return self.s.head[name]
        return self.s.layers[self.layer][name]

    def _move(self, label: str, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        _Where.label = label
        if self.s is None:
            return x
        assert isinstance(x, DTensor), f"{label}: expected a DTensor, got a plain tensor"
        return x.redistribute(self.s.mesh, self.s.placements(layout))

    def __call__(self, src: str, dst: str, x: torch.Tensor) -> torch.Tensor:
        if self.s is None:
            return x
        label = f"layer{self.layer}: {src} -> {dst}"
        return self._move(label, x, self.s.layers[self.layer][dst].inp)

    def into_residual(self, x: torch.Tensor) -> torch.Tensor:
        if self.s is None:
            return x
        src = self.s.entering_from
        return self._move(f"{src} -> layer{self.layer}.residual", x, self._opt("residual").inp)

    def head(self, src: str, dst: str, x: torch.Tensor) -> torch.Tensor:
        if self.s is None:
            return x
        if src == "token_ids":
            # Token ids enter as TOKEN_IDS_LAYOUT; the cost model lists no edge here.
            _Where.label = "token_ids -> embedding"
            if self.s.styles == "torch" and self._opt("embedding").name == "vocab_sharded":
                return x  # RowwiseParallel(nn.Embedding) takes replicated ids itself
            return x.redistribute(self.s.mesh, self.s.placements(self._opt(dst).inp))
        return self._move(f"{src} -> {dst}", x, self._opt(dst).inp)

    def run(self, op: str, module: nn.Module, *args: torch.Tensor) -> Any:
        """Run operator ``op``; collectives seen while it runs are labelled with it."""
        if self.s is None:
            return module(*args)
        where = f"layer{self.layer}: {op}" if self.layer is not None else op
        _Where.label = where
        if self.s.styles == "torch" and op == "embedding":
            opt = self._opt("embedding")
            if opt.name == "vocab_sharded":
                # RowwiseParallel redistributes its output itself: that is the first edge.
                first = self.s.layers[0]["residual"]
                _Where.label = "embedding -> layer0.residual"
                out = module(*args)
                self._check_out(where, opt, first.inp, out)
                return out
        out = module(*args)
        self._check_out(where, self._opt(op), self._opt(op).out, out)
        return out

    def _check_out(self, where: str, opt: OptionSpec, layout: Layout, out: Any) -> None:
        assert self.s is not None
        want = [p for a, p in zip(MESH_AXES, layout, strict=True) if a in self.s.axes]
        if not isinstance(out, DTensor):
            raise ShardlabError(f"{where} ({opt.name}): returned a plain tensor, not a DTensor")
        got = out.placements
        if not all(_same_placement(g, w, out.ndim) for g, w in zip(got, want, strict=True)):
            raise ShardlabError(
                f"{where} ({opt.name}): DTensor produced {_layout_str(got)}, the option "
                f"declares {'(' + ', '.join(p.short for p in want) + ')'}"
            )


def _linear_weight_placements(opt: OptionSpec, axes: tuple[str, ...]) -> list[Any]:
    """Placement of an ``nn.Linear`` weight ``[out, in]`` on each mesh axis."""
    out = []
    for axis, i, o in zip(MESH_AXES, opt.inp, opt.out, strict=True):
        if axis not in axes:
            continue
        if o.kind == "S" and o.dim == "hid":
            out.append(Shard(0))  # output features split: column-parallel
        elif i.kind == "S" and i.dim == "hid":
            out.append(Shard(1))  # input features split: row-parallel
        else:
            out.append(Replicate())
    return out


def _embedding_weight_placements(opt: OptionSpec, axes: tuple[str, ...]) -> list[Any]:
    return [
        Shard(0) if o.kind == "P" else Replicate()
        for axis, o in zip(MESH_AXES, opt.out, strict=True)
        if axis in axes
    ]


class OptionParallel(ParallelStyle):
    """One operator option on the 2-D ``(dp, tp)`` mesh.

    The weights of every ``nn.Linear``/``nn.Embedding`` inside become DTensors placed as
    the option says (output features split where the option outputs ``S(hid)``, input
    features where it reads ``S(hid)`` and returns partial sums, vocabulary rows where
    the embedding returns partial sums); other parameters are replicated. With
    ``local=True`` the module computes on local shards: its DTensor inputs (already in
    ``inp``: the model redistributes on every edge) are unwrapped and its output is
    wrapped with the ``out`` placements, like ``PrepareModuleInputOutput``.
    """

    def __init__(self, opt: OptionSpec, *, local: bool = False) -> None:
        super().__init__()
        self.opt = opt
        self.local = local

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        axes = MESH_AXES
        if not self.local:
            for sub in module.modules():
                if isinstance(sub, nn.Linear):
                    placements = _linear_weight_placements(self.opt, axes)
                elif isinstance(sub, nn.Embedding):
                    placements = _embedding_weight_placements(self.opt, axes)
                else:
                    placements = [Replicate()] * len(axes)
                for name, p in list(sub.named_parameters(recurse=False)):
                    d = distribute_tensor(p.detach(), device_mesh, placements, src_data_rank=None)
                    sub.register_parameter(name, nn.Parameter(d, requires_grad=False))
            return module
        out = [torch_placement(p) for p in self.opt.out]

        def pre(_mod: nn.Module, args: tuple) -> tuple:
            return tuple(a.to_local() if isinstance(a, DTensor) else a for a in args)

        def post(_mod: nn.Module, _args: tuple, result: torch.Tensor) -> DTensor:
            return DTensor.from_local(result, device_mesh, out, run_check=False)

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
        return module


class ExpertParallel(ParallelStyle):
    """Routed experts split over ``ep`` ranks (each over ``etp``), local weights only.

    ``alltoall``: tokens arrive split over every rank, are dispatched to the ranks that
    own their experts and combined back with ``all_to_all_single`` (``etp = 1``).
    ``allgather``: every rank holds every token and returns partial sums.
    """

    def __init__(self, opt: OptionSpec, *, ep: int, etp: int, rank: int, layer: int) -> None:
        super().__init__()
        self.opt, self.ep, self.etp, self.rank, self.layer = opt, ep, etp, rank, layer

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        assert isinstance(module, Experts)
        if self.opt.name == "alltoall" and self.etp != 1:
            raise ShardlabError(
                "experts alltoall with etp > 1 (gather/scatter inside each expert group) is "
                "not implemented by the check; use degrees with etp = 1"
            )
        e_idx, t_idx = divmod(self.rank, self.etp)
        local = module.num_experts // self.ep
        width = module.w_gate.shape[1] // self.etp
        es = slice(e_idx * local, (e_idx + 1) * local)
        fs = slice(t_idx * width, (t_idx + 1) * width)
        with torch.no_grad():
            module.w_gate = nn.Parameter(module.w_gate[es, fs].clone(), requires_grad=False)
            module.w_up = nn.Parameter(module.w_up[es, fs].clone(), requires_grad=False)
            module.w_down = nn.Parameter(module.w_down[es, :, fs].clone(), requires_grad=False)
        module.sharding = _ExpertSharding(self.opt.name, self.ep, self.etp, self.rank, self.layer)
        mesh = device_mesh
        out = [torch_placement(p) for p in self.opt.out]
        if mesh.ndim == 1:  # styles="torch": only the tp axis is a mesh axis
            out = out[1:]

        def pre(_mod: nn.Module, args: tuple) -> tuple:
            return tuple(a.to_local() if isinstance(a, DTensor) else a for a in args)

        def post(_mod: nn.Module, _args: tuple, result: torch.Tensor) -> DTensor:
            return DTensor.from_local(result, mesh, out, run_check=False)

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
        return module


def _torch_style(op: str, opt: OptionSpec, module: nn.Module) -> dict[str, ParallelStyle]:
    """torch's own 1-D styles on the tp mesh for one operator option (``styles="torch"``)."""
    tp_in = torch_placement(opt.inp[1])
    tp_out = torch_placement(opt.out[1])

    def local() -> ParallelStyle:
        return PrepareModuleInputOutput(
            input_layouts=(tp_in,),
            desired_input_layouts=(tp_in,),
            use_local_input=True,
            output_layouts=tp_out,
            desired_output_layouts=tp_out,
            use_local_output=False,
        )

    linears = [n for n, _ in module.named_children()] if isinstance(module, SwiGLUUp) else [""]
    if op in ("attention", "sampler"):
        return {"": local()}
    if opt.name == "replicated":
        # Whole weights on every rank: compute on the local tensor.
        return {"": local()}
    if opt.name == "seq_sharded":
        return {n: SequenceParallel(sequence_dim=0) for n in linears}
    if opt.name == "column":
        return {
            n: ColwiseParallel(input_layouts=Replicate(), use_local_output=False) for n in linears
        }
    if opt.name == "row":
        return {
            "": RowwiseParallel(
                input_layouts=Shard(-1), output_layouts=Partial(), use_local_output=False
            )
        }
    raise ShardlabError(f"{op}: option {opt.name} has no torch style (it needs the dp axis)")


def torch_styles_supported(plan: Plan, model: Model) -> bool:
    """Whether every operator keeps requests split over dp (``styles="torch"`` works)."""
    for kind, opts in zip(model.layer_kinds, plan.layer_options, strict=True):
        for op, name in zip(layer_ops(model, kind), opts, strict=True):
            if op.name == "experts" and name == "allgather" and plan.degrees.dp_attn > 1:
                return False
            if name in ("column_full", "row_full"):
                return False
    return True


def apply_plan(
    net: TinyTransformer, plan: Plan, mesh: DeviceMesh, *, styles: Styles = "mesh"
) -> TinyTransformer:
    """Shard ``net`` in place as ``plan`` says, with ``parallelize_module`` on ``mesh``.

    ``mesh`` is the ``(dp_attn, tp)`` mesh with dimension names ``("dp", "tp")``.
    ``styles="mesh"``: :class:`OptionParallel` on the 2-D mesh; ``styles="torch"``:
    torch's own styles on ``mesh["tp"]`` (see the module docstring).
    """
    m, d = net.model, plan.degrees
    if d.pp != 1 or d.replicas != 1:
        raise ShardlabError(
            f"degrees {d.short()}: the check runs one pipeline stage of one replica "
            "(pp = replicas = 1)"
        )
    if tuple(mesh.shape) != (d.dp_attn, d.tp) or mesh.mesh_dim_names != MESH_AXES:
        raise ShardlabError(
            f"mesh {tuple(mesh.shape)} {mesh.mesh_dim_names} is not (dp_attn, tp) = "
            f"({d.dp_attn}, {d.tp}) named {MESH_AXES}"
        )
    if net.groups != d.tp:
        raise ShardlabError(
            f"the model groups its QKV heads for tp={net.groups}, the plan has tp={d.tp}"
        )
    if styles == "torch" and not torch_styles_supported(plan, m):
        raise ShardlabError(
            "styles='torch': the plan gathers tokens over dp (column_full, row_full or "
            "allgather experts), which torch's 1-D styles cannot express; use styles='mesh'"
        )
    layers = [
        {op.name: op.option(name) for op, name in zip(layer_ops(m, kind), opts, strict=True)}
        for kind, opts in zip(m.layer_kinds, plan.layer_options, strict=True)
    ]
    head = {op.name: op.option(name) for op, name in zip(HEAD_OPS, plan.head_options, strict=True)}
    if styles == "mesh":
        state = _PlanState(mesh, MESH_AXES, layers, head, styles)
        target = mesh
    else:
        state = _PlanState(mesh["tp"], ("tp",), layers, head, styles)
        target = mesh["tp"]
    rank = dist.get_rank(mesh.get_group("dp")) * d.tp + dist.get_rank(mesh.get_group("tp"))
    local_ops = ("attention", "sampler")
    plan_styles: dict[str, ParallelStyle] = {}

    def add(fqn: str, op: str, opt: OptionSpec, module: nn.Module) -> None:
        if styles == "mesh":
            plan_styles[fqn] = OptionParallel(opt, local=op in local_ops)
            return
        for sub, style in _torch_style(op, opt, module).items():
            plan_styles[f"{fqn}.{sub}" if sub else fqn] = style

    for name in ("embedding", "final_norm", "lm_head", "sampler"):
        opt = head[name]
        if styles == "torch" and name == "embedding":
            plan_styles["embedding"] = _torch_embedding_style(opt, layers[0]["residual"])
            continue
        add(name, name, opt, getattr(net, name))
    for i, block in enumerate(net.layers):
        for op, opt in layers[i].items():
            if op == "residual":
                continue
            module = getattr(block, op)
            if op == "experts":
                plan_styles[f"layers.{i}.experts"] = ExpertParallel(
                    opt, ep=d.ep, etp=d.etp, rank=rank, layer=i
                )
            else:
                add(f"layers.{i}.{op}", op, opt, module)
        block.plan = state
    parallelize_module(net, target, plan_styles, src_data_rank=None)
    net.plan = state
    return net


def _torch_embedding_style(opt: OptionSpec, residual: OptionSpec) -> ParallelStyle:
    tp_out = torch_placement(opt.out[1])
    if opt.name == "vocab_sharded":
        # The output of a vocabulary-sharded embedding is a masked partial sum that
        # DTensor only lets RowwiseParallel turn into the residual's layout directly.
        return RowwiseParallel(
            input_layouts=Replicate(),
            output_layouts=torch_placement(residual.inp[1]),
            use_local_output=False,
        )
    if opt.name == "seq_sharded":
        return SequenceParallel(sequence_dim=0)
    return PrepareModuleInputOutput(
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        use_local_input=True,
        output_layouts=tp_out,
        desired_output_layouts=tp_out,
        use_local_output=False,
    )


# -- DTensor's CPU all-to-all ---------------------------------------------------------------


def _shard_dim_alltoall_native(input, gather_dim, shard_dim, mesh, mesh_dim):
    """DTensor's ``Shard(a) -> Shard(b)`` as it runs on CUDA: one all-to-all."""
    from torch.distributed import _functional_collectives as funcol

    group = funcol._resolve_group((mesh, mesh_dim))
    return torch.ops._dtensor.shard_dim_alltoall(
        input, gather_dim, shard_dim, funcol._group_or_group_name(group)
    )


@contextlib.contextmanager
def _native_alltoall(enabled: bool) -> Iterator[None]:
    from torch.distributed.tensor import placement_types

    if not enabled or not hasattr(placement_types, "shard_dim_alltoall"):
        yield
        return
    old = placement_types.shard_dim_alltoall
    placement_types.shard_dim_alltoall = _shard_dim_alltoall_native
    try:
        yield
    finally:
        placement_types.shard_dim_alltoall = old


# -- running and comparing ------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One collective of one forward pass: the cost model's or the one torch issued."""

    where: str
    kind: str
    axis: str
    elements: float
    rtol: float = EXACT_RTOL  # predicted calls: relative tolerance on ``elements``

    def __str__(self) -> str:
        tol = f" ±{self.rtol:.1%}" if self.rtol > EXACT_RTOL else ""
        return f"{self.kind}[{self.axis}] {self.elements:g}{tol}"


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one plan: outputs, and the collectives on both sides."""

    name: str
    world_size: int
    styles: str
    outputs_match: bool
    max_abs_error: float
    observed: tuple[Call, ...]  # in issue order, elements averaged over ranks
    observed_spread: tuple[tuple[float, float], ...]  # (min, max) over ranks per call
    comm_counts: dict[str, int]  # CommDebugMode.get_comm_counts(), mapped to our kinds
    predicted: tuple[Call, ...]
    error: str = ""
    seconds: float = 0.0  # building, sharding and running the plan (slowest rank)

    @property
    def observed_counts(self) -> dict[str, int]:
        return dict(Counter(c.kind for c in self.observed))

    @property
    def predicted_counts(self) -> dict[str, int]:
        return dict(Counter(c.kind for c in self.predicted))

    @property
    def counts_match(self) -> bool:
        return not self.error and self.comm_counts == self.predicted_counts

    def edge_mismatches(self, *, unpredicted: bool = True) -> list[str]:
        """Edges whose (kind, axis, elements) sequence differs, one line each.

        ``unpredicted=False`` leaves out edges (and operators) the cost model lists no
        collective for: only the predicted collectives' sizes are compared.
        """
        if self.error:
            return [self.error]
        obs: dict[str, list[Call]] = {}
        for c in self.observed:
            obs.setdefault(c.where, []).append(c)
        pred: dict[str, list[Call]] = {}
        for c in self.predicted:
            pred.setdefault(c.where, []).append(c)
        out = []
        for where in dict.fromkeys([*pred, *obs] if unpredicted else pred):
            p, o = pred.get(where, []), obs.get(where, [])
            same = [(c.kind, c.axis) for c in p] == [(c.kind, c.axis) for c in o]
            if not same or not all(
                math.isclose(a.elements, b.elements, rel_tol=a.rtol)
                for a, b in zip(p, o, strict=True)
            ):
                out.append(
                    f"{where}: cost model [{', '.join(map(str, p)) or 'none'}], "
                    f"torch [{', '.join(map(str, o)) or 'none'}]"
                )
        return out

    @property
    def ok(self) -> bool:
        return self.outputs_match and self.counts_match and not self.edge_mismatches()

    def report(self) -> str:
        lines = [
            f"{self.name} on {self.world_size} ranks (styles={self.styles}): outputs "
            f"{'match' if self.outputs_match else 'DIFFER'} (max |err| {self.max_abs_error:.2e})",
            f"  counts: torch {self.comm_counts}, cost model {self.predicted_counts}",
        ]
        if self.error:
            lines.append(f"  error: {self.error}")
        lines += [f"  {m}" for m in self.edge_mismatches()]
        return "\n".join(lines)


def copies_moments(ep: int, top_k: int, num_experts: int) -> tuple[float, float]:
    """Mean and variance of one token's dispatch copies (distinct destination ranks
    among its ``top_k`` distinct experts) under uniform routing, ``num_experts / ep``
    experts per rank. The mean is ``dispatch_copies``'s expectation."""
    if ep == 1:
        return 1.0, 0.0
    local = num_experts // ep
    total = math.comb(num_experts, top_k)
    miss = math.comb(num_experts - local, top_k) / total  # P(rank r gets no copy)
    miss2 = math.comb(max(num_experts - 2 * local, 0), top_k) / total  # ... nor rank s
    mean = ep * (1.0 - miss)
    var = ep * miss * (1.0 - miss) + ep * (ep - 1) * (miss2 - miss * miss)
    return mean, var


def routing_rtol(ep: int, top_k: int, num_experts: int, tokens: int) -> float:
    """Tolerance on a routed call's size when ``tokens`` tokens are routed once (see
    ROUTING_Z): relative standard error of the mean copies per token, inflated."""
    mean, var = copies_moments(ep, top_k, num_experts)
    return ROUTING_Z * ROUTING_OVERDISPERSION * math.sqrt(var / tokens) / mean


def predicted_calls(problem: Problem, plan: Plan) -> tuple[Call, ...]:
    """``collectives_of(problem, plan)`` without point-to-point sends, in elements.

    Activations: ``bytes / ACT_BYTES`` (``2 * ACT_BYTES`` for the fp32 logits,
    ``dispatch_bytes`` for the MoE dispatch). The MoE count exchange is priced as
    ``ep * COUNT_BYTES`` bytes, one int32 per destination rank: it is
    ``bytes / COUNT_BYTES`` values of ``COUNT_DTYPE`` (not activation elements).
    The MoE dispatch and combine carry the tolerance of :func:`routing_rtol` for the
    workload's ``batch * input_len`` tokens (a static prefill: every token routed once).
    """
    from shardlab.costmodel.constants import ACT_BYTES
    from shardlab.costmodel.opcosts import COUNT_BYTES, dispatch_bytes
    from shardlab.costmodel.trace import collectives_of

    if COUNT_DTYPE.itemsize != COUNT_BYTES:
        raise ShardlabError(
            f"the check exchanges counts as {COUNT_DTYPE} ({COUNT_DTYPE.itemsize} bytes), "
            f"the cost model prices {COUNT_BYTES:g} bytes per count"
        )
    out = []
    for c in collectives_of(problem, plan):
        if c.kind == "p2p":
            continue
        per = ACT_BYTES
        rtol = EXACT_RTOL
        if c.where == "lm_head -> sampler":
            per = 2.0 * ACT_BYTES  # priced at width 2 * vocab: fp32 logits
        elif c.where.endswith("experts counts"):
            per = COUNT_BYTES  # ep * COUNT_BYTES bytes = ep int32 counts
        elif c.where.endswith(ROUTED):
            if c.where.endswith("experts dispatch"):
                per = dispatch_bytes(problem.weight_dtype("experts"))  # fp8 with fp8 experts
            moe = problem.model.moe
            assert moe is not None
            w = problem.workload
            rtol = routing_rtol(plan.degrees.ep, moe.top_k, moe.num_experts, w.batch * w.input_len)
        out.append(Call(c.where, c.kind, c.axis, c.bytes / per, rtol))
    return tuple(out)


@dataclass(frozen=True)
class _Case:
    name: str
    model: Model
    plan: Plan
    batch: int
    input_len: int
    styles: Styles
    cpu_alltoall_fallback: bool
    seed: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, cases: list[_Case], outdir: str) -> None:
    torch.set_num_threads(1)
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    logging.getLogger("torch.distributed.tensor._collective_utils").setLevel(logging.ERROR)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    results = []
    try:
        for case in cases:
            t0 = time.perf_counter()
            results.append(_run_case(rank, world, case))
            results[-1]["seconds"] = time.perf_counter() - t0
    finally:
        with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(results, f)
        dist.destroy_process_group()


_MESHES: dict[tuple[int, int], DeviceMesh] = {}


def _run_case(rank: int, world: int, case: _Case) -> dict[str, Any]:
    d = case.plan.degrees
    try:
        if d.group != world:
            raise ShardlabError(f"{case.name}: plan needs {d.group} ranks, {world} are running")
        shape = (d.dp_attn, d.tp)
        if shape not in _MESHES:  # one set of process groups per shape and process
            _MESHES[shape] = init_device_mesh("cpu", shape, mesh_dim_names=MESH_AXES)
        mesh = _MESHES[shape]
        axis_of_group = {dist.group.WORLD.group_name: "group"}
        for axis in MESH_AXES:
            axis_of_group[mesh.get_group(axis).group_name] = axis
        ref = TinyTransformer(case.model, groups=d.tp, seed=case.seed)
        g = torch.Generator().manual_seed(case.seed + 1)
        ids = torch.randint(0, case.model.vocab_size, (case.batch, case.input_len), generator=g)
        with torch.no_grad():
            want = ref(ids)
        net = apply_plan(copy.deepcopy(ref), case.plan, mesh, styles=case.styles)
        ids_mesh = mesh if case.styles == "mesh" else mesh["tp"]
        if case.styles == "mesh":
            placements = [torch_placement(p) for p in TOKEN_IDS_LAYOUT]
            dids = distribute_tensor(ids, ids_mesh, placements, src_data_rank=None)
        else:
            rows = case.batch // d.dp_attn
            dp_rank = dist.get_rank(mesh.get_group("dp"))
            mine = ids[dp_rank * rows : (dp_rank + 1) * rows]
            dids = DTensor.from_local(mine, ids_mesh, [Replicate()], run_check=False)
            want = want[dp_rank * rows : (dp_rank + 1) * rows]
        rec = _Recorder(axis_of_group)
        with torch.no_grad(), _native_alltoall(not case.cpu_alltoall_fallback), rec:
            out = net(dids)
        _Where.label = "compare"
        got = out.full_tensor()
        err = float((got - want).abs().max())
        match = bool(torch.allclose(got, want, atol=ATOL, rtol=RTOL))
        counts = Counter()
        for op, n in rec.get_comm_counts().items():
            counts[_kind_of(str(op))] += n
        return {
            "seen": rec.seen,
            "counts": dict(counts),
            "err": err,
            "match": match,
            "error": "",
        }
    except Exception as exc:  # reported per case; the other cases still run
        return {
            "seen": [],
            "counts": {},
            "err": math.inf,
            "match": False,
            "error": f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}",
        }


@dataclass(frozen=True, kw_only=True)
class CheckCase:
    """One plan to run: the problem (model, batch, input length) and the plan."""

    problem: Problem
    plan: Plan
    name: str = ""
    styles: Styles = "mesh"
    cpu_alltoall_fallback: bool = False
    seed: int = 0


def _launch(fn: Any, args: tuple, nprocs: int) -> list[Any]:
    """Run ``fn(rank, *args, outdir)`` in ``nprocs`` processes; each pickles its result."""
    if START_METHOD == "forkserver":
        mp.set_forkserver_preload([__name__])
    with tempfile.TemporaryDirectory(prefix="shardlab-dtensor-") as outdir:
        mp.start_processes(fn, args=(*args, outdir), nprocs=nprocs, start_method=START_METHOD)
        out = []
        for r in range(nprocs):
            with open(os.path.join(outdir, f"rank{r}.pkl"), "rb") as f:
                out.append(pickle.load(f))
    return out


def run_checks(cases: Sequence[CheckCase], world_size: int) -> list[CheckResult]:
    """Run every case in one set of ``world_size`` processes (one process group)."""
    inner = []
    for i, c in enumerate(cases):
        w = c.problem.workload
        if w.phase != "prefill" or w.schedule != "static":
            raise ShardlabError(f"{c.name or i}: the check runs a static prefill workload")
        if w.batch % c.plan.degrees.group:
            raise ShardlabError(
                f"{c.name or i}: batch {w.batch} does not split evenly over "
                f"{c.plan.degrees.group} ranks"
            )
        c.problem.space.encode(c.plan)  # raises if the plan is outside the space
        inner.append(
            _Case(
                name=c.name or f"case{i}",
                model=c.problem.model,
                plan=c.plan,
                batch=w.batch,
                input_len=w.input_len,
                styles=c.styles,
                cpu_alltoall_fallback=c.cpu_alltoall_fallback,
                seed=c.seed,
            )
        )
    per_rank = _launch(_worker, (world_size, _free_port(), inner), world_size)
    results = []
    for i, (c, case) in enumerate(zip(cases, inner, strict=True)):
        ranks = [per_rank[r][i] for r in range(world_size)]
        results.append(_merge(case, c, ranks, world_size))
    return results


def _merge(case: _Case, c: CheckCase, ranks: list[dict], world: int) -> CheckResult:
    errors = [r["error"] for r in ranks if r["error"]]
    seen = [r["seen"] for r in ranks]
    observed: list[Call] = []
    spread: list[tuple[float, float]] = []
    if not errors:
        shapes = {tuple((s.where, s.kind, s.axis) for s in rank_seen) for rank_seen in seen}
        if len(shapes) != 1:
            errors.append(
                "ranks issued different collective sequences: "
                + " | ".join(
                    ", ".join(f"{s.where} {s.kind}[{s.axis}]" for s in rank_seen)
                    for rank_seen in seen
                )
            )
        else:
            for calls in zip(*seen, strict=True):
                sizes = [s.elements for s in calls]
                first = calls[0]
                observed.append(Call(first.where, first.kind, first.axis, sum(sizes) / world))
                spread.append((min(sizes), max(sizes)))
    return CheckResult(
        name=case.name,
        world_size=world,
        styles=case.styles,
        outputs_match=all(r["match"] for r in ranks),
        max_abs_error=max(r["err"] for r in ranks),
        observed=tuple(observed),
        observed_spread=tuple(spread),
        comm_counts=ranks[0]["counts"],
        predicted=predicted_calls(c.problem, c.plan),
        error="\n".join(errors[:1]),
        seconds=max(r.get("seconds", 0.0) for r in ranks),
    )


def run_check(
    problem: Problem,
    plan: Plan,
    world_size: int,
    *,
    styles: Styles = "mesh",
    cpu_alltoall_fallback: bool = False,
) -> CheckResult:
    """Run ``plan`` on ``world_size`` CPU processes and compare with the cost model."""
    case = CheckCase(
        problem=problem,
        plan=plan,
        name="plan",
        styles=styles,
        cpu_alltoall_fallback=cpu_alltoall_fallback,
    )
    return run_checks([case], world_size)[0]


# -- every edge's redistribution, on a simulated mesh ------------------------------------


@dataclass(frozen=True)
class PairResult:
    """One (producer output, consumer input) layout pair: cost model vs DTensor."""

    src: Layout
    dst: Layout
    edges: tuple[str, ...]  # the operator edges (with options) that produce this pair
    predicted: tuple[Call, ...]
    observed: tuple[Call, ...]

    @property
    def ok(self) -> bool:
        def key(calls: tuple[Call, ...]) -> list[tuple[str, str, float]]:
            return [(c.kind, c.axis, round(c.elements, 6)) for c in calls]

        return key(self.predicted) == key(self.observed)

    def __str__(self) -> str:
        more = f" (+{len(self.edges) - 1} more)" if len(self.edges) > 1 else ""
        return (
            f"{layout_str(self.src)} -> {layout_str(self.dst)} e.g. {self.edges[0]}{more}: "
            f"cost model [{', '.join(map(str, self.predicted)) or 'none'}], "
            f"DTensor [{', '.join(map(str, self.observed)) or 'none'}]"
        )


def edge_layout_pairs(
    model: Model, degrees: Degrees | None = None
) -> dict[tuple[Layout, Layout], list[str]]:
    """Every (producer ``out``, consumer ``inp``) pair a plan of ``model`` can put on an
    edge (under ``degrees``: valid options only), with the edges that produce it."""
    from shardlab.problems.space import option_valid

    pairs: dict[tuple[Layout, Layout], list[str]] = {}

    def valid(op: Any) -> list[OptionSpec]:
        return [o for o in op.options if degrees is None or option_valid(op, o, degrees)]

    def add(src_name: str, src: Any, dst_name: str, dst: Any) -> None:
        for a in valid(src):
            for c in valid(dst):
                where = f"{src_name}.{a.name} -> {dst_name}.{c.name}"
                pairs.setdefault((a.out, c.inp), []).append(where)

    residual = None
    for kind in model.kinds:
        ops = {op.name: op for op in layer_ops(model, kind)}
        residual = ops["residual"]
        for src, dst in layer_edges(model, kind):
            add(src, ops[src], dst, ops[dst])
    assert residual is not None
    add("residual", residual, "residual", residual)
    emb, fnorm, lm, sampler = HEAD_OPS
    add("embedding", emb, "residual", residual)
    add("residual", residual, "final_norm", fnorm)
    add("final_norm", fnorm, "lm_head", lm)
    add("lm_head", lm, "sampler", sampler)
    for c in valid(emb):
        pairs.setdefault((TOKEN_IDS_LAYOUT, c.inp), []).append(f"token_ids -> embedding.{c.name}")
    return pairs


def check_redistributions(
    dp: int, tp: int, *, model: Model | None = None, cpu_alltoall_fallback: bool = False
) -> list[PairResult]:
    """Redistribute a ``[batch, seq, features]`` DTensor between every layout pair a valid
    plan can put on an edge, on a ``(dp, tp)`` mesh, and compare with the cost model.

    Runs in one process on torch's fake process group (collectives are issued and
    recorded but move no data), so any mesh shape can be checked on one CPU.
    """
    from shardlab.costmodel.constants import ACT_BYTES
    from shardlab.costmodel.opcosts import CostContext

    model = model or tiny_problem("moe").model
    degrees = Degrees(dp_attn=dp, tp=tp, etp=dp * tp)
    pairs = edge_layout_pairs(model, degrees)
    observed = _launch(_pairs_worker, (dp, tp, list(pairs), cpu_alltoall_fallback), 1)[0]
    problem = Problem.build(model, f"h100x{dp * tp}", "prefill")
    ctx = CostContext(problem, degrees, np.array([1]))
    full, _ = _pair_shape(dp, tp)
    out = []
    for (src, dst), seen in zip(pairs, observed, strict=True):
        steps = ctx.redistribution_steps(src, dst, np.array([math.prod(full) * ACT_BYTES]))
        pred = tuple(Call("", k, a, float(m[0]) / ACT_BYTES) for k, a, m in steps)
        obs = tuple(Call("", s.kind, s.axis, s.elements) for s in seen)
        out.append(PairResult(src, dst, tuple(pairs[src, dst]), pred, obs))
    return out


def _pair_shape(dp: int, tp: int) -> tuple[tuple[int, int, int], int]:
    n = dp * tp
    return (2 * n, 2, 2 * n), n


def _pairs_worker(
    rank: int,
    dp: int,
    tp: int,
    pairs: list[tuple[Layout, Layout]],
    fallback: bool,
    outdir: str,
) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    logging.getLogger("torch.distributed.tensor._collective_utils").setLevel(logging.ERROR)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dp * tp)
    try:
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=MESH_AXES)
        axis_of_group = {mesh.get_group(a).group_name: a for a in MESH_AXES}
        shape, _ = _pair_shape(dp, tp)
        full = torch.zeros(shape)
        seen = []
        for src, dst in pairs:
            placements = [torch_placement(p) for p in src]
            as_data = [Replicate() if p.is_partial() else p for p in placements]
            local = distribute_tensor(full, mesh, as_data, src_data_rank=None).to_local()
            x = DTensor.from_local(
                local, mesh, placements, run_check=False, shape=full.shape, stride=full.stride()
            )
            rec = _Recorder(axis_of_group)
            with _native_alltoall(not fallback), rec:
                x.redistribute(mesh, [torch_placement(p) for p in dst])
            seen.append(rec.seen)
        with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(seen, f)
    finally:
        dist.destroy_process_group()
