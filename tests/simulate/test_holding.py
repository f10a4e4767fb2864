"""TensorRT-LLM's options that hold prompts back (shardlab.simulate.schedulers.Holding):
off by default, the attention-DP balance and batch waiting each as the engine's
executor applies them, counted in iterations."""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import pytest

from shardlab import Degrees, Problem, ShardlabError
from shardlab.problems.traffic import Arrivals, Lengths, Traffic, synthetic_traffic
from shardlab.simulate import Deployment, Simulation, price, simulate_priced
from shardlab.simulate.pricing import Pricer
from shardlab.simulate.schedulers import Holding

BALANCE = Holding(adp_balance=True, adp_timeout_iters=20, adp_batching_wait_iters=0)
WAITING = Holding(batch_wait_timeout_iters=40, batch_wait_max_tokens_ratio=0.8)


@cache
def pool(dp_attn: int):
    """One TensorRT-LLM replica of Mixtral: four attention-DP ranks, or tp 4."""
    problem = Problem.build("mixtral-8x7b", "h100x4", "chat", engine="trtllm")
    tp = 1 if dp_attn > 1 else 4
    plan = problem.space.megatron_plan(Degrees(tp=tp, dp_attn=dp_attn, ep=4, etp=1))
    deployment = Deployment.of_plan(problem, plan)
    # priced for any request of at least 100 tokens
    shortest = Traffic(input_len=np.array([90]), output_len=np.array([10]),
                       arrival_s=np.array([0.0]), arrival="trace")  # fmt: skip
    return deployment, price(deployment, shortest)


def trace(arrivals: list[float], inputs: list[int], outputs: list[int]) -> Traffic:
    return Traffic(input_len=np.array(inputs), output_len=np.array(outputs),
                   arrival_s=np.array(arrivals), arrival="trace")  # fmt: skip


def run(dp_attn: int, traffic: Traffic, holding: Holding | None = None) -> Simulation:
    deployment, priced = pool(dp_attn)
    if holding is not None:
        deployment = deployment.with_holding(holding)
    return simulate_priced(deployment, priced, traffic, seed=0)


def step_s(dp_attn: int, decoding: int, context: float) -> float:
    """One decode iteration of ``decoding`` requests at ``context`` on a rank."""
    return Pricer(pool(dp_attn)[1][0].costs).decode(decoding, context)


def test_holding_nothing_is_the_default_run() -> None:
    """Every option at the engine's default, or one the engine ignores for the layout
    (batch waiting with attention DP, the balance without it), gives the run without
    any, bit for bit."""
    traffic = synthetic_traffic(
        requests=400, lengths=Lengths(kind="uniform", input_len=1024, output_len=256,
                                      range_ratio=0.5),
        arrivals=Arrivals(kind="gamma", rate=40.0, cv=3.0), seed=2,
    )  # fmt: skip
    for dp_attn, ignored in ((4, WAITING), (1, BALANCE)):
        base = run(dp_attn, traffic)
        for holding in (Holding(), ignored):
            other = run(dp_attn, traffic, holding)
            for name in ("first_s", "finish_s", "rank", "itl_s", "itl_n"):
                assert np.array_equal(getattr(base, name), getattr(other, name)), name


def test_a_prompt_on_one_attention_dp_rank_waits_for_the_timeout() -> None:
    """Four ranks each decode a long request; a prompt arriving on one of them alone is
    held until the balance's counter reaches its timeout: at most ``timeout_iters``
    decode iterations, never when the timeout is one iteration, nor without the
    balance."""
    traffic = trace([0.0, 0.0, 0.0, 0.0, 1.0], [1000] * 4 + [200], [3000] * 4 + [10])
    off = run(4, traffic)
    assert len(set(off.rank[:4].tolist())) == 4  # a long request on every rank
    ttft = off.first_s[4] - off.arrival_s[4]
    step = step_s(4, 1, 1000 + 1.0 / step_s(4, 1, 1000))
    for timeout in (5, 20, 60):
        held = run(4, traffic, dataclasses.replace(BALANCE, adp_timeout_iters=timeout))
        waited = (held.first_s[4] - held.arrival_s[4] - ttft) / step
        assert 0 <= waited <= timeout * 1.05
        assert waited == pytest.approx(round(waited), abs=0.01)  # whole iterations
        assert held.finish_s[:4] == pytest.approx(off.finish_s[:4], rel=1e-3)
    one = run(4, traffic, dataclasses.replace(BALANCE, adp_timeout_iters=1))
    assert one.first_s[4] == pytest.approx(off.first_s[4], rel=1e-9)
    # the counter runs from the prompts' release at 0 s: 60 iterations of about
    # ``step`` each are past well before the prompt comes at 1 s; it finds the
    # counter part-way and waits out the rest
    sixty = run(4, traffic, dataclasses.replace(BALANCE, adp_timeout_iters=60))
    assert sixty.first_s[4] > off.first_s[4] + step


