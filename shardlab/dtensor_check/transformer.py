"""The scaled-down reference transformer the check shards: one plain-torch module
per operator of :mod:`shardlab.problems.operators`, built from a model's shapes."""

from __future__ import annotations

import math

import torch
from torch import nn

from shardlab.dtensor_check.dense import RMSNorm, Sampler, SwiGLUUp
from shardlab.dtensor_check.edges import _Edges, _PlanState
from shardlab.dtensor_check.experts import Experts
from shardlab.dtensor_check.mixers import (
    Attention,
    LinearMixer,
    MLAAttention,
    MLAProjection,
    mixer_parts,
)
from shardlab.dtensor_check.recording import _Where
from shardlab.errors import ShardlabError
from shardlab.problems.model import Model

# Models larger than this are not "scaled down": refuse rather than allocate gigabytes.
MAX_PARAMS = 20_000_000


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
