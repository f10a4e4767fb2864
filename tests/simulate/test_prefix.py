"""The prefix cache: blocks found, held, freed and evicted (shardlab.simulate.prefix),
and runs that use it (shardlab.simulate.run)."""

from __future__ import annotations

import dataclasses
import math
from functools import cache

import numpy as np
import pytest

from shardlab import Degrees, Problem, ShardlabError
from shardlab.problems.traces import read_trace
from shardlab.problems.traffic import (
    REUSE_BLOCK_TOKENS,
    Arrivals,
    Lengths,
    closed_loop,
    synthetic_traffic,
)
from shardlab.simulate import Deployment, Pool, price, simulate_priced
from shardlab.simulate.prefix import PrefixCache
from shardlab.simulate.pricing import Pricer
from shardlab.simulate.rank import Book, Rank
from shardlab.simulate.schedulers import RULES
from tests.conftest import DATA_DIR

MOONCAKE = DATA_DIR / "traces" / "mooncake_conversation_head200.jsonl"


@cache
def priced(engine: str, replicas: int = 2):
    problem = Problem.build("llama-3.1-8b", f"h100x{replicas}", "chat", engine=engine)
    plan = problem.space.megatron_plan(Degrees(replicas=replicas, tp=1))
    deployment = Deployment(pools=(Pool(role="agg", problem=problem, plan=plan),))
    traffic = closed_loop(clients=1, prompts_per_client=1, lengths=Lengths(input_len=64))
    return deployment, price(deployment, traffic)


# -- the cache alone -----------------------------------------------------------------


def test_a_lookup_finds_the_leading_blocks_held_or_free_and_leaves_the_last_token() -> None:
    c = PrefixCache(block=4)
    assert c.lookup((1, 2, 3), 12) == (0, 0, 0)
    c.acquire(0, (1, 2, 3), 0, 12)
    c.computed(0, (1, 2, 3), 12)  # request 0 holds blocks 1, 2, 3
    # a prompt of 12 tokens on the same blocks: the last block would complete it
    assert c.lookup((1, 2, 3), 12) == (2, 8, 8)
    # a longer prompt on them finds all three, all held by request 0
    assert c.lookup((1, 2, 3, 9), 14) == (3, 12, 12)
    # a chain found up to its first block not here
    assert c.lookup((1, 7, 3), 12) == (1, 4, 4)
    assert c.release(0) == 0
    assert c.cached == 12 and c.dup == 0 and not c.refs
    # free blocks are found as well, and held by no running request
    assert c.lookup((1, 2, 3, 9), 14) == (3, 12, 0)


def test_shared_blocks_count_once_while_two_requests_hold_them() -> None:
    c = PrefixCache(block=4)
    c.acquire(0, (1, 2), 0, 10)
    c.computed(0, (1, 2, 3), 10)  # blocks of 4, 4 and 2 tokens
    n, hit, shared = c.lookup((1, 2, 5), 10)
    assert (n, hit, shared) == (2, 8, 8)
    c.acquire(1, (1, 2, 5), n, 10)
    assert c.dup == 8  # request 1's first 8 tokens are request 0's
    c.computed(1, (1, 2, 5), 10)
    assert c.release(0) == 8  # its blocks 1 and 2 are held once now
    assert c.dup == 0 and c.cached == 2  # only block 3 is no one's now
    c.release(1)
    assert c.cached == 12 and not c.refs  # blocks 1, 2, 3 and 5


def test_eviction_takes_the_least_recently_freed_blocks_a_chain_tail_first() -> None:
    c = PrefixCache(block=4)
    for r, chain in enumerate(((1, 2, 3), (4, 5, 6))):
        c.computed(r, chain, 12)
        c.release(r)
    assert list(c.free) == [3, 2, 1, 6, 5, 4]
    c.trim(16)  # keep 4 blocks: request 0's tail and middle go
    assert list(c.free) == [1, 6, 5, 4] and c.cached == 16
    assert c.lookup((1, 2, 3, 7), 16) == (1, 4, 0)
    # found blocks are held, not free: eviction cannot take them
    c.acquire(2, (4, 5, 6, 7), 3, 16)
    c.trim(0)
    assert not c.free and c.cached == 0 and set(c.refs) == {4, 5, 6}