def test_prompts_on_every_attention_dp_rank_go_at_once() -> None:
    """The same prompt on every rank of the group at once: nothing is held, and the
    prompts start as they would without the balance; a rank with nothing to decode
    lets the others' prompts go too."""
    every = trace([0.0] * 4 + [1.0] * 4, [1000] * 4 + [200] * 4, [3000] * 4 + [10] * 4)
    off = run(4, every)
    held = run(4, every, BALANCE)
    assert np.array_equal(off.first_s, held.first_s)
    # three ranks decode; the fourth has nothing to decode when the prompt comes
    idle = trace([0.0] * 3 + [1.0], [1000] * 3 + [200], [3000] * 3 + [10])
    assert np.array_equal(run(4, idle).first_s, run(4, idle, BALANCE).first_s)


def test_batch_waiting_holds_prompts_until_the_token_ratio_or_the_timeout() -> None:
    """One rank (no attention DP) decoding a long request: a short prompt waits the 40
    iterations of the timeout; prompts whose tokens reach 0.8 of ``max_num_tokens``
    go at once, in one iteration."""
    short = trace([0.0, 1.0], [1000, 200], [3000, 10])
    off = run(1, short)
    wait = run(1, short, WAITING)
    step = step_s(1, 1, 1000 + 1.0 / step_s(1, 1, 1000))
    waited = (wait.first_s[1] - off.first_s[1]) / step
    assert waited == pytest.approx(40, abs=1.5)
    budget = pool(1)[1][0].costs.max_tokens
    size = int(0.8 * budget / 6) + 1  # six prompts pass the ratio, five do not
    many = trace([0.0] + [1.0] * 6, [1000] + [size] * 6, [3000] + [10] * 6)
    off, wait = run(1, many), run(1, many, WAITING)
    assert len(set(wait.first_s[1:].tolist())) == 1  # one iteration
    together = Pricer(pool(1)[1][0].costs).mixed(1, 1000 + 1.0 / step, 6 * size)
    assert wait.first_s[1] - 1.0 < together + 2 * step  # no timeout waited
    assert len(set(off.first_s[1:].tolist())) > 1  # unheld, the first went alone


def test_same_seed_same_run_with_holding() -> None:
    traffic = synthetic_traffic(
        requests=600, lengths=Lengths(kind="uniform", input_len=1024, output_len=512,
                                      range_ratio=0.8),
        arrivals=Arrivals(kind="poisson", rate=30.0), seed=5,
    )  # fmt: skip
    for dp_attn, holding in ((4, BALANCE), (1, WAITING)):
        a, b = run(dp_attn, traffic, holding), run(dp_attn, traffic, holding)
        assert np.array_equal(a.first_s, b.first_s) and np.array_equal(a.finish_s, b.finish_s)
        # and the options do act on this traffic
        assert not np.array_equal(a.first_s, run(dp_attn, traffic).first_s)


@pytest.mark.parametrize(
    "bad",
    [
        {"adp_timeout_iters": -1},
        {"batch_wait_timeout_iters": -3},
        {"batch_wait_max_tokens_ratio": 1.5},
    ],
)
def test_holding_out_of_range_is_refused(bad: dict) -> None:
    with pytest.raises(ShardlabError, match=next(iter(bad))):
        Holding(**bad)
