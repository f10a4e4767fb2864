"""TensorRT-LLM's capability model: every rule with the source line it is read from.

The vocabulary (an engine's "TP size" against shardlab's degrees) is
:mod:`shardlab.problems.engines.base`'s.
"""

from __future__ import annotations

from shardlab.problems.cluster import Cluster
from shardlab.problems.engines.base import DEEPSEEK, TENSOR_PARALLEL, Capability, Feature, Wants
from shardlab.problems.model import Model
from shardlab.problems.plan import Degrees

REPLICATED_LAYER = dict.fromkeys(TENSOR_PARALLEL, ("replicated",))


class TensorRTLLM(Capability):
    engine = "trtllm"
    version = "1.3.0rc3"
    uneven_pp = True  # YAML pp_partition (tensorrt_llm/llmapi/llm_args.py:2051)
    features = (
        Feature(
            name="attention-dp",
            turns_on="enable_attention_dp: true",
            source="tensorrt_llm/llmapi/llm_args.py:2041; tensorrt_llm/mapping.py:237-239",
            doc="attention data parallel over the whole TP size (attention TP = 1); dense "
            "MLP, shared experts, embedding and LM head replicated per rank",
        ),
        Feature(
            name="nvlink-alltoall",
            turns_on="TRTLLM_FORCE_COMM_METHOD=NVLINK_ONE_SIDED (one stage) or "
            "NVLINK_TWO_SIDED (stages), the default inside a node; without it "
            "TRTLLM_FORCE_COMM_METHOD=ALLGATHER",
            source="tensorrt_llm/_torch/modules/fused_moe/communication/"
            "communication_factory.py:108-150; nvlink_one_sided.py:169-170",
            doc="MoE all-to-all over one node's NVLink (pure EP, moe_tp = 1); one-sided "
            "needs world size = EP size, so stages take the two-sided one",
        ),
        Feature(
            name="deepep",
            turns_on="TRTLLM_CAN_USE_DEEP_EP=1 TRTLLM_FORCE_COMM_METHOD=DEEPEP",
            source="tensorrt_llm/_torch/modules/fused_moe/communication/"
            "communication_factory.py:157-187; deep_ep.py:97-110",
            doc="DeepEP all-to-all for EP across nodes: 8 ranks per node and EP / 8 in "
            "{2, 4, 8, 16} (it will not start otherwise)",
        ),
    )

    # Architectures whose input embedding TensorRT-LLM builds without a mapping
    # (_torch/models/modeling_deepseekv3.py:1662-1666, modeling_mixtral.py:158-163,
    # modeling_glm.py:929, modeling_minimaxm2.py:258).
    REPLICATED_EMBEDDING = DEEPSEEK | {"mixtral", "glm4_moe", "minimax_m2"}

    def refusal(self, model: Model, cluster: Cluster, d: Degrees) -> str | None:
        if d.dp_attn > 1 and d.tp > 1:
            # _ParallelConfig.to_mapping never passes attn_tp_size (llm_args.py:582-596)
            return "attention data parallel with attention TP > 1 is not reachable"
        if d.dp_attn > 1 and not model.is_moe:
            # plain Llama builds a TP-sharded MLP but skips its all-reduce under ADP
            # (_torch/models/modeling_llama.py:645-653, 752-755): replicas instead
            return "attention data parallel of a dense model (run replicas instead)"
        if model.architecture in DEEPSEEK and d.dp_attn == 1 and d.tp > cluster.host_size:
            # the dense MLP's TP is capped at a host's GPUs (modeling_deepseekv3.py:1299-1313),
            # which no option here prices
            return "DeepSeek's tensor parallel over more than a host without attention DP"
        return None

    @staticmethod
    def _deepep_starts(cluster: Cluster, d: Degrees) -> bool:
        # DeepEP._is_deepep_feasible (deep_ep.py:97-110): EP = the local MPI size in
        # {2, 4, 8}, or 8 local ranks and EP / 8 in {2, 4, 8, 16}
        local = min(d.pp * d.group, cluster.host_size)
        return (d.ep == local and d.ep in (2, 4, 8)) or (
            local == 8 and d.ep % 8 == 0 and d.ep // 8 in (2, 4, 8, 16)
        )

    def feature_sets(self, model: Model, cluster: Cluster, d: Degrees) -> list[tuple[str, ...]]:
        if d.dp_attn == 1:
            return [()]
        adp = ("attention-dp",)
        # moe_tp != 1 forces all-gather + reduce-scatter (communication_factory.py:104-105)
        if not model.is_moe or d.etp != 1 or d.ep == 1:
            return [adp]
        if d.pp * d.group <= cluster.domain_size:  # the NVLink strategies, then all-gather
            # (on a rack's NVLink domain too: MNNVL all-to-all spans its trays)
            return [(*adp, "nvlink-alltoall"), adp]
        # across NVLink domains: all-gather unless DeepEP
        return [adp, (*adp, "deepep")] if self._deepep_starts(cluster, d) else [adp]

    def wants(self, model: Model, d: Degrees, features: tuple[str, ...], kind: str) -> Wants:
        if "attention-dp" not in features:
            w = dict(TENSOR_PARALLEL)
            if model.architecture in self.REPLICATED_EMBEDDING:
                w["embedding"] = ("replicated",)
            # no attention DP: no MoE dispatch, the MoE output is all-reduced
            # (communication_factory.py:99-100; modeling_deepseekv3.py:952-954)
            return w
        # attention, dense MLP, shared experts, embedding, LM head replicated per rank
        # (attention.py:236-237; modeling_deepseekv3.py:996-998, 1296-1298;
        # modeling_utils.py:360-365)
        w = dict(REPLICATED_LAYER)
        alltoall = {"nvlink-alltoall", "deepep"} & set(features)
        w["experts"] = ("alltoall",) if alltoall else ("allgather",)
        return w
