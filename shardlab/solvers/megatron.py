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

from shardlab.problems.plan import Degrees
from shardlab.solvers.base import Outcome, SearchContext, Solver
from shardlab.solvers.registry import register


def megatron_candidates(ctx: SearchContext) -> list[Degrees]:
    """Degree tuples in the order the rule tries them."""
    space = ctx.space
    node = ctx.problem.cluster.node_size
    n = ctx.problem.cluster.num_gpus
    moe = ctx.problem.model.is_moe
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


@register("megatron")
class MegatronSolver(Solver):
    description = "Megatron-LM / vLLM default: TP in a node, PP across nodes, EP over TP"

    def _search(self, ctx: SearchContext) -> Outcome:
        tried = []
        for d in megatron_candidates(ctx):
            code = ctx.space.encode(ctx.space.megatron_plan(d))[None]
            metrics = ctx.evaluator.metrics(code)
            tried.append(d.short())
            if not metrics.memory_violation[0]:
                return Outcome(facts={"degrees": d.short(), "tried": tried})
        return Outcome(facts={"tried": tried})
