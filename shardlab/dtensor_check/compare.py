"""What the cost model predicts a forward pass issues, and how observed
collectives are compared with it."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from shardlab.dtensor_check.experts import COUNT_DTYPE
from shardlab.errors import ShardlabError
from shardlab.problems.model import Model
from shardlab.problems.operators import (
    HEAD_OPS,
    TOKEN_IDS_LAYOUT,
    OptionSpec,
    layer_edges,
    layer_ops,
)
from shardlab.problems.placements import Layout, layout_str
from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem

# float32 comparison of the sharded and the unsharded logits (values are O(1)).
ATOL = 1e-4
RTOL = 1e-4

# Sizes that do not depend on the routing must match exactly (up to float rounding).
EXACT_RTOL = 1e-9

# The MoE dispatch and combine move one row per (token, destination rank): how many
# depends on the routing. The cost model prices the expectation under uniform routing
# (``dispatch_copies``, exact), so one forward pass's size (mean over ranks) is a sample
# whose noise the comparison must allow: ROUTING_Z standard errors of the mean copies
# per token (see routing_rtol). The standard error assumes independent tokens, which
# understates the spread: a random router favours some experts in every batch. Over
# seeds 0-99 of the tiny MoE configs (128 tokens, top-2 of 8) the sample mean spread
# 1.45x (ep=2) and 1.27x (ep=4) the independent-token value, centred on the prediction
# (mean deviation -0.06 % and -0.13 %), hence ROUTING_OVERDISPERSION. With these the
# tolerance is 12.5 % at ep=2 and 7.5 % at ep=4: three standard deviations of the
# measured spread, no allowance for bias (there is none left to allow for).
ROUTED = ("experts dispatch", "experts combine")
ROUTING_Z = 3.0
ROUTING_OVERDISPERSION = 1.5


# -- running and comparing ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Call:
    """One collective of one forward pass: the cost model's or the one torch issued."""

    where: str
    kind: str
    axis: str
    elements: float
    rtol: float = EXACT_RTOL  # predicted calls: relative tolerance on ``elements``

    def __str__(self) -> str:
        tol = f" ±{self.rtol:.1%}" if self.rtol > EXACT_RTOL else ""
        return f"{self.kind}[{self.axis}] {self.elements:g}{tol}"


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """Outcome of one plan: outputs, and the collectives on both sides."""

    name: str
    world_size: int
    styles: str
    outputs_match: bool
    max_abs_error: float
    observed: tuple[Call, ...]  # in issue order, elements averaged over ranks
    observed_spread: tuple[tuple[float, float], ...]  # (min, max) over ranks per call
    comm_counts: dict[str, int]  # CommDebugMode.get_comm_counts(), mapped to our kinds
    predicted: tuple[Call, ...]
    error: str = ""
    seconds: float = 0.0  # building, sharding and running the plan (slowest rank)

    @property
    def observed_counts(self) -> dict[str, int]:
        return dict(Counter(c.kind for c in self.observed))

    @property
    def predicted_counts(self) -> dict[str, int]:
        return dict(Counter(c.kind for c in self.predicted))

    @property
    def counts_match(self) -> bool:
        return not self.error and self.comm_counts == self.predicted_counts

    def edge_mismatches(self, *, unpredicted: bool = True) -> list[str]:
        """Edges whose (kind, axis, elements) sequence differs, one line each.

        ``unpredicted=False`` leaves out edges (and operators) the cost model lists no
        collective for: only the predicted collectives' sizes are compared.
        """
        if self.error:
            return [self.error]
        obs: dict[str, list[Call]] = {}
        for c in self.observed:
            obs.setdefault(c.where, []).append(c)
        pred: dict[str, list[Call]] = {}
        for c in self.predicted:
            pred.setdefault(c.where, []).append(c)
        out = []
        for where in dict.fromkeys([*pred, *obs] if unpredicted else pred):
            p, o = pred.get(where, []), obs.get(where, [])
            same = [(c.kind, c.axis) for c in p] == [(c.kind, c.axis) for c in o]
            if not same or not all(
                math.isclose(a.elements, b.elements, rel_tol=a.rtol)
                for a, b in zip(p, o, strict=True)
            ):
                out.append(
                    f"{where}: cost model [{', '.join(map(str, p)) or 'none'}], "
                    f"torch [{', '.join(map(str, o)) or 'none'}]"
                )
        return out

    @property
    def ok(self) -> bool:
        return self.outputs_match and self.counts_match and not self.edge_mismatches()

    def report(self) -> str:
        lines = [
            f"{self.name} on {self.world_size} ranks (styles={self.styles}): outputs "
            f"{'match' if self.outputs_match else 'DIFFER'} (max |err| {self.max_abs_error:.2e})",
            f"  counts: torch {self.comm_counts}, cost model {self.predicted_counts}",
        ]
        if self.error:
            lines.append(f"  error: {self.error}")
        lines += [f"  {m}" for m in self.edge_mismatches()]
        return "\n".join(lines)


def copies_moments(ep: int, top_k: int, num_experts: int) -> tuple[float, float]:
    """Mean and variance of one token's dispatch copies (distinct destination ranks
    among its ``top_k`` distinct experts) under uniform routing, ``num_experts / ep``
    experts per rank. The mean is ``dispatch_copies``'s expectation."""
    if ep == 1:
        return 1.0, 0.0
    local = num_experts // ep
    total = math.comb(num_experts, top_k)
    miss = math.comb(num_experts - local, top_k) / total  # P(rank r gets no copy)
    miss2 = math.comb(max(num_experts - 2 * local, 0), top_k) / total  # ... nor rank s
    mean = ep * (1.0 - miss)
    var = ep * miss * (1.0 - miss) + ep * (ep - 1) * (miss2 - miss * miss)
    return mean, var


