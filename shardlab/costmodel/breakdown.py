"""Where one plan's time and memory go, operator by operator (:class:`OpBreakdown`):
the entries of its degree tuple's tables that the batched arithmetic summed for it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.costmodel.arithmetic import Assembled
from shardlab.costmodel.metrics import OpBreakdown
from shardlab.costmodel.opcosts import kernel_class
from shardlab.costmodel.tables import DegreeTables, degree_tables, layer_classes_of
from shardlab.costmodel.units import Terms, Units, terms_of
from shardlab.problems.operators import HEAD_OPS, Head, layer_edges, layer_ops
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem


class _Rows:
    """The breakdown's rows of one step, accumulated by name."""

    def __init__(self) -> None:
        self.acc: dict[str, dict] = {}

    def add(
        self,
        name: str,
        option: str,
        *,
        layers: int = 1,
        on_fullest: int = 0,
        time: float,
        compute: float = 0.0,
        memory: float = 0.0,
        comm: float = 0.0,
        weight: float = 0.0,
        kv: float = 0.0,
        act: float = 0.0,
        source: str = "roofline",
        kernel: str | None = None,
    ) -> None:
        """``layers`` layers (``on_fullest`` of them on the fullest stage) with these
        per-layer costs; ``time`` is theirs in total."""
        e = self.acc.setdefault(
            name,
            {
                "option": option,
                "layers": 0,
                "compute": 0.0,
                "memory": 0.0,
                "comm": 0.0,
                "time": 0.0,
                "weight": 0.0,
                "kv": 0.0,
                "act": 0.0,
                "timing": source,
                "kernel_class": kernel,
            },
        )
        if e["option"] != option:
            e["option"] = "mixed"
        if e["timing"] != source:
            e["timing"] = "mixed"
        e["layers"] += layers
        e["time"] += time
        e["compute"] += compute * layers
        e["memory"] += memory * layers
        e["comm"] += comm
        e["weight"] += weight * on_fullest
        e["kv"] += kv * on_fullest
        e["act"] = max(e["act"], act)

    def breakdowns(self, step: str) -> list[OpBreakdown]:
        """The rows of ``step``, in the order their names first came."""
        return [
            OpBreakdown(
                step=step,
                name=name,
                option=e["option"],
                layers=e["layers"],
                compute_ms=e["compute"] * 1e3,
                memory_ms=e["memory"] * 1e3,
                comm_ms=e["comm"] * 1e3,
                time_ms=e["time"] * 1e3,
                weight_gb=e["weight"] / 1e9,
                kv_gb=e["kv"] / 1e9,
                act_gb=e["act"] / 1e9,
                timing=e["timing"],
                kernel_class=e["kernel_class"],
            )
            for name, e in self.acc.items()
        ]


@dataclass(frozen=True, kw_only=True)
class _Plan:
    """One priced plan, as the breakdown reads it: its tables, units and concurrency."""

    problem: Problem
    t: DegreeTables
    terms: Terms
    u: Units
    b_run: int  # the b column of the tables at its concurrency
    requests_per_rank: int  # requests per dp rank
    fullest: int  # its fullest stage
    res: np.ndarray  # (U,) each unit's residual-stream option


def breakdown_of(problem: Problem, plan: Plan, u: Units, a: Assembled) -> tuple[OpBreakdown, ...]:
    """Each step's operators, head, and pipeline sends, as :class:`OpBreakdown` rows."""
    t = degree_tables(problem, plan.degrees)
    p = _Plan(
        problem=problem,
        t=t,
        terms=terms_of(problem, u.layout),
        u=u,
        b_run=int(a.b_index[0]),
        requests_per_rank=int(a.requests_per_rank[0]),
        fullest=int(a.fullest_stage[0]),
        res=u.opts[0, :, t.res_index],
    )
    out: list[OpBreakdown] = []
    for si, step in enumerate(t.steps):
        bi = 0 if step.single else p.b_run
        acc = _Rows()
        _layer_rows(p, acc, si, bi)
        _head_rows(p, acc, si, bi)
        for s in range(t.degrees.pp - 1):
            last = int(p.res[p.terms.layer_unit[int(u.ends[0, s]) - 1]])
            hop = float(t.p2p[si, s, last, bi])
            acc.add("pipeline.p2p", "send", time=hop, comm=hop)
        out.extend(acc.breakdowns(step.kind))
    return tuple(out)


