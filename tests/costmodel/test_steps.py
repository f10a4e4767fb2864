"""Steps of a workload, their tokens and attention pairs (shardlab.costmodel.steps)."""

from __future__ import annotations

import numpy as np
import pytest

from shardlab.costmodel.steps import attended, causal_pairs, kv_context, round_tokens, steps_of
from shardlab.problems.model import FULL, AttentionSpan
from shardlab.problems.workload import get_workload

CHAT = get_workload("chat").with_overrides(input_len=1000, output_len=200)


def brute_pairs(length: int, span: AttentionSpan) -> int:
    """Query-key pairs counted one query at a time."""
    return int(attended(np.arange(1, length + 1), span).sum())


@pytest.mark.parametrize(
    "span", [FULL, AttentionSpan(kind="sliding", tokens=7), AttentionSpan(kind="chunked", tokens=5)]
)
@pytest.mark.parametrize("length", [1, 4, 5, 7, 23, 64])
def test_causal_pairs_count_every_query_key_pair(span: AttentionSpan, length: int) -> None:
    assert causal_pairs(length, span) == brute_pairs(length, span)


def test_attended_keys_stay_inside_the_window_or_chunk() -> None:
    ctx = np.arange(1, 30)
    assert (attended(ctx, FULL) == ctx).all()
    assert attended(ctx, AttentionSpan(kind="sliding", tokens=8)).max() == 8
    chunked = attended(ctx, AttentionSpan(kind="chunked", tokens=10))
    assert chunked[9] == 10 and chunked[10] == 1  # a new chunk starts over


def test_step_kinds_by_phase_and_schedule() -> None:
    kinds = {
        (phase, schedule): [
            s.kind for s in steps_of(CHAT.with_overrides(phase=phase, schedule=schedule))
        ]
        for phase in ("prefill", "decode", "request")
        for schedule in ("static", "inflight")
    }
    assert kinds[("prefill", "static")] == kinds[("prefill", "inflight")] == ["prefill"]
    assert kinds[("decode", "static")] == kinds[("decode", "inflight")] == ["decode"]
    assert kinds[("request", "static")] == ["prefill", "decode"]
    assert kinds[("request", "inflight")] == ["decode", "prefill"]


def test_in_flight_prompts_are_whole_prompts_beside_the_decode_round() -> None:
    """The round is a decode step: the prompts of the requests it replaces are priced
    whole (the single prefill), not spread over it as a few tokens a request; the
    engine's token budget still holds each request's share of its prompt."""
    w = CHAT.with_overrides(schedule="inflight")
    decode, first = steps_of(w)
    assert decode.kind == "decode" and decode.tokens == 1.0 and decode.prompt_tokens == 0.0
    assert decode.logits == 1.0 and decode.pairs(FULL)[1] == 0.0
    assert first.single and first.kind == "prefill" and first.tokens == 1000
    assert first.prompt_tokens == 1000
    # a request lasts 200 rounds: its 1000-token prompt is 5 tokens of each round's budget
    assert round_tokens(w) == pytest.approx(1 + 1000 / 200)
    assert round_tokens(w.with_overrides(phase="decode")) == 1.0
    assert round_tokens(w.with_overrides(phase="prefill")) == 1000.0


def test_speculative_decoding_verifies_drafts_and_advances_by_accepted_tokens() -> None:
    w = CHAT.with_overrides(schedule="inflight", draft_tokens=2, acceptance=0.5)
    decode, _ = steps_of(w)
    assert decode.decode_tokens == decode.tokens == 3.0
    assert decode.accepted == pytest.approx(1 + 0.5 + 0.25)
    assert round_tokens(w) == pytest.approx(3 + 1000 * 1.75 / 200)


def test_decode_reads_the_context_the_request_has_grown_to() -> None:
    (decode,) = steps_of(CHAT.with_overrides(phase="decode"))
    # mean over the 199 decode steps after the first token: 1000 + 1 .. 1000 + 199
    assert decode.decode_context(FULL) == pytest.approx(1000 + 100)
    assert decode.kv_read(FULL) == decode.decode_context(FULL)
    window = AttentionSpan(kind="sliding", tokens=128)
    assert decode.decode_context(window) == 128
    assert decode.pairs(FULL) == (decode.decode_context(FULL), 0.0)
    (prefill,) = steps_of(CHAT.with_overrides(phase="prefill"))
    assert prefill.pairs(FULL) == (0.0, causal_pairs(1000, FULL))
    assert prefill.kv_read(FULL) == 0.0


def test_kv_context_is_what_a_request_holds_when_memory_is_tightest() -> None:
    assert kv_context(CHAT.with_overrides(phase="prefill")) == 1000
    assert kv_context(CHAT.with_overrides(schedule="static")) == 1200
    assert kv_context(CHAT.with_overrides(schedule="inflight")) == pytest.approx(1000 + 199 / 2)
