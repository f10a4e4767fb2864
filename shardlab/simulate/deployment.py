"""What the simulator runs: a deployment's pools, each a plan on its problem and a
number of instances of it (a plan from ``solve``: one aggregated pool; a
disaggregated plan: a prefill and a decode pool; a sized deployment: its pools)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from shardlab.errors import ShardlabError
from shardlab.problems.disagg import DisaggPlan, decode_problem, in_one_domain, prefill_problem
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.simulate.schedulers import HOLD_NOTHING, Holding

Role = Literal["agg", "prefill", "decode"]


@dataclass(frozen=True, kw_only=True)
class Pool:
    """``instances`` copies of ``plan`` (each its replicas and attention-DP ranks);
    ``holding``: the engine's launch options that hold prompts back (default none);
    ``weight``: what the least-loaded router counts one of its ranks as (a deployment
    of unequal instances weighs each rank by what it serves: the router then sends it
    requests in proportion, as the sizing's covering assumes)."""

    role: Role
    problem: Problem
    plan: Plan
    instances: int = 1
    holding: Holding = HOLD_NOTHING
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ShardlabError(f"a pool's weight must be > 0, got {self.weight!r}", field="weight")

    @property
    def ranks(self) -> int:
        d = self.plan.degrees
        return self.instances * d.replicas * d.dp_attn


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """Aggregated pools behind one router, or a prefill pool and a decode pool."""

    pools: tuple[Pool, ...]

    def __post_init__(self) -> None:
        roles = sorted(p.role for p in self.pools)
        if not roles:
            raise ShardlabError("a deployment needs at least one pool", field="pools")
        if roles not in (["decode", "prefill"], ["decode"], ["prefill"]) and set(roles) != {"agg"}:
            raise ShardlabError(
                f"pools {', '.join(roles)}: a deployment is aggregated pools, one "
                "prefill and one decode pool, a decode pool alone (prompts cached), or a "
                "prefill pool alone (each request ends when its cache is handed off)",
                field="pools",
            )

    @property
    def entry(self) -> Role:
        """The pool requests arrive at: aggregated, prefill, or a decode pool alone."""
        roles = {p.role for p in self.pools}
        return "agg" if "agg" in roles else "prefill" if "prefill" in roles else "decode"

    def pool(self, role: Role) -> Pool:
        return next(p for p in self.pools if p.role == role)

    def with_holding(self, holding: Holding) -> Deployment:
        """The same pools, each launched with ``holding``."""
        return Deployment(pools=tuple(dataclasses.replace(p, holding=holding) for p in self.pools))

    @classmethod
    def of_plan(cls, problem: Problem, plan: Plan) -> Deployment:
        return cls(pools=(Pool(role="agg", problem=problem, plan=plan),))

    @classmethod
    def of_disagg(cls, problem: Problem, plan: DisaggPlan) -> Deployment:
        """The two pools of a disaggregated plan, each instance's problem as the
        disaggregated search priced it."""
        cluster = problem.cluster
        d = plan.decode.degrees
        prefill_gpus, decode_gpus = plan.gpus("prefill"), plan.gpus("decode")
        one_domain = in_one_domain(
            cluster, plan.prefill_instances * prefill_gpus + plan.decode_instances * decode_gpus
        )
        pre = prefill_problem(
            problem,
            prefill_gpus,
            plan.prefill_instances,
            decode_pp=d.pp,
            decode_tp=d.tp,
            one_domain=one_domain,
        )
        dec = decode_problem(problem, decode_gpus, plan.decode_instances)
        return cls(
            pools=(
                Pool(role="prefill", problem=pre, plan=plan.prefill,
                     instances=plan.prefill_instances),
                Pool(role="decode", problem=dec, plan=plan.decode,
                     instances=plan.decode_instances),
            )
        )  # fmt: skip
