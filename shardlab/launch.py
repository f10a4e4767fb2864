"""A plan as its engine's own launch commands: plan in, commands (and config files) out.

The plan is first placed in the engine's space (:mod:`shardlab.problems.engines`):
a plan the engine cannot run is refused there, naming the option. Then every replica
becomes one server: a replica smaller than a node shares it with others (its own
``CUDA_VISIBLE_DEVICES`` and port), a larger one spans whole nodes, each node getting
the engine's multi-node flags (node count, node rank, the head node's address as a
placeholder). Replicas are independent servers; a router in front spreads requests.

Flags are the pinned versions' own (``shardlab/problems/data/engines/``, read off the
engines' argument definitions; ``tests/test_launch.py`` checks every flag printed
against them).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shardlab.errors import ShardlabError
from shardlab.problems.disagg import POOLS, DisaggPlan
from shardlab.problems.engines.base import EngineConfig
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem

TRTLLM_CONFIG = "extra-llm-api-config.yaml"
BASE_PORT = 8000
# Servers sharing a node are this many ports apart: SGLang takes port + 233 to + 239
# for its own use (srt/server_args.py:7302-7330).
PORT_STEP = 10
# Architectures whose MTP layers SGLang 0.5.14 drafts from the served checkpoint
# (srt/arg_groups/speculative_hook.py:290-306; kimi_k2 is DeepseekV3ForCausalLM).
SGLANG_MTP = frozenset({"deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe", "glm_moe_dsa"})


def _quote(arg: str) -> str:
    """Shell quoting that leaves the ``${NODE<i>_ADDR}`` placeholders to expand."""
    return arg if re.fullmatch(r"[\w@%+=:,./${}-]+", arg) else shlex.quote(arg)


@dataclass(frozen=True, kw_only=True)
class NodeCommand:
    replica: int
    node: int  # the cluster node it runs on (its head node, for a multi-node job)
    node_rank: int  # rank of that node within the replica's nodes
    nodes: int  # nodes of the replica
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]
    role: str = ""  # disaggregated serving: "prefill" or "decode"

    def shell(self) -> str:
        env = " ".join(f"{k}={_quote(v)}" for k, v in self.env)
        return (env + " " if env else "") + " ".join(_quote(a) for a in self.argv)

    def to_dict(self) -> dict[str, object]:
        return {
            "replica": self.replica,
            "node": self.node,
            "node_rank": self.node_rank,
            "nodes": self.nodes,
            "env": dict(self.env),
            "argv": list(self.argv),
            "shell": self.shell(),
            **({"role": self.role} if self.role else {}),
        }


@dataclass(frozen=True, kw_only=True)
class Launch:
    engine: str
    version: str
    features: tuple[str, ...]
    commands: tuple[NodeCommand, ...]
    files: tuple[tuple[str, str], ...] = ()  # (file name, content)
    notes: tuple[str, ...] = field(default=())
    router: tuple[str, ...] = ()  # disaggregated serving: what sends requests to the pools

    def router_shell(self) -> str:
        return " ".join(_quote(a) for a in self.router)

    def to_dict(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "version": self.version,
            "features": list(self.features),
            "commands": [c.to_dict() for c in self.commands],
            "files": [{"name": n, "content": c} for n, c in self.files],
            "notes": list(self.notes),
            **({"router": list(self.router)} if self.router else {}),
        }


@dataclass(frozen=True, kw_only=True)
class Target:
    """One node's server of one replica: what its engine command is made of."""

    problem: Problem
    plan: Plan
    config: EngineConfig
    model_path: str
    trust_remote_code: bool
    config_dir: str
    port: int
    first_node: int  # the cluster node of the replica's node rank 0
    node_rank: int
    nodes: int

    def addr(self, k: int) -> str:
        """The address of the replica's node ``k`` (a placeholder the user sets)."""
        return f"${{NODE{self.first_node + k}_ADDR}}"

    @property
    def head(self) -> str:
        return self.addr(0)


