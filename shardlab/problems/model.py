"""The transformer being served: its shapes, layer by layer, and its parameter counts.
:mod:`shardlab.problems.hf_config` reads one from a HuggingFace ``config.json``.

Layers (:class:`LayerAttention`, one per layer): softmax attention is full,
sliding-window (``sliding_window`` with ``layer_types``, ``sliding_window_pattern`` or
``max_window_layers``) or chunked-local (Llama 4: ``attention_chunk_size`` on the RoPE
layers of ``no_rope_layers``); MHA/GQA or MLA; with its own head count and head dim per
kind (Gemma 4: ``global_head_dim``, ``num_global_key_value_heads``, ``attention_k_eq_v``),
its KV reused from an earlier layer (``num_kv_shared_layers``) or a DSA indexer that
picks the ``index_topk`` keys it reads (DeepSeek-V3.2, GLM-5). A linear-attention layer
(Qwen3-Next's gated DeltaNet, Kimi-Linear's KDA) keeps a fixed recurrent state per
request instead of a KV cache. The FFN of a layer is dense or MoE, interleaved as
``mlp_layer_types``, ``moe_layers``, ``interleave_moe_layer_step``,
``first_k_dense_replace`` or ``decoder_sparse_step`` say; MoE layers may carry shared
experts (DeepSeek, Qwen, GLM, Llama 4; Gemma 4's dense MLP next to its experts).
Multi-token-prediction layers (``num_nextn_predict_layers``) are counted apart
(:attr:`ParamCount.mtp`): cards leave them out, memory holds them when they draft.

Parameter counting follows the module shapes of the HuggingFace implementations and
counts as model cards do: every weight, the input embedding included, tied embeddings
once. "Active" parameters are those of one token's forward pass: everything but the
routed experts it is not sent to, the input embedding included (Qwen3-30B-A3B's 3.3B).
Some cards leave the input embedding out of their active figure (gpt-oss-120b's 5.1B);
:attr:`ParamCount.embedding` is that difference.

Approximations, stated once: a sliding-window layer attends to and caches at most
``sliding_window`` tokens, a chunked layer its chunk; gpt-oss's attention sinks (one
scalar per head) count as parameters but not as work; Llama 4's weightless QK norm,
Gemma's softcapping and Gemma 4's per-layer scalar cost nothing; a linear layer's
recurrent state is held in fp32 (transformers and vLLM's KDA do), its short-conv state
in the activation dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from shardlab.errors import ShardlabError
from shardlab.problems.cached_hash import CachedHash
from shardlab.problems.dtypes import WeightDtype

LayerKind = Literal["dense", "moe"]
AttentionKind = Literal["full", "sliding", "chunked"]
QKNorm = Literal["none", "head", "full"]


# Weight families a checkpoint's quantization may cover. Embeddings, the LM head,
# norms and routers stay in bf16 in every deployment we model (DeepSeek-V3's fp8
# checkpoint and gpt-oss's mxfp4 checkpoint both keep them in bf16).
QUANTIZABLE_FAMILIES: tuple[str, ...] = ("attention", "ffn", "experts")


@dataclass(frozen=True, kw_only=True)
class AttentionSpan:
    """The earlier tokens one layer's attention reads (and so caches): all of them, a
    sliding window of ``tokens``, or the tokens of its own chunk of ``tokens``."""

    kind: AttentionKind = "full"
    tokens: int = 0  # window or chunk length; 0 for full attention

    def __post_init__(self) -> None:
        if (self.kind == "full") != (self.tokens == 0) or self.tokens < 0:
            raise ValueError(f"attention span {self.kind} of {self.tokens} tokens")

    def short(self) -> str:
        return "full" if self.kind == "full" else f"{self.kind} {self.tokens}"


FULL = AttentionSpan()


@dataclass(frozen=True, kw_only=True)
class MLA:
    """DeepSeek multi-head latent attention: a low-rank latent is cached instead of K/V."""

    q_lora_rank: int  # 0: queries are projected directly from the hidden state
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True, kw_only=True)
class LinearAttention:
    """The shapes of a model's linear-attention layers: gated DeltaNet (Qwen3-Next) or
    KDA (Kimi-Linear). Each keeps, per request, a recurrent state of ``v_heads`` matrices
    of ``k_head_dim x v_head_dim`` and the last ``conv_kernel - 1`` inputs of its short
    convolution, whatever the context."""

    kind: Literal["gated_deltanet", "kda"]
    k_heads: int
    v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def input_params(self, hidden: int) -> int:
        """Every weight before the output projection: projections, gates, the short
        convolution, the decay parameters and the gated output norm."""
        kd, vd, k = self.key_dim, self.value_dim, self.conv_kernel
        if self.kind == "gated_deltanet":
            # in_proj_qkvz, in_proj_ba, conv1d, dt_bias and A_log, the norm (one per head dim)
            return (
                hidden * (2 * kd + 2 * vd)
                + hidden * 2 * self.v_heads
                + self.conv_dim * k
                + (2 * self.v_heads + self.v_head_dim)
            )
        d, n = self.v_head_dim, self.v_heads
        # q, k, v; their convolutions; forget gate (f_a, f_b, dt_bias, A_log); beta;
        # output gate (g_a, g_b); the output norm
        return (
            hidden * (kd + kd + vd)
            + self.conv_dim * k
            + (d * hidden + vd * d + vd + n)
            + n * hidden
            + (d * hidden + vd * d)
            + d
        )

    def projection_width(self) -> int:
        """Values per token the input projections produce (q, k, v, gates, beta)."""
        if self.kind == "gated_deltanet":
            return 2 * self.key_dim + 2 * self.value_dim + 2 * self.v_heads
        return self.conv_dim + 2 * self.value_dim + self.v_heads

    def state_values(self) -> tuple[int, int]:
        """(recurrent-state values, short-convolution values) per request."""
        return self.v_heads * self.k_head_dim * self.v_head_dim, (
            self.conv_kernel - 1
        ) * self.conv_dim


@dataclass(frozen=True, kw_only=True)
class DSA:
    """DeepSeek sparse attention: a lightweight indexer scores every earlier token and
    attention reads only the ``top_k`` best (DeepSeek-V3.2, GLM-5)."""

    top_k: int
    heads: int
    head_dim: int

    def indexer_params(self, hidden: int, q_lora_rank: int) -> int:
        # wq_b from the query latent, wk, k_norm (a LayerNorm: weight and bias), weights_proj
        return self.heads * self.head_dim * q_lora_rank + (
            self.head_dim * hidden + 2 * self.head_dim + self.heads * hidden
        )

    def key_bytes(self) -> float:
        """Indexer cache per token per layer: FP8 keys with one fp32 scale per 128
        values (DeepSeek's reference and vLLM's indexer cache)."""
        return self.head_dim + 4.0 * (-(-self.head_dim // 128))


@dataclass(frozen=True, kw_only=True)
class LayerAttention:
    """One layer's token mixer: what it reads and caches (``span``) and its shape."""

    span: AttentionSpan = FULL
    heads: int
    kv_heads: int
    head_dim: int
    linear: bool = False  # the model's LinearAttention, not softmax attention
    k_eq_v: bool = False  # Gemma 4: V from k_proj's output (no v_proj); both cached
    kv_shared: bool = False  # Gemma 4: reads an earlier layer's KV; no k/v proj, no cache
    indexer: bool = False  # runs its own DSA indexer (weights and key cache)
    top_k: int = 0  # DSA: the keys attention reads (0: every key of the span)

    def short(self) -> str:
        if self.linear:
            return "linear"
        parts = [self.span.short()]
        if self.top_k:
            parts.append(f"top-{self.top_k}" + ("" if self.indexer else " shared"))
        if self.kv_shared:
            parts.append("shared KV")
        return " ".join(parts)

    @property
    def read_span(self) -> AttentionSpan:
        """The keys one query reads: its span, or the DSA top-k of it (as many pairs
        as a window of ``top_k``)."""
        if self.top_k and self.span.kind == "full":
            return AttentionSpan(kind="sliding", tokens=self.top_k)
        return self.span


