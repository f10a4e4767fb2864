"""vLLM's capability model: every rule with the source line it is read from.

The vocabulary (an engine's "TP size" against shardlab's degrees) is
:mod:`shardlab.problems.engines.base`'s.
"""

from __future__ import annotations

from shardlab.problems.cluster import Cluster
from shardlab.problems.engines.base import (
    DEEPSEEK,
    TENSOR_PARALLEL,
    Capability,
    Feature,
    Wants,
    block_split,
)
from shardlab.problems.model import Model
from shardlab.problems.plan import Degrees


class VLLM(Capability):
    engine = "vllm"
    version = "0.24.0"
    uneven_pp = True  # VLLM_PP_LAYER_PARTITION (vllm/distributed/utils.py:109-149)
    features = (
        Feature(
            name="expert-parallel",
            turns_on="--enable-expert-parallel",
            source="vllm/engine/arg_utils.py:1086; "
            "vllm/model_executor/layers/fused_moe/config.py:1190-1237",
            doc="experts split over the whole DP x TP group (expert TP 1); without it "
            "they are tensor-parallel over that group",
        ),
        Feature(
            name="deepep",
            turns_on="--all2all-backend deepep_high_throughput (deepep_low_latency for a "
            "decode-phase workload)",
            source="vllm/config/parallel.py:40-53; vllm/distributed/device_communicators/"
            "all2all.py:144-327",
            doc="all-to-all token dispatch (DeepEP); the default allgather_reducescatter "
            "gathers tokens over the group and reduce-scatters the output",
        ),
        Feature(
            name="sequence-parallel",
            turns_on='--compilation-config \'{"pass_config": {"enable_sp": true, '
            '"sp_min_token_num": 1}}\'',
            source="vllm/config/compilation.py:129-132,173; vllm/config/vllm.py:1186-1215; "
            "vllm/compilation/passes/fusion/sequence_parallelism.py:498-528",
            doc="all-reduce + RMSNorm rewritten as reduce-scatter, RMSNorm, all-gather: "
            "residual and norms token-sharded over TP, in every step (sp_min_token_num 1; "
            "off by default, vllm/config/vllm.py:98-104)",
        ),
    )

    # Models whose MoE block chunks its tokens over TP under EP with DP (MoE sequence
    # parallel, sequence_parallel_chunk: models/deepseek_v2.py:366-385, qwen3_moe.py:235,
    # gpt_oss.py:208, llama4.py:153, qwen3_next.py:188, qwen2_moe.py)
    CHUNKED_MOE = DEEPSEEK | {"qwen2_moe", "qwen3_moe", "gpt_oss", "llama4_text", "qwen3_next"}

    def refusal(self, model: Model, cluster: Cluster, d: Degrees) -> str | None:
        if d.dp_attn > 1 and not model.is_moe:
            # "Non-MoE DP ranks are completely independent" (vllm/v1/engine/core.py:1193)
            return "data parallel of a dense model is replicas"
        if model.is_moe and d.ep not in (1, d.group):
            # the EP group is always DP x TP per stage (parallel_state.py:1872-1884)
            return f"expert parallel over {d.ep} of the {d.group} GPUs of the DP x TP group"
        return None

    def _moe_sp(self, model: Model, d: Degrees, features: tuple[str, ...]) -> bool:
        # MoE sequence parallel (vllm/config/parallel.py:641-656): EP, TP > 1, DP > 1,
        # in the models that chunk their tokens
        return (
            "expert-parallel" in features
            and d.tp > 1
            and d.dp_attn > 1
            and model.architecture in self.CHUNKED_MOE
        )

    def feature_sets(self, model: Model, cluster: Cluster, d: Degrees) -> list[tuple[str, ...]]:
        if model.is_moe:
            if d.ep == 1:
                return [()]
            ep = ("expert-parallel",)
            # all-to-all kernels run only when DP > 1 and EP is on (fused_moe/config.py:
            # 1039-1041); with DP = 1 tokens are replicated and the output all-reduced.
            # With TP > 1 each TP rank dispatches its own chunk only in the chunking models.
            chunked = d.tp == 1 or model.architecture in self.CHUNKED_MOE
            return [ep, (*ep, "deepep")] if d.dp_attn > 1 and chunked else [ep]
        if d.tp > 1:
            return [(), ("sequence-parallel",)]
        return [()]

    def wants(self, model: Model, d: Degrees, features: tuple[str, ...], kind: str) -> Wants:
        w = dict(TENSOR_PARALLEL)
        if "sequence-parallel" in features:
            for op in ("residual", "attn_norm", "ffn_norm", "final_norm"):
                w[op] = ("seq_sharded",)
        if "deepep" in features:
            w["experts"] = ("alltoall",)
        if self._moe_sp(model, d, features):
            # the router and the shared experts (whole weights) run on each TP rank's
            # chunk (models/deepseek_v2.py:212-231, 366-378)
            w["router"] = ("seq_sharded",)
            w["shared_up"] = w["shared_down"] = ("seq_sharded",)
        return w

    def check(self, model: Model, d: Degrees, options: dict[str, str]) -> str | None:
        return block_split(model, d, options)
