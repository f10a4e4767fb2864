"""The serving engines shardlab models, one capability model each (see
:mod:`shardlab.problems.engines.base`): the registry. Adding an engine is one module
beside these and one line in :data:`CAPABILITIES` (and in :data:`Engine`).
"""

from __future__ import annotations

from typing import Literal, get_args

from shardlab.errors import ShardlabError
from shardlab.problems.catalog import load_model
from shardlab.problems.cluster import parse_cluster
from shardlab.problems.degrees import enumerate_degrees
from shardlab.problems.engines.base import Capability
from shardlab.problems.engines.sglang import SGLang
from shardlab.problems.engines.trtllm import TensorRTLLM
from shardlab.problems.engines.vllm import VLLM
from shardlab.problems.operators import HEAD_OPS, layer_ops

Engine = Literal["trtllm", "vllm", "sglang"]
ENGINES: tuple[str, ...] = get_args(Engine)
# The engines each vendor's GPUs run: TensorRT-LLM is CUDA only; vLLM and SGLang ship
# ROCm builds for AMD Instinct; on Intel's Arc Pro, vLLM's XPU backend (the one engine
# aiconfigurator-core measures there).
VENDOR_ENGINES: dict[str, tuple[str, ...]] = {
    "nvidia": ENGINES,
    "amd": ("vllm", "sglang"),
    "intel": ("vllm",),
}

CAPABILITIES: dict[str, Capability] = {
    "trtllm": TensorRTLLM(),
    "vllm": VLLM(),
    "sglang": SGLang(),
}
assert tuple(CAPABILITIES) == ENGINES


def capability(engine: str) -> Capability:
    """The capability model of ``engine`` at its pinned version."""
    try:
        return CAPABILITIES[engine]
    except KeyError:
        raise ShardlabError(
            f"engine {engine!r} is not modeled",
            field="engine",
            fix=f"choose one of {', '.join(ENGINES)}",
        ) from None


# Models and a cluster whose engine configurations show every feature at work: a
# dense model, a MoE model with shared experts and dense layers (DeepSeek-V3), one
# with few experts; two nodes, so that multi-node rules apply.
COVERAGE_CASES: tuple[tuple[str, str], ...] = (
    ("llama-3.1-70b", "h100x16"),
    ("deepseek-v3", "h200x16"),
    ("mixtral-8x7b", "h100x16"),
)


def option_coverage(engine: str) -> dict[tuple[str, str], tuple[str, ...] | None]:
    """For every (operator, option): the fewest engine features under which ``engine``
    produces it on :data:`COVERAGE_CASES` with more than one GPU per stage (``()``:
    with its defaults), None if never (the option has no equivalent in the engine)."""

    cap = capability(engine)
    out: dict[tuple[str, str], tuple[str, ...] | None] = {}
    for model_name, cluster_name in COVERAGE_CASES:
        model, cluster = load_model(model_name), parse_cluster(cluster_name)
        for op in (*{o for k in model.kinds for o in layer_ops(model, k)}, *HEAD_OPS):
            for opt in op.options:
                out.setdefault((op.name, opt.name), None)
        for c in cap.configs(model, cluster, enumerate_degrees(model, cluster)):
            if c.degrees.group == 1:  # one GPU per stage: every option is the same plan
                continue
            for _, op_name, name in c.options:
                seen = out.get((op_name, name))
                if seen is None or len(c.features) < len(seen):
                    out[(op_name, name)] = c.features
    return out
