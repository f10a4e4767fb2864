"""The collectives the cost model prices for one forward pass, call by call.

This is what the PyTorch DTensor checks compare against ``CommDebugMode``: the kind,
the mesh axis, the group size and the per-rank message bytes of every collective one
micro-batch of one step issues on one pipeline stage group (for ``pp > 1`` the
point-to-point sends between stages are listed too, with axis ``pp``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.costmodel.constants import ACT_BYTES
from shardlab.costmodel.evaluate import assemble_plan
from shardlab.costmodel.opcosts import alltoall_messages, output_width
from shardlab.costmodel.tables import degree_tables
from shardlab.problems.operators import HEAD_OPS, layer_edges, layer_ops
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem


@dataclass(frozen=True)
class CollectiveCall:
    where: str  # e.g. "layer3: o_proj -> residual"
    kind: str  # all_reduce, all_gather, reduce_scatter, all_to_all, p2p
    axis: str  # dp, tp, ep, etp, pp
    group_size: int
    bytes: float  # per-rank message: all-reduce tensor, all-gather output, ...


def collectives_of(problem: Problem, plan: Plan, *, step: int = 0) -> list[CollectiveCall]:
    """Collectives of step ``step`` (index into the workload's step kinds)."""
    t = degree_tables(problem, plan.degrees)
    _, a = assemble_plan(problem, plan)
    st = t.steps[step]
    b = 1.0 if st.single else float(t.b[int(a.b_index[0])])
    m, d, ctx = problem.model, plan.degrees, t.ctx
    dp = d.dp_attn
    calls: list[CollectiveCall] = []

    def edge(where: str, src, dst, per_req: float, width: float) -> None:
        full = np.array([b * per_req * dp * width * ACT_BYTES])
        for kind, axis, message in ctx.redistribution_steps(src, dst, full):
            calls.append(CollectiveCall(where, kind, axis, d.axis_size(axis), float(message[0])))

    emb, fnorm, lm, sampler = HEAD_OPS
    head = dict(zip((o.name for o in HEAD_OPS), plan.head_options, strict=True))
    h = float(m.hidden_size)
    first_ops = layer_ops(m, m.layer_kinds[0])
    res_first = first_ops[0].option(plan.layer_options[0][0])
    edge(
        "embedding -> layer0.residual",
        emb.option(head["embedding"]).out,
        res_first.inp,
        st.tokens,
        h,
    )
    stage_end = set(np.cumsum(plan.stage_layers)[:-1].tolist())
    for layer in range(m.num_layers):
        kind = m.layer_kinds[layer]
        ops = layer_ops(m, kind)
        opts = {
            op.name: op.option(name)
            for op, name in zip(ops, plan.layer_options[layer], strict=True)
        }
        if layer > 0:
            prev_ops = layer_ops(m, m.layer_kinds[layer - 1])
            prev = prev_ops[0].option(plan.layer_options[layer - 1][0])
            if layer in stage_end:
                local = b * st.tokens * h * ACT_BYTES
                if prev.out[1].kind == "S":
                    local /= d.tp
                calls.append(CollectiveCall(f"layer{layer - 1} -> stage", "p2p", "pp", 2, local))
            edge(
                f"layer{layer - 1}.residual -> layer{layer}.residual",
                prev.out,
                opts["residual"].inp,
                st.tokens,
                h,
            )
        by_name = {op.name: op for op in ops}
        for src, dst in layer_edges(m, kind):
            edge(
                f"layer{layer}: {src} -> {dst}",
                opts[src].out,
                opts[dst].inp,
                st.tokens,
                output_width(by_name[src], problem, m.attention_layers[layer]),
            )
        if kind == "moe" and opts["experts"].name == "alltoall" and d.group > 1:
            assert m.moe is not None
            tokens = b * st.tokens * dp
            for phase, message in alltoall_messages(problem, d, np.array([tokens])).items():
                calls.append(
                    CollectiveCall(
                        f"layer{layer}: experts {phase}",
                        "all_to_all",
                        "ep",
                        d.ep,
                        float(message[0]),
                    )
                )
            if d.etp > 1:
                # Mean assignments per rank (without the imbalance the cost adds).
                recv = tokens * m.moe.top_k / d.ep * h * ACT_BYTES
                calls.append(
                    CollectiveCall(
                        f"layer{layer}: experts gather", "all_gather", "etp", d.etp, recv
                    )
                )
                calls.append(
                    CollectiveCall(
                        f"layer{layer}: experts scatter", "reduce_scatter", "etp", d.etp, recv
                    )
                )
    last_ops = layer_ops(m, m.layer_kinds[-1])
    res_last = last_ops[0].option(plan.layer_options[-1][0])
    edge(
        "layers.last -> final_norm",
        res_last.out,
        fnorm.option(head["final_norm"]).inp,
        st.logits,
        h,
    )
    edge(
        "final_norm -> lm_head",
        fnorm.option(head["final_norm"]).out,
        lm.option(head["lm_head"]).inp,
        st.logits,
        h,
    )
    edge(
        "lm_head -> sampler",
        lm.option(head["lm_head"]).out,
        sampler.option(head["sampler"]).inp,
        st.logits,
        output_width(lm, problem),
    )
    return calls
