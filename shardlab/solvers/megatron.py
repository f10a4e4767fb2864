"""The heuristic practitioners use (Megatron-LM and vLLM defaults).

Rule: tensor parallelism inside a node on the smallest power of two (dividing the
heads) whose single-stage replica fits in memory; if even a whole node does not fit,
pipeline parallelism across nodes on the fewest stages that fit, with tensor
parallelism over the whole node. MoE layers use expert parallelism over the
tensor-parallel group (vLLM's ``--enable-expert-parallel``; Megatron-Core's EP inside
TP), no attention data parallelism. Operators are Megatron's: column-parallel QKV and
FFN up, row-parallel output and FFN down, vocabulary-parallel embedding and LM head,
everything else replicated; equal pipeline stages. The rest of the cluster holds
replicas. SLOs play no part in the rule.
"""

from __future__ import annotations

from collections.abc import Callable

from shardlab.costmodel import Metrics, evaluate
from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem
from shardlab.solvers.base import Outcome, SearchContext, Solver, priced
from shardlab.solvers.registry import register


def megatron_candidates(problem: Problem) -> list[Degrees]:
    """Degree tuples in the order the rule tries them."""
    space = problem.space
    node = problem.cluster.domain_size
    n = problem.cluster.num_gpus
    moe = problem.model.is_moe
    valid = set(space.degree_tuples)

    def degrees(tp: int, pp: int) -> Degrees | None:
        if n % (tp * pp):
            return None
        d = Degrees(
            replicas=n // (tp * pp), pp=pp, tp=tp, ep=tp if moe else 1, etp=1 if moe else tp
        )
        return d if d in valid else None

    out: list[Degrees] = []
    tp = 1
    while tp <= node:
        d = degrees(tp, 1)
        if d is not None:
            out.append(d)
        tp *= 2
    top = max((d.tp for d in out), default=1)
    pp = 2
    while top * pp <= n:
        d = degrees(top, pp)
        if d is not None:
            out.append(d)
        pp *= 2
    return out


def megatron_rule(ctx: SearchContext) -> tuple[Plan | None, list[Degrees]]:
    """The rule's plan (the first candidate that fits in memory; None if none does),
    and the degrees it tried; each candidate is priced by ``ctx.evaluator``."""

    def fits(plan: Plan) -> bool:
        return not ctx.evaluator.metrics(ctx.space.encode(plan)[None]).memory_violation[0]

    return _first_fit(ctx.problem, fits)


def megatron_baseline(problem: Problem) -> tuple[Plan, Metrics] | None:
    """The rule's plan, priced as a solve prices its best plan; None when no candidate
    fits in memory. What every other method's ratio to Megatron is taken against."""
    priced_plans: dict[Plan, Metrics] = {}

    def fits(plan: Plan) -> bool:
        priced_plans[plan] = evaluate(problem, plan, breakdown=False)
        return "memory" not in priced_plans[plan].violations

    plan, _ = _first_fit(problem, fits)
    return priced(problem, plan, priced_plans[plan]) if plan is not None else None


def _first_fit(problem: Problem, fits: Callable[[Plan], bool]) -> tuple[Plan | None, list[Degrees]]:
    """The rule: its candidates in order, the first that ``fits`` in memory."""
    tried = []
    for d in megatron_candidates(problem):
        plan = problem.space.megatron_plan(d)
        tried.append(d)
        if fits(plan):
            return plan, tried
    return None, tried


@register("megatron")
class MegatronSolver(Solver):
    description = "Megatron-LM / vLLM default: TP in a node, PP across nodes, EP over TP"

    def _search(self, ctx: SearchContext) -> Outcome:
        plan, tried = megatron_rule(ctx)
        facts: dict[str, object] = {"tried": [d.short() for d in tried]}
        if plan is not None:
            facts = {"degrees": plan.degrees.short(), **facts}
        return Outcome(facts=facts)
