"""Reading a HuggingFace ``config.json`` into a :class:`~shardlab.problems.model.Model`, by
its structure.

The structural keys decide each layer's attention and FFN (see :func:`model_from_config`);
``model_type`` only supplies what a family's config leaves unsaid (key defaults and
facts such as gpt-oss's expert biases, :mod:`shardlab.problems.families`). A config of a
``model_type`` shardlab does not know loads from the standard keys with a one-line notice
(``Model.notices``); one whose structure shardlab does not model yet is refused in
one line that names the key. Multimodal wrappers are read through their
``text_config`` (the vision tower is not counted).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from shardlab.errors import ShardlabError
from shardlab.problems.dtypes import WeightDtype
from shardlab.problems.families import MODEL_TYPE_ALIASES, Family, family_of
from shardlab.problems.limits import MAX_CONFIG_INT, MAX_LAYERS, check_count
from shardlab.problems.model import (
    DSA,
    FULL,
    MLA,
    QUANTIZABLE_FAMILIES,
    AttentionKind,
    AttentionSpan,
    LayerAttention,
    LayerKind,
    LinearAttention,
    Model,
    MoE,
)


@dataclass(kw_only=True)
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
        limit = MAX_LAYERS if key == "num_hidden_layers" else MAX_CONFIG_INT
        return check_count(value, limit, what=f"{self.where}: key {key!r}", minimum=minimum)

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
        "supported: fp8, fbgemm_fp8, mxfp4",
        field="model",
        fix="remove quantization_config and set the workload's weight_dtype",
    )


def _weight_block(r: _ConfigReader) -> int:
    """Rows per scale block of a block-quantized checkpoint (0: not block-quantized)."""
    quant = r.cfg.get("quantization_config")
    block = quant.get("weight_block_size") if isinstance(quant, Mapping) else None
    if block is None:
        return 0
    if (
        not isinstance(block, list)
        or not block
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        raise ShardlabError(
            f"{r.where}: key 'quantization_config.weight_block_size' must be a list of "
            f"positive integers (e.g. [128, 128]), got {block!r}"
        )
    return block[0]


# Keys whose structure shardlab does not model yet: refused rather than mispriced.
_NOT_MODELED: tuple[tuple[str, str], ...] = (
    ("per_layer_config", "per-layer overrides of the shapes are not modeled yet"),
    (
        "hidden_size_per_layer_input",
        "per-layer input embeddings (Gemma 4 E2B/E4B) are not modeled yet",
    ),
    ("use_double_wide_mlp", "an FFN width per layer (Gemma 4's KV consumers) is not modeled yet"),
)
# layer_types entries: the span kind, or "linear" for linear attention. DSA's
# "indexed_attention" is full attention whose keys the indexer selects.
_LAYER_TYPES: dict[str, AttentionKind | Literal["linear"]] = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    "indexed_attention": "full",
    "linear_attention": "linear",
}


def _num_experts(r: _ConfigReader) -> int:
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        if r.has(key):
            return r.int(key, minimum=0)
    return 0


def _layer_kinds(r: _ConfigReader, num_layers: int) -> tuple[LayerKind, ...]:
    """Which layers are MoE, from whichever placement key the config uses."""
    if not _num_experts(r) or (r.has("enable_moe_block") and not r.bool("enable_moe_block")):
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
    elif r.bool("enable_moe_block"):
        # Gemma 4: the layer's dense MLP runs next to the experts on every token.
        shared_n, shared = 1, r.int("intermediate_size")
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
        router_scale=r.bool("enable_moe_block"),
        shared_gate=family.shared_expert_gate and shared_n > 0,
    )


def _layer_types(r: _ConfigReader, num_layers: int) -> list[str] | None:
    """Each layer's ``layer_types`` entry, as the config gives or implies it (None: the
    config has no per-layer types)."""
    if r.has("layer_types"):
        types = r.str_list("layer_types", num_layers)
        bad = sorted(set(types) - set(_LAYER_TYPES))
        if bad:
            raise r.refuse(
                "layer_types",
                f"{bad[0]!r} layers are not modeled yet (" + ", ".join(_LAYER_TYPES) + ")",
            )
        return types
    lin = r.get("linear_attn_config")
    if lin is not None:
        # Kimi-Linear: 1-indexed lists of the KDA and the full-attention layers.
        if not isinstance(lin, Mapping):
            raise r.refuse("linear_attn_config", "must be an object")
        sub = _ConfigReader(cfg=lin, where=f"{r.where} (linear_attn_config)")
        kda = set(sub.int_list("kda_layers"))
        full = set(sub.int_list("full_attn_layers")) if sub.has("full_attn_layers") else set()
        if kda & full or (kda | full) - set(range(1, num_layers + 1)):
            raise r.refuse(
                "linear_attn_config",
                f"kda_layers and full_attn_layers must be disjoint layer numbers 1..{num_layers}",
            )
        return ["linear_attention" if i + 1 in kda else "full_attention" for i in range(num_layers)]
    if r.has("linear_num_value_heads"):
        # Qwen3-Next: every full_attention_interval-th layer is full attention.
        every = r.int("full_attention_interval", 4)
        return [
            "full_attention" if (i + 1) % every == 0 else "linear_attention"
            for i in range(num_layers)
        ]
    return None


def _spans(r: _ConfigReader, num_layers: int, types: list[str] | None) -> list[AttentionSpan]:
    """Each layer's attention span, from whichever pattern key the config uses (a
    linear layer's is FULL: it attends to nothing, see LayerAttention.linear)."""
    if types is not None:
        size = {
            "full": 0,
            "linear": 0,
            "sliding": r.int("sliding_window") if "sliding_attention" in types else 0,
            "chunked": r.int("attention_chunk_size") if "chunked_attention" in types else 0,
        }
        out = []
        for t in types:
            kind = _LAYER_TYPES[t]
            out.append(
                FULL if kind in ("full", "linear") else AttentionSpan(kind=kind, tokens=size[kind])
            )
        return out
    if r.has("attention_chunk_size"):
        # Llama 4: the RoPE layers are chunked, the NoPE layers (0 in no_rope_layers) global.
        chunk = r.int("attention_chunk_size")
        rope = r.int_list("no_rope_layers") if r.has("no_rope_layers") else []
        if not rope:
            every = r.int("no_rope_layer_interval", 4)
            rope = [int((i + 1) % every != 0) for i in range(num_layers)]
        if len(rope) != num_layers:
            raise r.refuse("no_rope_layers", f"must list one entry per layer ({num_layers})")
        return [AttentionSpan(kind="chunked", tokens=chunk) if on else FULL for on in rope]
    window = r.get("sliding_window")
    if window and r.has("sliding_window_pattern"):
        # Gemma 2/3: every pattern-th layer is global, the others slide.
        w, every = r.int("sliding_window"), r.int("sliding_window_pattern")
        return [
            AttentionSpan(kind="sliding", tokens=w) if (i + 1) % every else FULL
            for i in range(num_layers)
        ]
    if window and r.bool("use_sliding_window", True):
        w = r.int("sliding_window")
        limit = r.int("max_window_layers", num_layers, minimum=0)
        # Qwen2-style: layers below max_window_layers use the window.
        return [
            AttentionSpan(kind="sliding", tokens=w) if i < limit else FULL
            for i in range(num_layers)
        ]
    return [FULL] * num_layers


