"""The validity rules of parallelism degrees (:class:`~shardlab.problems.plan.Degrees`):
which degree tuples split a model over a cluster, and which operator options are
distinct, realizable choices under a degree tuple. Below the search space and the
engines' capability models, which both ask these questions.
"""

from __future__ import annotations

import math

from shardlab.problems.cluster import Cluster
from shardlab.problems.model import LayerAttention, Model
from shardlab.problems.operators import OpSpec, OptionSpec
from shardlab.problems.plan import Degrees


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _splits_heads(model: Model, a: LayerAttention, tp: int) -> bool:
    """Whether tp ranks can split this mixer's heads: query heads evenly, KV heads
    evenly or replicated to one per rank; linear heads evenly."""
    if a.linear:
        assert model.linear is not None
        return model.linear.k_heads % tp == 0 and model.linear.v_heads % tp == 0
    if a.heads % tp:
        return False
    return model.mla is not None or not (a.kv_heads % tp and tp % a.kv_heads)


def enumerate_degrees(model: Model, cluster: Cluster) -> tuple[Degrees, ...]:
    """Every valid degree tuple that uses all of ``cluster``'s GPUs."""
    n = cluster.num_gpus
    out = []
    # A layer that reads another's KV needs it on its own GPUs: one stage (vLLM does
    # not share KV across pipeline stages either).
    max_pp = 1 if any(a.kv_shared for a in model.attention_layers) else model.num_layers
    for tp in _divisors(n):
        if not all(_splits_heads(model, a, tp) for a in model.attentions):
            continue
        for dp in _divisors(n // tp):
            group = tp * dp
            for pp in _divisors(n // group):
                if pp > max_pp:
                    continue
                replicas = n // (group * pp)
                if not model.is_moe:
                    out.append(Degrees(replicas=replicas, pp=pp, tp=tp, dp_attn=dp, etp=group))
                    continue
                assert model.moe is not None
                for ep in _divisors(group):
                    etp = group // ep
                    if model.moe.num_experts % ep or model.moe.expert_ffn_size % etp:
                        continue
                    out.append(Degrees(replicas=replicas, pp=pp, tp=tp, dp_attn=dp, ep=ep, etp=etp))
    return tuple(sorted(out, key=lambda d: (d.pp, d.tp, d.dp_attn, d.ep)))


def option_valid(op: OpSpec, opt: OptionSpec, degrees: Degrees) -> bool:
    """Whether ``opt`` is a distinct, realizable choice for ``op`` under ``degrees``."""
    for req in opt.requires:
        if req == "tp" and degrees.tp == 1:
            return False
        if req == "dp" and degrees.dp_attn == 1:
            return False
        if req == "group" and degrees.group == 1:
            return False
    if op.split_size and opt.weight_axes and op.family != "experts":
        ways = math.prod(degrees.axis_size(a) for a in opt.weight_axes)
        if op.split_size % ways:
            return False
    return True