def build_launch(
    problem: Problem,
    plan: Plan,
    *,
    model_path: str,
    trust_remote_code: bool = False,
    config_dir: str = ".",
) -> Launch:
    """The launch commands of ``plan`` on ``problem.engine`` (refused in one line if the
    engine cannot run it)."""
    space = problem.with_space("engine").space
    config = space.configs[int(space.encode(plan)[0])]  # type: ignore[index]
    d = plan.degrees
    gpus = d.pp * d.group
    per_node, nodes = _tiling(problem.cluster.node_size, gpus)
    server = _Server(problem, plan, config, model_path, trust_remote_code, config_dir)
    commands: list[NodeCommand] = []
    files: dict[str, str] = {}
    notes: list[str] = []
    for r in range(d.replicas):
        if per_node:
            first, slot = r // per_node, r % per_node
            gpu0 = slot * gpus
        else:
            first, slot, gpu0 = r * nodes, 0, 0
        server.place(r, first, slot, gpu0, per_node > 1, commands, files, notes)
    if d.replicas > 1:
        notes.append(
            f"{d.replicas} replicas are {d.replicas} independent servers: put a router or "
            "load balancer in front of their ports"
        )
    if nodes > 1:
        notes.append(NODE_ADDR_NOTE)
    return Launch(
        engine=problem.engine,
        version=space.capability.version,  # type: ignore[union-attr]
        features=config.features,
        commands=tuple(commands),
        files=tuple(sorted(files.items())),
        notes=tuple(notes),
    )


NODE_ADDR_NOTE = (
    "set NODE<i>_ADDR to the address of cluster node i (the head node of each "
    "multi-node replica) before running"
)


def _tiling(node: int, gpus: int) -> tuple[int, int]:
    """(servers per node, nodes per server) of servers of ``gpus`` GPUs: servers of a
    node or less tile it, larger ones take whole nodes."""
    if gpus <= node:
        if node % gpus:
            raise ShardlabError(
                f"plan: a replica of {gpus} GPUs does not tile {node}-GPU nodes; use degrees "
                "whose GPUs per replica divide a node or are whole nodes"
            )
        return node // gpus, 1
    if gpus % node:
        raise ShardlabError(
            f"plan: a replica of {gpus} GPUs spans part of a {node}-GPU node; use "
            "degrees whose GPUs per replica are whole nodes"
        )
    return 0, gpus // node


@dataclass(frozen=True)
class _Server:
    """What every server of one plan shares; :meth:`place` adds one server's node
    commands (``extra``: a role's own arguments and environment, per target)."""

    problem: Problem
    plan: Plan
    config: EngineConfig
    model_path: str
    trust_remote_code: bool
    config_dir: str

    def place(
        self,
        replica: int,
        first: int,
        slot: int,
        gpu0: int,
        share: bool,
        commands: list[NodeCommand],
        files: dict[str, str],
        notes: list[str],
        extra: Callable[[Target], tuple[list[tuple[str, str]], list[str]]] | None = None,
        role: str = "",
    ) -> list[Target]:
        """Server ``replica``: on node ``first`` from GPU ``gpu0`` (``share``: other
        servers use the rest of the node: it sees only its own GPUs), ``slot`` of the
        node's servers (its port), or on whole nodes from ``first``."""
        d = self.plan.degrees
        gpus = d.pp * d.group
        _, nodes = _tiling(self.problem.cluster.node_size, gpus)
        env: list[tuple[str, str]] = []
        if share:
            env = [("CUDA_VISIBLE_DEVICES", ",".join(str(g) for g in range(gpu0, gpu0 + gpus)))]
        port = BASE_PORT + PORT_STEP * slot
        targets = []
        for k in range(nodes):
            target = Target(
                problem=self.problem,
                plan=self.plan,
                config=self.config,
                model_path=self.model_path,
                trust_remote_code=self.trust_remote_code,
                config_dir=self.config_dir,
                port=port,
                first_node=first,
                node_rank=k,
                nodes=nodes,
            )
            targets.append(target)
            out = _BUILDERS[self.problem.engine](target)
            if out is None:  # the engine starts every node from the head's command
                continue
            more_env, argv, made, said = out
            if extra is not None:
                role_env, role_argv = extra(target)
                more_env, argv = more_env + role_env, argv + role_argv
            files.update(made)
            notes += [n for n in said if n not in notes]
            commands.append(
                NodeCommand(
                    replica=replica,
                    node=first + k,
                    node_rank=k,
                    nodes=nodes,
                    env=tuple(env + more_env),
                    argv=tuple(argv),
                    role=role,
                )
            )
        return targets