def _linear_attention(r: _ConfigReader) -> LinearAttention:
    lin = r.get("linear_attn_config")
    if isinstance(lin, Mapping):
        sub = _ConfigReader(cfg=lin, where=f"{r.where} (linear_attn_config)")
        heads, dim = sub.int("num_heads"), sub.int("head_dim")
        return LinearAttention(
            kind="kda",
            k_heads=heads,
            v_heads=heads,
            k_head_dim=dim,
            v_head_dim=dim,
            conv_kernel=sub.int("short_conv_kernel_size", 4),
        )
    if not r.has("linear_num_value_heads"):
        raise r.refuse(
            "layer_types",
            "linear_attention layers need their shapes (linear_num_value_heads and the "
            "other linear_* keys, or linear_attn_config)",
        )
    return LinearAttention(
        kind="gated_deltanet",
        k_heads=r.int("linear_num_key_heads"),
        v_heads=r.int("linear_num_value_heads"),
        k_head_dim=r.int("linear_key_head_dim"),
        v_head_dim=r.int("linear_value_head_dim"),
        conv_kernel=r.int("linear_conv_kernel_dim", 4),
    )


def _own_indexers(r: _ConfigReader, num_layers: int) -> list[bool]:
    """Which DSA layers run their own indexer; the others reuse the top-k of the
    last one that does (GLM-5's ``indexer_types``, configuration_glm_moe_dsa.py)."""
    if r.has("indexer_types"):
        types = r.str_list("indexer_types", num_layers)
        if set(types) - {"full", "shared"}:
            raise r.refuse("indexer_types", "entries must be 'full' or 'shared'")
        own = [t == "full" for t in types]
    elif r.has("index_topk_pattern"):
        pattern = r.get("index_topk_pattern")
        letters = list(pattern) if isinstance(pattern, (str, list)) else []
        if len(letters) != num_layers or set(letters) - {"F", "S"}:
            raise r.refuse(
                "index_topk_pattern", f"must give F or S for each of the {num_layers} layers"
            )
        own = [c == "F" for c in letters]
    else:
        freq = r.int("index_topk_freq", 1)
        offset = r.int("index_skip_topk_offset", 2, minimum=0)
        own = [max(i - offset + 1, 0) % freq == 0 for i in range(num_layers)]
    if not own[0]:
        raise r.refuse("indexer_types", "the first layer has no earlier indexer to share")
    return own


