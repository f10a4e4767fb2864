"""Each engine's launch command for one node of one server: its arguments, environment
and config files, from the plan's engine configuration.

Flags are the pinned versions' own (``shardlab/problems/data/engines/``, read off the
engines' argument definitions; ``tests/launch/test_launch.py`` checks every flag printed
against them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from shardlab.errors import ShardlabError
from shardlab.launch.hardware import mnnvl_env
from shardlab.problems.engines.base import EngineConfig
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem

TRTLLM_CONFIG = "extra-llm-api-config.yaml"
# Architectures whose MTP layers SGLang 0.5.14 drafts from the served checkpoint
# (srt/arg_groups/speculative_hook.py:290-306; kimi_k2 is DeepseekV3ForCausalLM).
SGLANG_MTP = frozenset({"deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe", "glm_moe_dsa"})


@dataclass(frozen=True, kw_only=True)
class Server:
    """What every server of one plan shares: the plan in its engine's configuration,
    and where the model and the config files are."""

    problem: Problem
    plan: Plan
    config: EngineConfig
    model_path: str
    trust_remote_code: bool
    config_dir: str


@dataclass(frozen=True, kw_only=True)
class Target(Server):
    """One node's server of one replica: what its engine command is made of."""

    port: int
    first_node: int  # the cluster node of the replica's node rank 0
    node_rank: int
    nodes: int
    # Kubernetes (LeaderWorkerSet): the head's address and a worker's node rank are
    # the variables LWS sets in each pod, and one command serves every worker
    in_pods: bool = False

    def addr(self, k: int) -> str:
        """The address of the replica's node ``k`` (a placeholder the user sets; in
        pods, the group's leader)."""
        if self.in_pods:
            if k:
                raise ShardlabError(
                    f"plan: {self.problem.engine} names every node of a multi-node server; "
                    "a LeaderWorkerSet gives its pods the leader's address only",
                    field="target",
                    fix="use target dynamo (its operator starts every node) or shell",
                )
            return "${LWS_LEADER_ADDRESS}"
        return f"${{NODE{self.first_node + k}_ADDR}}"

    @property
    def head(self) -> str:
        return self.addr(0)

    def rank_times(self, n: int = 1) -> str:
        """This node's rank times ``n``, as an argument (in a worker pod, the shell's
        arithmetic on LWS's worker index)."""
        if self.in_pods and self.node_rank:
            return "${LWS_WORKER_INDEX}" if n == 1 else f"$((LWS_WORKER_INDEX*{n}))"
        return str(self.node_rank * n)


BuildOut = tuple[list[tuple[str, str]], list[str], dict[str, str], list[str]] | None


def _partition(plan: Plan) -> str:
    return ",".join(str(n) for n in plan.stage_layers)


def _fabric_env(t: Target) -> list[tuple[str, str]]:
    """NCCL's multi-node NVLink switches, when the server spans hosts of one domain."""
    return mnnvl_env(t.problem.cluster, t.plan.degrees.pp * t.plan.degrees.group)


# DeepEP is CUDA only; on AMD GPUs both engines run the same dispatch and combine on
# MoRI (ROCm/mori: "MORI-EP integrated into SGLang and vLLM for MoE Expert Parallelism
# ... on AMD GPUs"), under the pinned versions' own choices (--moe-a2a-backend mori;
# --all2all-backend mori_high_throughput|mori_low_latency).
MORI_NOTE = (
    "DeepEP is CUDA only: on AMD GPUs the plan's expert dispatch runs on MoRI, AMD's "
    "counterpart (its time was priced as DeepEP's)"
)


def _on_amd(t: Target) -> bool:
    return t.problem.cluster.accelerator.vendor == "amd"


