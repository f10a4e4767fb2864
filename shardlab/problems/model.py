"""The transformer being served, read from a HuggingFace ``config.json`` by its structure.

The structural keys decide each layer's attention and FFN (see :func:`model_from_config`);
``model_type`` only supplies what a family's config leaves unsaid (key defaults and
facts such as gpt-oss's expert biases, :data:`FAMILIES`). A config of a ``model_type``
shardlab does not know loads from the standard keys with a one-line notice
(:attr:`Model.notices`); one whose structure shardlab does not model yet is refused in
one line that names the key. Multimodal wrappers are read through their
``text_config`` (the vision tower is not counted).

Layers: attention is full, sliding-window (``sliding_window`` with ``layer_types``,
``sliding_window_pattern`` or ``max_window_layers``) or chunked-local (Llama 4:
``attention_chunk_size`` on the RoPE layers of ``no_rope_layers``); MHA/GQA or MLA. The
FFN of a layer is dense or MoE, interleaved as ``mlp_layer_types``, ``moe_layers``,
``interleave_moe_layer_step``, ``first_k_dense_replace`` or ``decoder_sparse_step``
say; MoE layers may carry shared experts (DeepSeek, Qwen, GLM, Llama 4).

Parameter counting follows the module shapes of the HuggingFace implementations and
counts as model cards do: every weight, the input embedding included, tied embeddings
once. "Active" parameters are those of one token's forward pass: everything but the
routed experts it is not sent to, the input embedding included (Qwen3-30B-A3B's 3.3B).
Some cards leave the input embedding out of their active figure (gpt-oss-120b's 5.1B);
:attr:`ParamCount.embedding` is that difference.

Approximations, stated once: a sliding-window layer attends to and caches at most
``sliding_window`` tokens, a chunked layer its chunk; gpt-oss's attention sinks (one
scalar per head) count as parameters but not as work; Llama 4's weightless QK norm and
Gemma's softcapping cost nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from shardlab.errors import ShardlabError
from shardlab.problems.dtypes import WeightDtype

LayerKind = Literal["dense", "moe"]
AttentionKind = Literal["full", "sliding", "chunked"]
QKNorm = Literal["none", "head", "full"]


@dataclass(frozen=True, kw_only=True)
class Family:
    """What a ``model_type`` decides that its config does not state."""

    defaults: Mapping[str, Any] = field(default_factory=dict)  # transformers' defaults
    qk_norm: QKNorm = "none"  # q/k norm weights without a use_qk_norm key
    qk_norm_weights: QKNorm = "head"  # what ``use_qk_norm: true`` means: per head, full width
    norms_per_layer: int = 2  # RMSNorms of width hidden_size in one layer
    o_bias: bool = True  # does ``attention_bias`` also put a bias on o_proj?
    expert_bias: bool = False  # gpt-oss's experts carry biases
    attention_sinks: bool = False  # gpt-oss: one learned sink logit per head
    shared_expert_key: str = ""  # Llama 4: one shared expert as wide as this key


FAMILIES: dict[str, Family] = {
    "llama": Family(),
    "mistral": Family(),
    # Qwen2's q, k and v always carry a bias, its o_proj none (modeling_qwen2.py).
    "qwen2": Family(defaults={"qkv_bias": True}),
    "qwen3": Family(qk_norm="head"),
    "mixtral": Family(),
    "qwen2_moe": Family(defaults={"qkv_bias": True}),
    "qwen3_moe": Family(qk_norm="head"),
    "deepseek_v2": Family(),
    "deepseek_v3": Family(),
    "deepseek_v32": Family(),
    "glm_moe_dsa": Family(),  # GLM-5: MLA with DSA, like DeepSeek-V3.2
    "kimi_k2": Family(),
    "gpt_oss": Family(expert_bias=True, attention_sinks=True),
    # Llama 4's QK norm is a weightless L2 norm; no_rope_layer_interval is the
    # fallback of an empty no_rope_layers (configuration_llama4.py).
    "llama4_text": Family(
        defaults={"no_rope_layer_interval": 4},
        qk_norm_weights="none",
        shared_expert_key="intermediate_size",
    ),
    # Gemma 3: four norms a layer, per-head q/k norms, tied embeddings, and a hub
    # config that leaves vocab_size and the 5:1 sliding pattern to the defaults
    # (configuration_gemma3.py).
    "gemma3_text": Family(
        defaults={
            "vocab_size": 262208,
            "sliding_window_pattern": 6,
            "tie_word_embeddings": True,
        },
        qk_norm="head",
        norms_per_layer=4,
    ),
    # Gemma 2 alternates sliding and global layers.
    "gemma2": Family(
        defaults={"tie_word_embeddings": True, "sliding_window_pattern": 2}, norms_per_layer=4
    ),
    # GLM-4.5: attention_bias is on q, k and v only (modeling_glm4_moe.py).
    "glm4_moe": Family(o_bias=False),
    # MiniMax-M2: q and k normed over their full width (modeling_minimax_m2.py).
    "minimax_m2": Family(qk_norm="full", qk_norm_weights="full"),
}
# Wrappers and text configs that name their family another way.
MODEL_TYPE_ALIASES: dict[str, str] = {
    "qwen3_text": "qwen3",
    "llama4": "llama4_text",
    "gemma3": "gemma3_text",
}

# Weight families a checkpoint's quantization may cover. Embeddings, the LM head,
# norms and routers stay in bf16 in every deployment we model (DeepSeek-V3's fp8
# checkpoint and gpt-oss's mxfp4 checkpoint both keep them in bf16).
QUANTIZABLE_FAMILIES: tuple[str, ...] = ("attention", "ffn", "experts")


@dataclass(frozen=True)
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
class MoE:
    num_experts: int
    top_k: int
    expert_ffn_size: int
    num_shared_experts: int  # shared experts run on every token
    shared_ffn_size: int  # total width of the shared experts (0 when there are none)
    expert_bias: bool = False  # gpt-oss's experts carry biases
    router_bias: bool = False  # a per-expert bias on the router (selection correction)


@dataclass(frozen=True, kw_only=True)
class ParamCount:
    total: int
    active: int  # per token, the input embedding included
    embedding: int = 0  # the input embedding's share of ``active`` (0 when tied)

    @property
    def active_compute(self) -> int:
        """Active parameters a token multiplies by: ``active`` without the lookup."""
        return self.active - self.embedding


@dataclass(frozen=True, kw_only=True)
class Model:
    """Shapes of a decoder-only transformer, as far as sharding and cost depend on them."""

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
    attention_spans: tuple[AttentionSpan, ...]  # per layer
    mla: MLA | None = None
    moe: MoE | None = None
    attention_bias: bool = False  # on q, k and v
    o_bias: bool = False  # on o_proj
    qk_norm: QKNorm = "none"
    norms_per_layer: int = 2
    attention_sinks: bool = False
    tie_word_embeddings: bool = False
    weight_dtype: WeightDtype = "bf16"
    quantized_families: tuple[str, ...] = QUANTIZABLE_FAMILIES
    max_position_embeddings: int = 0
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
        if len(self.layer_kinds) != self.num_layers or len(self.attention_spans) != (
            self.num_layers
        ):
            raise ShardlabError(f"{where}: per-layer tables do not have num_layers entries")
        if "moe" in self.layer_kinds and self.moe is None:
            raise ShardlabError(f"{where}: MoE layers without an MoE configuration")
        if "dense" in self.layer_kinds and self.ffn_size <= 0:
            raise ShardlabError(f"{where}: dense layers need intermediate_size > 0")

    # -- shape helpers -------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.moe is not None and "moe" in self.layer_kinds

    @property
    def kinds(self) -> tuple[LayerKind, ...]:
        """Layer kinds present, in first-appearance order."""
        return tuple(dict.fromkeys(self.layer_kinds))

    def layers_of(self, kind: LayerKind) -> int:
        return sum(1 for k in self.layer_kinds if k == kind)

    @property
    def spans(self) -> tuple[AttentionSpan, ...]:
        """Attention spans present, in first-appearance order."""
        return tuple(dict.fromkeys(self.attention_spans))

    @property
    def q_dim(self) -> int:
        """Width of the attention's query (= output-projection input) per token."""
        if self.mla is not None:
            return self.num_heads * self.mla.v_head_dim
        return self.num_heads * self.head_dim

    def kv_cache_values_per_token(self) -> int:
        """Values cached per token per layer on one unsharded copy of the cache."""
        if self.mla is not None:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    # -- parameters per module (one layer); the cost model prices exactly these ----

    def qkv_params(self) -> int:
        h = self.hidden_size
        if self.mla is not None:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank:
                q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * self.num_heads * qk
            else:
                q = h * self.num_heads * qk
            kv = (
                h * (m.kv_lora_rank + m.qk_rope_head_dim)
                + m.kv_lora_rank
                + m.kv_lora_rank * self.num_heads * (m.qk_nope_head_dim + m.v_head_dim)
            )
            return q + kv
        out = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        n = h * out
        if self.attention_bias:
            n += out
        if self.qk_norm == "head":
            n += 2 * self.head_dim
        elif self.qk_norm == "full":
            n += (self.num_heads + self.num_kv_heads) * self.head_dim
        if self.attention_sinks:
            n += self.num_heads
        return n

    def o_params(self) -> int:
        n = self.q_dim * self.hidden_size
        if self.o_bias:
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

    def num_params(self) -> ParamCount:
        attn = self.qkv_params() + self.o_params() + self.norms_per_layer * self.norm_params()
        total = active = 0
        for kind in self.layer_kinds:
            total += attn
            active += attn
            if kind == "dense":
                ffn = self.ffn_up_params() + self.ffn_down_params()
                total += ffn
                active += ffn
            else:
                assert self.moe is not None
                shared = self.shared_up_params() + self.shared_down_params()
                total += self.router_params() + shared + self.moe.num_experts * self.expert_params()
                active += self.router_params() + shared + self.moe.top_k * self.expert_params()
        head = self.norm_params() + self.lm_head_params()
        embedding = 0 if self.tie_word_embeddings else self.embedding_params()
        return ParamCount(
            total=total + head + embedding, active=active + head + embedding, embedding=embedding
        )


