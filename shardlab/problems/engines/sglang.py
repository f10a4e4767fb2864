"""SGLang's capability model: every rule with the source line it is read from.

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
        if gpus > cluster.host_size:
            nodes = gpus // cluster.host_size
            # (tp*pp) % nnodes == 0 (server_args.py:6632-6634); ranks are placed per
            # stage or a stage over nodes (srt/entrypoints/engine.py:1375-1406)
            if gpus % cluster.host_size or (d.pp % nodes and nodes % d.pp):
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
        return block_split(model, d, options)
