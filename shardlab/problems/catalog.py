"""Built-in models: real HuggingFace configs shipped with the package, by short name."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from shardlab.errors import ShardlabError
from shardlab.problems.hf_config import load_config_file, model_from_config
from shardlab.problems.model import Model


@dataclass(frozen=True, kw_only=True)
class CatalogEntry:
    name: str
    hf_id: str
    file: str
    note: str = ""


CATALOG: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        name="llama-3.1-8b",
        hf_id="meta-llama/Meta-Llama-3.1-8B",
        file="meta-llama--Meta-Llama-3.1-8B.json",
    ),
    CatalogEntry(
        name="llama-3.1-70b",
        hf_id="meta-llama/Meta-Llama-3.1-70B",
        file="meta-llama--Meta-Llama-3.1-70B.json",
    ),
    CatalogEntry(
        name="llama-3.1-405b",
        hf_id="meta-llama/Meta-Llama-3.1-405B",
        file="meta-llama--Meta-Llama-3.1-405B.json",
    ),
    CatalogEntry(name="qwen3-32b", hf_id="Qwen/Qwen3-32B", file="Qwen--Qwen3-32B.json"),
    CatalogEntry(
        name="qwen3-235b-a22b", hf_id="Qwen/Qwen3-235B-A22B", file="Qwen--Qwen3-235B-A22B.json"
    ),
    CatalogEntry(
        name="mixtral-8x7b",
        hf_id="mistralai/Mixtral-8x7B-v0.1",
        file="mistralai--Mixtral-8x7B-v0.1.json",
    ),
    CatalogEntry(
        name="mixtral-8x22b",
        hf_id="mistralai/Mixtral-8x22B-v0.1",
        file="mistralai--Mixtral-8x22B-v0.1.json",
    ),
    CatalogEntry(
        name="deepseek-v3",
        hf_id="deepseek-ai/DeepSeek-V3",
        file="deepseek-ai--DeepSeek-V3.json",
        note="MTP layer counted apart; it drafts with --draft-tokens",
    ),
    CatalogEntry(
        name="kimi-k2",
        hf_id="moonshotai/Kimi-K2-Instruct",
        file="moonshotai--Kimi-K2-Instruct.json",
    ),
    CatalogEntry(
        name="gpt-oss-120b",
        hf_id="openai/gpt-oss-120b",
        file="openai--gpt-oss-120b.json",
        note="sliding-window layers modeled as attending to <= 128 tokens",
    ),
    CatalogEntry(name="qwen3-8b", hf_id="Qwen/Qwen3-8B", file="Qwen--Qwen3-8B.json"),
    CatalogEntry(name="qwen3-30b-a3b", hf_id="Qwen/Qwen3-30B-A3B", file="Qwen--Qwen3-30B-A3B.json"),
    CatalogEntry(
        name="llama-4-scout",
        hf_id="meta-llama/Llama-4-Scout-17B-16E-Instruct",
        file="meta-llama--Llama-4-Scout-17B-16E-Instruct.json",
        note="text model (vision encoder not counted); chunked attention on 3 of 4 layers",
    ),
    CatalogEntry(
        name="llama-4-maverick",
        hf_id="meta-llama/Llama-4-Maverick-17B-128E-Instruct",
        file="meta-llama--Llama-4-Maverick-17B-128E-Instruct.json",
        note="text model (vision encoder not counted); dense and MoE layers alternate",
    ),
    CatalogEntry(
        name="gemma-3-27b",
        hf_id="google/gemma-3-27b-it",
        file="google--gemma-3-27b-it.json",
        note="text model (vision encoder not counted); 5 sliding-window layers per global one",
    ),
    CatalogEntry(
        name="glm-4.5",
        hf_id="zai-org/GLM-4.5",
        file="zai-org--GLM-4.5.json",
        note="MTP layer counted apart; it drafts with --draft-tokens",
    ),
    CatalogEntry(
        name="glm-5",
        hf_id="zai-org/GLM-5",
        file="zai-org--GLM-5.json",
        note="MLA with DSA: attention reads the indexer's top 2,048 keys; MTP counted apart",
    ),
    CatalogEntry(
        name="minimax-m2", hf_id="MiniMaxAI/MiniMax-M2", file="MiniMaxAI--MiniMax-M2.json"
    ),
    CatalogEntry(
        name="deepseek-v3.2",
        hf_id="deepseek-ai/DeepSeek-V3.2",
        file="deepseek-ai--DeepSeek-V3.2.json",
        note="MLA with DSA: attention reads the indexer's top 2,048 keys; MTP counted apart",
    ),
    CatalogEntry(
        name="gemma-4-26b-a4b",
        hf_id="google/gemma-4-26B-A4B",
        file="google--gemma-4-26B-A4B.json",
        note="text model; 5 sliding layers (256-dim heads) per global one (512-dim, K = V); "
        "dense MLP next to 128 experts",
    ),
    CatalogEntry(
        name="qwen3-next-80b-a3b",
        hf_id="Qwen/Qwen3-Next-80B-A3B-Instruct",
        file="Qwen--Qwen3-Next-80B-A3B-Instruct.json",
        note="3 gated-DeltaNet layers (fixed state) per gated full-attention one",
    ),
    CatalogEntry(
        name="kimi-linear-48b-a3b",
        hf_id="moonshotai/Kimi-Linear-48B-A3B-Instruct",
        file="moonshotai--Kimi-Linear-48B-A3B-Instruct.json",
        note="20 KDA layers (fixed state), 7 MLA layers",
    ),
    CatalogEntry(
        name="moe-1.6t",
        hf_id="",
        file="shardlab--MoE-1.6T.json",
        note="stand-in for Learning-to-Shard's 1.6T MoE: DeepSeek-V3 layers, "
        "64 layers (2 dense), 512 experts of width 2304, top-8",
    ),
)


def _lookup(name: str) -> CatalogEntry | None:
    key = name.lower()
    for entry in CATALOG:
        if key == entry.name or (entry.hf_id and key == entry.hf_id.lower()):
            return entry
    return None


@cache
def _load_entry(entry: CatalogEntry) -> Model:
    text = (resources.files("shardlab.problems") / "data" / "models" / entry.file).read_text()
    return model_from_config(json.loads(text), name=entry.name, source=f"catalog:{entry.name}")


def load_model(name_or_path: str | Path) -> Model:
    """A catalog name (``deepseek-v3``), a HuggingFace id, or a config.json path."""
    if not str(name_or_path).strip():
        raise ShardlabError(
            "model '': name a catalog model (see `shardlab models`) or a config.json path"
        )
    entry = _lookup(str(name_or_path))
    if entry is not None:
        return _load_entry(entry)
    path = Path(name_or_path)
    if path.exists() or str(name_or_path).endswith(".json"):
        return load_config_file(path)
    raise ShardlabError(
        f"model {str(name_or_path)!r}: not in the catalog and no such file; catalog: "
        + ", ".join(e.name for e in CATALOG)
    )


def hf_id_of(model: Model) -> str | None:
    """The HuggingFace id of a catalog model (None for others)."""
    name = model.source.removeprefix("catalog:")
    for entry in CATALOG:
        if entry.name == name:
            return entry.hf_id
    return None
