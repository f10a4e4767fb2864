"""A sized deployment (``shardlab size --rate R --out F``) read back as the pools
``shardlab launch`` starts: each pool's instance problem, plan and instance count."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardlab.errors import ShardlabError
from shardlab.launch.servers import PoolLaunch
from shardlab.problems.cluster import Accelerator, Cluster
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem


def pool_launches(
    data: Mapping[str, Any],
    *,
    where: str,
    model: str | None,
    engine: str,
    max_tokens: int | None = None,
    **overrides: Any,
) -> list[PoolLaunch]:
    """The pools of a sizing file of one rate (``shardlab size --rate R --out F``), each
    as the instance problem and plan ``launch`` builds servers of."""
    rates = data.get("rates")
    if not isinstance(rates, list) or len(rates) != 1:
        raise ShardlabError(
            f"{where}: a sizing of {len(rates) if isinstance(rates, list) else 'no'} rates; "
            "launch takes one deployment",
            fix="write the answer of one rate (`shardlab size` at one rate, with its out file)",
        )
    deployment = rates[0].get("deployment") if isinstance(rates[0], Mapping) else None
    if not isinstance(deployment, Mapping):
        raise ShardlabError(f"{where}: holds no deployment (the rate was not served)")
    gpus = data.get("gpus")
    if not isinstance(gpus, Mapping):
        raise ShardlabError(f"{where}: missing key 'gpus' (the GPU types sized over)")
    w = data.get("workload") or {}
    given = {k: w.get(k) for k in ("input_len", "output_len", "weight_dtype", "kv_dtype")}
    given["draft_tokens"] = w.get("draft_tokens") or None
    given |= {k: v for k, v in overrides.items() if v is not None}
    name = model or data.get("model")
    if not name:
        raise ShardlabError(f"{where}: names no model; give the model")
    pools: list[PoolLaunch] = []
    for i, pool in enumerate(deployment.get("pools") or ()):
        spec = gpus.get(pool.get("gpu")) if isinstance(pool, Mapping) else None
        if not isinstance(spec, Mapping) or not isinstance(spec.get("accelerator"), Mapping):
            raise ShardlabError(f"{where}: pool {i} names a GPU the file does not describe")
        try:
            acc = Accelerator(**spec["accelerator"])
        except TypeError:
            raise ShardlabError(f"{where}: pool {i}: a malformed accelerator") from None
        n = pool.get("gpus_per_instance")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ShardlabError(f"{where}: pool {i}: gpus_per_instance must be an integer >= 1")
        cluster = Cluster(accelerator=acc, num_gpus=n, gpus_per_node=acc.gpus_per_node)
        problem = Problem.build(
            name,
            cluster,
            engine=engine,  # type: ignore[arg-type]
            max_tokens=max_tokens if max_tokens is not None else data.get("max_tokens"),
            **given,
        )
        plan = Plan.from_dict(pool.get("plan") or {}, problem.model, where=f"{where}: pool {i}")
        instances = pool.get("instances")
        if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
            raise ShardlabError(f"{where}: pool {i}: instances must be an integer >= 1")
        pools.append(
            PoolLaunch(role=str(pool.get("role")), problem=problem, plan=plan, instances=instances)
        )
    if not pools:
        raise ShardlabError(f"{where}: the deployment has no pools")
    return pools