# -- reading config.json ------------------------------------------------------------


@dataclass
class _ConfigReader:
    """Typed access to a config dict whose errors name the file and the key; a key the
    config leaves out takes the family's default (transformers' own)."""

    cfg: Mapping[str, Any]
    where: str
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> Any:
        value = self.cfg.get(key)
        return self.defaults.get(key) if value is None else value

    def has(self, key: str) -> bool:
        return self.get(key) is not None

    def int(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.get(key)
        if value is None:
            if default is None:
                raise ShardlabError(f"{self.where}: missing key {key!r}")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ShardlabError(
                f"{self.where}: key {key!r} must be an integer >= {minimum}, got {value!r}"
            )
        return value

    def first_int(self, keys: tuple[str, ...], *, minimum: int = 1) -> int:
        for key in keys:
            if self.has(key):
                return self.int(key, minimum=minimum)
        raise ShardlabError(f"{self.where}: missing key {keys[0]!r} (or {', '.join(keys[1:])})")

    def bool(self, key: str, default: bool = False) -> bool:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ShardlabError(f"{self.where}: key {key!r} must be true or false, got {value!r}")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.get(key)
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ShardlabError(f"{self.where}: key {key!r} must be a list of integers")
        return value

    def str_list(self, key: str, length: int) -> list[str]:
        value = self.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ShardlabError(f"{self.where}: key {key!r} must be a list of strings")
        if len(value) != length:
            raise ShardlabError(
                f"{self.where}: key {key!r} must list one entry per layer ({length}), "
                f"got {len(value)}"
            )
        return value

    def refuse(self, key: str, what: str) -> ShardlabError:
        return ShardlabError(f"{self.where}: key {key!r}: {what}")


def _weight_dtype(r: _ConfigReader) -> tuple[WeightDtype, tuple[str, ...]]:
    quant = r.cfg.get("quantization_config")
    if quant is None:
        dtype = r.cfg.get("torch_dtype") or r.cfg.get("dtype") or "bfloat16"
        if dtype not in ("bfloat16", "float16", "float32"):
            raise ShardlabError(
                f"{r.where}: key 'torch_dtype' has unsupported value {dtype!r}; "
                "use bfloat16 or float16"
            )
        return "bf16", QUANTIZABLE_FAMILIES
    if not isinstance(quant, Mapping):
        raise ShardlabError(f"{r.where}: key 'quantization_config' must be an object")
    method = quant.get("quant_method")
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", QUANTIZABLE_FAMILIES
    if method == "mxfp4":
        skipped = " ".join(quant.get("modules_to_not_convert") or ())
        families = tuple(
            f
            for f, marker in (("attention", "self_attn"), ("ffn", "mlp."), ("experts", "experts"))
            if marker not in skipped
        )
        return "fp4", families
    raise ShardlabError(
        f"{r.where}: key 'quantization_config.quant_method' = {method!r} is not supported; "
        "supported: fp8, fbgemm_fp8, mxfp4 (or remove quantization_config and pass "
        "--weight-dtype)"
    )


# Keys whose structure shardlab does not model yet: refused rather than mispriced.
_NOT_MODELED: tuple[tuple[str, str], ...] = (
    ("linear_attn_config", "linear attention (KDA) is not modeled yet"),
    ("linear_num_value_heads", "linear attention (gated DeltaNet) is not modeled yet"),
    ("num_kv_shared_layers", "KV shared across layers is not modeled yet"),
    ("global_head_dim", "per-kind head dims (Gemma 4) are not modeled yet"),
    ("per_layer_config", "per-layer overrides of the shapes are not modeled yet"),
    ("hidden_size_per_layer_input", "per-layer input embeddings are not modeled yet"),
)
_LAYER_TYPES: dict[str, AttentionKind] = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
}


