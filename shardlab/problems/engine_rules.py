"""The rules of each engine's capability model (:mod:`shardlab.problems.capability`),
one class per engine, every rule with the source line it is read from.

Vocabulary: the engine's "TP size" is shardlab's group (``tp * dp_attn``) where the
engine runs attention data parallel inside it (SGLang, TensorRT-LLM), and shardlab's
``tp`` where data parallel ranks are counted apart (vLLM). Replicas are separate
servers in every engine (``shardlab launch`` prints one per replica).
"""

from __future__ import annotations

from shardlab.problems.capability import TENSOR_PARALLEL, Capability, Feature, Wants
from shardlab.problems.cluster import Cluster
from shardlab.problems.model import Model
from shardlab.problems.plan import Degrees

REPLICATED_LAYER = dict.fromkeys(TENSOR_PARALLEL, ("replicated",))

# DeepSeek-V3's architecture in every engine (Kimi-K2 and DeepSeek-V3.2 included).
DEEPSEEK = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2"})


def _block_split(model: Model, d: Degrees, options: dict[str, str]) -> str | None:
    """Why a block-quantized checkpoint cannot be split so (None: it can).

    vLLM and SGLang refuse a slice of an fp8 weight that is not whole scale blocks
    (vLLM model_executor/layers/quantization/fp8.py:560-573, utils/fp8_utils.py
    validate_fp8_block_shape; SGLang srt/layers/quantization/fp8_utils.py:1788-1812,
    srt/model_executor/model_runner.py:1129-1143)."""
    block = model.weight_block
    if not block:
        return None
    sizes = {"ffn_up": model.ffn_size, "ffn_down": model.ffn_size}
    if model.moe is not None:
        sizes.update(shared_up=model.moe.shared_ffn_size, shared_down=model.moe.shared_ffn_size)
    ways = {"column": d.tp, "row": d.tp, "column_full": d.group, "row_full": d.group}
    for op, size in sizes.items():
        option = options.get(op, "replicated")
        n = ways.get(option, 1)
        if size and n > 1 and size % n == 0 and (size // n) % block:
            return f"{op} {option} leaves {size // n}-row slices of {block}-row fp8 blocks"
    if model.moe is not None and d.etp > 1 and (model.moe.expert_ffn_size // d.etp) % block:
        return (
            f"expert TP {d.etp} leaves {model.moe.expert_ffn_size // d.etp}-row slices of "
            f"{block}-row fp8 blocks"
        )
    return None


# -- TensorRT-LLM ------------------------------------------------------------------------


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
        if model.architecture in DEEPSEEK and d.dp_attn == 1 and d.tp > cluster.node_size:
            # the dense MLP's TP is capped at a node (modeling_deepseekv3.py:1299-1313),
            # which no option here prices
            return "DeepSeek's tensor parallel over more than a node without attention DP"
        return None

    @staticmethod
    def _deepep_starts(cluster: Cluster, d: Degrees) -> bool:
        # DeepEP._is_deepep_feasible (deep_ep.py:97-110): EP = the local MPI size in
        # {2, 4, 8}, or 8 local ranks and EP / 8 in {2, 4, 8, 16}
        local = min(d.pp * d.group, cluster.node_size)
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
        if d.pp * d.group <= cluster.node_size:  # the NVLink strategies, then all-gather
            return [(*adp, "nvlink-alltoall"), adp]
        # across nodes on these GPUs: no multi-node NVLink, so all-gather unless DeepEP
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


# -- vLLM -------------------------------------------------------------------------------


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
        return _block_split(model, d, options)


# -- SGLang -----------------------------------------------------------------------------


class SGLang(Capability):
    engine = "sglang"
    version = "0.5.14"
    uneven_pp = True  # SGLANG_PP_LAYER_PARTITION (srt/distributed/utils.py:109)
    features = (
        Feature(
            name="dp-attention",
            turns_on="--enable-dp-attention --dp-size DP (and --enable-dp-lm-head)",
            source="srt/server_args.py:868-874,918-929; srt/layers/dp_attention.py:245-259",
            doc="attention data parallel inside --tp-size (attention TP = tp/dp); the LM "
            "head vocab-split over the attention-TP group: without --enable-dp-lm-head it "
            "spans the whole group on gathered tokens, which no option here models "
            "(srt/layers/logits_processor.py:272-286)",
        ),
        Feature(
            name="deepep",
            turns_on="--moe-a2a-backend deepep",
            source="srt/server_args.py:1601-1616,5274-5360; srt/layers/communicator.py:380-385",
            doc="all-to-all dispatch over the whole group (ep forced to tp); residual, norms "
            "and router token-split over attention TP, shared experts whole on each rank's "
            "tokens; the default 'none' gathers every token and all-reduces",
        ),
        Feature(
            name="dense-tp1",
            turns_on="--moe-dense-tp-size 1",
            source="srt/server_args.py:1675-1678,6663-6667; srt/models/deepseek_v2.py:2033-2047",
            doc="the dense MLP layers of a MoE model with whole weights on each rank's own "
            "tokens; by default they are tensor-parallel over the whole group on tokens "
            "gathered from every DP rank",
        ),
    )

    # Models built on LayerCommunicator, which gathers and scatters tokens between DP
    # ranks and attention-TP ranks; in the others (Mixtral, Gemma, Kimi-Linear, ...)
    # attention spans the whole --tp-size and DP attention or DeepEP would compute wrong
    # results (srt/models/*.py; srt/layers/communicator.py)
    COMMUNICATOR = DEEPSEEK | {
        "glm4_moe",
        "glm_moe_dsa",
        "gpt_oss",
        "llama4_text",
        "minimax_m2",
        "qwen2_moe",
        "qwen3_moe",
        "qwen3_next",
    }

    def refusal(self, model: Model, cluster: Cluster, d: Degrees) -> str | None:
        if d.dp_attn > 1 and not model.is_moe:
            # normal DP is single-node replicas (srt/server_args.py:6656-6658)
            return "DP attention of a dense model (run replicas instead)"
        if d.dp_attn > 1 and model.architecture not in self.COMMUNICATOR:
            return f"DP attention of a {model.architecture or 'this'} model (no LayerCommunicator)"
        gpus = d.pp * d.group
        if gpus > cluster.node_size:
            nodes = gpus // cluster.node_size
            # (tp*pp) % nnodes == 0 (server_args.py:6632-6634); ranks are placed per
            # stage or a stage over nodes (srt/entrypoints/engine.py:1375-1406)
            if gpus % cluster.node_size or (d.pp % nodes and nodes % d.pp):
                return f"{d.pp} pipeline stages over {nodes} nodes"
        return None

    def feature_sets(self, model: Model, cluster: Cluster, d: Degrees) -> list[tuple[str, ...]]:
        base = ("dp-attention",) if d.dp_attn > 1 else ()
        out = [base]
        if model.is_moe and d.group > 1 and model.architecture in self.COMMUNICATOR:
            if d.ep == d.group and d.ep > 1:  # a2a backends force ep = tp
                out.append((*base, "deepep"))
            if "dense" in model.kinds:
                out += [(*f, "dense-tp1") for f in list(out)]
        return out

    def wants(self, model: Model, d: Degrees, features: tuple[str, ...], kind: str) -> Wants:
        w = dict(TENSOR_PARALLEL)
        if kind == "head":
            return w  # embedding and LM head over attention TP (with --enable-dp-lm-head)
        # under DP attention the dense MLP and the shared experts are tensor-parallel
        # over the whole group on every DP rank's tokens (communicator.py:392-397)
        for up, down in (("ffn_up", "ffn_down"), ("shared_up", "shared_down")):
            w[up], w[down] = ("column_full", "column"), ("row_full", "row")
        scattered = (kind == "moe" and "deepep" in features) or (
            kind == "dense" and "dense-tp1" in features
        )
        if kind == "moe" and "deepep" in features:
            w["experts"] = ("alltoall",)
            # shared experts tp = 1 on local tokens (srt/models/deepseek_v2.py:694-713)
            w["shared_up"] = w["shared_down"] = ("seq_sharded", "replicated")
        if kind == "dense" and "dense-tp1" in features:
            w["ffn_up"] = w["ffn_down"] = ("seq_sharded", "replicated")
        if scattered:  # the MLP's SCATTERED mode (srt/layers/communicator.py:409-428)
            for op in ("residual", "attn_norm", "ffn_norm", "router"):
                w[op] = ("seq_sharded", "replicated")
        return w

    def check(self, model: Model, d: Degrees, options: dict[str, str]) -> str | None:
        return _block_split(model, d, options)


CAPABILITIES: dict[str, Capability] = {
    "trtllm": TensorRTLLM(),
    "vllm": VLLM(),
    "sglang": SGLang(),
}