def routing_rtol(ep: int, top_k: int, num_experts: int, tokens: int) -> float:
    """Tolerance on a routed call's size when ``tokens`` tokens are routed once (see
    ROUTING_Z): relative standard error of the mean copies per token, inflated."""
    mean, var = copies_moments(ep, top_k, num_experts)
    return ROUTING_Z * ROUTING_OVERDISPERSION * math.sqrt(var / tokens) / mean


def predicted_calls(problem: Problem, plan: Plan) -> tuple[Call, ...]:
    """``collectives_of(problem, plan)`` without point-to-point sends, in elements.

    Activations: ``bytes / ACT_BYTES`` (``2 * ACT_BYTES`` for the fp32 logits,
    ``dispatch_bytes`` for the MoE dispatch). The MoE count exchange is priced as
    ``ep * COUNT_BYTES`` bytes, one int32 per destination rank: it is
    ``bytes / COUNT_BYTES`` values of ``COUNT_DTYPE`` (not activation elements).
    The MoE dispatch and combine carry the tolerance of :func:`routing_rtol` for the
    workload's ``batch * input_len`` tokens (a static prefill: every token routed once).
    """
    from shardlab.costmodel import ACT_BYTES, COUNT_BYTES, collectives_of, dispatch_bytes

    if COUNT_DTYPE.itemsize != COUNT_BYTES:
        raise ShardlabError(
            f"the check exchanges counts as {COUNT_DTYPE} ({COUNT_DTYPE.itemsize} bytes), "
            f"the cost model prices {COUNT_BYTES:g} bytes per count"
        )
    out = []
    for c in collectives_of(problem, plan):
        if c.kind == "p2p":
            continue
        per = ACT_BYTES
        rtol = EXACT_RTOL
        if c.where == "lm_head -> sampler":
            per = 2.0 * ACT_BYTES  # priced at width 2 * vocab: fp32 logits
        elif c.where.endswith("experts counts"):
            per = COUNT_BYTES  # ep * COUNT_BYTES bytes = ep int32 counts
        elif c.where.endswith(ROUTED):
            if c.where.endswith("experts dispatch"):
                per = dispatch_bytes(problem.weight_dtype("experts"))  # fp8 with fp8 experts
            moe = problem.model.moe
            assert moe is not None
            w = problem.workload
            rtol = routing_rtol(plan.degrees.ep, moe.top_k, moe.num_experts, w.batch * w.input_len)
        out.append(Call(where=c.where, kind=c.kind, axis=c.axis, elements=c.bytes / per, rtol=rtol))
    return tuple(out)


# -- every edge's redistribution, on a simulated mesh ------------------------------------


@dataclass(frozen=True, kw_only=True)
class PairResult:
    """One (producer output, consumer input) layout pair: cost model vs DTensor."""

    src: Layout
    dst: Layout
    edges: tuple[str, ...]  # the operator edges (with options) that produce this pair
    predicted: tuple[Call, ...]
    observed: tuple[Call, ...]

    @property
    def ok(self) -> bool:
        def key(calls: tuple[Call, ...]) -> list[tuple[str, str, float]]:
            return [(c.kind, c.axis, round(c.elements, 6)) for c in calls]

        return key(self.predicted) == key(self.observed)

    def __str__(self) -> str:
        more = f" (+{len(self.edges) - 1} more)" if len(self.edges) > 1 else ""
        return (
            f"{layout_str(self.src)} -> {layout_str(self.dst)} e.g. {self.edges[0]}{more}: "
            f"cost model [{', '.join(map(str, self.predicted)) or 'none'}], "
            f"DTensor [{', '.join(map(str, self.observed)) or 'none'}]"
        )


def edge_layout_pairs(
    model: Model, degrees: Degrees | None = None
) -> dict[tuple[Layout, Layout], list[str]]:
    """Every (producer ``out``, consumer ``inp``) pair a plan of ``model`` can put on an
    edge (under ``degrees``: valid options only), with the edges that produce it."""
    from shardlab.problems.degrees import option_valid

    pairs: dict[tuple[Layout, Layout], list[str]] = {}

    def valid(op: Any) -> list[OptionSpec]:
        return [o for o in op.options if degrees is None or option_valid(op, o, degrees)]

    def add(src_name: str, src: Any, dst_name: str, dst: Any) -> None:
        for a in valid(src):
            for c in valid(dst):
                where = f"{src_name}.{a.name} -> {dst_name}.{c.name}"
                pairs.setdefault((a.out, c.inp), []).append(where)

    residual = None
    for kind in model.kinds:
        ops = {op.name: op for op in layer_ops(model, kind)}
        residual = ops["residual"]
        for src, dst in layer_edges(model, kind):
            add(src, ops[src], dst, ops[dst])
    assert residual is not None
    add("residual", residual, "residual", residual)
    emb, fnorm, lm, sampler = HEAD_OPS
    add("embedding", emb, "residual", residual)
    add("residual", residual, "final_norm", fnorm)
    add("final_norm", fnorm, "lm_head", lm)
    add("lm_head", lm, "sampler", sampler)
    for c in valid(emb):
        pairs.setdefault((TOKEN_IDS_LAYOUT, c.inp), []).append(f"token_ids -> embedding.{c.name}")
    return pairs