def _num_experts(r: _ConfigReader) -> int:
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        if r.has(key):
            return r.int(key, minimum=0)
    return 0


def _layer_kinds(r: _ConfigReader, num_layers: int) -> tuple[LayerKind, ...]:
    """Which layers are MoE, from whichever placement key the config uses."""
    if not _num_experts(r):
        return ("dense",) * num_layers
    if r.has("mlp_layer_types"):
        kinds = r.str_list("mlp_layer_types", num_layers)
        bad = sorted(set(kinds) - {"dense", "sparse", "moe"})
        if bad:
            raise r.refuse("mlp_layer_types", f"unknown entry {bad[0]!r} (dense or sparse)")
        return tuple("dense" if k == "dense" else "moe" for k in kinds)
    if r.has("moe_layers"):
        layers = set(r.int_list("moe_layers"))
        if not layers <= set(range(num_layers)):
            raise r.refuse("moe_layers", f"lists a layer outside 0..{num_layers - 1}")
        return tuple("moe" if i in layers else "dense" for i in range(num_layers))
    if r.has("interleave_moe_layer_step"):
        step = r.int("interleave_moe_layer_step")
        return tuple("moe" if (i + 1) % step == 0 else "dense" for i in range(num_layers))
    if r.has("first_k_dense_replace"):
        first_dense = r.int("first_k_dense_replace", minimum=0)
        freq = r.int("moe_layer_freq", 1)
        return tuple(
            "moe" if i >= first_dense and i % freq == 0 else "dense" for i in range(num_layers)
        )
    step = r.int("decoder_sparse_step", 1)
    dense_only = set(r.int_list("mlp_only_layers")) if r.has("mlp_only_layers") else set()
    return tuple(
        "moe" if i not in dense_only and (i + 1) % step == 0 else "dense" for i in range(num_layers)
    )