def _vllm(t: Target) -> BuildOut:
    problem, plan, config = t.problem, t.plan, t.config
    d, w, f = plan.degrees, problem.workload, set(config.features)
    node = problem.cluster.host_size
    notes: list[str] = []
    argv = ["vllm", "serve", t.model_path, *_vllm_degrees(t)[0]]
    env = _fabric_env(t)
    if d.pp > 1:
        env.append(("VLLM_PP_LAYER_PARTITION", _partition(plan)))
    if "deepep" in f:
        mode = "low_latency" if w.phase == "decode" else "high_throughput"
        argv += ["--all2all-backend", f"{'mori' if _on_amd(t) else 'deepep'}_{mode}"]
        if _on_amd(t):
            notes.append(MORI_NOTE)
    if "sequence-parallel" in f:  # in every step, as priced (not above a token count)
        sp = {"pass_config": {"enable_sp": True, "sp_min_token_num": 1}}
        argv += ["--compilation-config", json.dumps(sp)]
    if plan.requests_per_rank is not None:
        argv += ["--max-num-seqs", str(plan.requests_per_rank)]  # per DP engine core
    if problem.max_tokens is not None:
        argv += ["--max-num-batched-tokens", str(problem.max_tokens)]
    if problem.kv_dtype == "fp8":
        argv += ["--kv-cache-dtype", "fp8"]
    if w.draft_tokens:
        spec = {"method": "mtp", "num_speculative_tokens": w.draft_tokens}
        argv += ["--speculative-config", json.dumps(spec)]
    if t.trust_remote_code:
        argv.append("--trust-remote-code")
    if t.nodes > 1:
        rank_gpus = d.tp * d.pp
        if d.dp_attn > 1 and rank_gpus <= node:  # DP ranks spread over the nodes
            local = node // rank_gpus
            argv += ["--data-parallel-size-local", str(local)]
            argv += ["--data-parallel-address", t.head, "--data-parallel-rpc-port", "13345"]
            if t.node_rank:
                argv += ["--data-parallel-start-rank", t.rank_times(local), "--headless"]
        else:  # a DP rank over several nodes: TP / PP over them, multiprocessing backend
            if d.dp_attn > 1:
                notes.append(
                    "vLLM data parallel ranks that span nodes use --nnodes/--node-rank with "
                    "the mp backend (vllm/engine/arg_utils.py:1910-1939); vLLM's guides show "
                    "only -dpl or Ray for data parallel over nodes"
                )
            argv += ["--nnodes", str(t.nodes), "--node-rank", t.rank_times()]
            argv += ["--master-addr", t.head, "--master-port", "29501"]
            if t.node_rank:
                argv.append("--headless")
    if not (t.nodes > 1 and t.node_rank):
        argv += ["--host", "0.0.0.0", "--port", str(t.port)]
    return env, argv, {}, notes


