"""A plan's servers as groups of identical pods, with the command each pod runs.

A server on one node (or part of one) is one pod; a server over several nodes is a
LeaderWorkerSet group of that many pods, the leader running node rank 0's command and
every worker one command over LWS's variables (``LWS_LEADER_ADDRESS``,
``LWS_WORKER_INDEX``). The commands are :mod:`shardlab.launch.engines`' own, built for
pods (:attr:`~shardlab.launch.engines.Target.in_pods`): the flags, degrees and per-rank
limits are those ``--target shell`` prints. Each pod owns its GPUs (the device plugin
hands them out), so no ``CUDA_VISIBLE_DEVICES``, and every server listens on one port.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

from shardlab.errors import ShardlabError
from shardlab.launch.engines import BUILDERS, Server, Target
from shardlab.launch.servers import (
    BASE_PORT,
    NodeCommand,
    PoolLaunch,
    disagg_args,
    pool_server,
    tiling,
)
from shardlab.problems.disagg import POOLS, DisaggPlan, in_one_domain
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
    # the server's command as on one node (its degrees and limits, no node flags): for
    # operators that add the multi-node flags themselves (Dynamo)
    flat: NodeCommand
    pods: tuple[NodeCommand, ...]  # the leader's, then one for every worker; () if refused
    refusal: ShardlabError | None  # why the pods' own commands cannot be written
    files: tuple[tuple[str, str], ...]
    notes: tuple[str, ...]
    # disaggregated pools priced to hand the KV cache over one rack-scale NVLink domain
    # (shardlab.problems.disagg.in_one_domain): every pod of both pools needs its IMEX
    # channel, from one ComputeDomain they share
    kv_over_nvlink: bool = False

    @property
    def engine(self) -> str:
        return self.server.problem.engine

    @property
    def gpu(self) -> str:
        return self.server.problem.cluster.accelerator.key

    @property
    def leader(self) -> NodeCommand:
        """Node rank 0's command (the only pod's, on one node)."""
        if self.refusal is not None:
            raise self.refusal
        return self.pods[0]

    @property
    def worker(self) -> NodeCommand | None:
        """Every worker pod's command (over LWS's variables), if several nodes."""
        if self.refusal is not None:
            raise self.refusal
        return self.pods[1] if self.nodes > 1 else None


def _command(
    server: Server, role: str, k: int, nodes: int
) -> tuple[NodeCommand | None, dict, list]:
    target = Target(
        **{f.name: getattr(server, f.name) for f in fields(Server)},
        port=PORT,
        first_node=0,
        node_rank=k,
        nodes=nodes,
        in_pods=True,
    )
    out = BUILDERS[server.problem.engine](target)
    if out is None:
        return None, {}, []
    env, argv, files, notes = out
    if role in POOLS:
        role_env, role_argv = disagg_args(target, role, 0)
        env, argv = env + role_env, argv + role_argv
    command = NodeCommand(
        replica=0, node=k, node_rank=k, nodes=nodes, env=tuple(env), argv=tuple(argv)
    )
    return command, files, notes


def _group(server: Server, role: str, name: str, instances: int) -> PodGroup:
    d = server.plan.degrees
    gpus = d.pp * d.group
    node = server.problem.cluster.host_size
    _, nodes = tiling(node, gpus)  # refuses a server that does not tile nodes
    flat, files, notes = _command(server, role, 0, 1)
    assert flat is not None  # every engine starts its server on node rank 0
    pods: list[NodeCommand] = []
    refusal = None
    if nodes == 1:
        pods = [flat]
    else:
        try:  # the leader, and one command for every worker
            for k in (0, 1):
                command, more_files, more_notes = _command(server, role, k, nodes)
                if command is not None:
                    pods.append(command)
                files.update(more_files)
                notes += [n for n in more_notes if n not in notes]
        except ShardlabError as exc:  # an operator may still start it (Dynamo)
            pods, refusal = [], exc
    return PodGroup(
        role=role,
        name=name,
        server=server,
        instances=instances,
        nodes=nodes,
        gpus_per_pod=gpus if nodes == 1 else node,
        flat=flat,
        pods=tuple(pods),
        refusal=refusal,
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
    cluster = problem.cluster
    shared = cluster.domain_size > cluster.host_size and in_one_domain(cluster, plan.num_gpus)
    return [
        dataclasses.replace(
            _group(
                pool_server(
                    pools[r], getattr(plan, r), model_path, trust_remote_code, POD_CONFIG_DIR
                ),
                r,
                r,
                getattr(plan, f"{r}_instances"),
            ),
            kv_over_nvlink=shared,
        )
        for r in POOLS
    ]


def sized_groups(
    pools: list[PoolLaunch], *, model_path: str, trust_remote_code: bool = False
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