def _moe(r: _ConfigReader, family: Family) -> MoE | None:
    num = _num_experts(r)
    if not num:
        return None
    width_key = "moe_intermediate_size" if r.has("moe_intermediate_size") else "intermediate_size"
    expert = r.int(width_key)
    if family.shared_expert_key:
        shared_n, shared = 1, r.int(family.shared_expert_key)
    elif r.has("shared_expert_intermediate_size"):
        shared = r.int("shared_expert_intermediate_size", minimum=0)
        shared_n = 1 if shared else 0
    else:
        shared_n = r.int("n_shared_experts", r.int("num_shared_experts", 0, minimum=0), minimum=0)
        shared = shared_n * expert
    top_k = r.first_int(
        ("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "top_k_experts")
    )
    if top_k > num:
        raise r.refuse("num_experts_per_tok", f"{top_k} is more than the {num} experts")
    return MoE(
        num_experts=num,
        top_k=top_k,
        expert_ffn_size=expert,
        num_shared_experts=shared_n,
        shared_ffn_size=shared,
        expert_bias=family.expert_bias,
        router_bias=r.get("topk_method") == "noaux_tc" or r.bool("use_routing_bias"),
    )


def _spans(r: _ConfigReader, num_layers: int) -> tuple[AttentionSpan, ...]:
    """Each layer's attention span, from whichever pattern key the config uses."""
    if r.has("layer_types"):
        types = r.str_list("layer_types", num_layers)
        bad = sorted(set(types) - set(_LAYER_TYPES))
        if bad:
            raise r.refuse(
                "layer_types",
                f"{bad[0]!r} layers are not modeled yet (" + ", ".join(_LAYER_TYPES) + ")",
            )
        size = {
            "full": 0,
            "sliding": r.int("sliding_window") if "sliding_attention" in types else 0,
            "chunked": r.int("attention_chunk_size") if "chunked_attention" in types else 0,
        }
        return tuple(AttentionSpan(_LAYER_TYPES[t], size[_LAYER_TYPES[t]]) for t in types)
    if r.has("attention_chunk_size"):
        # Llama 4: the RoPE layers are chunked, the NoPE layers (0 in no_rope_layers) global.
        chunk = r.int("attention_chunk_size")
        rope = r.int_list("no_rope_layers") if r.has("no_rope_layers") else []
        if not rope:
            every = r.int("no_rope_layer_interval", 4)
            rope = [int((i + 1) % every != 0) for i in range(num_layers)]
        if len(rope) != num_layers:
            raise r.refuse("no_rope_layers", f"must list one entry per layer ({num_layers})")
        return tuple(AttentionSpan("chunked", chunk) if on else FULL for on in rope)
    window = r.get("sliding_window")
    if window and r.has("sliding_window_pattern"):
        # Gemma 2/3: every pattern-th layer is global, the others slide.
        w, every = r.int("sliding_window"), r.int("sliding_window_pattern")
        return tuple(
            AttentionSpan("sliding", w) if (i + 1) % every else FULL for i in range(num_layers)
        )
    if window and r.bool("use_sliding_window", True):
        w = r.int("sliding_window")
        limit = r.int("max_window_layers", num_layers, minimum=0)
        # Qwen2-style: layers below max_window_layers use the window.
        return tuple(AttentionSpan("sliding", w) if i < limit else FULL for i in range(num_layers))
    return (FULL,) * num_layers


def _family(cfg: Mapping[str, Any], where: str) -> tuple[Family, tuple[str, ...]]:
    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ShardlabError(f"{where}: key 'model_type' must be a string, got {model_type!r}")
    key = MODEL_TYPE_ALIASES.get(model_type or "", model_type or "")
    if key in FAMILIES:
        return FAMILIES[key], ()
    named = f"model_type {model_type!r}" if model_type else "no model_type"
    return Family(), (f"{where}: {named} is not a known family; read by its standard keys",)


def model_from_config(config: Mapping[str, Any], *, name: str, source: str) -> Model:
    """Build a :class:`Model` from a parsed ``config.json`` dict."""
    where = source
    if not isinstance(config, Mapping):
        raise ShardlabError(f"{where}: a config.json must hold a JSON object")
    cfg = config
    text = config.get("text_config")
    if text is not None:
        if not isinstance(text, Mapping):
            raise ShardlabError(f"{where}: key 'text_config' must be an object")
        cfg = {**text, "model_type": text.get("model_type", config.get("model_type"))}
        where = f"{source} (text_config)"
    family, notices = _family(cfg, where)
    r = _ConfigReader(cfg, where, family.defaults)
    for key, what in _NOT_MODELED:
        if r.get(key) not in (None, 0, {}, []):
            raise r.refuse(key, what)
    num_layers = r.int("num_hidden_layers")
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    mla = None
    if r.has("kv_lora_rank"):
        mla = MLA(
            q_lora_rank=r.int("q_lora_rank", 0, minimum=0),
            kv_lora_rank=r.int("kv_lora_rank"),
            qk_nope_head_dim=r.int("qk_nope_head_dim"),
            qk_rope_head_dim=r.int("qk_rope_head_dim"),
            v_head_dim=r.int("v_head_dim"),
        )
        kv_heads = heads
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    else:
        kv_heads = r.int("num_key_value_heads", heads)
        if hidden % heads and not r.has("head_dim"):
            raise ShardlabError(
                f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads "
                f"{heads} and no 'head_dim' key is given"
            )
        head_dim = r.int("head_dim", hidden // heads)
    if r.has("index_topk"):
        notices += (
            f"{where}: key 'index_topk': DSA sparse attention is priced as dense attention "
            "(its indexer is not modeled yet)",
        )
    kinds = _layer_kinds(r, num_layers)
    moe = _moe(r, family)
    dense_key = "intermediate_size_mlp" if r.has("intermediate_size_mlp") else "intermediate_size"
    ffn = r.int(dense_key) if "dense" in kinds else 0
    weight_dtype, families = _weight_dtype(r)
    bias = r.bool("attention_bias") or r.bool("qkv_bias")
    qk_norm = family.qk_norm
    if r.has("use_qk_norm"):
        qk_norm = family.qk_norm_weights if r.bool("use_qk_norm") else "none"
    return Model(
        name=name,
        source=source,
        num_layers=num_layers,
        hidden_size=hidden,
        vocab_size=r.int("vocab_size"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_size=ffn,
        layer_kinds=kinds,
        attention_spans=_spans(r, num_layers),
        mla=mla,
        moe=moe if "moe" in kinds else None,
        attention_bias=bias,
        o_bias=family.o_bias and r.bool("attention_bias"),
        qk_norm=qk_norm if mla is None else "none",
        norms_per_layer=family.norms_per_layer,
        attention_sinks=family.attention_sinks,
        tie_word_embeddings=r.bool("tie_word_embeddings"),
        weight_dtype=weight_dtype,
        quantized_families=families,
        max_position_embeddings=r.int("max_position_embeddings", 0, minimum=1)
        if r.has("max_position_embeddings")
        else 0,
        notices=notices,
    )


def load_config_file(path: str | Path) -> Model:
    """Read a ``config.json`` from disk; the model is named after its folder or file."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        text = p.read_text()
    except OSError as exc:
        raise ShardlabError(
            f"{path}: cannot read the model config ({exc.strerror}); give a catalog name "
            "(see `shardlab models`) or the path of a HuggingFace config.json"
        ) from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ShardlabError(
            f"{p}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    stem = p.parent.name if p.name == "config.json" else p.stem
    return model_from_config(config, name=stem, source=str(p))