# Disaggregated serving (shardlab.problems.disagg): each pool's servers with the
# engine's own disaggregation arguments, and the router that sends requests to them.
# SGLang 0.5.14: --disaggregation-mode prefill|decode, --disaggregation-transfer-backend
# (default mooncake), --disaggregation-bootstrap-port (default 8998) on the prefill
# servers (srt/server_args.py:2223-2241); the router of sglang-router 0.3.2
# (router_args.py:345-364, prefill URLs with their bootstrap ports at 975-1012).
# vLLM 0.24.0: --kv-transfer-config (engine/arg_utils.py:1510-1511) with NixlConnector
# (distributed/kv_transfer/kv_connector/factory.py) as kv_producer / kv_consumer
# (config/kv_transfer.py:11-13); its side channel on VLLM_NIXL_SIDE_CHANNEL_HOST/PORT
# (envs.py:198-199), the port plus the DP rank (nixl/base_scheduler.py:64-68).
ROUTER_PORT = 30000
SGLANG_BOOTSTRAP_PORT = 8998
NIXL_PORT = 5600
VLLM_PROXY_NOTE = (
    "toy_proxy_server.py is vLLM's example proxy for NixlConnector "
    "(tests/v1/kv_connector/nixl_integration/ in the vLLM repository; it is not in the "
    "wheel): copy it from the vLLM source of your version"
)


def build_disagg_launch(
    problem: Problem,
    plan: DisaggPlan,
    *,
    model_path: str,
    trust_remote_code: bool = False,
    config_dir: str = ".",
) -> Launch:
    """The servers of both pools of a disaggregated ``plan`` (instances placed as
    :func:`shardlab.problems.disagg.fits` does: whole-node ones first, the others
    filling nodes) and the router in front of them."""
    engine = problem.engine
    if engine == "trtllm":
        raise ShardlabError(
            "shardlab launch: TensorRT-LLM's disaggregated serving (cache_transceiver_config, "
            "trtllm-serve disaggregated) is not checked against 1.3.0rc3 yet; use --engine "
            "vllm or sglang"
        )
    from shardlab.costmodel import pool_problems

    node = problem.cluster.node_size
    pools = dict(zip(POOLS, pool_problems(problem, plan), strict=True))
    servers = {}
    for name in POOLS:
        pool = pools[name].with_space("engine")
        pool_plan: Plan = getattr(plan, name)
        space = pool.space
        config = space.configs[int(space.encode(pool_plan)[0])]  # type: ignore[index]
        servers[name] = _Server(pool, pool_plan, config, model_path, trust_remote_code, config_dir)
    # (GPUs, pool, instance), largest first: whole nodes, then nodes filled in order
    order = sorted(
        (
            (plan.gpus(name), name, i)
            for name in POOLS
            for i in range(getattr(plan, f"{name}_instances"))
        ),
        key=lambda x: (-x[0], POOLS.index(x[1]), x[2]),
    )
    commands: list[NodeCommand] = []
    files: dict[str, str] = {}
    notes: list[str] = []
    endpoints: dict[str, list[tuple[str, int, int]]] = {name: [] for name in POOLS}
    next_node, filling, used, slot_of = 0, -1, node, 0
    for gpus, name, i in order:
        if gpus >= node:
            first, slot, gpu0, share = next_node, 0, 0, False
            next_node += gpus // node
        else:
            if used + gpus > node:
                filling, used, slot_of = next_node, 0, 0
                next_node += 1
            first, slot, gpu0, share = filling, slot_of, used, gpus < node
            used, slot_of = used + gpus, slot_of + 1
        targets = servers[name].place(
            i,
            first,
            slot,
            gpu0,
            share,
            commands,
            files,
            notes,
            extra=lambda t, role=name, slot=slot: _disagg_args(t, role, slot),
            role=name,
        )
        endpoints[name].append((targets[0].head, targets[0].port, slot))
    router, said = _router(engine, endpoints)
    notes += said
    notes.append(
        f"{plan.label()}: the prefill servers hand each prompt's KV cache to the decode "
        f"servers; send requests to the router (port {ROUTER_PORT})"
    )
    if next_node > 1:
        notes.append(NODE_ADDR_NOTE)
    capability = pools["prefill"].with_space("engine").space.capability
    return Launch(
        engine=engine,
        version=capability.version,  # type: ignore[union-attr]
        features=tuple(dict.fromkeys(f for s in servers.values() for f in s.config.features)),
        commands=tuple(commands),
        files=tuple(sorted(files.items())),
        notes=tuple(notes),
        router=tuple(router),
    )


