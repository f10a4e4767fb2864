"""The collectives the cost model prices for one forward pass, call by call.

This is what the PyTorch DTensor checks compare against ``CommDebugMode``: the kind,
the mesh axis, the group size and the per-rank message bytes of every collective one
micro-batch of one step issues on one pipeline stage group (for ``pp > 1`` the
point-to-point sends between stages are listed too, with axis ``pp``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shardlab.costmodel.constants import ACT_BYTES
from shardlab.costmodel.context import CostContext
from shardlab.costmodel.experts import alltoall_messages
from shardlab.costmodel.pricing import assemble_plan
from shardlab.costmodel.steps import Step
from shardlab.costmodel.tables import degree_tables
from shardlab.costmodel.widths import output_width
from shardlab.problems.operators import HEAD_OPS, Head, OptionSpec, layer_edges, layer_ops
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem


@dataclass(frozen=True, kw_only=True)
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
    tracer = _Tracer(problem=problem, plan=plan, ctx=t.ctx, step=st, b=b)
    tracer.model_start()
    for layer in range(problem.model.num_layers):
        tracer.layer(layer)
    tracer.model_end()
    return tracer.calls


@dataclass(kw_only=True)
class _Tracer:
    """The calls of one micro-batch of one step, listed in the order they run."""

    problem: Problem
    plan: Plan
    ctx: CostContext
    step: Step
    b: float  # requests per dp rank in the micro-batch
    calls: list[CollectiveCall] = field(default_factory=list)

    def call(self, where: str, kind: str, axis: str, group_size: int, size: float) -> None:
        self.calls.append(
            CollectiveCall(where=where, kind=kind, axis=axis, group_size=group_size, bytes=size)
        )

    def edge(self, where: str, src, dst, per_req: float, width: float) -> None:
        """The redistribution of a tensor of ``width`` values per token between two
        operators' layouts."""
        d = self.plan.degrees
        full = np.array([self.b * per_req * d.dp_attn * width * ACT_BYTES])
        for kind, axis, message in self.ctx.redistribution_steps(src, dst, full):
            self.call(where, kind, axis, d.axis_size(axis), float(message[0]))

    def head(self, name: str) -> OptionSpec:
        op = next(o for o in HEAD_OPS if o.name == name)
        chosen = dict(zip((o.name for o in HEAD_OPS), self.plan.head_options, strict=True))
        return op.option(chosen[name])

    def residual(self, layer: int) -> OptionSpec:
        m = self.problem.model
        return layer_ops(m, m.layer_kinds[layer])[0].option(self.plan.layer_options[layer][0])

    def model_start(self) -> None:
        h = float(self.problem.model.hidden_size)
        where = "embedding -> layer0.residual"
        self.edge(where, self.head("embedding").out, self.residual(0).inp, self.step.tokens, h)

    def layer(self, layer: int) -> None:
        """A layer's calls: the hop from the layer before (and the send to this stage
        when one ends there), the edges between its operators, its experts' exchange."""
        m, plan, st, d = self.problem.model, self.plan, self.step, self.plan.degrees
        h = float(m.hidden_size)
        kind = m.layer_kinds[layer]
        ops = layer_ops(m, kind)
        opts = {
            op.name: op.option(name)
            for op, name in zip(ops, plan.layer_options[layer], strict=True)
        }
        if layer > 0:
            prev = self.residual(layer - 1)
            if layer in set(np.cumsum(plan.stage_layers)[:-1].tolist()):
                local = self.b * st.tokens * h * ACT_BYTES
                if prev.out[1].kind == "S":
                    local /= d.tp
                self.call(f"layer{layer - 1} -> stage", "p2p", "pp", 2, local)
            where = f"layer{layer - 1}.residual -> layer{layer}.residual"
            self.edge(where, prev.out, opts["residual"].inp, st.tokens, h)
        by_name = {op.name: op for op in ops}
        for src, dst in layer_edges(m, kind):
            self.edge(
                f"layer{layer}: {src} -> {dst}",
                opts[src].out,
                opts[dst].inp,
                st.tokens,
                output_width(by_name[src], self.problem, m.attention_layers[layer]),
            )
        if kind == "moe" and opts["experts"].name == "alltoall" and d.group > 1:
            self.experts(layer)

    def experts(self, layer: int) -> None:
        """The all-to-all of routed tokens, and expert tensor parallelism's gather and
        scatter around it."""
        m, d = self.problem.model, self.plan.degrees
        assert m.moe is not None
        tokens = self.b * self.step.tokens * d.dp_attn
        for phase, message in alltoall_messages(self.problem, d, np.array([tokens])).items():
            self.call(f"layer{layer}: experts {phase}", "all_to_all", "ep", d.ep, float(message[0]))
        if d.etp > 1:
            # Mean assignments per rank (without the imbalance the cost adds).
            recv = tokens * m.moe.top_k / d.ep * m.hidden_size * ACT_BYTES
            self.call(f"layer{layer}: experts gather", "all_gather", "etp", d.etp, recv)
            self.call(f"layer{layer}: experts scatter", "reduce_scatter", "etp", d.etp, recv)

    def model_end(self) -> None:
        h = float(self.problem.model.hidden_size)
        logits = self.step.logits
        fnorm, lm, sampler = self.head("final_norm"), self.head("lm_head"), self.head("sampler")
        last = self.residual(self.problem.model.num_layers - 1)
        self.edge("layers.last -> final_norm", last.out, fnorm.inp, logits, h)
        self.edge("final_norm -> lm_head", fnorm.out, lm.inp, logits, h)
        width = output_width(HEAD_OPS[Head.LM_HEAD], self.problem)
        self.edge("lm_head -> sampler", lm.out, sampler.inp, logits, width)
