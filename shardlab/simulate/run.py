"""One deployment under one traffic, request by request: the router, the arrivals (a
trace's, synthetic, or a closed loop's clients), the ranks' iterations and, when the
serving is disaggregated, each prompt's cache handed from a prefill rank to a decode
rank.

Events are taken in time order from one heap of the ranks' next iteration ends;
arrivals come from the traffic (open) or from the requests that finish (a closed
loop: a client sends its next request when its last one ends). At one instant, ranks
finish first, then arrivals are routed, then idle ranks plan: a request that arrives
when an iteration ends joins the next one.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Sequence
from typing import Literal

import numpy as np

from shardlab.costmodel import IterationCosts, engine_limits, forget_tables, handoff_seconds
from shardlab.errors import ShardlabError
from shardlab.problems.traffic import Traffic
from shardlab.simulate.deployment import Deployment, Pool
from shardlab.simulate.prefix import PrefixCache
from shardlab.simulate.pricing import Pricer
from shardlab.simulate.rank import Book, Rank
from shardlab.simulate.requests import Simulation
from shardlab.simulate.schedulers import RULES

Router = Literal["least", "round-robin", "prefix"]
ROUTERS: tuple[Router, ...] = ("least", "round-robin", "prefix")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolCosts:
    """A pool's iteration prices, built once (seconds per call of the cost model)."""

    pool: Pool
    costs: IterationCosts
    handoff_fixed_s: float  # a prefill pool's handoff: fixed part
    handoff_token_s: float  # and per prompt token
    most: int | None = None  # priced only up to this many requests in the system

    @classmethod
    def of(
        cls,
        pool: Pool,
        shortest: int,
        most: int | None = None,
        costs: IterationCosts | None = None,
    ) -> PoolCosts:
        """Priced up to the requests of ``shortest`` tokens (prompt and output) the
        KV cache holds, the engine runs, or ``most`` (the requests the traffic can
        have in the system at once), whichever is fewer: a table's time grows with its
        requests. ``costs``: the tables, priced already for the same plan on a
        problem that differs in its handoff only (the handoff is no iteration's)."""
        p = pool.problem
        d = pool.plan.degrees
        running = engine_limits(p, d.tp, d.pp, d.dp_attn).max_batch
        held = IterationCosts.kv_capacity(p, pool.plan) // max(shortest, 1) + 1
        limit = min(running, held)
        bound = most if most is not None and most < limit else None  # the traffic's
        if costs is None or costs.max_requests != max(1, bound or limit):
            costs = IterationCosts.of(p, pool.plan, max_requests=max(1, bound or limit))
        fixed = per_token = 0.0
        if pool.role == "prefill" and p.handoff is not None:
            whole = float(handoff_seconds(p, d.pp, d.tp))
            empty = dataclasses.replace(p.handoff, received_bytes=0.0)
            fixed = float(handoff_seconds(dataclasses.replace(p, handoff=empty), d.pp, d.tp))
            per_token = (whole - fixed) / p.workload.input_len
        return cls(
            pool=pool,
            costs=costs,
            handoff_fixed_s=fixed,
            handoff_token_s=per_token,
            most=bound,
        )


def price(
    deployment: Deployment,
    traffic: Traffic,
    *,
    shortest: int | None = None,
    most: int | None = None,
) -> tuple[PoolCosts, ...]:
    """Every pool's iteration prices for ``traffic`` (the part of a run that calls the
    cost model), or for any traffic whose requests are at least ``shortest`` tokens;
    ``most``: only up to that many requests in the system at once (a closed loop's
    clients; :func:`simulate_priced` refuses a traffic that can have more)."""
    if shortest is None:
        shortest = int((traffic.input_len + traffic.output_len).min())
    priced = tuple(PoolCosts.of(pool, shortest, most) for pool in deployment.pools)
    # the hundred derived problems a plan's tables were read off stay in the cost
    # model's caches otherwise: gigabytes after a few dozen plans of a large MoE
    forget_tables()
    return priced