# -- runs ----------------------------------------------------------------------------


def _unshared(traffic, block: int):
    """``traffic`` with a chain per prompt no other shares."""
    chains, start = [], 0
    for i in traffic.input_len.tolist():
        k = math.ceil(i / block)
        chains.append(tuple(range(start, start + k)))
        start += k
    return dataclasses.replace(traffic, prefix_blocks=tuple(chains), block_tokens=block)


@pytest.mark.parametrize("engine", ["vllm", "trtllm", "sglang"])
def test_prefixes_no_prompt_shares_change_nothing(engine: str) -> None:
    """A run whose prompts share no block is the run without prefixes, to the bit,
    under enough load that the cache fills and cached blocks must give way to running
    requests. Short of preemption: a preempted request finds its own prompt's blocks
    again, which a run without prefixes recomputes (the test below); at 5 requests/s
    SGLang preempts 5 requests under the engine costs fitted in deb6c38."""
    deployment, pcs = priced(engine)
    traffic = synthetic_traffic(
        requests=1500,
        lengths=Lengths(kind="uniform", input_len=6000, output_len=1500, range_ratio=0.2),
        arrivals=Arrivals(kind="gamma", rate=4.0, cv=3.0),
        seed=3,
    )
    # every rank's prompts fill its cache three times over: blocks are evicted
    assert traffic.input_len.sum() / 2 > 3 * pcs[0].costs.kv_tokens
    plain = simulate_priced(deployment, pcs, traffic)
    cached = simulate_priced(deployment, pcs, _unshared(traffic, 16))
    assert plain.hit_tokens is None and plain.summary().prefix_hit_rate is None
    assert cached.prefix_hit_rate == 0.0
    for name in ("arrival_s", "first_s", "finish_s", "rank", "itl_s", "itl_n"):
        assert np.array_equal(getattr(plain, name), getattr(cached, name)), name
    assert plain.preemptions == cached.preemptions == 0


def test_a_preempted_request_finds_its_own_prompt_again_uncounted() -> None:
    """vLLM frees a preempted request's blocks to the cache: recomputed, it finds its
    prompt there (and is prefilled sooner), which the hit rate does not count."""
    deployment, pcs = priced("vllm")
    traffic = synthetic_traffic(
        requests=1500,
        lengths=Lengths(kind="uniform", input_len=6000, output_len=1500, range_ratio=0.2),
        arrivals=Arrivals(kind="gamma", rate=10.0, cv=3.0),
        seed=3,
    )
    plain = simulate_priced(deployment, pcs, traffic)
    cached = simulate_priced(deployment, pcs, _unshared(traffic, 16))
    assert plain.preemptions > 0 and cached.prefix_hit_rate == 0.0
    assert (
        cached.summary().latencies["e2e_ms"]["mean"] < plain.summary().latencies["e2e_ms"]["mean"]
    )


@pytest.mark.parametrize("engine", ["vllm", "trtllm", "sglang"])
def test_a_shared_prefix_is_found_and_skips_its_prefill(engine: str) -> None:
    """Half of every prompt from one shared prefix: once each rank holds it, every
    prompt finds it (the first on each rank does not), and TTFT and throughput gain."""
    deployment, pcs = priced(engine)
    traffic = synthetic_traffic(
        requests=400,
        lengths=Lengths(input_len=4096, output_len=64),
        arrivals=Arrivals(kind="poisson", rate=12.0),
    )
    plain = simulate_priced(deployment, pcs, traffic).summary()
    shared = simulate_priced(deployment, pcs, traffic.with_prefix_reuse(0.5))
    s = shared.summary()
    assert shared.hit_tokens is not None
    assert (shared.hit_tokens == 2048).sum() >= traffic.requests - 2 * 8
    assert s.prefix_hit_rate == pytest.approx(0.5, abs=0.02)
    # TTFT past the engine's fixed cost per request, which no cache shortens
    fixed = 1e3 * shared.request_s
    assert s.latencies["ttft_ms"]["mean"] - fixed < 0.8 * (
        plain.latencies["ttft_ms"]["mean"] - fixed
    )
    assert s.latencies["e2e_ms"]["p99"] < plain.latencies["e2e_ms"]["p99"]


