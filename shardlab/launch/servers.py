"""A plan as its engine's own launch commands: plan in, commands (and config files) out.

The plan is first placed in the engine's space (:mod:`shardlab.problems.engines`):
a plan the engine cannot run is refused there, naming the option. Then every replica
becomes one server: a replica smaller than a node shares it with others (its own
``CUDA_VISIBLE_DEVICES`` and port), a larger one spans whole nodes, each node getting
the engine's multi-node flags (node count, node rank, the head node's address as a
placeholder). Replicas are independent servers; a router in front spreads requests.

Each engine's own command for one node is built in :mod:`shardlab.launch.engines`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from shardlab.errors import ShardlabError
from shardlab.launch.engines import BUILDERS, Server, Target, degree_mapping
from shardlab.launch.hardware import rocm_note
from shardlab.problems.disagg import POOLS, DisaggPlan, in_one_domain
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem

BASE_PORT = 8000
# Servers sharing a node are this many ports apart: SGLang takes port + 233 to + 239
# for its own use (srt/server_args.py:7302-7330).
PORT_STEP = 10


def shell_quote(arg: str) -> str:
    """Shell quoting that leaves the ``${NODE<i>_ADDR}`` placeholders (in pods, LWS's
    variables and ``$((LWS_WORKER_INDEX*n))``) to expand."""
    if re.fullmatch(r"[\w@%+=:,./${}-]+", arg) or re.fullmatch(r"\$\(\(\w+\*\d+\)\)", arg):
        return arg
    return shlex.quote(arg)


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
        env = " ".join(f"{k}={shell_quote(v)}" for k, v in self.env)
        return (env + " " if env else "") + " ".join(shell_quote(a) for a in self.argv)

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
    # per group of identical servers: the plan's degrees and the engine's flags for them
    degree_flags: tuple[str, ...] = ()

    def router_shell(self) -> str:
        return " ".join(shell_quote(a) for a in self.router)

    def heredocs(self, command: NodeCommand) -> list[str]:
        """Shell lines that write the config files ``command`` reads, on its node (a
        here-document each): printed commands then need no file written where shardlab
        ran, and each node gets the file it reads."""
        return [
            f"cat > {shell_quote(name)} <<'EOF'\n{content}EOF"
            for name, content in self.files
            if name in command.argv
        ]

    def to_dict(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "version": self.version,
            "features": list(self.features),
            "commands": [c.to_dict() for c in self.commands],
            "files": [{"name": n, "content": c} for n, c in self.files],
            "notes": list(self.notes),
            "degree_flags": list(self.degree_flags),
            **({"router": list(self.router)} if self.router else {}),
        }


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
    per_node, nodes = tiling(problem.cluster.host_size, gpus)
    server = Server(
        problem=problem,
        plan=plan,
        config=config,
        model_path=model_path,
        trust_remote_code=trust_remote_code,
        config_dir=config_dir,
    )
    commands: list[NodeCommand] = []
    files: dict[str, str] = {}
    notes: list[str] = []
    for r in range(d.replicas):
        if per_node:
            first, slot = r // per_node, r % per_node
            gpu0 = slot * gpus
        else:
            first, slot, gpu0 = r * nodes, 0, 0
        _place(server, r, first, slot, gpu0, per_node > 1, commands, files, notes)
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
        degree_flags=(degree_mapping(server),),
    )


NODE_ADDR_NOTE = (
    "set NODE<i>_ADDR to the address of cluster node i (the head node of each "
    "multi-node replica) before running"
)


def tiling(node: int, gpus: int) -> tuple[int, int]:
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


def _place(
    server: Server,
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
    """Add the node commands of instance ``replica`` of ``server`` (``extra``: a role's
    own arguments and environment, per target): on node ``first`` from GPU ``gpu0``
    (``share``: other servers use the rest of the node: it sees only its own GPUs),
    ``slot`` of the node's servers (its port), or on whole nodes from ``first``."""
    d = server.plan.degrees
    gpus = d.pp * d.group
    _, nodes = tiling(server.problem.cluster.host_size, gpus)
    env: list[tuple[str, str]] = []
    if share:  # ROCm honours it too: HIP reads it, and vLLM's ROCm platform controls
        # devices with it (vllm/platforms/rocm.py, device_control_env_var)
        env = [("CUDA_VISIBLE_DEVICES", ",".join(str(g) for g in range(gpu0, gpu0 + gpus)))]
    port = BASE_PORT + PORT_STEP * slot
    said = rocm_note(server.problem.engine, server.problem.cluster.accelerator)
    notes += [n for n in said if n not in notes]
    targets = []
    for k in range(nodes):
        target = Target(
            **{f.name: getattr(server, f.name) for f in fields(Server)},
            port=port,
            first_node=first,
            node_rank=k,
            nodes=nodes,
        )
        targets.append(target)
        out = BUILDERS[server.problem.engine](target)
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
        raise ShardlabError(TRTLLM_DISAGG, field="engine", fix="launch it on vllm or sglang")
    from shardlab.costmodel import pool_problems

    pools = dict(zip(POOLS, pool_problems(problem, plan), strict=True))
    servers = {
        name: pool_server(pools[name], getattr(plan, name), model_path, trust_remote_code,
                           config_dir)
        for name in POOLS
    }  # fmt: skip
    spots, nodes_used = _disagg_spots(plan, problem.cluster.host_size)
    cluster = problem.cluster
    nvlink = cluster.domain_size > cluster.host_size and in_one_domain(cluster, plan.num_gpus)
    return _serve(
        engine,
        [(servers[name], i, first, slot, gpu0, share, name) for name, i, first, slot, gpu0,
         share in spots],
        nodes_used,
        f"{plan.label()}: the prefill servers hand each prompt's KV cache to the decode "
        f"servers; send requests to the router (port {ROUTER_PORT})",
        kv_over_nvlink=nvlink,
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class PoolLaunch:
    """One pool of a sized deployment: ``instances`` servers of ``plan`` (one instance,
    ``replicas = 1``) on ``problem``'s GPU type (its cluster one instance)."""

    role: str  # agg, prefill or decode
    problem: Problem
    plan: Plan
    instances: int


def build_pools_launch(
    pools: list[PoolLaunch],
    *,
    model_path: str,
    trust_remote_code: bool = False,
    config_dir: str = ".",
) -> Launch:
    """The servers of a deployment sized over GPU types (:mod:`shardlab.sizing`): each
    pool on nodes of its own type, numbered after the previous pool's; a prefill and
    a decode pool get the engine's disaggregation arguments and a router, aggregated
    pools a note on weighting the router by capacity."""
    engine = pools[0].problem.engine
    disagg = any(p.role != "agg" for p in pools)
    if disagg and engine == "trtllm":
        raise ShardlabError(TRTLLM_DISAGG, field="engine", fix="size it for vllm or sglang")
    placed: list[tuple[Server, int, int, int, int, bool, str]] = []
    node_base = 0
    for pool in pools:
        server = pool_server(pool.problem, pool.plan, model_path, trust_remote_code, config_dir)
        node = pool.problem.cluster.accelerator.gpus_per_node
        gpus = pool.plan.degrees.num_gpus
        per_node, nodes = tiling(node, gpus)
        key = pool.problem.cluster.accelerator.key
        role = pool.role if pool.role in POOLS else f"{key} x{gpus}"
        for i in range(pool.instances):
            if per_node:
                first, slot = node_base + i // per_node, i % per_node
                placed.append((server, i, first, slot, slot * gpus, per_node > 1, role))
            else:
                placed.append((server, i, node_base + i * nodes, 0, 0, False, role))
        node_base += -(-pool.instances * gpus // node)
    if disagg:
        label = " + ".join(f"{p.instances} {p.role} x {p.plan.degrees.num_gpus} "
                           f"{p.problem.cluster.accelerator.key}" for p in pools)  # fmt: skip
        return _serve(
            engine,
            placed,
            node_base,
            f"{label}: the prefill servers hand each prompt's KV cache to the decode servers "
            f"over the network; send requests to the router (port {ROUTER_PORT})",
        )
    launch = _serve(engine, placed, node_base, "")
    weights = ", ".join(f"{p.problem.cluster.accelerator.key} x{p.plan.degrees.num_gpus}: "
                        f"{p.instances} server(s)" for p in pools)  # fmt: skip
    return dataclasses.replace(
        launch,
        notes=(
            *launch.notes,
            f"put one router in front of every server ({weights}); weight each by its "
            "capacity (`shardlab size` reports instance_capacity_rps)",
        ),
    )


TRTLLM_DISAGG = (
    "TensorRT-LLM's disaggregated serving (cache_transceiver_config, trtllm-serve "
    "disaggregated) is not checked against 1.3.0rc3 yet"
)


# Both pools of a disaggregated plan in one rack-scale NVLink domain were priced to hand
# the KV cache over NVLink: Mooncake (SGLang's transfer backend here) takes it only when
# forced, as NVIDIA Dynamo's GB200 recipe sets it.
KV_MNNVL_ENV = {"sglang": [("MC_FORCE_MNNVL", "1")]}
KV_MNNVL_NOTE = (
    "both pools are in one NVLink domain and were priced to hand the KV cache over it: "
    "run them on hosts of one NVL72 rack, with the transfer library's multi-node NVLink on"
)


def _serve(
    engine: str,
    placed: list[tuple[Server, int, int, int, int, bool, str]],
    nodes_used: int,
    label: str,
    *,
    kv_over_nvlink: bool = False,
) -> Launch:
    """Every placed server's node commands (role ``prefill``/``decode``: with the
    engine's disaggregation arguments, and the router in front; any other role only
    names the server's pool; ``kv_over_nvlink``: the pools hand the KV cache over a
    rack's NVLink)."""
    commands: list[NodeCommand] = []
    files: dict[str, str] = {}
    notes: list[str] = []
    endpoints: dict[str, list[tuple[str, int, int]]] = {name: [] for name in POOLS}
    for server, i, first, slot, gpu0, share, role in placed:
        pd = role in POOLS
        targets = _place(
            server,
            i,
            first,
            slot,
            gpu0,
            share,
            commands,
            files,
            notes,
            extra=(lambda t, role=role, slot=slot: _kv_args(t, role, slot, kv_over_nvlink))
            if pd
            else None,
            role=role,
        )
        if pd:
            endpoints[role].append((targets[0].head, targets[0].port, slot))
    router: list[str] = []
    if endpoints["prefill"]:
        router, said = _router(engine, endpoints)
        notes += said
    if label:
        notes.append(label)
    if kv_over_nvlink:
        notes.append(KV_MNNVL_NOTE)
    if nodes_used > 1:
        notes.append(NODE_ADDR_NOTE)
    capability = placed[0][0].problem.with_space("engine").space.capability
    features = tuple(dict.fromkeys(f for p in placed for f in p[0].config.features))
    return Launch(
        engine=engine,
        version=capability.version,  # type: ignore[union-attr]
        features=features,
        commands=tuple(commands),
        files=tuple(sorted(files.items())),
        notes=tuple(notes),
        router=tuple(router),
        degree_flags=tuple(
            dict.fromkeys(f"{role}: {degree_mapping(server)}" for server, *_, role in placed)
        ),
    )


def pool_server(
    pool: Problem, pool_plan: Plan, model_path: str, trust_remote_code: bool, config_dir: str
) -> Server:
    """What every server of one pool shares: its plan placed in its engine's space."""
    pool = pool.with_space("engine")
    space = pool.space
    config = space.configs[int(space.encode(pool_plan)[0])]  # type: ignore[index]
    return Server(
        problem=pool,
        plan=pool_plan,
        config=config,
        model_path=model_path,
        trust_remote_code=trust_remote_code,
        config_dir=config_dir,
    )


def _disagg_spots(
    plan: DisaggPlan, node: int
) -> tuple[list[tuple[str, int, int, int, int, bool]], int]:
    """Where each instance of both pools runs, largest first: whole-node instances on
    nodes of their own, the others filling nodes in order. Each spot is (pool,
    instance, first node, slot on the node, first GPU, shares the node); with the
    number of nodes used."""
    order = sorted(
        (
            (plan.gpus(name), name, i)
            for name in POOLS
            for i in range(getattr(plan, f"{name}_instances"))
        ),
        key=lambda x: (-x[0], POOLS.index(x[1]), x[2]),
    )
    spots = []
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
        spots.append((name, i, first, slot, gpu0, share))
    return spots, next_node


def _kv_args(
    t: Target, role: str, slot: int, kv_over_nvlink: bool
) -> tuple[list[tuple[str, str]], list[str]]:
    env, argv = disagg_args(t, role, slot)
    if kv_over_nvlink:
        env = env + KV_MNNVL_ENV.get(t.problem.engine, [])
    return env, argv


def disagg_args(t: Target, role: str, slot: int) -> tuple[list[tuple[str, str]], list[str]]:
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
    port = NIXL_PORT + t.problem.cluster.host_size * slot
    env = [
        ("VLLM_NIXL_SIDE_CHANNEL_HOST", "${POD_IP}" if t.in_pods else t.addr(t.node_rank)),
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
