"""Each engine's documented default recipe for the model's class: what users deploy
when they follow the engine's guide rather than search.

The problem's ``--engine`` picks the recipe; its serving unit (one server) is the
smallest that holds the model in memory, and the rest of the cluster holds replicas:

- dense models, and MoE models with few experts (under 64, e.g. Mixtral), with
  experts tensor-parallel:
  - vLLM: one GPU if it fits, else TP = the GPUs of a node, else TP over the node and
    PP over the fewest nodes ("parallelism and scaling" guide,
    docs.vllm.ai/en/latest/serving/parallelism_scaling/);
  - SGLang: one GPU, else TP over the node, else TP over the fewest nodes
    (docs.sglang.io/references/multi_node_deployment/multi_node.html, ``--tp 16``);
  - TensorRT-LLM: the smallest TP that fits (the curated Llama-3.3-70B deployment is
    TP 1 per server, examples/configs/curated/llama-3.3-70b.yaml), TP over nodes beyond
    one (examples/llm-api/llm_mgmn_trtllm_serve.sh);
- DeepSeek-class MoE models (64 or more routed experts), on the fewest whole nodes:
  - vLLM: attention DP over the unit with expert parallel, DeepEP across nodes
    (docs.vllm.ai/en/latest/serving/expert_parallel_deployment/);
  - SGLang: DP attention with wide EP, DeepEP, ``--moe-dense-tp-size 1`` and
    ``--enable-dp-lm-head`` (the large-scale EP recipe, lmsys.org/blog/2025-05-05-
    large-scale-ep/);
  - TensorRT-LLM: attention DP with EP over the unit (the curated DeepSeek-R1
    throughput configuration, examples/configs/curated/deepseek-r1-throughput.yaml).

A DeepSeek-class model that the engine runs no wide-EP recipe for (SGLang's DP attention
needs a model built on its LayerCommunicator) takes the tensor-parallel recipe. The plan
is always one the engine can launch; in the free space it is encoded there.
"""

from __future__ import annotations

from collections.abc import Iterator

from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem
from shardlab.solvers.base import Outcome, SearchContext, Solver
from shardlab.solvers.registry import register

WIDE_EP_EXPERTS = 64


def _units(problem: Problem) -> Iterator[int]:
    """GPUs of one server, smallest first: powers of two up to a node, then nodes."""
    node, n = problem.cluster.host_size, problem.cluster.num_gpus
    g = 1
    while g < node and g <= n:
        yield g
        g *= 2
    g = node
    while g <= n:
        yield g
        g *= 2


def recipe_candidates(problem: Problem, *, wide: bool) -> list[tuple[Degrees, tuple[str, ...]]]:
    """The recipe's (degrees, engine features), in the order it tries them: the wide-EP
    recipe of DeepSeek-class models, or the tensor-parallel one."""
    engine = problem.engine
    node, n = problem.cluster.host_size, problem.cluster.num_gpus
    out: list[tuple[Degrees, tuple[str, ...]]] = []
    for g in _units(problem):
        if n % g:
            continue
        replicas = n // g
        if wide:
            if g < node and g < n:
                continue  # whole nodes
            if engine == "vllm":
                feats: tuple[str, ...] = ("expert-parallel",) + (("deepep",) if g > node else ())
            elif engine == "sglang":
                feats = ("dp-attention", "deepep", "dense-tp1")
            else:
                feats = ("attention-dp",) + (("nvlink-alltoall",) if g <= node else ())
            out.append((Degrees(replicas=replicas, tp=1, dp_attn=g, ep=g, etp=1), feats))
            continue
        if engine in ("vllm", "sglang") and 1 < g < node:
            continue  # one GPU or whole nodes
        if engine == "vllm" and g > node:  # TP over a node, PP over nodes
            out.append((Degrees(replicas=replicas, pp=g // node, tp=node, etp=node), ()))
            continue
        out.append((Degrees(replicas=replicas, tp=g, etp=g), ()))  # experts TP too
    return out


def recipe_plans(problem: Problem) -> list[Plan]:
    """The recipe's plans the engine can run, in order; a DeepSeek-class model whose
    architecture the engine runs no wide-EP recipe for takes the tensor-parallel one."""
    space = problem.with_space("engine").space
    m = problem.model
    wide = m.moe is not None and m.moe.num_experts >= WIDE_EP_EXPERTS
    for kind in (True, False) if wide else (False,):
        found = [space.config_index(d, f) for d, f in recipe_candidates(problem, wide=kind)]
        plans = [space.config_plan(i) for i in found if i is not None]
        if plans:
            return plans
    return []


@register("recipe")
class RecipeSolver(Solver):
    description = "the engine's documented default recipe for the model class"

    def _search(self, ctx: SearchContext) -> Outcome:
        tried = []
        for plan in recipe_plans(ctx.problem):
            metrics = ctx.evaluator.metrics(ctx.space.encode(plan)[None])
            tried.append(plan.degrees.short())
            if not metrics.memory_violation[0]:
                return Outcome(facts={"engine": ctx.problem.engine, "degrees": tried[-1]})
        return Outcome(facts={"engine": ctx.problem.engine, "tried": tried})
