"""The scaled-down reference transformer the check shards: tiny configs, and one
plain-torch module per operator of :mod:`shardlab.problems.operators`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from shardlab.dtensor_check.edges import _Edges, _PlanState
from shardlab.dtensor_check.recording import _explicit, _Where
from shardlab.errors import ShardlabError
from shardlab.problems.hf_config import model_from_config
from shardlab.problems.model import LayerAttention, Model
from shardlab.problems.operators import (
    HEAD_OPS,
    layer_ops,
)
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem

# Models larger than this are not "scaled down": refuse rather than allocate gigabytes.
MAX_PARAMS = 20_000_000


# The count exchange before the dispatch sends one value of this type per destination
# rank; the cost model prices it as COUNT_BYTES per value (checked in predicted_calls).
COUNT_DTYPE = torch.int32


# -- tiny configs ----------------------------------------------------------------------


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
    alternating = ["sliding_attention", "full_attention"] * (num_layers // 2)
    if kind == "dense":
        return {"model_type": "llama", **common}
    if kind == "gemma4":
        return {
            "model_type": "gemma4_text",
            **common,
            "head_dim": 8,
            "global_head_dim": 16,
            "num_global_key_value_heads": 2,
            "attention_k_eq_v": True,
            "sliding_window": 4,
            "layer_types": alternating,
            "num_kv_shared_layers": 2,
            "hidden_size_per_layer_input": 0,
        }
    if kind == "gdn":
        return {
            "model_type": "qwen3_next",
            **common,
            "head_dim": 8,
            "linear_num_key_heads": 4,
            "linear_num_value_heads": 8,
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 8,
            "full_attention_interval": 2,
        }
    if kind == "dsa":
        return {
            "model_type": "glm_moe_dsa",
            **common,
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
    if kind == "kda":
        return {
            "model_type": "kimi_linear",
            **common,
            "linear_attn_config": {
                "num_heads": 8,
                "head_dim": 8,
                "short_conv_kernel_size": 4,
                "kda_layers": list(range(1, num_layers + 1, 2)),
                "full_attn_layers": list(range(2, num_layers + 1, 2)),
            },
        }
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


def mixer_parts(model: Model, a: LayerAttention) -> tuple[int, ...]:
    """Widths of the tensors the fused input projection of a layer's mixer produces,
    in order; each is laid out in ``groups`` slices so that a ``Shard(-1)`` slice over
    ``groups`` ranks holds whole heads of every one of them."""
    if a.linear:
        lin = model.linear
        assert lin is not None
        kd, vd, nv = lin.key_dim, lin.value_dim, lin.v_heads
        if lin.kind == "gated_deltanet":
            return (kd, kd, vd, vd, nv, nv)  # q, k, v, output gate z, beta, decay input a
        return (kd, kd, vd, vd, vd, nv)  # q, k, v, per-channel decay f, output gate g, beta
    q = a.heads * a.head_dim
    parts = [q, q] if model.attention_gate else [q]
    kv_tensors = 0 if a.kv_shared else 1 if a.k_eq_v else 2
    return (*parts, *[a.kv_heads * a.head_dim] * kv_tensors)


class Attention(nn.Module):
    """Causal GQA attention on the fused QKV projection's output (no weights).

    The QKV features are laid out in ``groups`` consecutive groups, each holding
    ``heads / groups`` query heads and their ``kv_heads / groups`` key and value heads
    (see :func:`mixer_parts`), so that a ``Shard(-1)`` slice over ``groups`` ranks is a
    set of whole heads. Any number of whole groups may arrive (replicated,
    head-sharded, token-sharded). Gemma 4's K = V layers take V from the K projection;
    a layer that shares KV reads the K and V its ``store`` layer computed on the same
    rank (its plan shards attention the same way); Qwen3-Next's output gate multiplies
    the output by a sigmoid.
    """

    def __init__(self, model: Model, a: LayerAttention, groups: int) -> None:
        super().__init__()
        if a.heads % groups or a.kv_heads % groups:
            raise ShardlabError(
                f"attention: {a.heads} heads / {a.kv_heads} KV heads do not split into "
                f"{groups} groups"
            )
        self.hq, self.hkv, self.hd = a.heads // groups, a.kv_heads // groups, a.head_dim
        self.parts = [p // groups for p in mixer_parts(model, a)]
        self.gate = model.attention_gate
        self.k_eq_v, self.kv_shared = a.k_eq_v, a.kv_shared
        self.store: Attention | None = None  # the layer whose K and V a KV-sharing layer reads
        self.kv: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        b, s, width = qkv.shape
        g = width // sum(self.parts)
        parts = list(qkv.view(b, s, g, sum(self.parts)).split(self.parts, -1))
        q = parts.pop(0)
        gate = parts.pop(0) if self.gate else None

        def heads(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.reshape(b, s, g * n, self.hd).transpose(1, 2)

        if self.kv_shared:
            assert self.store is not None and self.store.kv is not None
            k, v = self.store.kv
        else:
            k = heads(parts[0], self.hkv)
            v = k if self.k_eq_v else heads(parts[1], self.hkv)
            self.kv = (k, v)
        o = F.scaled_dot_product_attention(heads(q, self.hq), k, v, is_causal=True, enable_gqa=True)
        o = o.transpose(1, 2).reshape(b, s, g * self.hq * self.hd)
        if gate is not None:
            o = o * torch.sigmoid(gate.reshape(b, s, -1))
        return o


class LinearMixer(nn.Module):
    """Gated DeltaNet or KDA on the fused input projection's output (no weights): per
    value head a ``k_head_dim x v_head_dim`` state, decayed (per head for gated
    DeltaNet, per key channel for KDA), corrected by the delta rule and read out by the
    query, then a per-head RMS norm times a sigmoid output gate. Heads are independent,
    so whole head groups on a rank compute their share of the output with no exchange;
    requests are independent, so whole requests may be split too."""

    def __init__(self, model: Model, a: LayerAttention, groups: int) -> None:
        super().__init__()
        lin = model.linear
        assert lin is not None
        if lin.k_heads % groups or lin.v_heads % groups:
            raise ShardlabError(
                f"linear attention: {lin.k_heads} key / {lin.v_heads} value heads do not "
                f"split into {groups} groups"
            )
        self.kind = lin.kind
        self.nk, self.nv = lin.k_heads // groups, lin.v_heads // groups
        self.dk, self.dv = lin.k_head_dim, lin.v_head_dim
        self.parts = [p // groups for p in mixer_parts(model, a)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, width = x.shape
        g = width // sum(self.parts)
        parts = x.view(b, s, g, sum(self.parts)).split(self.parts, -1)
        nv, nk, dk, dv = g * self.nv, g * self.nk, self.dk, self.dv
        if self.kind == "gated_deltanet":
            q, k, v, gate, beta, a = parts
            decay = torch.sigmoid(a.reshape(b, s, nv, 1))  # one per head
        else:
            q, k, v, f, gate, beta = parts
            decay = torch.sigmoid(f.reshape(b, s, nv, dk))  # one per key channel
        rep = nv // nk
        q = F.normalize(q.reshape(b, s, nk, dk), dim=-1).repeat_interleave(rep, 2)
        k = F.normalize(k.reshape(b, s, nk, dk), dim=-1).repeat_interleave(rep, 2)
        v = v.reshape(b, s, nv, dv)
        beta = torch.sigmoid(beta.reshape(b, s, nv))
        state = x.new_zeros(b, nv, dk, dv)
        out = []
        for t in range(s):
            state = state * decay[:, t, :, :, None]
            kt = k[:, t]
            err = v[:, t] - torch.einsum("bnkv,bnk->bnv", state, kt)
            state = state + beta[:, t, :, None, None] * torch.einsum("bnk,bnv->bnkv", kt, err)
            out.append(torch.einsum("bnkv,bnk->bnv", state, q[:, t]))
        o = torch.stack(out, 1)  # [b, s, nv, dv]
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (o.reshape(b, s, nv * dv)) * torch.sigmoid(gate.reshape(b, s, nv * dv))


class _HeadSlice:
    """A module that computes some of its ``groups`` head groups on local weights:
    ``first_group`` and ``local_groups`` are set when a plan splits its heads over tp
    (styles.apply_plan); unsharded it computes all of them."""

    groups: int
    first_group: int = 0
    local_groups: int | None = None

    def span(self) -> range:
        n = self.groups if self.local_groups is None else self.local_groups
        return range(self.first_group, self.first_group + n)


class MLAProjection(nn.Module, _HeadSlice):
    """MLA's input projections (``qkv_proj``) and, on DSA layers, the indexer's.

    Per head group it emits ``[q of the group's heads; latent; rope key; indexer q, k
    and weights]``: the latent and the indexer are computed whole on every rank that
    holds any head (vLLM's ReplicatedLinear), so a rank's slice of the groups is whole
    heads with everything they read, and a head split needs no exchange.
    """

    def __init__(self, model: Model, a: LayerAttention, groups: int) -> None:
        super().__init__()
        mla = model.mla
        assert mla is not None
        h = model.hidden_size
        self.groups, self.mla = groups, mla
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        self.per_group = a.heads // groups * qk
        q_in = mla.q_lora_rank or h
        if mla.q_lora_rank:
            self.q_a = nn.Parameter(torch.empty(mla.q_lora_rank, h))
            self.q_a_norm = RMSNorm(mla.q_lora_rank)
        self.q = nn.Parameter(torch.empty(a.heads * qk, q_in))
        self.kv_a = nn.Parameter(torch.empty(mla.kv_lora_rank + mla.qk_rope_head_dim, h))
        self.kv_a_norm = RMSNorm(mla.kv_lora_rank)
        self.indexer = a.indexer
        if a.indexer:
            dsa = model.dsa
            assert dsa is not None
            self.index_q = nn.Parameter(torch.empty(dsa.heads * dsa.head_dim, q_in))
            self.index_k = nn.Parameter(torch.empty(dsa.head_dim, h))
            self.index_k_norm = nn.LayerNorm(dsa.head_dim)
            self.index_w = nn.Parameter(torch.empty(dsa.heads, h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        latent_q = self.q_a_norm(x @ self.q_a.T) if hasattr(self, "q_a") else x
        q = latent_q @ self.q.T
        kv = x @ self.kv_a.T
        r = self.mla.kv_lora_rank
        shared = [self.kv_a_norm(kv[..., :r]), kv[..., r:]]
        if self.indexer:
            k = self.index_k_norm(x @ self.index_k.T)
            shared += [latent_q @ self.index_q.T, k, x @ self.index_w.T]
        n = self.per_group
        return torch.cat(
            [t for g in self.span() for t in (q[..., g * n : (g + 1) * n], *shared)], -1
        )


class MLAAttention(nn.Module, _HeadSlice):
    """Causal MLA on :class:`MLAProjection`'s output: each head expands the latent with
    its own slice of ``kv_b`` (held whole, used for the local heads). A DSA layer's
    indexer scores every earlier key (``sum_h w_h relu(q_h . k)``) and each query attends
    to its ``top_k`` best; a layer that shares an indexer reuses its ``source``'s pick."""

    def __init__(self, model: Model, a: LayerAttention, groups: int) -> None:
        super().__init__()
        mla = model.mla
        assert mla is not None
        self.groups, self.mla, self.top_k = groups, mla, a.top_k
        self.hq = a.heads // groups
        self.nope, self.rope, self.v = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        self.kv_b = nn.Parameter(torch.empty(a.heads, self.nope + self.v, mla.kv_lora_rank))
        self.parts = [self.hq * (self.nope + self.rope), mla.kv_lora_rank, self.rope]
        dsa = model.dsa
        if a.indexer:
            assert dsa is not None
            self.index = (dsa.heads, dsa.head_dim)
            self.parts += [dsa.heads * dsa.head_dim, dsa.head_dim, dsa.heads]
        self.source: MLAAttention | None = None  # the layer whose top-k a sharing layer reads
        self.picked: torch.Tensor | None = None

    def _pick(self, parts: list[torch.Tensor], s: int) -> torch.Tensor | None:
        if not self.top_k:
            return None
        if self.source is not None:
            assert self.source.picked is not None
            return self.source.picked
        heads, dim = self.index
        b = parts[0].shape[0]
        q = parts[3][:, :, 0].reshape(b, s, heads, dim)
        k, w = parts[4][:, :, 0], parts[5][:, :, 0]
        score = torch.einsum("bthd,bsd->bths", q, k).relu()
        score = torch.einsum("bths,bth->bts", score, w)
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        score = score.masked_fill(~causal, float("-inf"))
        top = score.topk(min(self.top_k, s), dim=-1).indices
        keep = torch.zeros_like(score, dtype=torch.bool).scatter_(-1, top, True) & causal
        self.picked = keep
        return keep

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, width = x.shape
        g = width // sum(self.parts)
        parts = list(x.view(b, s, g, sum(self.parts)).split(self.parts, -1))
        q = parts[0].reshape(b, s, g * self.hq, self.nope + self.rope).transpose(1, 2)
        c, kr = parts[1][:, :, 0], parts[2][:, :, 0]  # every group carries the same latent
        first = self.span()[0] * self.hq
        w = self.kv_b[first : first + g * self.hq]
        k_nope = torch.einsum("bsl,hdl->bhsd", c, w[:, : self.nope])
        v = torch.einsum("bsl,hdl->bhsd", c, w[:, self.nope :])
        k = torch.cat([k_nope, kr[:, None].expand(-1, g * self.hq, -1, -1)], -1)
        keep = self._pick(parts, s)
        if keep is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None])
        return o.transpose(1, 2).reshape(b, s, g * self.hq * self.v)


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
        a = m.attention_layers[index]
        self.qkv_proj: nn.Module
        if m.mla is not None and not a.linear:
            self.qkv_proj = MLAProjection(m, a, groups)
            self.attention = MLAAttention(m, a, groups)
        else:
            self.qkv_proj = nn.Linear(h, m.qkv_width(a), bias=False)
            self.attention = (LinearMixer if a.linear else Attention)(m, a, groups)
        self.o_proj = nn.Linear(m.q_dim(a), h, bias=False)
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
        self.model = model
        self.groups = groups
        h = model.hidden_size
        self.embedding = nn.Embedding(model.vocab_size, h)
        self.layers = nn.ModuleList(Block(model, i, groups) for i in range(model.num_layers))
        # A KV-sharing layer reads the last earlier layer of its span that computes KV;
        # a DSA layer without an indexer, the last earlier layer that has one.
        store: dict[object, Attention] = {}
        indexer: MLAAttention | None = None
        for i, a in enumerate(model.attention_layers):
            attn = self.layers[i].attention
            if a.kv_shared:
                attn.store = store[a.span]
            elif isinstance(attn, Attention):
                store[a.span] = attn
            if isinstance(attn, MLAAttention) and a.top_k:
                if a.indexer:
                    indexer = attn
                else:
                    attn.source = indexer
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
            if isinstance(block.qkv_proj, nn.Linear):  # (MLA's projection groups itself)
                w = block.qkv_proj.weight
                parts = mixer_parts(m, m.attention_layers[block.index])
                w.copy_(_group_rows(w, parts, self.groups))

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


def _group_rows(w: torch.Tensor, parts: tuple[int, ...], groups: int) -> torch.Tensor:
    """Reorder the rows of ``parts`` stacked tensors into ``groups`` groups, each holding
    a ``1 / groups`` slice of every part in order."""
    split = w.split(list(parts))
    return torch.cat(
        [
            t[j * (t.shape[0] // groups) : (j + 1) * (t.shape[0] // groups)]
            for j in range(groups)
            for t in split
        ]
    )
