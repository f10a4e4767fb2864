"""One attention-DP rank of one engine instance, stepping through its iterations.

A rank holds a waiting queue (first come, first served), requests being prefilled,
and requests decoding. At each iteration boundary it admits what its rules allow
(:mod:`shardlab.simulate.schedulers`) and composes the next iteration:

- prompt chunks to prefill (in the order admitted, under the token budget left by the
  decodes, or alone on a prefill-first engine): one iteration, priced by its
  composition, at whose end every finished prompt has its first token;
- decodes alone: a run of ``k`` iterations up to the next event the rank can see
  (a request's last token, the KV cache filling up), priced at once: the requests'
  mean context grows by one a step, so ``k`` steps take ``k * decode(c, L + (k -
  1) / 2)`` (exact where the decode time is linear in the context, as it is between
  the cost model's nodes). An arrival in the middle of a run cuts it at the iteration
  boundary after it (:meth:`Rank.cut`), with no loop over its tokens.

Where the engine is launched to hold prompts back (:class:`Holding`), a rank whose
prompts are held runs its decodes alone, in a run that ends where the hold would end
(a timeout's iteration); what another rank of its attention-DP group does that may
end it sooner (a prompt arriving, its last decode finishing) cuts the run (``wake`` in
:mod:`shardlab.simulate.run`). The group's ranks step apart here, where the engine
steps them together, so each counts the group's iterations in its own.

Requests' state lives in the :class:`Book` all ranks share, in plain lists indexed by
request: this loop runs once per event, and numpy's per-call cost would dominate it.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from shardlab.simulate.prefix import PrefixCache
from shardlab.simulate.pricing import Pricer
from shardlab.simulate.schedulers import (
    HOLD_NOTHING,
    RATIO_FLOOR,
    RATIO_START,
    RATIO_STEPS,
    Holding,
    Rules,
)

RATIO_DECAY = (RATIO_START - RATIO_FLOOR) / RATIO_STEPS
# Decode steps between two looks at the waiting queue while SGLang's ratio falls
RATIO_LOOK = 16
# Why a rank's prompts are held: the attention-DP balance's timeout counter, its
# batching wait, TensorRT-LLM's batch waiting
HELD_BALANCE, HELD_BATCHING, HELD_BATCH = 1, 2, 3


class Book:
    """Every request's lengths and progress, and what the run records of it."""

    __slots__ = (
        "base",
        "chain",
        "done",
        "entry",
        "finish",
        "first",
        "hit",
        "input",
        "itl_n",
        "itl_s",
        "made",
        "need",
        "output",
        "rank_of",
    )  # fmt: skip

    def __init__(
        self,
        input_len: list[int],
        output_len: list[int],
        chain: tuple[tuple[int, ...], ...] | None = None,
    ) -> None:
        """``chain``: each prompt's prefix blocks (:mod:`shardlab.simulate.prefix`)."""
        n = len(input_len)
        self.input = input_len
        self.output = output_len
        self.need = list(input_len)  # prompt tokens to compute (more after a preemption)
        self.done = [0] * n  # of them computed
        self.made = [0] * n  # output tokens made when it last entered decoding
        self.entry = [0] * n  # the rank's decode step it entered decoding at
        self.base = [0] * n  # its context at that step
        self.first = [math.nan] * n
        self.finish = [math.nan] * n
        self.rank_of = [-1] * n
        self.chain = chain
        self.hit = [0] * n  # prompt tokens found in the prefix cache when last admitted
        # inter-token gaps: one iteration's seconds, and how many tokens had it as
        # their gap
        self.itl_s: list[float] = []
        self.itl_n: list[int] = []


