"""What one pipeline micro-batch computes in each kind of step of a workload.

A step processes ``b`` requests on each attention-data-parallel rank. Per request it
carries ``tokens`` query tokens, produces ``logits`` logit rows, writes ``tokens``
new KV entries per layer and, per attention layer, multiplies query-key pairs and
reads cached KV entries. Steps by workload:

- static prefill: every request's whole prompt (``input_len`` tokens, causal);
- decode: one token per request at the mean context of its generation; the first
  output token comes from the prefill, the other ``output_len - 1`` from decode steps
  at contexts ``input_len + 1 .. input_len + output_len - 1`` (the mean is exact for
  every cost linear in the context; sliding windows and chunks are averaged token by
  token);
- in flight with prompts: the decode step, and a prompt alone (one request per dp
  rank, ``single`` below). The prompts of the requests that replace finished ones
  are not spread over the rounds as ``input_len / output_len`` tokens per request:
  an engine prefills a prompt whole (or in chunks of its token budget) in an
  iteration of its own or beside the decodes, so a prompt is priced as one, and
  the round is the decode step plus the prompts it prefills, ``b * accepted /
  output_len`` of them for a micro-batch of ``b`` (the tables add that share of the
  prompt alone to the decode step: :class:`shardlab.costmodel.tables.DegreeTables`;
  an upper bound where a round holds several prompts, which an engine batches).
  Spread thin, a prompt's tokens were priced at a small batch's cost per token: a
  MoE layer reads most of its experts for 64 tokens but hardly more for 8,192, so
  DeepSeek-V3's TPOT came out up to twice the measured at 8,192-token prompts.
- prefix reuse (``Workload.prefix_reuse``): a prefill step computes the prompt's
  tokens past its cached prefix (:func:`prefill_tokens`), each attending to the whole
  prompt before it, and reads the prefix's cached KV; the decode context and the KV
  cache keep the whole prompt.
- speculative decoding: a decoding request verifies ``draft_tokens + 1`` tokens per
  step (each attends to its context; the cached KV is read once) and advances by
  ``accepted`` of them; the draft passes are priced with the sampler
  (:mod:`shardlab.costmodel.tables`), and decode steps are timed per accepted token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from shardlab.problems.model import AttentionSpan
from shardlab.problems.workload import Workload

StepKind = Literal["prefill", "decode"]


def causal_pairs(length: int, span: AttentionSpan) -> float:
    """Query-key pairs of causal attention over ``length`` tokens."""
    w = span.tokens
    if span.kind == "full" or w >= length:
        return length * (length + 1) / 2.0
    if span.kind == "sliding":
        # The first `w` queries see 1..w keys, the rest see `w` each.
        return w * (w + 1) / 2.0 + (length - w) * w
    # Chunked: each whole chunk is a causal block of its own, then the partial one.
    whole, rest = divmod(length, w)
    return whole * w * (w + 1) / 2.0 + rest * (rest + 1) / 2.0


def attended(context: np.ndarray, span: AttentionSpan) -> np.ndarray:
    """Keys a token attends to at each ``context`` (its own position counted)."""
    if span.kind == "full":
        return context
    if span.kind == "sliding":
        return np.minimum(context, span.tokens)
    return (context - 1) % span.tokens + 1


@dataclass(frozen=True, kw_only=True)
class Step:
    kind: StepKind
    tokens: float  # query tokens per request
    logits: float  # logit rows per request
    input_len: int
    output_len: int
    single: bool = False  # one request per dp rank, whatever the concurrency
    decode_tokens: float = 1.0  # tokens a decoding request verifies (draft tokens + 1)
    accepted: float = 1.0  # tokens a decode step advances a request by (on average)
    cached: int = 0  # a prefill's prompt tokens already in the prefix cache (not computed)

    @property
    def prompt_tokens(self) -> float:
        """Prompt tokens per request in the step (a decode step has none)."""
        return self.tokens if self.kind == "prefill" else 0.0

    def decode_context(self, span: AttentionSpan) -> float:
        """Mean keys a decode token attends to (and KV entries it reads)."""
        ctx = self.input_len + np.arange(1, max(self.output_len, 2), dtype=float)
        return float(attended(ctx, span).mean())

    def pairs(self, span: AttentionSpan) -> tuple[float, float]:
        """(decode pairs, prefill pairs) per request for a layer of ``span``."""
        if self.kind == "prefill":
            whole = causal_pairs(self.input_len, span)
            # the cached prefix's own pairs were computed when it was cached
            return 0.0, whole - causal_pairs(self.cached, span) if self.cached else whole
        return self.decode_context(span) * self.decode_tokens, 0.0

    def kv_read(self, span: AttentionSpan) -> float:
        """Cached KV entries read per request per layer."""
        if self.kind == "prefill":
            # a prompt past a cached prefix reads the prefix's cache (what it attends to)
            return float(attended(np.array([float(self.cached)]), span)[0]) if self.cached else 0.0
        return self.decode_context(span)


def cached_tokens(workload: Workload) -> int:
    """Prompt tokens the prefix cache serves: ``floor(prefix_reuse * input_len)``, below
    ``input_len`` (an engine computes a prompt's last token however much it caches)."""
    return int(workload.prefix_reuse * workload.input_len)


def prefill_tokens(workload: Workload) -> int:
    """Prompt tokens a request's prefill computes: the prompt past its cached prefix.
    The one place the forms read ``prefix_reuse`` (the steps' tokens and attention
    pairs, the engine's token budget per round); the closed loop's first-wave cohorts
    stay whole prompts (:mod:`shardlab.costmodel.regimes`)."""
    return workload.input_len - cached_tokens(workload)


def steps_of(workload: Workload) -> tuple[Step, ...]:
    """Step kinds: (prefill,), (decode,), (prefill, decode) or, in flight with
    prompts, (decode, single prefill)."""
    i, o = workload.input_len, workload.output_len
    v, e = workload.draft_tokens + 1.0, workload.accepted_per_step
    h = cached_tokens(workload)
    prefill = Step(
        kind="prefill", tokens=float(i - h), logits=1.0, input_len=i, output_len=o, cached=h
    )
    spec = {"decode_tokens": v, "accepted": e}
    decode = Step(kind="decode", tokens=v, logits=v, input_len=i, output_len=o, **spec)
    if workload.phase == "prefill":
        return (prefill,)
    if workload.phase == "decode":
        return (decode,)
    if workload.schedule == "static":
        return (prefill, decode)
    first = replace(prefill, single=True)
    return (decode, first)


def round_tokens(workload: Workload) -> float:
    """Tokens a running request brings to one round on average, what the engine's
    token budget per iteration holds: its decode tokens and, in flight with prompts,
    its prompt's share (a request finishes in ``o / e`` rounds: ``i * e / o``); a
    prompt counts the tokens it computes (:func:`prefill_tokens`)."""
    v = workload.draft_tokens + 1.0
    i = prefill_tokens(workload)
    if workload.phase == "request" and workload.schedule == "inflight":
        return v + i * workload.accepted_per_step / workload.output_len
    return float(i) if workload.phase == "prefill" else v


def kv_context(workload: Workload) -> float:
    """Context tokens whose KV a request keeps, at the moment memory is tightest.

    Static: the batch ends with ``input + output`` tokens each. In flight: requests are
    spread uniformly over their generation, holding ``input + (output - 1) / 2`` on
    average (paged KV cache allocates what is used). Prefill only: the prompt.
    """
    i, o = workload.input_len, workload.output_len
    if workload.phase == "prefill":
        return float(i)
    if workload.schedule == "static":
        return float(i + o)
    return i + (o - 1) / 2.0
