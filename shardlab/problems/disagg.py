"""Disaggregated serving: a prefill pool and a decode pool, each of identical
instances of a plan of its own.

A request's prompt is prefilled on the prefill pool, its KV cache handed off
(:mod:`shardlab.problems.handoff`) to the decode pool, which generates the rest.
An *instance* is one copy of the model (a plan with ``replicas = 1``, on
``pp * tp * dp_attn`` GPUs); a pool is ``x`` instances of one plan:

- the **prefill pool**: ``x`` instances serving prompts in flight (phase
  ``prefill``); TTFT is a round of prompts plus the handoff, under the TTFT SLO;
- the **decode pool**: ``y`` instances generating in flight (phase ``decode``, the
  prompt cached); TPOT is its round, under the TPOT SLO;
- ``x * G_prefill + y * G_decode <= num_gpus``, the instances placed in nodes as the
  rank layout allows (one of a node or less inside one node, larger ones on whole
  nodes);
- the offered load ``--batch`` (most requests in flight) is spread over a pool's
  instances as over an aggregated plan's replicas: each instance is priced as a
  problem of its own with ``ceil(batch / x)`` requests offered.

The pools serve ``min(x * prefill rate, y * decode rate)`` requests per second: the
rate matching of xPyD serving, the slower pool sets the pace. The handoff goes over
NVLink when every instance of both pools fits in one node, over the network
otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.problems.cluster import Accelerator, Cluster
from shardlab.problems.handoff import Handoff
from shardlab.problems.model import Model
from shardlab.problems.plan import PLAN_SCHEMA, Plan, made_for
from shardlab.problems.problem import Problem

Serving = Literal["agg", "disagg", "best"]
SERVINGS: tuple[str, ...] = get_args(Serving)
DISAGG_SCHEMA = "shardlab.disagg-plan/1"
POOLS = ("prefill", "decode")


def check_disagg(problem: Problem) -> None:
    """Refuse, in one line, a problem that has no disaggregated form."""
    w = problem.workload
    if w.phase != "request":
        raise ShardlabError(
            f"disaggregated serving splits whole requests; phase {w.phase!r} is one pool's "
            "work already",
            field="workload.phase",
            fix="use phase 'request', or serve aggregated",
        )
    if w.schedule != "inflight":
        raise ShardlabError(
            "disaggregated serving serves requests in flight",
            field="workload.schedule",
            fix="use schedule 'inflight', or serve aggregated",
        )
    if w.objective not in ("throughput", "throughput_per_gpu"):
        raise ShardlabError(
            f"disaggregated serving maximizes throughput; objective {w.objective!r} is not "
            "offered for it yet",
            field="workload.objective",
            fix="use objective 'throughput', or serve aggregated",
        )
    if w.output_len < 2:
        raise ShardlabError(
            "disaggregated serving needs a decode step; a single token comes from the prefill",
            field="workload.output_len",
            fix="use an output_len of 2 or more, or serve aggregated",
        )


def instance_sizes(cluster: Cluster) -> tuple[int, ...]:
    """GPU counts an instance can have: a power of two dividing the node's GPUs (sizes
    that divide one another fill nodes first-fit, so a sum that fits is placed), or
    whole nodes."""
    node = cluster.host_size
    sizes = [1 << k for k in range(node.bit_length()) if node % (1 << k) == 0]
    sizes += [node * k for k in range(2, cluster.num_gpus // node + 1)]
    return tuple(g for g in sizes if g < cluster.num_gpus)


def fits(cluster: Cluster, instances: dict[int, int]) -> bool:
    """Whether ``instances`` (GPUs per instance -> count) can be placed: instances of
    a node or more on whole nodes, smaller ones inside a node each."""
    node = cluster.host_size
    used = sum(g * n for g, n in instances.items())
    whole = sum(-(-g // node) * n for g, n in instances.items() if g >= node)
    small = sum(g * n for g, n in instances.items() if g < node)
    return used <= cluster.num_gpus and whole + -(-small // node) <= cluster.num_hosts


# Pairs of pools the exact search enumerates at most (about 1,024 GPUs in nodes of 8).
MAX_PAIRS = 4_000_000


def pair_count(cluster: Cluster) -> int:
    """How many pairs :func:`pairs` holds, counted without listing them. For each
    prefill pool (``gp`` GPUs x ``x``) and decode size ``gd``, :func:`fits` holds for
    ``y = 1..Y`` and no more (what it checks grows with ``y``), and ``Y`` is what the
    nodes leave (``W``: the prefill pool's whole nodes, ``S``: its GPUs in shared
    nodes): with ``gd >= node``, ``W + y * ceil(gd / node) + ceil(S / node) <= N``; with
    ``gd < node``, ``W + ceil((S + y * gd) / node) <= N``, i.e. ``S + y * gd <= (N - W) *
    node``. The GPU count needs no check of its own: instance sizes below a node divide
    it and the others are whole nodes, so the nodes bound the GPUs."""
    node, nodes = cluster.host_size, cluster.num_hosts
    sizes = instance_sizes(cluster)
    total = 0
    for gp in sizes:
        x = np.arange(1, cluster.num_gpus // gp + 1)
        whole = -(-gp // node) * x if gp >= node else np.zeros_like(x)
        small = np.zeros_like(x) if gp >= node else gp * x
        for gd in sizes:
            if gd >= node:
                y = (nodes - whole - -(-small // node)) // -(-gd // node)
            else:
                y = ((nodes - whole) * node - small) // gd
            total += int(np.clip(y, 0, None).sum())
    return total


def pairs(cluster: Cluster) -> tuple[tuple[int, int, int, int], ...]:
    """(prefill GPUs per instance, x, decode GPUs per instance, y) of every pair of
    pools that fits in ``cluster``; refused, before any is listed, past ``MAX_PAIRS``."""
    if pair_count(cluster) > MAX_PAIRS:
        raise ShardlabError(
            f"disaggregated serving on {cluster.name}: more than {MAX_PAIRS:,} "
            "pairs of pools to enumerate (the exact search goes to about 1,024 GPUs)",
            field="cluster",
            fix="plan one part of the cluster, or serve aggregated",
        )
    sizes = instance_sizes(cluster)
    n = cluster.num_gpus
    out = []
    for gp in sizes:
        for x in range(1, n // gp + 1):
            for gd in sizes:
                for y in range(1, (n - x * gp) // gd + 1):
                    counts = {gp: x, gd: y} if gp != gd else {gp: x + y}
                    if fits(cluster, counts):
                        out.append((gp, x, gd, y))
    return tuple(out)


def in_one_domain(cluster: Cluster, gpus: int) -> bool:
    """Both pools, ``gpus`` in all, in one NVLink domain (the KV cache moves over it)."""
    return gpus <= cluster.domain_size


def offered(problem: Problem, instances: int) -> int:
    """Requests offered one of ``instances`` instances (the offered load spread)."""
    return -(-problem.workload.batch // instances)


def prefill_problem(
    problem: Problem,
    gpus: int,
    instances: int,
    *,
    decode_pp: int,
    decode_tp: int,
    one_domain: bool,
    decode_gpu: Accelerator | None = None,
) -> Problem:
    """One prefill instance's problem: ``gpus`` GPUs serving prompts in flight, TTFT
    (with the handoff to decode ranks of ``decode_pp x decode_tp``) under the TTFT
    SLO, offered its share of the load."""
    w = problem.workload
    handoff = Handoff.of(
        problem.model,
        w.input_len,
        problem.kv_dtype,
        decode_pp=decode_pp,
        decode_tp=decode_tp,
        same_domain=one_domain,
        decode_gpu=decode_gpu,
    )
    return dataclasses.replace(
        _instance_problem(problem, "prefill", gpus, instances), handoff=handoff
    )


def decode_problem(
    problem: Problem, gpus: int, instances: int, *, layout: tuple[int, int] | None = None
) -> Problem:
    """One decode instance's problem: ``gpus`` GPUs generating in flight, the prompts
    cached, TPOT under the TPOT SLO, offered its share of the load (``layout``: only
    plans of this ``(pp, tp)``)."""
    pool = _instance_problem(problem, "decode", gpus, instances)
    if layout is None:
        return pool
    return dataclasses.replace(pool, pin=(*pool.pin, ("pp", layout[0]), ("tp", layout[1])))


def _instance_problem(problem: Problem, phase: str, gpus: int, instances: int) -> Problem:
    """One instance of a pool: ``phase`` on ``gpus`` GPUs, one copy of the model, its
    share of the offered load, under the pool's SLO only."""
    w = problem.workload
    slo = {"tpot_ms": None} if phase == "prefill" else {"ttft_ms": None}
    workload = dataclasses.replace(
        w,
        name=f"{w.name}/{phase}",
        phase=phase,
        objective="throughput",
        batch=offered(problem, instances),
        clients=None if w.clients is None else -(-w.clients // instances),
        **slo,
    )
    return dataclasses.replace(
        problem,
        cluster=dataclasses.replace(problem.cluster, num_gpus=gpus),
        workload=workload,
        pin=(("replicas", 1),),
    )


@dataclass(frozen=True, kw_only=True)
class DisaggPlan:
    """``prefill_instances`` copies of the prefill plan and ``decode_instances`` of
    the decode plan (each plan one instance: ``replicas = 1``)."""

    prefill: Plan
    prefill_instances: int
    decode: Plan
    decode_instances: int

    def __post_init__(self) -> None:
        for name in POOLS:
            plan: Plan = getattr(self, name)
            n = getattr(self, f"{name}_instances")
            if plan.degrees.replicas != 1:
                raise ShardlabError(
                    f"{name} pool: an instance is one copy of the model (replicas 1), got "
                    f"replicas {plan.degrees.replicas}; count copies in 'instances'"
                )
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ShardlabError(f"{name} pool: instances must be an integer >= 1, got {n!r}")

    def gpus(self, pool: str) -> int:
        """GPUs of one instance of ``pool``."""
        plan: Plan = getattr(self, pool)
        return plan.degrees.num_gpus

    def instances(self) -> dict[int, int]:
        """GPUs per instance -> instances of that size, over both pools."""
        counts: dict[int, int] = {}
        for name in POOLS:
            g = self.gpus(name)
            counts[g] = counts.get(g, 0) + getattr(self, f"{name}_instances")
        return counts

    @property
    def num_gpus(self) -> int:
        return self.prefill_instances * self.gpus("prefill") + self.decode_instances * self.gpus(
            "decode"
        )

    def label(self) -> str:
        """``xPyD`` with each instance's GPUs: ``6P(2) + 1D(4)``."""
        return (
            f"{self.prefill_instances}P({self.gpus('prefill')}) + "
            f"{self.decode_instances}D({self.gpus('decode')})"
        )

    def to_dict(
        self, model: Model, *, cluster: str = "", engine: str = "", accelerator: str = ""
    ) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema": DISAGG_SCHEMA,
            "model": model.name,
            "cluster": cluster,
            **made_for(engine=engine, accelerator=accelerator),
            "serving": "disagg",
        }
        for name in POOLS:
            plan: Plan = getattr(self, name)
            pool = plan.to_dict(model)
            for key in ("schema", "model", "cluster"):
                pool.pop(key)
            data[name] = {
                "instances": getattr(self, f"{name}_instances"),
                "gpus_per_instance": plan.degrees.num_gpus,
                **pool,
            }
        return data

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], model: Model, *, where: str, cluster: Cluster | None = None
    ) -> DisaggPlan:
        if data.get("schema") != DISAGG_SCHEMA:
            raise ShardlabError(f"{where}: schema {data.get('schema')!r} is not {DISAGG_SCHEMA!r}")
        planned_for = data.get("cluster")
        if cluster is not None and planned_for not in (None, "", cluster.name):
            raise ShardlabError(
                f"{where}: the plan is for cluster {planned_for!r}, not {cluster.name!r}",
                field="cluster",
                fix=f"solve again for {cluster.name} or evaluate the plan on {planned_for}",
            )
        parts: dict[str, Any] = {}
        for name in POOLS:
            pool = data.get(name)
            if not isinstance(pool, Mapping):
                raise ShardlabError(f"{where}: missing key {name!r} (the {name} pool's plan)")
            inner = {k: v for k, v in pool.items() if k not in ("instances", "gpus_per_instance")}
            inner |= {"schema": PLAN_SCHEMA, "model": data.get("model")}
            plan = Plan.from_dict(inner, model, where=f"{where}: {name}")
            given = pool.get("gpus_per_instance")
            if given is not None and given != plan.degrees.num_gpus:
                raise ShardlabError(
                    f"{where}: {name}.gpus_per_instance is {given!r} but its degrees use "
                    f"{plan.degrees.num_gpus}"
                )
            parts[name] = plan
            parts[f"{name}_instances"] = pool.get("instances")
        out = cls(**parts)
        if cluster is not None and not fits(cluster, out.instances()):
            raise ShardlabError(
                f"{where}: {out.label()} needs {out.num_gpus} GPUs placed in nodes of "
                f"{cluster.host_size}; {cluster.name} cannot hold them"
            )
        return out


def check_serving(serving: str) -> Serving:
    if serving not in SERVINGS:
        raise ShardlabError(
            f"serving {serving!r} is not one of {', '.join(SERVINGS)}",
            field="serving",
            fix=f"choose one of {', '.join(SERVINGS)}",
        )
    return serving  # type: ignore[return-value]