def test_a_mooncake_trace_finds_its_own_blocks_up_to_what_one_cache_could() -> None:
    """The excerpt's hash ids: one rank finds at most the leading blocks some earlier
    prompt had (every block kept forever), and finds some."""
    trace = read_trace(MOONCAKE)
    assert trace.prefix_blocks is not None and trace.block_tokens == 512
    bound, seen = 0, set()
    for chain, i in zip(trace.prefix_blocks, trace.input_len.tolist(), strict=True):
        hit = 0
        for blk in chain:
            size = min(512, i - hit)
            if blk not in seen or hit + size >= i:
                break
            hit += size
        bound += hit
        seen.update(chain)
    deployment, pcs = priced("vllm", replicas=1)
    sim = simulate_priced(deployment, pcs, trace.at_rate(0.5))
    assert 0 < sim.hit_tokens.sum() <= bound
    assert sim.summary().prefix_hit_rate == sim.hit_tokens.sum() / trace.input_len.sum()
    # the same trace without its blocks
    bare = simulate_priced(deployment, pcs, trace.at_rate(0.5).with_prefix_reuse(0.0))
    assert bare.hit_tokens is None
    assert bare.summary().latencies["ttft_ms"]["mean"] > sim.summary().latencies["ttft_ms"]["mean"]