def _layer_rows(p: _Plan, acc: _Rows, si: int, bi: int) -> None:
    """The layers' operators of step ``si`` at b column ``bi``, unit by unit."""
    m, t, terms, u = p.problem.model, p.t, p.terms, p.u
    split_reqs = -(-p.requests_per_rank // t.degrees.tp)
    layers = terms.cs_unit[-1].astype(int)  # (U,)
    stage = (u.starts[0, p.fullest], u.ends[0, p.fullest])
    on_fullest = (terms.cs_unit[stage[1]] - terms.cs_unit[stage[0]]).astype(int)
    hops = terms.cs_pair[-1]  # residual hops of each unit pair, over the model
    classes = layer_classes_of(m)
    mixers = len(m.attentions) > 1
    for ui, (ci, kind_i) in enumerate(zip(u.layout.unit_class, u.layout.unit_kind, strict=True)):
        kind = m.kinds[kind_i]
        attn = classes[ci][1]
        ops = layer_ops(m, kind)
        opts = u.opts[0, ui]
        names = [op.name for op in ops]
        comm_in = dict.fromkeys(names, 0.0)  # per layer
        for e, (src, dst) in enumerate(layer_edges(m, kind)):
            s_i, d_i = names.index(src), names.index(dst)
            comm_in[dst] += t.edge_time[si, ci, e, opts[s_i], opts[d_i], bi]
        into = terms.pair_b == ui  # residual hops into this unit's layers, in total
        res = p.res
        hop_in = float((t.inter_time[si, res[terms.pair_a[into]], res[ui], bi] * hops[into]).sum())
        for ki, op in enumerate(ops):
            c = t.op_costs[si][ci][ki][int(opts[ki])]
            assert c is not None
            kv = c.kv_bytes_per_req * (split_reqs if c.kv_split_tp else p.requests_per_rank)
            name = f"{kind}.{op.name}"
            if mixers and op.family in ("kv_cache", "attention"):
                # Mixers of different kinds hold, cache and read differently.
                name += f" ({attn.short()})"
            hop = hop_in if ki == t.res_index else 0.0
            acc.add(
                name,
                op.options[int(opts[ki])].name,
                layers=int(layers[ui]),
                on_fullest=int(on_fullest[ui]),
                time=(float(c.time_s[bi]) + comm_in[op.name]) * layers[ui] + hop,
                compute=float(c.compute_s[bi]),
                memory=float(c.memory_s[bi]) + c.kernel_s,
                comm=(float(c.comm_s[bi]) + comm_in[op.name]) * layers[ui] + hop,
                weight=c.weight_bytes,
                kv=kv,
                act=float(c.act_bytes[-1]),
                source=c.source,
                kernel=kernel_class(op),
            )


def _head_rows(p: _Plan, acc: _Rows, si: int, bi: int) -> None:
    """The model's ends (embedding, final norm, LM head, sampler) of step ``si``."""
    t, terms, res = p.t, p.terms, p.res
    h = p.u.head[0]
    emb, fnorm, lm, sampler = (h[k] for k in Head)
    head_comm = {
        "embedding": t.emb_first[si, emb, res[terms.first_unit], bi],
        "final_norm": t.last_fnorm[si, res[terms.last_unit], fnorm, bi],
        "lm_head": t.fnorm_lm[si, fnorm, lm, bi],
        "sampler": t.lm_sampler[si, lm, sampler, bi],
    }
    for ki, op in enumerate(HEAD_OPS):
        c = t.head_costs[si][ki][int(h[ki])]
        stage = 0 if ki == Head.EMBEDDING else t.degrees.pp - 1
        comm = float(head_comm[op.name])
        draft = float(np.broadcast_to(c.draft_s, c.compute_s.shape)[bi])
        acc.add(
            # speculative decoding's draft passes run with the sampler (as compute)
            f"head.{op.name}" + (" + MTP drafts" if draft else ""),
            op.options[int(h[ki])].name,
            on_fullest=int(stage == p.fullest),
            time=float(c.time_s[bi]) + comm,
            compute=float(c.compute_s[bi]) + draft,
            memory=float(c.memory_s[bi]) + c.kernel_s,
            comm=comm,
            weight=c.weight_bytes,
            act=float(c.act_bytes[-1]),
            source=c.source,
            kernel=kernel_class(op),
        )