def _ranks(
    deployment: Deployment,
    priced: Sequence[PoolCosts],
    role: str,
    book: Book,
    start: int,
    block: int = 0,
    weights: list[float] | None = None,
) -> list[Rank]:
    """The ranks of the pools of ``role``, each with a prefix cache of ``block``-token
    blocks (0: none); ``weights`` gets each rank's pool's weight, in rank order."""
    ranks = []
    # the deployment's pools hold how each is launched; their prices may have been
    # read for the same pools launched otherwise
    for pool, pc in zip(deployment.pools, priced, strict=True):
        if pool.role != role:
            continue
        c = pc.costs
        rules = RULES[pool.problem.engine]
        pricer = Pricer(c, stages=pool.plan.degrees.pp)
        if c.kv_tokens <= 0:
            raise ShardlabError(
                f"{role} pool: no request's KV cache fits the plan's memory",
                field="plan",
                fix="give a plan that fits (shardlab evaluate shows its memory)",
            )
        # the attention-DP ranks of one replica are consecutive and share a group
        dp = pool.plan.degrees.dp_attn
        group: list[Rank] | None = None
        for i in range(pool.ranks):
            if dp > 1 and i % dp == 0:
                group = []
            rank = Rank(
                start + len(ranks),
                rules,
                pricer,
                book,
                budget=c.max_tokens,
                max_running=c.max_running,
                kv_tokens=c.kv_tokens,
                handoff=role == "prefill",
                holding=pool.holding,
                group=group,
                cache=PrefixCache(block) if block else None,
            )
            if group is not None:
                group.append(rank)
            ranks.append(rank)
            if weights is not None:
                weights.append(pool.weight)
    return ranks


def _refuse_too_long(traffic: Traffic, ranks: list[Rank], role: str) -> None:
    longest = int((traffic.input_len + traffic.output_len).max())
    room = min(r.kv for r in ranks)
    if longest > room:
        raise ShardlabError(
            f"traffic {traffic.source!r}: a request of {longest:,} tokens does not fit the "
            f"{role} pool's KV cache of {room:,} tokens per rank",
            field="traffic",
            fix="drop the longest requests, or give a plan with more memory per rank",
        )