def _sglang(t: Target) -> BuildOut:
    problem, plan, config = t.problem, t.plan, t.config
    d, w, f = plan.degrees, problem.workload, set(config.features)
    if w.draft_tokens and d.pp > 1:
        raise ShardlabError(
            "plan: SGLang 0.5.14 does not run speculative decoding with pipeline stages "
            "(srt/server_args.py:6651-6654)",
            field="workload.draft_tokens",
            fix="draft no tokens, or use pp = 1",
        )
    if w.draft_tokens and problem.model.architecture not in SGLANG_MTP:
        raise ShardlabError(
            f"draft tokens: SGLang 0.5.14 drafts with the served checkpoint's MTP layers "
            f"only for DeepSeek-V3/V3.2, Kimi-K2 and GLM (not {problem.model.architecture}; "
            "srt/arg_groups/speculative_hook.py:290-306)",
            field="workload.draft_tokens",
            fix="draft no tokens",
        )
    notes = []
    if d.dp_attn > 1 and d.ep > 1 and "deepep" not in f:
        notes.append(
            "SGLang DP attention with --ep-size > 1 on the default MoE backend was reported "
            "to give wrong logits (sgl-project/sglang#23729, closed); check the outputs"
        )
    argv = ["python", "-m", "sglang.launch_server", "--model-path", t.model_path]
    argv += _sglang_degrees(t)[0]
    env = _fabric_env(t)
    if d.pp > 1:
        env.append(("SGLANG_PP_LAYER_PARTITION", _partition(plan)))
    if "deepep" in f:
        argv += ["--moe-a2a-backend", "mori" if _on_amd(t) else "deepep"]
        if _on_amd(t):
            notes.append(MORI_NOTE)
    if "dense-tp1" in f:
        argv += ["--moe-dense-tp-size", "1"]
    if plan.requests_per_rank is not None:  # the server's limit, divided over its DP ranks
        argv += ["--max-running-requests", str(plan.requests_per_rank * d.dp_attn)]
    if problem.max_tokens is not None:  # divided over DP ranks (server_args.py:5053)
        argv += ["--chunked-prefill-size", str(problem.max_tokens * d.dp_attn)]
    if problem.kv_dtype == "fp8":
        argv += ["--kv-cache-dtype", "fp8_e4m3"]
    if w.draft_tokens:
        k = w.draft_tokens
        argv += ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(k)]
        argv += ["--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(k + 1)]
    if t.trust_remote_code:
        argv.append("--trust-remote-code")
    if t.nodes > 1:
        argv += ["--nnodes", str(t.nodes), "--node-rank", t.rank_times()]
        argv += ["--dist-init-addr", f"{t.head}:5000"]
    argv += ["--host", "0.0.0.0", "--port", str(t.port)]
    return env, argv, {}, notes


def _trtllm(t: Target) -> BuildOut:
    problem, plan, config = t.problem, t.plan, t.config
    if t.node_rank:
        return None  # one MPI job starts every rank from the head node
    d, w, f = plan.degrees, problem.workload, set(config.features)
    node = problem.cluster.host_size
    degree_flags, options = _trtllm_degrees(t)
    if d.pp > 1:
        options["pp_partition"] = list(plan.stage_layers)
    if problem.kv_dtype == "fp8":
        options["kv_cache_config"] = {"dtype": "fp8"}
    if w.draft_tokens:
        options["speculative_config"] = {
            "decoding_type": "MTP",
            "num_nextn_predict_layers": w.draft_tokens,
        }
    env = _fabric_env(t)
    if "nvlink-alltoall" in f:
        env.append(("TRTLLM_FORCE_COMM_METHOD", "NVLINK_ONE_SIDED"))
    elif "deepep" in f:
        env += [("TRTLLM_CAN_USE_DEEP_EP", "1"), ("TRTLLM_FORCE_COMM_METHOD", "DEEPEP")]
    elif d.dp_attn > 1 and d.ep > 1:  # the all-gather the plan was priced with
        env.append(("TRTLLM_FORCE_COMM_METHOD", "ALLGATHER"))
    path = str(Path(t.config_dir) / TRTLLM_CONFIG)
    serve = ["trtllm-serve", t.model_path, "--backend", "pytorch", *degree_flags]
    if plan.requests_per_rank is not None:  # it admits pp x max_batch_size requests
        # (tensorrt_llm/_torch/pyexecutor/model_engine.py:1334-1339)
        serve += ["--max_batch_size", str(-(-plan.requests_per_rank // d.pp))]
    if problem.max_tokens is not None:
        serve += ["--max_num_tokens", str(problem.max_tokens)]
    if t.trust_remote_code:
        serve.append("--trust_remote_code")
    serve += ["--host", "0.0.0.0", "--port", str(t.port), "--config", path]
    notes = []
    if t.nodes > 1:
        ranks = d.group * d.pp
        hosts = ",".join(f"{t.addr(k)}:{node}" for k in range(t.nodes))
        serve += ["--gpus_per_node", str(node)]
        forward = [a for name, _ in env for a in ("-x", name)]  # to every node's ranks
        argv = ["mpirun", "-H", hosts, "-n", str(ranks), *forward]
        argv += ["trtllm-llmapi-launch", *serve]
        notes.append(
            "TensorRT-LLM runs a multi-node server as one MPI job started from its head "
            "node (srun with trtllm-llmapi-launch works the same; "
            "examples/llm-api/llm_mgmn_trtllm_serve.sh)"
        )
    else:
        argv = serve
    return env, argv, {path: _yaml(options)}, notes


# Each engine's flags (and, for TensorRT-LLM, LLM API options) for the plan's degrees:
# the one place the degrees become the engine's, for its commands and the line that
# shows the mapping. vLLM's tensor-parallel size is the attention TP (its data-parallel
# ranks each hold one); SGLang's and TensorRT-LLM's is a stage's whole group, which
# their attention data parallelism splits.
EngineDegrees = tuple[list[str], dict[str, object]]


def _vllm_degrees(t: Server) -> EngineDegrees:
    d = t.plan.degrees
    argv = ["--tensor-parallel-size", str(d.tp)]
    if d.pp > 1:
        argv += ["--pipeline-parallel-size", str(d.pp)]
    if d.dp_attn > 1:
        argv += ["--data-parallel-size", str(d.dp_attn)]
    if "expert-parallel" in t.config.features:
        argv.append("--enable-expert-parallel")
    return argv, {}


def _sglang_degrees(t: Server) -> EngineDegrees:
    d = t.plan.degrees
    argv = ["--tp-size", str(d.group)]
    if d.pp > 1:
        argv += ["--pp-size", str(d.pp)]
    if d.dp_attn > 1:
        argv += ["--dp-size", str(d.dp_attn), "--enable-dp-attention", "--enable-dp-lm-head"]
    if d.ep > 1:
        argv += ["--ep-size", str(d.ep)]
    return argv, {}


def _trtllm_degrees(t: Server) -> EngineDegrees:
    d = t.plan.degrees
    argv = ["--tp_size", str(d.group), "--pp_size", str(d.pp)]
    options: dict[str, object] = {"enable_attention_dp": d.dp_attn > 1}
    if t.problem.model.is_moe:
        argv += ["--ep_size", str(d.ep)]
        options["moe_expert_parallel_size"] = d.ep
        options["moe_tensor_parallel_size"] = d.etp
    return argv, options


DEGREES = {"vllm": _vllm_degrees, "sglang": _sglang_degrees, "trtllm": _trtllm_degrees}


def degree_mapping(server: Server) -> str:
    """The plan's degrees and the engine's flags they become, on one line:
    ``plan pp=1 tp=1 dp_attn=8 ep=8 etp=1 -> --tp-size 8 --dp-size 8 ...``."""
    d = server.plan.degrees
    plan = f"plan pp={d.pp} tp={d.tp} dp_attn={d.dp_attn}"
    if server.problem.model.is_moe:
        plan += f" ep={d.ep} etp={d.etp}"
    argv, options = DEGREES[server.problem.engine](server)
    line = f"{plan} -> {' '.join(argv)}"
    if options:
        line += ", " + ", ".join(f"{k}: {json.dumps(v)}" for k, v in options.items())
        line += f" ({TRTLLM_CONFIG})"
    return line


def _yaml(options: dict[str, object]) -> str:
    """The LLM-API options as YAML (JSON scalars are YAML; the schema is strict)."""
    lines = []
    for key, value in options.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines += [f"  {k}: {json.dumps(v)}" for k, v in value.items()]
        else:
            lines.append(f"{key}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"


BUILDERS = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm}