def _disagg_args(t: Target, role: str, slot: int) -> tuple[list[tuple[str, str]], list[str]]:
    """A server's own disaggregation arguments (and environment) for its ``role``."""
    engine = t.problem.engine
    if engine == "sglang":
        argv = ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "mooncake"]
        if role == "prefill":  # servers sharing a node each take their own port
            argv += [
                "--disaggregation-bootstrap-port",
                str(SGLANG_BOOTSTRAP_PORT + PORT_STEP * slot),
            ]
        return [], argv
    # vLLM: each node's NIXL side channel on its own address, ports a node of DP ranks apart
    kv = {
        "kv_connector": "NixlConnector",
        "kv_role": f"kv_{'producer' if role == 'prefill' else 'consumer'}",
    }
    port = NIXL_PORT + t.problem.cluster.node_size * slot
    env = [
        ("VLLM_NIXL_SIDE_CHANNEL_HOST", t.addr(t.node_rank)),
        ("VLLM_NIXL_SIDE_CHANNEL_PORT", str(port)),
    ]
    return env, ["--kv-transfer-config", json.dumps(kv, separators=(",", ":"))]


def _router(
    engine: str, endpoints: dict[str, list[tuple[str, int, int]]]
) -> tuple[list[str], list[str]]:
    """The router's command, and what to know about it."""
    if engine == "sglang":
        argv = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        for addr, port, slot in endpoints["prefill"]:
            argv += [
                "--prefill",
                f"http://{addr}:{port}",
                str(SGLANG_BOOTSTRAP_PORT + PORT_STEP * slot),
            ]
        for addr, port, _ in endpoints["decode"]:
            argv += ["--decode", f"http://{addr}:{port}"]
        argv += ["--host", "0.0.0.0", "--port", str(ROUTER_PORT)]
        return argv, ["the router is the sglang-router package (pip install sglang-router)"]
    argv = ["python", "toy_proxy_server.py", "--host", "0.0.0.0", "--port", str(ROUTER_PORT)]
    for flag, name in (("prefiller", "prefill"), ("decoder", "decode")):
        argv += [f"--{flag}-hosts", *(a for a, _, _ in endpoints[name])]
        argv += [f"--{flag}-ports", *(str(p) for _, p, _ in endpoints[name])]
    return argv, [VLLM_PROXY_NOTE]


BuildOut = tuple[list[tuple[str, str]], list[str], dict[str, str], list[str]] | None


def _partition(plan: Plan) -> str:
    return ",".join(str(n) for n in plan.stage_layers)


