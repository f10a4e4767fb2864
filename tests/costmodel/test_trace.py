"""The collectives one forward pass issues, call by call (shardlab.costmodel.trace)."""

from __future__ import annotations

from collections import Counter

import pytest

from shardlab import Degrees, Problem
from shardlab.costmodel.constants import ACT_BYTES
from shardlab.costmodel.decompose import requests_per_rank
from shardlab.costmodel.experts import COUNT_BYTES
from shardlab.costmodel.trace import collectives_of

PROBLEM = Problem.build(
    "llama-3.1-8b", "h100x8", "chat", timing="roofline", input_len=1000, output_len=200
)
H = PROBLEM.model.hidden_size
LAYERS = PROBLEM.model.num_layers
ROUND_TOKENS = 1  # a decode token per request (prompts run whole: the single prefill)


def megatron(d: Degrees):
    return PROBLEM.space.megatron_plan(d)


def test_pure_replicas_communicate_nothing() -> None:
    assert collectives_of(PROBLEM, megatron(Degrees(replicas=8))) == []


@pytest.mark.parametrize("tp", [2, 4])
def test_megatron_all_reduces_twice_a_layer_over_tp(tp: int) -> None:
    plan = megatron(Degrees(replicas=8 // tp, tp=tp, etp=tp))
    calls = collectives_of(PROBLEM, plan)
    in_layers = [c for c in calls if c.where.startswith("layer")]
    assert Counter(c.where.split(": ")[1] for c in in_layers) == {
        "o_proj -> residual": LAYERS,
        "ffn_down -> residual": LAYERS,
    }
    assert {(c.kind, c.axis, c.group_size) for c in in_layers} == {("all_reduce", "tp", tp)}
    # the residual stream of the rank's requests (one micro-batch: pp = 1)
    b = requests_per_rank(PROBLEM, plan)
    assert {c.bytes for c in in_layers} == {b * ROUND_TOKENS * H * ACT_BYTES}
    assert all(c.group_size == tp for c in calls)


def test_stages_send_the_residual_stream_once_a_boundary() -> None:
    plan = megatron(Degrees(replicas=2, pp=2, tp=2, etp=2))
    calls = collectives_of(PROBLEM, plan)
    sends = [c for c in calls if c.kind == "p2p"]
    assert len(sends) == 1
    (send,) = sends
    assert send.axis == "pp" and send.where == f"layer{plan.stage_layers[0] - 1} -> stage"
    b = -(-requests_per_rank(PROBLEM, plan) // 2)  # two micro-batches
    assert send.bytes == b * ROUND_TOKENS * H * ACT_BYTES
    # calls come in the order they run: the send sits between the stages' layers
    at = calls.index(send)
    assert calls[at - 1].where.startswith(f"layer{plan.stage_layers[0] - 1}:")
    assert calls[at + 1].where.startswith(f"layer{plan.stage_layers[0]}:")


def test_a_single_prefill_step_runs_one_whole_prompt() -> None:
    plan = megatron(Degrees(replicas=4, tp=2, etp=2))
    prefill = collectives_of(PROBLEM, plan, step=1)
    in_layers = {c.bytes for c in prefill if c.where.startswith("layer")}
    assert in_layers == {1 * 1000 * H * ACT_BYTES}


def test_moe_experts_exchange_tokens_all_to_all() -> None:
    problem = Problem.build("mixtral-8x7b", "h100x8", "chat", timing="roofline")
    plan = problem.space.megatron_plan(Degrees(tp=8, ep=8, etp=1))
    assert all(layer[-1] == "alltoall" for layer in plan.layer_options)
    a2a = [c for c in collectives_of(problem, plan) if c.kind == "all_to_all"]
    assert len(a2a) == 3 * problem.model.num_layers
    phases = Counter(c.where.split("experts ")[1] for c in a2a)
    assert phases == dict.fromkeys(("counts", "dispatch", "combine"), problem.model.num_layers)
    assert all(c.axis == "ep" and c.group_size == 8 for c in a2a)
    assert {c.bytes for c in a2a if c.where.endswith("counts")} == {8 * COUNT_BYTES}
    # bf16 experts dispatch what they combine
    dispatch = {c.bytes for c in a2a if c.where.endswith("dispatch")}
    assert dispatch == {c.bytes for c in a2a if c.where.endswith("combine")}
    assert len(dispatch) == 1 and dispatch.pop() > 0
