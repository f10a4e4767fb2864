"""The operators of one layer (and of the model's ends) and their sharding options.

Every option states the layout it needs on its input and the layout it produces (see
:mod:`shardlab.problems.placements`), the mesh axes its weights are split over and the
mesh axes its tokens are split over. The first option of every operator is the
canonical one: it is valid under every degree tuple, and it is what every other option
collapses to when the axes it would shard have size 1.

Megatron tensor parallelism is ``qkv_proj=column, attention=head_sharded, o_proj=row,
ffn_up=column, ffn_down=row`` with replicated norms and residual; Megatron sequence
parallelism additionally shards norms and residual by tokens; attention data parallel
inside the tensor-parallel group is ``seq_sharded`` attention with replicated weights.

Residual connections are the ``residual`` pseudo-operator: the layout of the residual
stream of a layer. Outputs of ``o_proj``/``ffn_down``/the MoE block are redistributed
to it before the add, and the next layer's operators read from it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import IntEnum
from functools import cache

from shardlab.problems.model import LayerKind, Model
from shardlab.problems.placements import (
    PARTIAL,
    REPLICATE,
    SHARD_HID,
    SHARD_TOK,
    Layout,
)


@dataclass(frozen=True, kw_only=True)
class OptionSpec:
    name: str
    inp: Layout
    out: Layout
    weight_axes: tuple[str, ...]  # mesh axes the weights (for attention: the KV cache) split over
    token_axes: tuple[str, ...]  # mesh axes the tokens split over
    requires: tuple[str, ...] = ()  # "tp": tp > 1, "dp": dp_attn > 1, "group": tp * dp_attn > 1
    doc: str = ""


@dataclass(frozen=True, kw_only=True)
class OpSpec:
    name: str
    family: str  # which weights it holds: attention, ffn, experts, norm, router, embedding, ...
    options: tuple[OptionSpec, ...]
    split_size: int = 0  # size of the dimension weight sharding splits; 0: padding is fine

    def option(self, name: str) -> OptionSpec:
        for opt in self.options:
            if opt.name == name:
                return opt
        raise KeyError(f"operator {self.name!r} has no option {name!r}")

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)


# -- option templates ---------------------------------------------------------------

_TOK_R: Layout = (SHARD_TOK, REPLICATE)
_TOK_TOK: Layout = (SHARD_TOK, SHARD_TOK)
_TOK_HID: Layout = (SHARD_TOK, SHARD_HID)
_TOK_P: Layout = (SHARD_TOK, PARTIAL)

REPLICATED = OptionSpec(
    name="replicated",
    inp=_TOK_R,
    out=_TOK_R,
    weight_axes=(),
    token_axes=("dp",),
    doc="whole weights on every tp rank; every tp rank computes every token",
)
SEQ_SHARDED = OptionSpec(
    name="seq_sharded",
    inp=_TOK_TOK,
    out=_TOK_TOK,
    weight_axes=(),
    token_axes=("dp", "tp"),
    requires=("tp",),
    doc="whole weights on every tp rank; tokens (whole requests) split over tp",
)
COLUMN = OptionSpec(
    name="column",
    inp=_TOK_R,
    out=_TOK_HID,
    weight_axes=("tp",),
    token_axes=("dp",),
    requires=("tp",),
    doc="output features split over tp (Megatron column-parallel)",
)
ROW = OptionSpec(
    name="row",
    inp=_TOK_HID,
    out=_TOK_P,
    weight_axes=("tp",),
    token_axes=("dp",),
    requires=("tp",),
    doc="input features split over tp; partial sums out (Megatron row-parallel)",
)
COLUMN_FULL = OptionSpec(
    name="column_full",
    inp=(REPLICATE, REPLICATE),
    out=(SHARD_HID, SHARD_HID),
    weight_axes=("dp", "tp"),
    token_axes=(),
    requires=("dp",),
    doc="tokens gathered over dp; output features split over the whole dp x tp group",
)
ROW_FULL = OptionSpec(
    name="row_full",
    inp=(SHARD_HID, SHARD_HID),
    out=(PARTIAL, PARTIAL),
    weight_axes=("dp", "tp"),
    token_axes=(),
    requires=("dp",),
    doc="input features split over the whole dp x tp group; partial sums out",
)
HEAD_SHARDED = OptionSpec(
    name="head_sharded",
    inp=_TOK_HID,
    out=_TOK_HID,
    weight_axes=("tp",),
    token_axes=("dp",),
    requires=("tp",),
    doc="heads (and the KV cache, down to one KV head per rank) split over tp",
)
VOCAB_SHARDED = OptionSpec(
    name="vocab_sharded",
    inp=_TOK_R,
    out=_TOK_P,
    weight_axes=("tp",),
    token_axes=("dp",),
    requires=("tp",),
    doc="vocabulary rows split over tp; each rank embeds the ids it owns (Megatron)",
)
ALLTOALL = OptionSpec(
    name="alltoall",
    inp=_TOK_TOK,
    out=_TOK_TOK,
    weight_axes=("dp", "tp"),
    token_axes=("dp", "tp"),
    doc="experts split over ep (each expert over etp); tokens dispatched and combined "
    "with all-to-all over ep (DeepEP style)",
)
ALLGATHER = OptionSpec(
    name="allgather",
    inp=(REPLICATE, REPLICATE),
    out=(PARTIAL, PARTIAL),
    weight_axes=("dp", "tp"),
    token_axes=(),
    requires=("group",),
    doc="experts split over ep (each expert over etp); every rank sees every token and "
    "returns partial sums (Megatron all-gather dispatcher)",
)

_NORM = (REPLICATED, SEQ_SHARDED)
_LINEAR_IN = (REPLICATED, COLUMN, SEQ_SHARDED, COLUMN_FULL)
_LINEAR_OUT = (REPLICATED, ROW, SEQ_SHARDED, ROW_FULL)


# The sampler reads logits; it needs every vocabulary entry of a token on one rank.
SAMPLER_OPTIONS = (
    replace(REPLICATED, doc="logits gathered on every tp rank, sampled there"),
    replace(SEQ_SHARDED, doc="each tp rank samples its own tokens"),
)


@cache
def layer_ops(model: Model, kind: LayerKind) -> tuple[OpSpec, ...]:
    """Operators of one layer of ``kind``, in execution order."""
    heads = model.num_heads
    ops = [
        OpSpec(name="residual", family="residual", options=_NORM),
        OpSpec(name="attn_norm", family="norm", options=_NORM),
        OpSpec(
            name="qkv_proj",
            family="attention",
            options=(REPLICATED, COLUMN, SEQ_SHARDED),
            split_size=heads,
        ),
        OpSpec(
            name="attention",
            family="kv_cache",
            options=(REPLICATED, HEAD_SHARDED, SEQ_SHARDED),
            split_size=heads,
        ),
        OpSpec(
            name="o_proj",
            family="attention",
            options=(REPLICATED, ROW, SEQ_SHARDED),
            split_size=heads,
        ),
        OpSpec(name="ffn_norm", family="norm", options=_NORM),
    ]
    if kind == "dense":
        ops += [
            OpSpec(name="ffn_up", family="ffn", options=_LINEAR_IN, split_size=model.ffn_size),
            OpSpec(name="ffn_down", family="ffn", options=_LINEAR_OUT, split_size=model.ffn_size),
        ]
    else:
        assert model.moe is not None
        ops += [
            OpSpec(name="router", family="router", options=_NORM),
            OpSpec(
                name="experts",
                family="experts",
                options=(ALLTOALL, ALLGATHER),
                split_size=model.moe.num_experts,
            ),
        ]
        if model.moe.shared_ffn_size:
            size = model.moe.shared_ffn_size
            ops += [
                OpSpec(name="shared_up", family="ffn", options=_LINEAR_IN, split_size=size),
                OpSpec(name="shared_down", family="ffn", options=_LINEAR_OUT, split_size=size),
            ]
    return tuple(ops)


@cache
def layer_edges(model: Model, kind: LayerKind) -> tuple[tuple[str, str], ...]:
    """Producer -> consumer pairs inside one layer; the residual adds are edges into it."""
    edges = [
        ("residual", "attn_norm"),
        ("attn_norm", "qkv_proj"),
        ("qkv_proj", "attention"),
        ("attention", "o_proj"),
        ("o_proj", "residual"),
        ("residual", "ffn_norm"),
    ]
    if kind == "dense":
        edges += [("ffn_norm", "ffn_up"), ("ffn_up", "ffn_down"), ("ffn_down", "residual")]
    else:
        edges += [
            ("ffn_norm", "router"),
            ("ffn_norm", "experts"),
            ("router", "experts"),
            ("experts", "residual"),
        ]
        assert model.moe is not None
        if model.moe.shared_ffn_size:
            edges += [
                ("ffn_norm", "shared_up"),
                ("shared_up", "shared_down"),
                ("shared_down", "residual"),
            ]
    return tuple(edges)


# Operators outside the layers: embedding (first stage) and the output end (last stage).
HEAD_OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="embedding",
        family="embedding",
        options=(REPLICATED, VOCAB_SHARDED, SEQ_SHARDED),
    ),
    OpSpec(name="final_norm", family="norm", options=_NORM),
    OpSpec(
        name="lm_head",
        family="lm_head",
        options=(
            REPLICATED,
            replace(COLUMN, doc="vocabulary split over tp; logits sharded"),
            SEQ_SHARDED,
        ),
    ),
    OpSpec(name="sampler", family="sampler", options=SAMPLER_OPTIONS),
)


class Head(IntEnum):
    """Each of :data:`HEAD_OPS` by name: its index there and in every table's head rows."""

    EMBEDDING = 0
    FINAL_NORM = 1
    LM_HEAD = 2
    SAMPLER = 3


# The ends on the last pipeline stage (the embedding runs on the first), in model order.
LAST_STAGE_HEADS = (Head.FINAL_NORM, Head.LM_HEAD, Head.SAMPLER)


# Edges of the model's ends. "layers.first"/"layers.last" stand for the residual
# stream of the first and last layer.
HEAD_EDGES: tuple[tuple[str, str], ...] = (
    ("embedding", "layers.first"),
    ("layers.last", "final_norm"),
    ("final_norm", "lm_head"),
    ("lm_head", "sampler"),
)

# Token ids enter every tp rank of the first stage (each dp rank gets its own requests).
TOKEN_IDS_LAYOUT: Layout = _TOK_R