class Rank:
    """One rank's scheduler. ``handoff``: a prefill pool's rank, whose requests leave
    once prefilled (their first token made), to be decoded elsewhere."""

    __slots__ = (
        "book",
        "budget",
        "busy",
        "bwait",
        "cache",
        "chunks",
        "ctx0",
        "decoding",
        "dt",
        "end",
        "group",
        "handoff",
        "held",
        "holding",
        "index",
        "k",
        "kv",
        "left0",
        "max_running",
        "order",
        "outstanding",
        "preemptions",
        "prefilling",
        "price",
        "ratio",
        "rules",
        "slack",
        "stall",
        "step",
        "t0",
        "tick",
        "used",
        "version",
        "waiting",
    )  # fmt: skip

    def __init__(
        self,
        index: int,
        rules: Rules,
        price: Pricer,
        book: Book,
        *,
        budget: int,
        max_running: int,
        kv_tokens: int,
        handoff: bool = False,
        holding: Holding = HOLD_NOTHING,
        group: list[Rank] | None = None,
        cache: PrefixCache | None = None,
    ) -> None:
        """``group``: the ranks of its attention-DP group, itself included, as the
        caller fills it (None: no attention DP); ``cache``: its prefix cache (None:
        prompts are prefilled whole)."""
        self.index = index
        self.rules = rules
        self.price = price
        self.book = book
        self.budget = budget
        self.max_running = min(max_running, price.top)
        self.kv = kv_tokens
        self.slack = rules.block / 2 if rules.block > 1 else 0.0
        self.handoff = handoff
        self.waiting: deque[int] = deque()
        self.prefilling: list[int] = []
        self.decoding: list[tuple[int, int]] = []  # heap of (last step, request)
        self.order: list[int] = []  # decoding requests, in the order admitted
        self.step = 0  # decode iterations run
        self.ctx0 = 0  # decoding requests' context = ctx0 + len * step
        self.left0 = 0  # tokens they have left to make = left0 - len * step
        # KV tokens held (TensorRT-LLM: reserved) by prefilling requests, less those of
        # prefix blocks running requests share (on the GPU once: PrefixCache.dup)
        self.used = 0.0
        self.ratio = RATIO_START
        self.t0 = 0.0
        self.dt = 0.0  # seconds of each iteration of the run under way
        self.k = 0  # iterations in it
        self.end = math.inf
        self.chunks: list[tuple[int, int]] = []  # (request, prompt tokens) of a prefill iteration
        self.busy = False
        self.version = 0
        self.outstanding = 0  # requests routed here, not yet gone
        self.preemptions = 0
        self.stall = 0.0  # seconds of prefill iterations the decoding requests sat out
        self.holding = holding
        # the ranks of its attention-DP group when they balance prompts (else None)
        self.group = group if holding.adp_balance else None
        # iterations waited for a batch (-1: never waits; the engine waits for a batch
        # only without attention DP)
        waits = holding.batch_waits and group is None
        self.bwait = 0 if self.group is not None or waits else -1
        self.tick = 0  # iterations the balance counter has run (it restarts at the timeout)
        self.held = 0  # the run under way holds prompts back: 0 no, else HELD_* why
        self.cache = cache

    # -- what the rank holds ----------------------------------------------------------

    def _kv_held(self) -> float:
        """KV tokens the running requests hold now (TensorRT-LLM: have reserved)."""
        n = len(self.decoding)
        running = n + len(self.prefilling)
        if self.rules.admission == "reserve":
            return self.used + running * self.slack
        return self.used + self.ctx0 + n * self.step + running * self.slack

    def _admit(self) -> None:
        """Move waiting requests to prefilling while the rules let them in (a cache
        handed over by a prefill pool goes straight to decoding)."""
        b = self.book
        rules = self.rules
        waiting = self.waiting
        cache = self.cache
        while waiting:
            if len(self.prefilling) + len(self.decoding) >= self.max_running:
                return
            r = waiting[0]
            handed = b.done[r] >= b.need[r]
            held = self._kv_held()
            if rules.admission == "reserve":
                want = b.input[r] + b.output[r] + self.slack
            else:
                want = b.need[r] - (0 if handed else b.done[r]) + self.slack
                if rules.admission == "ratio":
                    # what the running requests and this one may still write
                    left = self.left0 - len(self.decoding) * self.step
                    for q in self.prefilling:
                        left += b.output[q] - b.made[q] + b.need[q] - b.done[q]
                    want += self.ratio * (left + b.output[r] - b.made[r])
            if cache is not None and not handed:
                cache.trim(self.kv - held)  # what the running requests took since
                found, hit, shared = cache.lookup(b.chain[r], b.input[r])  # type: ignore[index]
                want -= shared  # blocks running requests hold already
            if held + want > self.kv:
                return
            waiting.popleft()
            if handed:  # its first token made elsewhere: here from the next step
                if b.first[r] != b.first[r]:
                    b.first[r] = self.t0
                if rules.admission == "reserve":
                    self.used += b.input[r] + b.output[r]
                self.enter_decoding(r, max(b.made[r], 1))
                continue
            if cache is not None:
                if found:
                    cache.acquire(r, b.chain[r], found, b.input[r])  # type: ignore[index]
                    self.used -= shared
                b.done[r] = hit  # not prefilled
                if not b.made[r]:  # its first prefill (not its own blocks found again)
                    b.hit[r] = hit
            self.prefilling.append(r)
            if rules.admission == "reserve":
                self.used += b.input[r] + b.output[r]
            else:
                self.used += b.done[r]

    # -- composing the next iteration ------------------------------------------------

    def plan(self, now: float) -> bool:
        """Start the rank's next iteration (or run of them) at ``now``; False when it
        has nothing to run."""
        self.version += 1
        self.t0 = now
        preempted = False
        if self.rules.preempts:  # running requests first: a step of them must fit
            while self.decoding and self.kv - self._kv_held() < len(self.decoding):
                self._preempt()
                preempted = True
        # vLLM and SGLang admit nothing new in a step that preempted (unless nothing
        # else is left to run: the rank would sit idle with requests waiting)
        if not preempted or not (self.decoding or self.prefilling):
            self._admit()
        price = self.price
        n = len(self.decoding)
        prefills = bool(self.prefilling) and (not self.rules.mixed or n == 0 or self.budget > n)
        hold = 0
        if self.bwait >= 0:  # the engine may hold the prompts back
            self.held = 0
            if prefills:
                hold = self._hold(n)
        if prefills and not hold:
            b = self.book
            room = self.budget - n if self.rules.mixed else self.budget
            chunks: list[tuple[int, int]] = []
            tokens = 0
            alone = longest = 0.0
            for r in self.prefilling:
                if room <= 0:
                    break
                take = min(b.need[r] - b.done[r], room)
                chunks.append((r, take))
                room -= take
                tokens += take
                one = price.prompt(take, b.done[r])
                alone += one
                longest = one if one > longest else longest
            self.chunks = chunks
            if n:
                self.dt = price.mixed(n, (self.ctx0 + n * self.step) / n, tokens)
            else:
                self.dt = price.prompts(alone, longest) + price.iteration_s
            self.k = 1
        elif n:
            self.chunks = []
            k = self.decoding[0][0] - self.step  # to the next request's last token
            if self.rules.preempts:  # to the step that would find no room
                k = min(k, math.floor((self.kv - self._kv_held()) / n))
            if self.rules.admission == "ratio" and self.ratio > RATIO_FLOOR and self.waiting:
                # the falling ratio may let a waiting request in: look again every
                # few steps
                k = min(k, RATIO_LOOK)
            if hold:  # to the iteration that would let the prompts go
                k = min(k, hold)
            mean = (self.ctx0 + n * self.step) / n
            self.k = k
            self.dt = price.decode(n, mean + (k - 1) / 2)
        else:
            self.busy = False
            self.end = math.inf
            return False
        self.busy = True
        self.end = now + self.k * self.dt
        return True

    def _hold(self, n: int) -> int:
        """How many iterations from now the prompts this rank would prefill are held
        back (0: they go now), by the engine's rules (``schedulers`` docstring); the
        run under way records why (``held``)."""
        h = self.holding
        if self.group is None:  # batch waiting: in iterations with prompts and decodes
            if n == 0:
                return 0
            b = self.book
            room = self.budget - n
            tokens = n
            for r in self.prefilling:  # the prompts the iteration would take, whole
                if room <= 0:
                    break
                room -= b.need[r] - b.done[r]
                tokens += b.need[r]
            wait = h.batch_wait_timeout_iters - self.bwait
            if wait <= 0 or tokens >= h.batch_wait_max_tokens_ratio * self.budget:
                self.bwait = 0
                return 0
            self.held = HELD_BATCH
            return wait
        everyone = room = True
        decoding = n > 0
        for q in self.group:
            if len(q.decoding) >= q.max_running:
                room = False
            if q is not self:
                if not (q.prefilling or q.waiting):
                    everyone = False
                if not q.decoding:
                    decoding = False
        if everyone and room:
            self.tick = 0
            wait = h.adp_batching_wait_iters - self.bwait
            if decoding and wait > 0:
                self.held = HELD_BATCHING
                return wait
            self.bwait = 0
            return 0
        if not decoding or self.tick + 1 >= h.adp_timeout_iters:
            self.tick = 0
            return 0
        self.held = HELD_BALANCE
        return h.adp_timeout_iters - 1 - self.tick

    def _ran(self, j: int) -> None:
        """``j`` iterations of a run of decodes went by: the holding counters count them."""
        if self.group is not None:
            if self.held == HELD_BATCHING:
                self.bwait += j
            else:  # the balance's counter runs in every iteration not every rank prefills
                self.tick = (self.tick + j) % max(self.holding.adp_timeout_iters, 1)
        elif self.held:
            self.bwait += j

    def _release(self, r: int) -> None:
        """``r`` leaves the rank: its prefix blocks go back to the cache, which gives
        up what the running requests now need."""
        cache = self.cache
        assert cache is not None
        self.used += cache.release(r)  # blocks no longer held twice count again
        cache.trim(self.kv - self._kv_held())

    def _preempt(self) -> None:
        """Preempt the decoding request admitted last: its cache is dropped and it is
        prefilled again, prompt and output so far, ahead of the queue."""
        b = self.book
        r = self.order.pop()
        while b.done[r] >= 0:  # finished, or preempted before: no longer decoding here
            r = self.order.pop()
        made = b.made[r] + (self.step - b.entry[r])
        self.decoding = [(s, q) for s, q in self.decoding if q != r]
        heapq.heapify(self.decoding)
        self.ctx0 -= b.base[r] - b.entry[r]
        self.left0 -= (b.output[r] - b.made[r]) + b.entry[r]
        b.made[r] = made
        b.need[r] = b.input[r] + made
        b.done[r] = 0
        if self.cache is not None:  # its blocks stay cached, to be found again
            self._release(r)
        self.waiting.appendleft(r)
        self.preemptions += 1
        if self.rules.admission == "ratio":
            self.ratio = RATIO_START

    # -- time passing ----------------------------------------------------------------

    def _decode_steps(self, j: int) -> None:
        """``j`` decode steps of every decoding request, ``dt`` seconds each."""
        if j <= 0 or not self.decoding:
            return
        n = len(self.decoding)
        self.step += j
        if self.rules.admission == "ratio":
            self.ratio = max(RATIO_FLOOR, self.ratio - j * RATIO_DECAY)
        b = self.book
        if self.stall:  # the first step's gap holds the prefill iterations before it
            b.itl_s.append(self.stall + self.dt)
            b.itl_n.append(n)
            self.stall = 0.0
            j -= 1
        if j:
            b.itl_s.append(self.dt)
            b.itl_n.append(j * n)

    def _finish_due(self, t: float, gone: list[int]) -> None:
        """Requests whose last token the steps so far made leave at ``t``."""
        b = self.book
        heap = self.decoding
        cache = self.cache
        if cache is not None and heap and heap[0][0] <= self.step:
            cache.trim(self.kv - self._kv_held())  # the run's peak, before any leaves
        while heap and heap[0][0] <= self.step:
            _, r = heapq.heappop(heap)
            b.finish[r] = t
            b.done[r] = 0  # no longer decoding on this rank
            self.ctx0 -= b.base[r] - b.entry[r]
            self.left0 -= (b.output[r] - b.made[r]) + b.entry[r]
            if self.rules.admission == "reserve":
                self.used -= b.input[r] + b.output[r]
            self.outstanding -= 1
            gone.append(r)
            if cache is not None:
                self._release(r)

    def complete(self, gone: list[int], handed: list[int]) -> None:
        """The iteration (or run) under way ends at ``self.end``: apply it. Finished
        requests go to ``gone``; a prefill pool's prefilled ones to ``handed``."""
        t = self.end
        if self.chunks and not self.rules.mixed and self.decoding:
            self.stall += self.dt
        self._decode_steps(self.k if not self.chunks else (1 if self.rules.mixed else 0))
        if self.bwait >= 0 and not self.chunks:
            self._ran(self.k)
        self._finish_due(t, gone)
        if self.chunks:
            self._prefilled(t, gone, handed)
        self.busy = False

    def cut(self, t: float, gone: list[int]) -> bool:
        """An arrival at ``t`` in a run of decodes: end the run at the boundary after
        ``t`` and plan again from there (True); a prefill iteration runs to its end
        (False)."""
        if self.chunks or not self.busy:
            return False
        j = math.ceil((t - self.t0) / self.dt - 1e-9)
        if j >= self.k:
            return False
        self._decode_steps(j)
        if self.bwait >= 0:
            self._ran(j)
        tb = self.t0 + j * self.dt
        self._finish_due(tb, gone)
        self.plan(tb)
        return True

    def _prefilled(self, t: float, gone: list[int], handed: list[int]) -> None:
        b = self.book
        finished = []
        for r, take in self.chunks:
            b.done[r] += take
            if self.rules.admission != "reserve":
                self.used += take
            if b.done[r] >= b.need[r]:
                finished.append(r)
        self.chunks = []
        if not finished:
            return
        done = set(finished)
        self.prefilling = [r for r in self.prefilling if r not in done]
        cache = self.cache
        for r in finished:
            if cache is not None:
                cache.computed(r, b.chain[r], b.input[r])  # type: ignore[index]
            if b.first[r] != b.first[r] and not self.handoff:  # nan: its first token
                b.first[r] = t
            made = b.made[r] + 1
            leaves = made >= b.output[r] or self.handoff
            if self.rules.admission != "reserve":
                self.used -= b.done[r]  # from here on the decoding context counts it
            elif leaves:
                self.used -= b.input[r] + b.output[r]
            if leaves:
                b.made[r] = made
                b.done[r] = 0
                self.outstanding -= 1
                if cache is not None:
                    self._release(r)
                if made >= b.output[r]:
                    b.finish[r] = t
                    gone.append(r)
                else:
                    handed.append(r)
                continue
            self.enter_decoding(r, made)

    def enter_decoding(self, r: int, made: int) -> None:
        """``r`` decodes from the next step, ``made`` output tokens made, its prompt's
        cache here (TensorRT-LLM: its reservation already counted)."""
        b = self.book
        b.made[r] = made
        b.entry[r] = self.step
        b.base[r] = b.need[r] + 1
        b.done[r] = -1  # decoding (see _preempt)
        self.ctx0 += b.base[r] - self.step
        self.left0 += (b.output[r] - made) + self.step
        heapq.heappush(self.decoding, (self.step + b.output[r] - made, r))
        self.order.append(r)
