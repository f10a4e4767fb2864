"""The model families: what a ``config.json``'s ``model_type`` decides that the config
does not state (key defaults, and facts such as gpt-oss's expert biases). The table is
package data, ``data/families.yaml``, validated on load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardlab.errors import ShardlabError
from shardlab.problems.datafile import load_records
from shardlab.problems.model import QKNorm


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
    shared_expert_gate: bool = False  # Qwen MoE: shared_expert_gate [1, hidden]
    attention_gate: bool = False  # Qwen3-Next: q_proj doubles as an output gate


FAMILIES: dict[str, Family] = load_records("families.yaml", Family)
# Wrappers and text configs that name their family another way.
MODEL_TYPE_ALIASES: dict[str, str] = {
    "qwen3_text": "qwen3",
    "llama4": "llama4_text",
    "gemma3": "gemma3_text",
    "gemma4": "gemma4_text",
}


def family_of(cfg: Mapping[str, Any], where: str) -> tuple[Family, tuple[str, ...]]:
    """The family of a config's ``model_type``, and a notice if it is not a known one."""
    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ShardlabError(f"{where}: key 'model_type' must be a string, got {model_type!r}")
    key = MODEL_TYPE_ALIASES.get(model_type or "", model_type or "")
    if key in FAMILIES:
        return FAMILIES[key], ()
    named = f"model_type {model_type!r}" if model_type else "no model_type"
    return Family(), (f"{where}: {named} is not a known family; read by its standard keys",)
