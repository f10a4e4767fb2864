"""A plan's servers as groups of identical pods, with the command each pod runs.

A server on one node (or part of one) is one pod; a server over several nodes is a
LeaderWorkerSet group of that many pods, the leader running node rank 0's command and
every worker one command over LWS's variables (``LWS_LEADER_ADDRESS``,
``LWS_WORKER_INDEX``). The commands are :mod:`shardlab.launch_engines`' own, built for
pods (:attr:`~shardlab.launch_engines.Target.in_pods`): the flags, degrees and per-rank
limits are those ``--target shell`` prints. Each pod owns its GPUs (the device plugin
hands them out), so no ``CUDA_VISIBLE_DEVICES``, and every server listens on one port.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from shardlab.launch import BASE_PORT, NodeCommand, disagg_args, pool_server, tiling
from shardlab.launch_engines import BUILDERS, Server, Target
from shardlab.problems.disagg import POOLS, DisaggPlan
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem

# Where pods find the config files a server takes (a ConfigMap mounted there).
POD_CONFIG_DIR = "/etc/shardlab"
PORT = BASE_PORT


@dataclass(frozen=True, kw_only=True)
class PodGroup:
    """``instances`` identical servers, each ``nodes`` pods of ``gpus_per_pod`` GPUs."""

    role: str  # serve (aggregated), prefill or decode
    name: str  # the part of the objects' names that tells the groups apart
    server: Server
    instances: int
    nodes: int
    gpus_per_pod: int
    leader: NodeCommand  # the only pod's command when nodes == 1
    worker: NodeCommand | None
    # the server's command as on one node (its degrees and limits, no node flags): for
    # operators that add the multi-node flags themselves (Dynamo)
    flat: NodeCommand
    files: tuple[tuple[str, str], ...]
    notes: tuple[str, ...]

    @property
    def engine(self) -> str:
        return self.server.problem.engine

    @property
    def gpu(self) -> str:
        return self.server.problem.cluster.accelerator.key


def _group(server: Server, role: str, name: str, instances: int) -> PodGroup:
    d = server.plan.degrees
    gpus = d.pp * d.group
    node = server.problem.cluster.node_size
    _, nodes = tiling(node, gpus)  # refuses a server that does not tile nodes
    commands: list[NodeCommand | None] = []
    files: dict[str, str] = {}
    notes: list[str] = []
    # the leader, one command for every worker, and the server as on one node
    for k, n in [*((k, nodes) for k in range(min(nodes, 2))), (0, 1)]:
        target = Target(
            **{f.name: getattr(server, f.name) for f in fields(Server)},
            port=PORT,
            first_node=0,
            node_rank=k,
            nodes=n,
            in_pods=True,
        )
        out = BUILDERS[server.problem.engine](target)
        if out is None:
            commands.append(None)
            continue
        env, argv, made, said = out
        if n == 1 and nodes > 1:  # the flat form only: its files and notes are the leader's
            made, said = {}, []
        if role in POOLS:
            role_env, role_argv = disagg_args(target, role, 0)
            env, argv = env + role_env, argv + role_argv
        files.update(made)
        notes += [n for n in said if n not in notes]
        commands.append(
            NodeCommand(
                replica=0, node=k, node_rank=k, nodes=nodes, env=tuple(env), argv=tuple(argv)
            )
        )
    leader, flat = commands[0], commands[-1]
    assert leader is not None and flat is not None  # every engine starts on node rank 0
    return PodGroup(
        role=role,
        name=name,
        server=server,
        instances=instances,
        nodes=nodes,
        gpus_per_pod=gpus if nodes == 1 else node,
        leader=leader,
        worker=commands[1] if nodes > 1 else None,
        flat=flat,
        files=tuple(sorted(files.items())),
        notes=tuple(notes),
    )


def plan_groups(
    problem: Problem, plan: Plan, *, model_path: str, trust_remote_code: bool = False
) -> list[PodGroup]:
    """An aggregated plan: one group of its replicas."""
    server = pool_server(problem, plan, model_path, trust_remote_code, POD_CONFIG_DIR)
    return [_group(server, "serve", "serve", plan.degrees.replicas)]


def disagg_groups(
    problem: Problem, plan: DisaggPlan, *, model_path: str, trust_remote_code: bool = False
) -> list[PodGroup]:
    """A disaggregated plan: its prefill group and its decode group."""
    from shardlab.costmodel import pool_problems

    pools = dict(zip(POOLS, pool_problems(problem, plan), strict=True))
    return [
        _group(
            pool_server(pools[r], getattr(plan, r), model_path, trust_remote_code, POD_CONFIG_DIR),
            r,
            r,
            getattr(plan, f"{r}_instances"),
        )
        for r in POOLS
    ]


def sized_groups(
    pools: list, *, model_path: str, trust_remote_code: bool = False
) -> list[PodGroup]:
    """A sized deployment (:class:`~shardlab.launch.PoolLaunch` each): one group per
    pool, on its own GPU type."""
    out = []
    for p in pools:
        server = pool_server(p.problem, p.plan, model_path, trust_remote_code, POD_CONFIG_DIR)
        gpu = p.problem.cluster.accelerator.key
        role = p.role if p.role in POOLS else "serve"
        name = f"{role}-{gpu}-x{p.plan.degrees.num_gpus}" if role == "serve" else role
        out.append(_group(server, role, name, p.instances))
    return out
