"""The reference model's token mixers: GQA attention, gated DeltaNet and KDA, and MLA
with DSA's indexer, each computing the head groups it holds."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shardlab.dtensor_check.dense import RMSNorm
from shardlab.errors import ShardlabError
from shardlab.problems.model import LayerAttention, Model


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