def test_a_reuse_fraction_makes_one_shared_chain() -> None:
    traffic = synthetic_traffic(
        requests=3,
        lengths=Lengths(kind="histogram", buckets=((100, 5, 1.0), (1000, 5, 1.0))),
        arrivals=Arrivals(kind="poisson", rate=1.0),
        seed=1,
    )
    t = traffic.with_prefix_reuse(0.5)
    assert t.block_tokens == REUSE_BLOCK_TOKENS
    for chain, i in zip(t.prefix_blocks, traffic.input_len.tolist(), strict=True):
        assert chain == tuple(range(int(0.5 * i) // 16))
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ShardlabError, match="prefix_reuse") as exc:
            traffic.with_prefix_reuse(bad)
        assert exc.value.field == "prefix_reuse"


def test_a_rank_holds_blocks_two_running_requests_share_once() -> None:
    """A second prompt on the first's blocks is admitted into a cache that could not
    hold two whole prompts: its prefix is the first's, on the GPU once."""
    _, (pc,) = priced("vllm", replicas=1)
    chain = tuple(range(100))  # 1,600 tokens in blocks of 16
    book = Book([1600, 1600], [50, 50], (chain, chain))
    rank = Rank(0, RULES["vllm"], Pricer(pc.costs), book, budget=8192, max_running=64,
                kv_tokens=1700, cache=PrefixCache(16))  # fmt: skip
    rank.waiting.append(0)
    assert rank.plan(0.0) and rank.chunks == [(0, 1600)]
    rank.complete([], [])
    rank.waiting.append(1)
    rank.plan(rank.end)
    # all but the block holding its last token found: only that block is prefilled
    assert book.hit[1] == 1584 and rank.chunks == [(1, 16)]
    assert rank._kv_held() == 1601 + 2 * 8  # request 0's context, half a block of slack each
    rank.complete([], [])  # request 0 decoded a token beside that block
    assert rank._kv_held() == 1602 + 1601 - 1584 + 2 * 8


def test_blocks_the_running_requests_need_are_evicted() -> None:
    """A conversation's next turn finds its first turn's blocks after a few other
    prompts, not after prompts that filled the rank's cache since."""
    deployment, pcs = priced("vllm", replicas=1)
    kv = pcs[0].costs.kv_tokens
    for others, found in ((5, True), (2 * kv // 8000 + 1, False)):
        n = others + 2
        chains = [tuple(range(500))]  # the first turn: 8,000 tokens
        chains += [tuple(range(1000 * (k + 1), 1000 * (k + 1) + 500)) for k in range(others)]
        chains.append(tuple(range(600)))  # the next turn opens with the first
        traffic = dataclasses.replace(
            synthetic_traffic(
                requests=n,
                lengths=Lengths(input_len=8000, output_len=16),
                arrivals=Arrivals(kind="poisson", rate=1.0),
            ),
            block_tokens=16,
        )
        lengths = np.full(n, 8000)
        lengths[-1] = 9600
        traffic = dataclasses.replace(traffic, input_len=lengths, prefix_blocks=tuple(chains))
        sim = simulate_priced(deployment, pcs, traffic)
        assert sim.hit_tokens[1:-1].sum() == 0
        assert sim.hit_tokens[-1] == (8000 if found else 0), (others, sim.hit_tokens[-1])


def test_a_preempted_requests_blocks_are_freed_and_found_again() -> None:
    _, (pc,) = priced("vllm", replicas=1)
    chains = (tuple(range(63)), tuple(range(100, 163)))  # 1,000 tokens: 62 blocks and 8 tokens
    book = Book([1000, 1000], [500, 500], chains)
    cache = PrefixCache(16)
    rank = Rank(0, RULES["vllm"], Pricer(pc.costs), book, budget=8192, max_running=64,
                kv_tokens=2100, cache=cache)  # fmt: skip
    rank.waiting.extend([0, 1])
    rank.outstanding = 2
    t = 0.0
    while rank.plan(t) and not rank.preemptions:
        rank.complete([], [])
        t = rank.end
    # request 1, admitted last, is preempted: its blocks are free, to be found again
    assert list(rank.waiting) == [1] and 1 not in cache.held
    assert set(chains[1]) <= set(cache.free) and set(chains[0]) == set(cache.refs)
    rank.complete([], [])
    t = rank.end
    while rank.plan(t) and 1 not in rank.prefilling:
        rank.complete([], [])
        t = rank.end
    # the head of its chain found again (request 0's growing context took the tail's
    # room: a chain's tail is evicted first), not prefilled
    assert 0 < book.done[1] <= 992 and book.done[1] % 16 == 0
    while True:
        rank.complete([], [])
        t = rank.end
        if not rank.plan(t):
            break
    assert book.finish[1] > book.finish[0]
    assert book.hit == [0, 0]  # what a request finds of its own is not a hit
    assert not cache.refs and not cache.held and cache.dup == 0
    assert cache.cached == sum(cache.free.values()) <= 2100


@pytest.mark.parametrize(("router", "rank", "found"), [("least", 0, 0), ("prefix", 1, 4000)])
def test_the_prefix_router_sends_a_prompt_where_its_prefix_is(
    router: str, rank: int, found: int
) -> None:
    """Two conversations start at once on two idle ranks; the second's next turn comes
    when both ranks are idle again: `least` sends it to the first rank, `prefix` to
    the rank that holds its first turn."""
    deployment, pcs = priced("vllm")
    first, second = tuple(range(250)), tuple(range(1000, 1250))  # 4,000 tokens each
    traffic = dataclasses.replace(
        synthetic_traffic(
            requests=3,
            lengths=Lengths(input_len=4000, output_len=8),
            arrivals=Arrivals(kind="poisson", rate=1.0),
        ),
        arrival_s=np.array([0.0, 0.0, 100.0]),
        input_len=np.array([4000, 4000, 6000]),
        prefix_blocks=(first, second, second + tuple(range(2000, 2125))),
        block_tokens=16,
    )
    sim = simulate_priced(deployment, pcs, traffic, router=router)  # type: ignore[arg-type]
    assert sim.rank.tolist() == [0, 1, rank]
    assert sim.hit_tokens.tolist() == [0, 0, found]