def simulate_priced(
    deployment: Deployment,
    priced: Sequence[PoolCosts],
    traffic: Traffic,
    *,
    router: Router = "least",
    seed: int = 0,
) -> Simulation:
    """Run ``traffic`` through ``deployment`` whose pools are ``priced``."""
    if router not in ROUTERS:
        raise ShardlabError(f"router {router!r} is not one of {', '.join(ROUTERS)}", field="router")
    bound = min((pc.most for pc in priced if pc.most is not None), default=None)
    most = traffic.most_in_system
    if bound is not None and (most is None or most > bound):
        raise ShardlabError(
            f"the pools were priced for at most {bound} requests in the system; traffic "
            f"{traffic.source!r} can have more",
            field="traffic",
            fix="price the deployment for this traffic (price(deployment, traffic))",
        )
    started = time.perf_counter()
    n = traffic.requests
    chains = traffic.prefix_blocks
    book = Book(traffic.input_len.tolist(), traffic.output_len.tolist(), chains)
    entry_role = deployment.entry
    # prompts are looked up where they are prefilled (a decode pool's come cached)
    block = traffic.block_tokens if chains is not None and entry_role != "decode" else 0
    # the least-loaded router counts a rank's requests over its pool's weight
    weight: list[float] = []
    front = _ranks(deployment, priced, entry_role, book, 0, block, weight)
    back = (
        _ranks(deployment, priced, "decode", book, len(front), weights=weight)
        if entry_role == "prefill"
        else []
    )
    if entry_role == "decode":  # prompts come cached
        book.done = list(book.need)
    for ranks, role in ((front, entry_role), (back, "decode")):
        if ranks:
            _refuse_too_long(traffic, ranks, role)
    pre = next((pc for pc in priced if pc.pool.role == "prefill"), None)
    fixed_s = pre.handoff_fixed_s if pre else 0.0
    token_s = pre.handoff_token_s if pre else 0.0
    # round robin starts at a seeded rank of the front pool (least-loaded ties: the
    # lowest index)
    turn = [int(np.random.default_rng(seed).integers(len(front))), 0]
    arrival = [math.nan] * n
    events: list[tuple[float, int, int]] = []  # (time, version, rank)
    ranks = front + back
    weighted = any(w != 1.0 for w in weight)
    pending: list[tuple[float, int]] = []  # (time, request): caches on their way to decode
    pools = (front, back)

    def route(p: int, r: int, t: float, gone: list[int]) -> None:
        pool = pools[p]
        if router == "round-robin":
            rank = pool[turn[p] % len(pool)]
            turn[p] += 1
        elif router == "prefix" and p == 0 and block:
            rank = min(pool, key=lambda q: (_prefix_cost(q, r), q.index))
        elif weighted:
            rank = min(pool, key=lambda q: (q.outstanding / weight[q.index], q.index))
        else:
            rank = min(pool, key=_load)
        book.rank_of[r] = rank.index
        rank.outstanding += 1
        rank.waiting.append(r)
        if not rank.busy:
            if rank.plan(t):
                heapq.heappush(events, (rank.end, rank.version, rank.index))
        elif rank.cut(t, gone) and rank.busy:
            heapq.heappush(events, (rank.end, rank.version, rank.index))
        if rank.group is not None and all(q.prefilling or q.waiting for q in rank.group):
            wake(rank, t, gone)  # every rank has a prompt: the held ones go

    def wake(rank: Rank, t: float, gone: list[int]) -> None:
        """The ranks of ``rank``'s group holding prompts back look again at ``t``."""
        assert rank.group is not None
        for q in rank.group:
            if q.held and q is not rank and q.cut(t, gone) and q.busy:
                heapq.heappush(events, (q.end, q.version, q.index))

    closed = traffic.arrival == "closed"
    if closed:
        clients = traffic.clients or 1
        sent = min(clients, n)
        for r in range(sent):
            arrival[r] = 0.0
    else:
        assert traffic.arrival_s is not None
        times = (traffic.arrival_s - traffic.arrival_s[0]).tolist()
        sent = 0
    gone: list[int] = []
    handed: list[int] = []
    if closed:
        for r in range(sent):
            route(0, r, 0.0, gone)
    while True:
        t_event = events[0][0] if events else math.inf
        t_arrive = times[sent] if not closed and sent < n else math.inf
        t_handoff = pending[0][0] if pending else math.inf
        t = min(t_event, t_arrive, t_handoff)
        if t == math.inf:
            break
        if t_event == t:
            _, version, k = heapq.heappop(events)
            rank = ranks[k]
            if version != rank.version or not rank.busy:
                continue
            rank.complete(gone, handed)
            if rank.group is not None and not rank.decoding:
                wake(rank, t, gone)  # a rank with nothing to decode: the held ones go
            for r in handed:
                book.done[r] = book.need[r]
                heapq.heappush(pending, (t + fixed_s + token_s * book.input[r], r))
            handed.clear()
        elif t_handoff == t:
            _, r = heapq.heappop(pending)
            if back:
                route(1, r, t, gone)
            else:  # a prefill pool alone: a request ends as its cache arrives
                book.first[r] = book.finish[r] = t
                gone.append(r)
            rank = None
        else:
            arrival[sent] = t
            route(0, sent, t, gone)
            sent += 1
            rank = None
        if closed:
            while gone:
                gone.pop()
                if sent < n:
                    arrival[sent] = t
                    route(0, sent, t, gone)
                    sent += 1
        else:
            gone.clear()
        if rank is not None and not rank.busy and rank.plan(t):
            heapq.heappush(events, (rank.end, rank.version, rank.index))
    first = np.array(book.first)
    return Simulation(
        deployment=deployment,
        traffic=traffic,
        router=router,
        seed=seed,
        arrival_s=np.array(arrival),
        first_s=first,
        finish_s=np.array(book.finish),
        rank=np.array(book.rank_of),
        request_s=next(pc.costs.request_s for pc in priced if pc.pool.role == entry_role),
        itl_s=np.array(book.itl_s),
        itl_n=np.array(book.itl_n, dtype=np.int64),
        preemptions=sum(r.preemptions for r in ranks),
        hit_tokens=np.array(book.hit) if block else None,
        wall_s=time.perf_counter() - started,
    )


def _load(rank: Rank) -> tuple[int, int]:
    return (rank.outstanding, rank.index)


def _prefix_cost(rank: Rank, r: int) -> float:
    """What request ``r`` would cost ``rank``, after Dynamo's KV router (the blocks to
    prefill plus the blocks the worker holds), in tokens: the prompt past what its
    prefix cache holds, the KV its running requests hold and the prompts waiting."""
    b = rank.book
    assert rank.cache is not None and b.chain is not None
    found = rank.cache.lookup(b.chain[r], b.input[r])[1]
    return b.input[r] - found + rank._kv_held() + sum(b.need[w] for w in rank.waiting)


def simulate(
    deployment: Deployment,
    traffic: Traffic,
    *,
    router: Router = "least",
    seed: int = 0,
) -> Simulation:
    """Price ``deployment``'s pools and run ``traffic`` through it (see the module
    docstring); same seed, same result."""
    priced = price(deployment, traffic, most=traffic.most_in_system)
    return simulate_priced(deployment, priced, traffic, router=router, seed=seed)
