"""Cost tables of one degree tuple: every operator option, every edge, every hop.

Once the degrees are fixed the cost of a plan is a sum of table entries (the additive
decomposition that exact search relies on):

- per layer: the chosen option of each operator (``op_time``) plus the
  redistribution on each edge between operators (``edge_time``) plus the
  redistribution from the previous layer's residual stream (``inter_time``);
- per stage: its layers, the model's ends on the first and last stage (``head_*``),
  and the point-to-point send of the residual stream to the next stage (``p2p``);
- memory: weights and KV cache per option (sums), activation workspace (the largest
  operator of the stage).

Tables are arrays over ``b`` (requests per attention-data-parallel rank per
micro-batch), so the same tables serve every concurrency of an in-flight workload.
They are not always nondecreasing in ``b``: measured kernel tables have bumps (a MoE
layer of Mixtral 8x7B on two H100 is timed at 3.2 ms for 185 tokens and 0.66 ms for
260), and a deployment running ``c`` requests runs them, so the model keeps them as
measured; :meth:`DegreeTables.floor` gives the least of each table over ``b`` and
more, the lower bound exact search uses for every concurrency at once.
Layers are grouped into classes (layer kind, token mixer): layers of one class have
identical tables.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from shardlab.costmodel.collectives import hop_is_inter_node, p2p_time
from shardlab.costmodel.constants import ACT_BYTES
from shardlab.costmodel.context import CostContext, OptionCost
from shardlab.costmodel.engines import engine_limits
from shardlab.costmodel.opcosts import option_cost
from shardlab.costmodel.steps import Step, round_tokens, steps_of
from shardlab.costmodel.widths import output_width
from shardlab.problems.model import LayerAttention, LayerKind, Model
from shardlab.problems.operators import HEAD_OPS, OpSpec, OptionSpec, layer_edges, layer_ops
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from shardlab.problems.request_range import request_range
from shardlab.problems.space import megatron_index

LayerClass = tuple[LayerKind, LayerAttention]


def layer_class(model: Model, layer: int) -> LayerClass:
    return model.layer_kinds[layer], model.attention_layers[layer]


@lru_cache(maxsize=64)
def layer_classes_of(model: Model) -> tuple[LayerClass, ...]:
    """(layer kind, token mixer) pairs: layers of one class share their tables."""
    return tuple(dict.fromkeys(zip(model.layer_kinds, model.attention_layers, strict=True)))


def table_dims(model: Model) -> tuple[int, int, int, int]:
    """(classes, operators, options, edges): the padded sizes of every degree tuple's
    tables (operators and edges per layer, options per operator, at most)."""
    kinds = model.kinds
    n_ops = max(len(layer_ops(model, k)) for k in kinds)
    n_opts = max(len(op.options) for k in kinds for op in (*layer_ops(model, k), *HEAD_OPS))
    n_edges = max(len(layer_edges(model, k)) for k in kinds)
    return len(layer_classes_of(model)), n_ops, n_opts, n_edges


class DegreeTables:
    """All cost tables of one problem under one degree tuple."""

    def __init__(self, problem: Problem, degrees: Degrees) -> None:
        self.problem = problem
        self.degrees = degrees
        self.engine = engine_limits(problem, degrees.tp, degrees.pp, degrees.dp_attn)
        self.steps: tuple[Step, ...] = steps_of(problem.workload)
        self.request_range = request_range(
            problem.workload,
            degrees,
            max_batch=self.engine.max_batch,
            max_tokens=self.engine.max_tokens,
            round_tokens=round_tokens(problem.workload),
        )
        bt = self.request_range
        if bt.inflight:
            b_max = int(bt.b_of(bt.max_requests_per_rank, degrees.pp))
            self.b = np.arange(1, b_max + 1)
        else:
            self.b = np.array([int(bt.b_of(bt.max_requests_per_rank, degrees.pp))])
        self.ctx = CostContext(problem, degrees, self.b)
        m = problem.model
        self.classes = layer_classes_of(m)
        self.kinds: tuple[LayerKind, ...] = m.kinds
        self.ops: dict[LayerKind, tuple[OpSpec, ...]] = {k: layer_ops(m, k) for k in self.kinds}
        _, self.n_ops, self.n_opts, self.n_edges = table_dims(m)
        self.res_index = 0  # "residual" is every layer's first operator
        self._build_op_tables()
        # redistributions priced in this build: the same pair of layouts and bytes per
        # request recurs across options, edges, classes and the model's ends
        seen: dict[tuple, np.ndarray] = {}
        self._build_edge_tables(seen)
        self._build_head_tables(seen)
        self._build_p2p()
        if [s.kind for s in self.steps] == ["decode", "prefill"]:  # in flight, with prompts
            self._with_prompts(0, 1)
        for st, step in enumerate(self.steps):
            if step.accepted != 1.0:
                self._per_accepted_token(st, step.accepted)

    def _build_op_tables(self) -> None:
        """The operators of the layers: every option of every class, step by step."""
        nb, nc, k, o = len(self.b), len(self.classes), self.n_ops, self.n_opts
        ns = len(self.steps)
        self.op_costs: list[list[list[list[OptionCost | None]]]] = []
        self.op_time = np.zeros((ns, nc, k, o, nb))
        self.op_act = np.zeros((ns, nc, k, o, nb))
        self.op_weight = np.zeros((nc, k, o))
        self.op_kv = np.zeros((nc, k, o))
        self.op_kv_split = np.zeros((nc, k, o), dtype=bool)
        for si, step in enumerate(self.steps):
            per_class = []
            for ci, (kind, attn) in enumerate(self.classes):
                per_op = []
                for ki, op in enumerate(self.ops[kind]):
                    per_opt: list[OptionCost | None] = []
                    for oi, opt in enumerate(op.options):
                        c = option_cost(self.ctx, op, opt, step, attn)
                        per_opt.append(c)
                        self.op_time[si, ci, ki, oi] = c.time_s
                        self.op_act[si, ci, ki, oi] = c.act_bytes
                        self.op_weight[ci, ki, oi] = c.weight_bytes
                        self.op_kv[ci, ki, oi] = c.kv_bytes_per_req
                        self.op_kv_split[ci, ki, oi] = c.kv_split_tp
                    per_op.append(per_opt)
                per_class.append(per_op)
            self.op_costs.append(per_class)

    def _build_edge_tables(self, seen: dict) -> None:
        """Edges inside a layer (per class: the mixer decides the tensor widths)."""
        m, o = self.problem.model, self.n_opts
        self.edges: dict[LayerKind, tuple[tuple[int, int], ...]] = {}
        self.edge_time = np.zeros(
            (len(self.steps), len(self.classes), self.n_edges, o, o, len(self.b))
        )
        for ci, (kind, attn) in enumerate(self.classes):
            ops = self.ops[kind]
            names = [op.name for op in ops]
            pairs = []
            for ei, (src, dst) in enumerate(layer_edges(m, kind)):
                si_, di_ = names.index(src), names.index(dst)
                pairs.append((si_, di_))
                width = output_width(ops[si_], self.problem, attn)
                for st, step in enumerate(self.steps):
                    self.edge_time[st, ci, ei] = self._edge_table(
                        ops[si_], ops[di_], step.tokens, width, seen
                    )
            self.edges[kind] = tuple(pairs)

    def _build_head_tables(self, seen: dict) -> None:
        """The residual stream from one layer to the next, and the model's ends."""
        problem, m = self.problem, self.problem.model
        ns, o, nb = len(self.steps), self.n_opts, len(self.b)
        residual = self.ops[self.kinds[0]][self.res_index]
        self.inter_time = np.zeros((ns, o, o, nb))
        self.head_time = np.zeros((ns, len(HEAD_OPS), o, nb))
        self.head_act = np.zeros((ns, len(HEAD_OPS), o, nb))
        self.head_weight = np.zeros((len(HEAD_OPS), o))
        self.head_costs: list[list[list[OptionCost]]] = []
        emb, fnorm, lm, sampler = HEAD_OPS
        h = float(m.hidden_size)
        self.emb_first = np.zeros((ns, o, o, nb))
        self.last_fnorm = np.zeros((ns, o, o, nb))
        self.fnorm_lm = np.zeros((ns, o, o, nb))
        self.lm_sampler = np.zeros((ns, o, o, nb))
        drafting = problem.workload.draft_tokens > 0
        for st, step in enumerate(self.steps):
            self.inter_time[st] = self._edge_table(residual, residual, step.tokens, h, seen)
            # MTP weights sit on the last stage whatever the step; drafts run in decoding ones.
            draft = self._draft(step) if drafting else None
            per_op = []
            for ki, op in enumerate(HEAD_OPS):
                per_opt = []
                for oi, opt in enumerate(op.options):
                    c = option_cost(self.ctx, op, opt, _rows_step(op, step), None)
                    if draft is not None and op is sampler:
                        seconds = 0.0 if step.kind == "prefill" else draft[0]
                        c = replace(c, draft_s=seconds, weight_bytes=c.weight_bytes + draft[1])
                    per_opt.append(c)
                    self.head_time[st, ki, oi] = c.time_s
                    self.head_act[st, ki, oi] = c.act_bytes
                    self.head_weight[ki, oi] = c.weight_bytes
                per_op.append(per_opt)
            self.head_costs.append(per_op)
            self.emb_first[st] = self._edge_table(emb, residual, step.tokens, h, seen)
            self.last_fnorm[st] = self._edge_table(residual, fnorm, step.logits, h, seen)
            self.fnorm_lm[st] = self._edge_table(fnorm, lm, step.logits, h, seen)
            self.lm_sampler[st] = self._edge_table(
                lm, sampler, step.logits, output_width(lm, problem), seen
            )

    def _build_p2p(self) -> None:
        """The send of the residual stream from each stage to the next."""
        problem, degrees = self.problem, self.degrees
        h = float(problem.model.hidden_size)
        residual = self.ops[self.kinds[0]][self.res_index]
        pp = degrees.pp
        self.p2p = np.zeros((len(self.steps), max(pp - 1, 0), self.n_opts, len(self.b)))
        for st, step in enumerate(self.steps):
            for s in range(pp - 1):
                inter = hop_is_inter_node(s, degrees, problem.cluster)
                for oi, opt in enumerate(residual.options):
                    full = self.b * step.tokens * degrees.dp_attn * h * ACT_BYTES
                    local = full / degrees.dp_attn
                    if opt.out[1].kind == "S":
                        local = local / degrees.tp
                    hop = p2p_time(local, inter, problem.cluster)
                    self.p2p[st, s, oi] = hop * self.ctx.communication_factor

    # Tables whose entries are times of one step.
    TIME_TABLES = (
        "op_time",
        "edge_time",
        "inter_time",
        "head_time",
        "emb_first",
        "last_fnorm",
        "fnorm_lm",
        "lm_sampler",
        "p2p",
    )

    def _with_prompts(self, st: int, prompt: int) -> None:
        """Round ``st`` carries the prompts of the requests that replace finished ones,
        each whole (see :mod:`shardlab.costmodel.steps`): a micro-batch of ``b`` requests
        finishes ``b * accepted / output`` of them a round, so each of its times gains
        that share of the prompt alone's (step ``prompt``, one request: column 0)."""
        w = self.problem.workload
        share = self.b * w.accepted_per_step / w.output_len
        for name in self.TIME_TABLES:
            table = getattr(self, name)
            table[st] = table[st] + table[prompt][..., :1] * share

        def added(c: OptionCost | None, alone: OptionCost | None) -> OptionCost | None:
            if c is None or alone is None:
                return c
            # its communication stays communication (calibrated by that factor)
            comm = alone.comm_s[0] * share
            kernels = (alone.time_s[0] - alone.comm_s[0]) * share
            return replace(c, comm_s=c.comm_s + comm, prompts_s=c.prompts_s + kernels)

        self.op_costs[st] = [
            [[added(c, a) for c, a in zip(opts, alone_opts, strict=True)] for opts, alone_opts in
             zip(ops, alone_ops, strict=True)]
            for ops, alone_ops in zip(self.op_costs[st], self.op_costs[prompt], strict=True)
        ]  # fmt: skip
        self.head_costs[st] = [
            [added(c, a) for c, a in zip(opts, alone_opts, strict=True)]
            for opts, alone_opts in zip(self.head_costs[st], self.head_costs[prompt], strict=True)
        ]

    def _per_accepted_token(self, st: int, accepted: float) -> None:
        """Time step ``st`` per accepted token: a speculative step advances a request by
        ``accepted`` tokens, so TPOT, throughput and latency follow from the regimes'
        one-token formulas (a new request's TTFT then waits a round over ``accepted``)."""
        for name in self.TIME_TABLES:
            getattr(self, name)[st] /= accepted

        def scaled(c: OptionCost | None) -> OptionCost | None:
            if c is None:
                return None
            return replace(
                c,
                compute_s=c.compute_s / accepted,
                memory_s=c.memory_s / accepted,
                comm_s=c.comm_s / accepted,
                kernel_s=c.kernel_s / accepted,
                draft_s=c.draft_s / accepted,
                prompts_s=c.prompts_s / accepted,
            )

        self.op_costs[st] = [
            [[scaled(c) for c in opts] for opts in ops] for ops in self.op_costs[st]
        ]
        self.head_costs[st] = [[scaled(c) for c in opts] for opts in self.head_costs[st]]

    def _draft(self, step: Step) -> tuple[np.ndarray, float]:
        """(seconds, weight bytes per GPU) of speculative decoding's drafts in one step:
        ``draft_tokens`` passes, one token per decoding request each, of one MTP layer
        (shaped as the last layer, sharded as Megatron would under these degrees, as
        vLLM runs the draft with the target's tensor parallelism) with its input
        projection and three norms, the LM head and the sampler, on the last stage. The
        MTP layer's own KV cache (one layer's) is not counted."""
        problem, ctx, d = self.problem, self.ctx, self.degrees
        m = problem.model
        kind, attn = layer_class(m, m.num_layers - 1)
        one = Step(
            kind="decode",
            tokens=1.0,
            logits=1.0,
            input_len=step.input_len,
            output_len=step.output_len,
        )
        chosen = {op.name: (op, _megatron_option(op, d)) for op in self.ops[kind]}
        seconds = np.zeros_like(self.b, dtype=float)
        weight = 0.0
        for op, opt in chosen.values():
            c = option_cost(ctx, op, opt, one, attn)
            seconds = seconds + c.time_s
            weight += c.weight_bytes
        for src, dst in layer_edges(m, kind):
            (s_op, s_opt), (_, d_opt) = chosen[src], chosen[dst]
            full = self.b * d.dp_attn * output_width(s_op, problem, attn) * ACT_BYTES
            seconds = seconds + ctx.redistribution_s(s_opt.out, d_opt.inp, full)
        h = m.hidden_size
        # eh_proj: [embedding; hidden] -> hidden, column-split over tp
        proj = 2 * h * h / d.tp
        proj_bytes = proj * ctx.weight_bytes_per_value("ffn") + 3 * h * ACT_BYTES
        compute, memory = ctx.roofline(
            2.0 * self.b * proj, proj_bytes + self.b * 3 * h * ACT_BYTES, ctx.gemm_rate("ffn")
        )
        seconds = seconds + np.maximum(compute, memory)
        weight += proj_bytes
        _, _, lm, sampler = HEAD_OPS
        for op in (lm, sampler):
            seconds = seconds + option_cost(ctx, op, _megatron_option(op, d), one, None).time_s
        return problem.workload.draft_tokens * seconds, weight

    def workspace(self) -> tuple[np.ndarray, np.ndarray]:
        """The activation workspace the engine reserves per (class, op, option) and per
        (head op, option): the largest over the steps, at one request for single steps
        and at the most requests otherwise."""
        last_b = len(self.b) - 1
        op_act = np.zeros(self.op_act.shape[1:-1])
        head_act = np.zeros(self.head_act.shape[1:-1])
        for si, step in enumerate(self.steps):
            at = 0 if step.single else last_b
            op_act = np.maximum(op_act, self.op_act[si, ..., at])
            head_act = np.maximum(head_act, self.head_act[si, ..., at])
        return op_act, head_act

    def floor(self, name: str) -> np.ndarray:
        """Table ``name`` at each ``b`` replaced by its least value over ``b`` and every
        larger ``b`` of the tables: a lower bound on the entry at any concurrency from
        ``b`` on, nondecreasing in ``b``."""
        floors = self.__dict__.setdefault("_floors", {})
        if name not in floors:
            table = getattr(self, name)
            floors[name] = np.minimum.accumulate(table[..., ::-1], axis=-1)[..., ::-1]
        return floors[name]

    def _edge_table(
        self, src: OpSpec, dst: OpSpec, per_req: float, width: float, seen: dict
    ) -> np.ndarray:
        """Seconds of each (src option, dst option) redistribution per ``b``; ``seen``:
        those already priced in this build, by layouts and bytes per request."""
        o = self.n_opts
        table = np.zeros((o, o, len(self.b)))
        full = self.b * per_req * self.degrees.dp_attn * width * ACT_BYTES
        for i, a in enumerate(src.options):
            for j, c in enumerate(dst.options):
                key = (a.out, c.inp, per_req * width)
                if key not in seen:
                    seen[key] = self.ctx.redistribution_s(a.out, c.inp, full)
                table[i, j] = seen[key]
        return table

    def b_index(self, b: int | np.ndarray) -> np.ndarray:
        return np.asarray(b) - int(self.b[0])


def _megatron_option(op: OpSpec, d: Degrees) -> OptionSpec:
    return op.options[megatron_index(op, d)]


def _rows_step(op: OpSpec, step: Step) -> Step:
    """Operators of the output end work on logit rows only (the last token of a prompt)."""
    if op.name == "final_norm":
        return replace(step, tokens=step.logits)
    return step


@lru_cache(maxsize=4096)
def degree_tables(problem: Problem, degrees: Degrees) -> DegreeTables:
    return DegreeTables(problem, degrees)