def _attention_layers(
    r: _ConfigReader,
    types: list[str] | None,
    spans: list[AttentionSpan],
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    mla: MLA | None,
    dsa: DSA | None,
) -> tuple[LayerAttention, ...]:
    n = len(spans)
    shared = r.int("num_kv_shared_layers", 0, minimum=0)
    if shared > n:
        raise r.refuse("num_kv_shared_layers", f"{shared} is more than the {n} layers")
    k_eq_v = r.bool("attention_k_eq_v")
    own = _own_indexers(r, n) if dsa is not None else [False] * n
    out = []
    for i, span in enumerate(spans):
        if types is not None and _LAYER_TYPES[types[i]] == "linear":
            out.append(
                LayerAttention(heads=heads, kv_heads=kv_heads, head_dim=head_dim, linear=True)
            )
            continue
        hd, kv, full_k_eq_v = head_dim, kv_heads, False
        if span.kind == "full" and mla is None:
            # Gemma 4: global layers have their own head dim, and with K = V their own
            # KV heads (configuration_gemma4.py).
            hd = r.int("global_head_dim", head_dim)
            if k_eq_v:
                full_k_eq_v = True
                kv = r.int("num_global_key_value_heads", kv_heads)
        out.append(
            LayerAttention(
                span=span,
                heads=heads,
                kv_heads=kv,
                head_dim=hd,
                k_eq_v=full_k_eq_v,
                kv_shared=i >= n - shared,
                indexer=own[i],
                top_k=dsa.top_k if dsa is not None else 0,
            )
        )
    return tuple(out)


def _reader(config: Any, source: str) -> tuple[_ConfigReader, Family, tuple[str, ...]]:
    """The reader of ``config`` (of its ``text_config`` in a multimodal wrapper), its
    family and the notices reading it gives; refuses structure not modeled yet."""
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
    family, notices = family_of(cfg, where)
    r = _ConfigReader(cfg=cfg, where=where, defaults=family.defaults)
    for key, what in _NOT_MODELED:
        if r.get(key) not in (None, 0, {}, []):
            raise r.refuse(key, what)
    return r, family, notices


