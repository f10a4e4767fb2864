"""The transformer being served, read from a HuggingFace ``config.json``.

Supported families (by ``model_type``): Llama/Mistral/Qwen2/Qwen3 dense (MHA or GQA),
Mixtral, Qwen2-MoE/Qwen3-MoE, DeepSeek-V2/V3 and Kimi-K2 (MLA attention, shared
experts, leading dense layers), gpt-oss (MoE, alternating sliding-window attention).
Multimodal wrappers are read through their ``text_config``.

Parameter counting follows the module shapes of the HuggingFace implementations.
"Active" parameters are those a token's forward pass multiplies by: everything except
the input-embedding lookup and the routed experts a token is not sent to. This is the
convention of the published active counts (e.g. gpt-oss-120b's 5.1B includes the
unembedding but not the embedding).

Approximation, stated once: a sliding-window layer attends to and caches at most
``sliding_window`` tokens; gpt-oss's attention sinks (one scalar per head) count as
parameters but not as work.
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

SUPPORTED_MODEL_TYPES: tuple[str, ...] = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "kimi_k2",
    "gpt_oss",
)

# Weight families a checkpoint's quantization may cover. Embeddings, the LM head,
# norms and routers stay in bf16 in every deployment we model (DeepSeek-V3's fp8
# checkpoint and gpt-oss's mxfp4 checkpoint both keep them in bf16).
QUANTIZABLE_FAMILIES: tuple[str, ...] = ("attention", "ffn", "experts")


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


@dataclass(frozen=True, kw_only=True)
class ParamCount:
    total: int
    active: int


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
    attention_windows: tuple[int, ...]  # per layer; 0 = full attention
    mla: MLA | None = None
    moe: MoE | None = None
    attention_bias: bool = False
    qk_norm: bool = False
    attention_sinks: bool = False
    tie_word_embeddings: bool = False
    weight_dtype: WeightDtype = "bf16"
    quantized_families: tuple[str, ...] = QUANTIZABLE_FAMILIES
    max_position_embeddings: int = 0

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
        if len(self.layer_kinds) != self.num_layers or len(self.attention_windows) != (
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
        if self.qk_norm:
            n += 2 * self.head_dim
        if self.attention_sinks:
            n += self.num_heads
        return n

    def o_params(self) -> int:
        n = self.q_dim * self.hidden_size
        if self.attention_bias:
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
        if self.moe.expert_bias or self.mla is not None:
            n += self.moe.num_experts  # gpt-oss router bias; DeepSeek's score-correction bias
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
        attn = self.qkv_params() + self.o_params() + 2 * self.norm_params()
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
        total += head + (0 if self.tie_word_embeddings else self.embedding_params())
        active += head
        return ParamCount(total=total, active=active)


# -- reading config.json ------------------------------------------------------------


@dataclass
class _ConfigReader:
    """Typed access to a config dict whose errors name the file and the key."""

    cfg: Mapping[str, Any]
    where: str
    used: set[str] = field(default_factory=set)

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def int(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.cfg.get(key)
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
        raise ShardlabError(f"{self.where}: missing key {keys[0]!r}")

    def bool(self, key: str, default: bool = False) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ShardlabError(f"{self.where}: key {key!r} must be true or false, got {value!r}")
        return value


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


def _layer_kinds(r: _ConfigReader, model_type: str, num_layers: int) -> tuple[LayerKind, ...]:
    if model_type in ("mixtral", "gpt_oss"):
        return ("moe",) * num_layers
    if model_type in ("qwen2_moe", "qwen3_moe"):
        step = r.int("decoder_sparse_step", 1)
        dense_only = set(r.cfg.get("mlp_only_layers") or ())
        return tuple(
            "moe" if i not in dense_only and (i + 1) % step == 0 else "dense"
            for i in range(num_layers)
        )
    if model_type in ("deepseek_v2", "deepseek_v3", "kimi_k2"):
        first_dense = r.int("first_k_dense_replace", 0, minimum=0)
        freq = r.int("moe_layer_freq", 1)
        return tuple(
            "moe" if i >= first_dense and i % freq == 0 else "dense" for i in range(num_layers)
        )
    return ("dense",) * num_layers


def _moe(r: _ConfigReader, model_type: str) -> MoE | None:
    if model_type in ("mixtral", "gpt_oss"):
        return MoE(
            num_experts=r.first_int(("num_local_experts", "num_experts")),
            top_k=r.first_int(("num_experts_per_tok", "experts_per_token")),
            expert_ffn_size=r.int("intermediate_size"),
            num_shared_experts=0,
            shared_ffn_size=0,
            expert_bias=model_type == "gpt_oss",
        )
    if model_type in ("qwen2_moe", "qwen3_moe"):
        shared = r.int("shared_expert_intermediate_size", 0, minimum=0)
        return MoE(
            num_experts=r.int("num_experts"),
            top_k=r.int("num_experts_per_tok"),
            expert_ffn_size=r.int("moe_intermediate_size"),
            num_shared_experts=1 if shared else 0,
            shared_ffn_size=shared,
        )
    if model_type in ("deepseek_v2", "deepseek_v3", "kimi_k2"):
        expert = r.int("moe_intermediate_size")
        shared = r.int("n_shared_experts", 0, minimum=0)
        return MoE(
            num_experts=r.int("n_routed_experts"),
            top_k=r.int("num_experts_per_tok"),
            expert_ffn_size=expert,
            num_shared_experts=shared,
            shared_ffn_size=shared * expert,
        )
    return None


def _windows(r: _ConfigReader, num_layers: int) -> tuple[int, ...]:
    window = r.cfg.get("sliding_window")
    layer_types = r.cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise ShardlabError(
                f"{r.where}: key 'layer_types' must list one entry per layer ({num_layers})"
            )
        if any(t == "sliding_attention" for t in layer_types):
            w = r.int("sliding_window")
            return tuple(w if t == "sliding_attention" else 0 for t in layer_types)
        return (0,) * num_layers
    if window and r.cfg.get("use_sliding_window", True):
        w = r.int("sliding_window")
        limit = r.int("max_window_layers", num_layers, minimum=0)
        # Qwen2-style: layers below max_window_layers use the window.
        return tuple(w if i < limit else 0 for i in range(num_layers))
    return (0,) * num_layers


def model_from_config(config: Mapping[str, Any], *, name: str, source: str) -> Model:
    """Build a :class:`Model` from a parsed ``config.json`` dict."""
    where = source
    if not isinstance(config, Mapping):
        raise ShardlabError(f"{where}: a config.json must hold a JSON object")
    cfg = config
    text = config.get("text_config")
    if isinstance(text, Mapping) and "hidden_size" in text:
        cfg = {**text, "model_type": text.get("model_type", config.get("model_type"))}
        where = f"{source} (text_config)"
    r = _ConfigReader(cfg, where)
    model_type = cfg.get("model_type")
    if model_type is None:
        raise ShardlabError(f"{where}: missing key 'model_type'")
    model_type = {"deepseek_v32": "deepseek_v3", "qwen3_text": "qwen3"}.get(model_type, model_type)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ShardlabError(
            f"{where}: key 'model_type' = {model_type!r} is not supported; supported: "
            + ", ".join(SUPPORTED_MODEL_TYPES)
        )
    num_layers = r.int("num_hidden_layers")
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    mla = None
    if model_type in ("deepseek_v2", "deepseek_v3", "kimi_k2"):
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
    kinds = _layer_kinds(r, model_type, num_layers)
    moe = _moe(r, model_type)
    ffn = r.int("intermediate_size") if "dense" in kinds else 0
    weight_dtype, families = _weight_dtype(r)
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
        attention_windows=_windows(r, num_layers),
        mla=mla,
        moe=moe if "moe" in kinds else None,
        attention_bias=r.bool("attention_bias") or r.bool("qkv_bias"),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        attention_sinks=model_type == "gpt_oss",
        tie_word_embeddings=r.bool("tie_word_embeddings"),
        weight_dtype=weight_dtype,
        quantized_families=families,
        max_position_embeddings=r.int("max_position_embeddings", 0, minimum=0),
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