def _vllm(t: Target) -> BuildOut:
    problem, plan, config = t.problem, t.plan, t.config
    d, w, f = plan.degrees, problem.workload, set(config.features)
    node = problem.cluster.node_size
    notes: list[str] = []
    argv = ["vllm", "serve", t.model_path, "--tensor-parallel-size", str(d.tp)]
    env: list[tuple[str, str]] = []
    if d.pp > 1:
        argv += ["--pipeline-parallel-size", str(d.pp)]
        env.append(("VLLM_PP_LAYER_PARTITION", _partition(plan)))
    if d.dp_attn > 1:
        argv += ["--data-parallel-size", str(d.dp_attn)]
    if "expert-parallel" in f:
        argv.append("--enable-expert-parallel")
    if "deepep" in f:
        mode = "low_latency" if w.phase == "decode" else "high_throughput"
        argv += ["--all2all-backend", f"deepep_{mode}"]
    if "sequence-parallel" in f:  # in every step, as priced (not above a token count)
        sp = {"pass_config": {"enable_sp": True, "sp_min_token_num": 1}}
        argv += ["--compilation-config", json.dumps(sp)]
    if plan.concurrency is not None:
        argv += ["--max-num-seqs", str(plan.concurrency)]  # per DP engine core
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
                argv += ["--data-parallel-start-rank", str(t.node_rank * local), "--headless"]
        else:  # a DP rank over several nodes: TP / PP over them, multiprocessing backend
            if d.dp_attn > 1:
                notes.append(
                    "vLLM data parallel ranks that span nodes use --nnodes/--node-rank with "
                    "the mp backend (vllm/engine/arg_utils.py:1910-1939); vLLM's guides show "
                    "only -dpl or Ray for data parallel over nodes"
                )
            argv += ["--nnodes", str(t.nodes), "--node-rank", str(t.node_rank)]
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
            "(srt/server_args.py:6651-6654); drop --draft-tokens or use pp = 1"
        )
    if w.draft_tokens and problem.model.architecture not in SGLANG_MTP:
        raise ShardlabError(
            f"--draft-tokens: SGLang 0.5.14 drafts with the served checkpoint's MTP layers "
            f"only for DeepSeek-V3/V3.2, Kimi-K2 and GLM (not {problem.model.architecture}; "
            "srt/arg_groups/speculative_hook.py:290-306); drop --draft-tokens"
        )
    notes = []
    if d.dp_attn > 1 and d.ep > 1 and "deepep" not in f:
        notes.append(
            "SGLang DP attention with --ep-size > 1 on the default MoE backend was reported "
            "to give wrong logits (sgl-project/sglang#23729, closed); check the outputs"
        )
    argv = ["python", "-m", "sglang.launch_server", "--model-path", t.model_path]
    argv += ["--tp-size", str(d.group)]
    env: list[tuple[str, str]] = []
    if d.pp > 1:
        argv += ["--pp-size", str(d.pp)]
        env.append(("SGLANG_PP_LAYER_PARTITION", _partition(plan)))
    if d.dp_attn > 1:
        argv += ["--dp-size", str(d.dp_attn), "--enable-dp-attention", "--enable-dp-lm-head"]
    if d.ep > 1:
        argv += ["--ep-size", str(d.ep)]
    if "deepep" in f:
        argv += ["--moe-a2a-backend", "deepep"]
    if "dense-tp1" in f:
        argv += ["--moe-dense-tp-size", "1"]
    if plan.concurrency is not None:  # the server's limit, divided over its DP ranks
        argv += ["--max-running-requests", str(plan.concurrency * d.dp_attn)]
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
        argv += ["--nnodes", str(t.nodes), "--node-rank", str(t.node_rank)]
        argv += ["--dist-init-addr", f"{t.head}:5000"]
    argv += ["--host", "0.0.0.0", "--port", str(t.port)]
    return env, argv, {}, notes


def _trtllm(t: Target) -> BuildOut:
    problem, plan, config = t.problem, t.plan, t.config
    if t.node_rank:
        return None  # one MPI job starts every rank from the head node
    d, w, f = plan.degrees, problem.workload, set(config.features)
    node = problem.cluster.node_size
    options: dict[str, object] = {"enable_attention_dp": d.dp_attn > 1}
    if problem.model.is_moe:
        options["moe_expert_parallel_size"] = d.ep
        options["moe_tensor_parallel_size"] = d.etp
    if d.pp > 1:
        options["pp_partition"] = list(plan.stage_layers)
    if problem.kv_dtype == "fp8":
        options["kv_cache_config"] = {"dtype": "fp8"}
    if w.draft_tokens:
        options["speculative_config"] = {
            "decoding_type": "MTP",
            "num_nextn_predict_layers": w.draft_tokens,
        }
    env: list[tuple[str, str]] = []
    if "nvlink-alltoall" in f:
        env.append(("TRTLLM_FORCE_COMM_METHOD", "NVLINK_ONE_SIDED"))
    elif "deepep" in f:
        env += [("TRTLLM_CAN_USE_DEEP_EP", "1"), ("TRTLLM_FORCE_COMM_METHOD", "DEEPEP")]
    elif d.dp_attn > 1 and d.ep > 1:  # the all-gather the plan was priced with
        env.append(("TRTLLM_FORCE_COMM_METHOD", "ALLGATHER"))
    path = str(Path(t.config_dir) / TRTLLM_CONFIG)
    serve = ["trtllm-serve", t.model_path, "--backend", "pytorch"]
    serve += ["--tp_size", str(d.group), "--pp_size", str(d.pp)]
    if problem.model.is_moe:
        serve += ["--ep_size", str(d.ep)]
    if plan.concurrency is not None:  # it admits pp x max_batch_size requests
        # (tensorrt_llm/_torch/pyexecutor/model_engine.py:1334-1339)
        serve += ["--max_batch_size", str(-(-plan.concurrency // d.pp))]
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


_BUILDERS = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm}