def _attention_heads(r: _ConfigReader, hidden: int, heads: int) -> tuple[int, int, MLA | None]:
    """KV heads, head dim and MLA's ranks (None: MHA or GQA)."""
    if r.has("kv_lora_rank"):
        mla = MLA(
            q_lora_rank=r.int("q_lora_rank", 0, minimum=0),
            kv_lora_rank=r.int("kv_lora_rank"),
            qk_nope_head_dim=r.int("qk_nope_head_dim"),
            qk_rope_head_dim=r.int("qk_rope_head_dim"),
            v_head_dim=r.int("v_head_dim"),
        )
        return heads, mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla
    kv_heads = r.int("num_key_value_heads", heads)
    if hidden % heads and not r.has("head_dim"):
        raise ShardlabError(
            f"{r.where}: hidden_size {hidden} is not a multiple of num_attention_heads "
            f"{heads} and no 'head_dim' key is given"
        )
    return kv_heads, r.int("head_dim", hidden // heads), None


def _dsa(r: _ConfigReader, mla: MLA | None) -> DSA | None:
    """DSA's indexer (DeepSeek-V3.2, GLM-5), None without one."""
    if not r.has("index_topk"):
        return None
    if mla is None:
        raise r.refuse("index_topk", "DSA sparse attention needs MLA (kv_lora_rank)")
    return DSA(
        top_k=r.int("index_topk"),
        heads=r.int("index_n_heads"),
        head_dim=r.int("index_head_dim"),
    )


def _mtp_layers(r: _ConfigReader) -> int:
    """Multi-token-prediction layers, under either family's keys."""
    mtp = r.int("num_nextn_predict_layers", 0, minimum=0)
    if not mtp and r.bool("use_mtp"):
        mtp = r.int("num_mtp_modules", 1) * r.int("mtp_transformer_layers", 1)
    return mtp


def model_from_config(config: Mapping[str, Any], *, name: str, source: str) -> Model:
    """Build a :class:`Model` from a parsed ``config.json`` dict."""
    r, family, notices = _reader(config, source)
    cfg = r.cfg
    num_layers = r.int("num_hidden_layers")
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    kv_heads, head_dim, mla = _attention_heads(r, hidden, heads)
    dsa = _dsa(r, mla)
    types = _layer_types(r, num_layers)
    attention = _attention_layers(
        r,
        types,
        _spans(r, num_layers, types),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        mla=mla,
        dsa=dsa,
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
    mtp = _mtp_layers(r)
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
        attention_layers=attention,
        mla=mla,
        moe=moe if "moe" in kinds else None,
        linear=_linear_attention(r) if any(a.linear for a in attention) else None,
        dsa=dsa,
        attention_gate=family.attention_gate,
        mtp_layers=mtp,
        attention_bias=bias,
        o_bias=family.o_bias and r.bool("attention_bias"),
        qk_norm=qk_norm if mla is None else "none",
        # Gemma 4's MoE block brings three norms of its own (modeling_gemma4.py).
        norms_per_layer=family.norms_per_layer + (3 if r.bool("enable_moe_block") else 0),
        attention_sinks=family.attention_sinks,
        tie_word_embeddings=r.bool("tie_word_embeddings"),
        weight_dtype=weight_dtype,
        quantized_families=families,
        weight_block=_weight_block(r),
        architecture=MODEL_TYPE_ALIASES.get(str(cfg.get("model_type") or ""), "")
        or str(cfg.get("model_type") or ""),
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
    except UnicodeDecodeError:
        raise ShardlabError(
            f"{p}: not a text file; give the path of a HuggingFace config.json"
        ) from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ShardlabError(
            f"{p}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except (ValueError, RecursionError) as exc:  # an integer of 4,300 digits, deep nesting
        raise ShardlabError(f"{p}: not a config.json ({str(exc)[:80]})") from None
    stem = p.parent.name if p.name == "config.json" else p.stem
    return model_from_config(config, name=stem, source=str(p))