@dataclass(frozen=True, kw_only=True)
class MoE:
    num_experts: int
    top_k: int
    expert_ffn_size: int
    num_shared_experts: int  # shared experts run on every token
    shared_ffn_size: int  # total width of the shared experts (0 when there are none)
    expert_bias: bool = False  # gpt-oss's experts carry biases
    router_bias: bool = False  # a per-expert bias on the router (selection correction)
    router_scale: bool = False  # Gemma 4: a scale over the hidden and one per expert
    shared_gate: bool = False  # Qwen MoE: a sigmoid gate on the shared expert's output


@dataclass(frozen=True, kw_only=True)
class ParamCount:
    total: int
    active: int  # per token, the input embedding included
    embedding: int = 0  # the input embedding's share of ``active`` (0 when tied)
    mtp: int = 0  # multi-token-prediction layers, outside ``total`` as cards count

    @property
    def active_compute(self) -> int:
        """Active parameters a token multiplies by: ``active`` without the lookup."""
        return self.active - self.embedding


@dataclass(frozen=True, kw_only=True)
class Model(CachedHash):
    """Shapes of a decoder-only transformer, as far as sharding and cost depend on them."""

    # @dataclass(frozen=True) would write its own __hash__ over the inherited one
    __hash__ = CachedHash.__hash__

    name: str
    source: str  # catalog name or the path it was read from
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int  # == num_heads for MHA and MLA
    head_dim: int
    ffn_size: int  # dense FFN width (0 when no layer is dense)
    layer_kinds: tuple[LayerKind, ...]
    attention_layers: tuple[LayerAttention, ...]  # per layer
    mla: MLA | None = None
    moe: MoE | None = None
    linear: LinearAttention | None = None  # shapes of the linear-attention layers
    dsa: DSA | None = None
    attention_gate: bool = False  # Qwen3-Next: q_proj also yields a sigmoid output gate
    mtp_layers: int = 0  # multi-token-prediction (next-n) layers
    attention_bias: bool = False  # on q, k and v
    o_bias: bool = False  # on o_proj
    qk_norm: QKNorm = "none"
    norms_per_layer: int = 2
    attention_sinks: bool = False
    tie_word_embeddings: bool = False
    weight_dtype: WeightDtype = "bf16"
    quantized_families: tuple[str, ...] = QUANTIZABLE_FAMILIES
    # output rows per scale of a block-quantized checkpoint (DeepSeek-V3's fp8: 128;
    # 0: none): engines refuse to split a weight into slices that are not whole blocks
    weight_block: int = 0
    max_position_embeddings: int = 0
    # the config's model_type (aliases resolved): which engine code serves the model
    architecture: str = ""
    # What reading the config assumed, one line each (an unknown model_type, ...).
    notices: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        where = self.source or f"model {self.name!r}"
        for name in ("num_layers", "hidden_size", "vocab_size", "num_heads", "num_kv_heads"):
            if getattr(self, name) <= 0:
                raise ShardlabError(f"{where}: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ShardlabError(
                f"{where}: num_attention_heads ({self.num_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if len(self.layer_kinds) != self.num_layers or len(self.attention_layers) != (
            self.num_layers
        ):
            raise ShardlabError(f"{where}: per-layer tables do not have num_layers entries")
        if any(a.linear for a in self.attention_layers) and self.linear is None:
            raise ShardlabError(f"{where}: linear-attention layers without their shapes")
        for a in self.attentions:
            if not a.linear and self.mla is None and a.heads % a.kv_heads:
                raise ShardlabError(
                    f"{where}: {a.short()} layers: {a.heads} heads are not a multiple of "
                    f"their {a.kv_heads} KV heads"
                )
        if "moe" in self.layer_kinds and self.moe is None:
            raise ShardlabError(f"{where}: MoE layers without an MoE configuration")
        if "dense" in self.layer_kinds and self.ffn_size <= 0:
            raise ShardlabError(f"{where}: dense layers need intermediate_size > 0")

    # -- shape helpers -------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.moe is not None and "moe" in self.layer_kinds

    @cached_property
    def kinds(self) -> tuple[LayerKind, ...]:
        """Layer kinds present, in first-appearance order."""
        return tuple(dict.fromkeys(self.layer_kinds))

    def layers_of(self, kind: LayerKind) -> int:
        return sum(1 for k in self.layer_kinds if k == kind)

    @property
    def attention_spans(self) -> tuple[AttentionSpan, ...]:
        """Each layer's attention span."""
        return tuple(a.span for a in self.attention_layers)

    @cached_property
    def attentions(self) -> tuple[LayerAttention, ...]:
        """Token mixers present, in first-appearance order."""
        return tuple(dict.fromkeys(self.attention_layers))

    def q_dim(self, a: LayerAttention) -> int:
        """Width of the mixer's output (= output-projection input) per token."""
        if a.linear:
            assert self.linear is not None
            return self.linear.value_dim
        if self.mla is not None:
            return a.heads * self.mla.v_head_dim
        return a.heads * a.head_dim

    def qkv_width(self, a: LayerAttention) -> int:
        """Values per token the input projection produces (what the mixer reads)."""
        if a.linear:
            assert self.linear is not None
            return self.linear.projection_width()
        if self.mla is not None:
            qk = self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim
            return a.heads * qk + self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return (self._q_heads(a) + self._kv_projected(a) * a.kv_heads) * a.head_dim

    def _q_heads(self, a: LayerAttention) -> int:
        return a.heads * (2 if self.attention_gate else 1)

    @staticmethod
    def _kv_projected(a: LayerAttention) -> int:
        """Tensors of KV-head width the layer projects: K and V, K only, or none."""
        return 0 if a.kv_shared else 1 if a.k_eq_v else 2

    def kv_cache_values_per_token(self, a: LayerAttention) -> int:
        """Values cached per token by one layer on one unsharded copy of the cache."""
        if a.linear or a.kv_shared:
            return 0
        if self.mla is not None:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return 2 * a.kv_heads * a.head_dim

    # -- parameters per module (one layer); the cost model prices exactly these ----

    def qkv_params(self, a: LayerAttention) -> int:
        """Everything of the mixer before its output projection (a DSA indexer included)."""
        h = self.hidden_size
        if a.linear:
            assert self.linear is not None
            return self.linear.input_params(h)
        if self.mla is not None:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank:
                q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * a.heads * qk
            else:
                q = h * a.heads * qk
            kv = (
                h * (m.kv_lora_rank + m.qk_rope_head_dim)
                + m.kv_lora_rank
                + m.kv_lora_rank * a.heads * (m.qk_nope_head_dim + m.v_head_dim)
            )
            return q + kv + self.indexer_params(a)
        kv_out = self._kv_projected(a) * a.kv_heads * a.head_dim
        out = self._q_heads(a) * a.head_dim + kv_out
        n = h * out
        if self.attention_bias:
            n += out
        keys = 0 if a.kv_shared else 1
        if self.qk_norm == "head":
            n += (1 + keys) * a.head_dim
        elif self.qk_norm == "full":
            n += (a.heads + keys * a.kv_heads) * a.head_dim
        if self.attention_sinks:
            n += a.heads
        return n

    def indexer_params(self, a: LayerAttention) -> int:
        """The layer's own DSA indexer (0 without one); part of :meth:`qkv_params`."""
        if not a.indexer:
            return 0
        assert self.dsa is not None and self.mla is not None
        return self.dsa.indexer_params(self.hidden_size, self.mla.q_lora_rank)

    def qkv_unsplit_params(self, a: LayerAttention) -> int:
        """The part of :meth:`qkv_params` no head split divides: MLA's query and KV
        down-projections with their norms (the latent every head reads) and the DSA
        indexer. vLLM keeps them whole on every tensor-parallel rank (ReplicatedLinear)."""
        if self.mla is None or a.linear:
            return 0
        m, h = self.mla, self.hidden_size
        q_down = h * m.q_lora_rank + m.q_lora_rank if m.q_lora_rank else 0
        kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
        return q_down + kv_down + self.indexer_params(a)

    def o_params(self, a: LayerAttention) -> int:
        n = self.q_dim(a) * self.hidden_size
        if self.o_bias and not a.linear:
            n += self.hidden_size
        return n

    def norm_params(self) -> int:
        return self.hidden_size

    def ffn_up_params(self) -> int:
        """Gate and up projections of the dense SwiGLU FFN."""
        return 2 * self.hidden_size * self.ffn_size

    def ffn_down_params(self) -> int:
        return self.ffn_size * self.hidden_size

    def router_params(self) -> int:
        assert self.moe is not None
        n = self.hidden_size * self.moe.num_experts
        if self.moe.expert_bias or self.moe.router_bias:
            n += self.moe.num_experts  # gpt-oss router bias; the score-correction bias
        if self.moe.router_scale:
            n += self.hidden_size + self.moe.num_experts
        if self.moe.shared_gate:
            n += self.hidden_size  # the shared expert's gate reads the hidden too
        return n

    def expert_params(self) -> int:
        """One routed expert (gate, up and down)."""
        assert self.moe is not None
        f, h = self.moe.expert_ffn_size, self.hidden_size
        n = 3 * h * f
        if self.moe.expert_bias:
            n += 2 * f + h
        return n

    def shared_up_params(self) -> int:
        assert self.moe is not None
        return 2 * self.hidden_size * self.moe.shared_ffn_size

    def shared_down_params(self) -> int:
        assert self.moe is not None
        return self.moe.shared_ffn_size * self.hidden_size

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def layer_params(self, layer: int) -> tuple[int, int]:
        """(total, active) parameters of one layer."""
        a = self.attention_layers[layer]
        attn = self.qkv_params(a) + self.o_params(a) + self.norms_per_layer * self.norm_params()
        if self.layer_kinds[layer] == "dense":
            ffn = self.ffn_up_params() + self.ffn_down_params()
            return attn + ffn, attn + ffn
        assert self.moe is not None
        common = attn + self.router_params() + self.shared_up_params() + self.shared_down_params()
        expert = self.expert_params()
        return common + self.moe.num_experts * expert, common + self.moe.top_k * expert

    def mtp_params(self) -> int:
        """One next-n layer is a decoder layer like the last one plus its input
        projection (embedding and hidden state concatenated) and three norms; it
        shares the embedding and the LM head (DeepSeek-V3, GLM, Qwen3-Next)."""
        h = self.hidden_size
        return self.mtp_layers * (self.layer_params(self.num_layers - 1)[0] + 2 * h * h + 3 * h)

    def num_params(self) -> ParamCount:
        total = active = 0
        for layer in range(self.num_layers):
            t, a = self.layer_params(layer)
            total += t
            active += a
        head = self.norm_params() + self.lm_head_params()
        embedding = 0 if self.tie_word_embeddings else self.embedding_params()
        return ParamCount(
            total=total + head + embedding,
            active=active + head + embedding,
            embedding=embedding,
            mtp=self.mtp_params(),
        )
