"""One engine iteration of one plan, priced by its composition: what a request-level
simulator steps through, with the kernels and engine costs of the analytic forms.

An iteration on one attention-DP rank decodes ``c`` requests (one token each, at a
mean context ``L``) and prefills prompt tokens. Its time is the round of
:mod:`shardlab.costmodel.regimes`: ``R + i`` with ``R = max(sum(t_s), m * max(t_s))``
over the plan's stages, ``m = min(pp, c)`` micro-batches of ``ceil(c / m)`` requests
(the steady state, every micro-batch running its share of the iteration), and a
prompt alone takes ``S = sum(t_s)`` (one request, no micro-batches: the pipeline's
fill and drain). Each time below is read off the evaluator itself
(:func:`shardlab.costmodel.arithmetic.assemble`) on a problem that differs from the
plan's only in the workload whose step it prices, so that it is the forms' number,
not a second copy of their formulas:

- **decode** ``(c, L)``: exact at every ``c`` in ``0..max`` and at the context
  nodes (a decode-phase workload of context ``L``: input ``L - 1``, output 2; the
  workload's own mean context ``input + output / 2`` is a node, priced from the
  workload's own lengths; by default one a doubling from 64 to the model's longest
  context); linear in ``L`` between nodes (silicon's decode kernels are linear between
  their measured lengths: 0.2% off at most on the tested plans) and past the last,
  clamped below the first.
- **prompt** ``S(P)``: one prompt of ``P`` tokens alone, exact at the prompt nodes
  (the workload's input is one; by default four a doubling from 16 to the model's
  longest context), linear between them (measured GEMMs have bumps in the token
  count: 2.0% off at most on the tested plans) and past the last. A chunk of ``P``
  tokens after ``Q`` cached ones is ``S(Q + P) - S(Q)``: the cost model prices no
  chunk of its own, and this choice makes a prompt's chunks add up to the prompt
  (approximate: each chunk's fixed per-pass costs are then shared out, not paid once
  per iteration).
- **mixed** ``(c, L, P)``: ``c`` decoding requests and ``P`` prompt tokens, as the
  cost model's in-flight round prices them: the decode round and ``P / input``
  whole prompts of the workload's input length, each alone (``x = P / c`` prompt
  tokens per decoding request). Exact at every ``c`` and at the ratio nodes ``x =
  input / o'`` (the round of the workload with output ``o'``; ``o' = output``: the
  forms' TPOT round) and ``x = 0`` (decode alone; by default ``o'`` four a doubling
  from 1 to four times the output), linear in ``x`` between nodes and past the last
  (as the round is); the decode context moves it by ``decode(c, L) - decode(c, L')``
  (``L'`` the node's), exact at the workload's own point. The prompt tokens' own
  context (a chunk late in a long prompt) does not move it: the round prices them as
  the forms do.

Micro-batches are the tables': ``c = 3`` on two stages runs two micro-batches of two,
each request with its ``x`` prompt tokens (so, at a fixed ``P``, three requests can
take longer than four). Speculative decoding is refused (its tables are per accepted
token).

Prefill-first engines (SGLang) run prefill iterations of their own (``c = 0``): a
prefill iteration of prompts is the sum of their ``S`` (the forms' cohort of ``k``
prompts takes ``k * S``) plus ``i``. The fixed cost per request ``r`` is apart
(:attr:`IterationCosts.request_s`): it is in TTFT, not in any iteration.

The engine's limits on one rank come with it, for a scheduler to step under: its
token budget per iteration and running requests (:func:`shardlab.costmodel.engines.engine_limits`,
the problem's own flags first) and the KV cache's capacity in tokens
(:attr:`IterationCosts.kv_tokens`: the requests of the workload's length the plan's
memory holds, as the evaluator budgets it, times that length).

Building one prices about a hundred derived problems through the evaluator (1 to 4 s
on the tested plans) and fills its caches (the stacks of the last 64 problems): build
once per plan, then price thousands of iterations a call (10,000 in under 6 ms).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardlab.costmodel.arithmetic import assemble
from shardlab.costmodel.engines import engine_limits, serving_costs
from shardlab.costmodel.tables import degree_tables
from shardlab.costmodel.units import units_of_plan
from shardlab.errors import ShardlabError
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.problems.workload import Workload

# Nodes of the default grids per doubling of the prompt or output length.
PER_OCTAVE = 4
# Requests of the workload's length counted into the KV capacity at most, per rank
KV_REQUESTS = 8192


@dataclass(frozen=True, kw_only=True)
class IterationCosts:
    """The iteration times of one plan on one problem, per attention-DP rank, in
    seconds (see the module docstring for what is exact and what is interpolated)."""

    max_requests: int  # decoding requests per rank the tables go to
    contexts: np.ndarray  # (K,) mean decode contexts priced, increasing
    decode_s: np.ndarray  # (max + 1, K) R + i of decoding alone (row 0: none, 0)
    ratios: np.ndarray  # (J,) prompt tokens per decoding request priced, from 0, increasing
    ratio_context: np.ndarray  # (J,) the mean decode context each ratio was priced at
    mixed_s: np.ndarray  # (max + 1, J) R + i of c decoding and c * ratio prompt tokens
    prompts: np.ndarray  # (P,) prompt lengths priced, from 0, increasing
    prompt_s: np.ndarray  # (P,) S of one prompt alone (0 at length 0)
    iteration_s: float  # the engine's fixed cost per iteration, in every iteration
    request_s: float  # the engine's fixed cost per request, in its TTFT
    prefill_first: bool  # prompts run in prefill iterations of their own
    max_running: int  # the engine's running requests per rank
    max_tokens: int  # the engine's tokens per iteration per rank (its budget)
    kv_tokens: int  # tokens the KV cache of one rank holds (0: none fits)

    @classmethod
    def of(
        cls,
        problem: Problem,
        plan: Plan,
        *,
        max_requests: int | None = None,
        contexts: Sequence[int] = (),
        prompts: Sequence[int] = (),
        outputs: Sequence[int] = (),
    ) -> IterationCosts:
        """Price ``plan``'s iterations: up to ``max_requests`` decoding requests per
        rank (default: what the workload offers a rank under the plan's degrees), at
        the mean decode ``contexts``, prompt lengths ``prompts`` and mixed rounds of
        outputs ``outputs`` (each with a default grid; the workload's own point is
        always priced)."""
        w = problem.workload
        if w.draft_tokens > 0:
            raise ShardlabError(
                f"workload {w.preset!r} decodes speculatively: its iterations are not "
                "priced one by one yet",
                field="workload.draft_tokens",
                fix="set draft_tokens to 0",
            )
        d = plan.degrees
        top = degree_tables(problem, d).request_range.max_requests_per_rank
        top = int(top if max_requests is None else max_requests)
        if top < 1:
            raise ShardlabError(
                f"max_requests {top}: an iteration table needs at least one request",
                field="max_requests",
                fix="give a positive number of requests per rank",
            )
        i, o = w.input_len, w.output_len
        ranks = d.replicas * d.dp_attn
        # the derived problems price what is asked of them, beyond the engine's limits
        base = dataclasses.replace(problem, handoff=None, max_batch=top, max_tokens=1 << 30)
        own = i + o / 2.0  # mean context of a decode step (steps.Step.decode_context)
        # decode costs are linear in the context between the measured kernels' lengths:
        # one node a doubling, up to the model's longest context
        # (a node of context L runs L + 1 tokens: the model's limit minus one at most)
        longest = problem.model.max_position_embeddings - 1
        if longest < i + o:
            longest = 2 * (i + o)  # no limit stated (0)
        grid = contexts or [min(c, longest) for c in _powers(64, longest, per_octave=1)]
        ctx_nodes = sorted({float(c) for c in grid if c != own} | {own})
        decode = np.zeros((top + 1, len(ctx_nodes)))
        for k, ctx in enumerate(ctx_nodes):
            lengths = (i, o) if ctx == own else (round(ctx) - 1, 2)
            wk = _plain(w, phase="decode", input_len=lengths[0], output_len=lengths[1])
            decode[1:, k] = _rounds(base, plan, wk, ranks, top)
        # mixed rounds of outputs up to 4 o, within the model's context
        outs = sorted(
            {int(x) for x in (outputs or _powers(1, 4 * o)) if 1 <= x <= longest + 1 - i} | {o}
        )
        ratios, ratio_ctx = [0.0], [own]
        mixed = [decode[:, ctx_nodes.index(own)]]
        for out in reversed(outs):  # increasing ratio
            wk = _plain(w, phase="request", output_len=out)
            ratios.append(i / out)
            ratio_ctx.append(i + out / 2.0)
            mixed.append(np.concatenate([[0.0], _rounds(base, plan, wk, ranks, top)]))
        grid = prompts or [min(p, longest) for p in _powers(16, longest)]
        lengths = sorted({int(p) for p in grid if p >= 1} | {i})
        prompt_s = [0.0]
        costs = serving_costs(problem)
        iteration = costs.iteration_ns * 1e-9
        limits = engine_limits(problem, d.tp, d.pp, d.dp_attn)
        for p in lengths:
            wk = _plain(
                w, phase="prefill", schedule="static", input_len=p, output_len=1, batch=ranks
            )
            q = dataclasses.replace(base, workload=wk)
            a = assemble(q, units_of_plan(q, plan))
            prompt_s.append(float(a.metrics.ttft_ms[0]) * 1e-3 - iteration)
        tables = cls(
            max_requests=top,
            contexts=np.array(ctx_nodes),
            decode_s=decode,
            ratios=np.array(ratios),
            ratio_context=np.array(ratio_ctx),
            mixed_s=np.stack(mixed, axis=1),
            prompts=np.array([0.0, *lengths]),
            prompt_s=np.array(prompt_s),
            iteration_s=iteration,
            request_s=costs.request_ns * 1e-9,
            prefill_first=costs.prefill_first,
            max_running=limits.max_batch,
            max_tokens=limits.max_tokens,
            kv_tokens=cls.kv_capacity(problem, plan),
        )
        # the simulator's own engine costs (fitted through it): the same iterations
        return tables.with_engine_costs(
            costs.simulated_request_ns * 1e-9, costs.simulated_iteration_ns * 1e-9
        )

    def with_engine_costs(self, request_s: float, iteration_s: float) -> IterationCosts:
        """The same iterations under other fixed engine costs (a calibration's): every
        priced iteration holds one iteration cost, the request cost is apart."""
        shift = iteration_s - self.iteration_s
        decode = self.decode_s + shift
        decode[0] = 0.0  # no request: no iteration
        mixed = self.mixed_s + shift
        mixed[0] = 0.0
        return dataclasses.replace(
            self, decode_s=decode, mixed_s=mixed, iteration_s=iteration_s, request_s=request_s
        )

    @staticmethod
    def kv_capacity(problem: Problem, plan: Plan) -> int:
        """Tokens of KV cache one rank of ``plan`` holds: the requests of the workload's
        length (input and output) that fit its memory with no engine limit on their
        number (up to :data:`KV_REQUESTS`), times that length (a sliding window's or a
        linear layer's cache is then counted at that length: it is not linear in it)."""
        w = problem.workload
        d = plan.degrees
        ranks = d.replicas * d.dp_attn
        # past any engine's default count; the decode workspace of that many requests
        # is then budgeted as well
        wk = _plain(w, phase="decode", batch=KV_REQUESTS * ranks)
        q = dataclasses.replace(
            problem, workload=wk, handoff=None, max_batch=KV_REQUESTS, max_tokens=1 << 30
        )
        a = assemble(q, units_of_plan(q, plan), np.ones(1, dtype=np.int64))
        held = int(a.metrics.capacity_per_rank[0])
        if held == 0:
            # the workspace of that many requests leaves no room (a plan whose memory is
            # tight): the workspace of the engine's own limits, as it allocates it
            limits = engine_limits(problem, d.tp, d.pp, d.dp_attn)
            wk = _plain(w, phase="decode", batch=limits.max_batch * ranks)
            q = dataclasses.replace(problem, workload=wk, handoff=None)
            a = assemble(q, units_of_plan(q, plan), np.ones(1, dtype=np.int64))
            held = int(a.metrics.capacity_per_rank[0])
        return held * (w.input_len + w.output_len)

    def _requests(self, requests: np.ndarray | int) -> np.ndarray:
        c = np.asarray(requests)
        if c.dtype.kind not in "iu" or (c < 0).any() or (c > self.max_requests).any():
            raise ShardlabError(
                f"decoding requests per rank must be integers in 0..{self.max_requests}",
                field="requests",
                fix="price the plan with a larger max_requests",
            )
        return c

    def decode(self, requests: np.ndarray | int, context: np.ndarray | float) -> np.ndarray:
        """Seconds of iterations that decode ``requests`` per rank at mean ``context``
        and nothing else (``R + i``; 0 for none)."""
        c = self._requests(requests)
        return _along(self.contexts, self.decode_s, c, np.asarray(context, dtype=float))

    def prompt(self, tokens: np.ndarray | float, context: np.ndarray | float = 0.0) -> np.ndarray:
        """Seconds of a prompt's ``tokens`` after ``context`` cached ones, alone:
        ``S(context + tokens) - S(context)`` (no iteration cost)."""
        t, q = np.asarray(tokens, dtype=float), np.asarray(context, dtype=float)
        s = self.prompt_s[None, :]
        zero = np.zeros(np.broadcast_shapes(t.shape, q.shape), dtype=np.int64)
        # measured GEMMs dip by a few percent between nearby token counts, so a short
        # chunk's difference can come out below zero: it then takes no time of its own
        return np.maximum(
            _along(self.prompts, s, zero, q + t) - _along(self.prompts, s, zero, q), 0.0
        )

    def iteration(
        self,
        requests: np.ndarray | int,
        context: np.ndarray | float,
        prompt_tokens: np.ndarray | float,
    ) -> np.ndarray:
        """Seconds of iterations of ``requests`` decoding per rank at mean ``context``
        and ``prompt_tokens`` prompt tokens (with the iteration cost ``i``; 0 when
        empty). With no decoding request the prompt tokens are one prompt's chunk from
        its start (:meth:`prompt`); prefill iterations of several prompts add their
        :meth:`prompt` times to one ``iteration_s``."""
        c = self._requests(requests)
        ctx = np.asarray(context, dtype=float)
        p = np.asarray(prompt_tokens, dtype=float)
        c, ctx, p = np.broadcast_arrays(c, ctx, p)
        ratio = np.where(c > 0, p / np.maximum(c, 1), 0.0)
        mixed = _along(self.ratios, self.mixed_s, c, ratio)
        # the decode context each ratio was priced at, moved to the one asked for
        at = _along(self.ratios, self.ratio_context[None, :], np.zeros_like(c), ratio)
        mixed = mixed + self.decode(c, ctx) - self.decode(c, at)
        alone = np.where(p > 0, self.prompt(p) + self.iteration_s, 0.0)
        return np.where(c > 0, mixed, alone)


def _plain(w: Workload, **changes: object) -> Workload:
    """``w`` as a derived step's workload: no SLO, clients, rate, objective or prefix
    reuse of its own (whole prompts)."""
    return dataclasses.replace(
        w,
        ttft_ms=None,
        tpot_ms=None,
        objective="throughput",
        clients=None,
        rate=None,
        prefix_reuse=0.0,  # a simulator looks its prompts' prefixes up itself
        **{"schedule": "inflight", "batch": 1, **changes},
    )


def _rounds(base: Problem, plan: Plan, w: Workload, ranks: int, top: int) -> np.ndarray:
    """``R + i`` (seconds) of ``w``'s round at 1..top requests per rank (the TPOT the
    evaluator gives, whose form is the round)."""
    q = dataclasses.replace(base, workload=dataclasses.replace(w, batch=top * ranks))
    units = units_of_plan(q, plan)
    a = assemble(q, units.take(np.zeros(top, dtype=np.int64)), np.arange(1, top + 1))
    return a.metrics.tpot_ms * 1e-3


def _powers(lo: int, hi: float, per_octave: int = PER_OCTAVE) -> list[int]:
    """Whole numbers from ``lo`` to the first at or above ``hi``, ``per_octave`` to
    each doubling."""
    out = [float(lo)]
    while out[-1] < hi:
        out.append(out[-1] * 2 ** (1 / per_octave))
    return sorted({round(x) for x in out})


def _along(x: np.ndarray, table: np.ndarray, row: np.ndarray, at: np.ndarray) -> np.ndarray:
    """``table[row]`` as a function of ``x`` at ``at``: linear between nodes and past
    the last, the first node's value below it."""
    row, at = np.broadcast_arrays(row, at)
    if len(x) == 1:
        return table[row, 0]
    k = np.clip(np.searchsorted(x, at, side="right"), 1, len(x) - 1)
    lo, hi = table[row, k - 1], table[row, k]
    t = np.maximum((at - x[k - 1]) / (x[k] - x[k - 1]), 0.0)
    return lo + t * (hi - lo)
