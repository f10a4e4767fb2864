"""One rank's prefix cache: the blocks of prompts it has computed, kept after their
requests leave until the memory is needed, so that a later prompt opening with the
same blocks skips their prefill.

What is modelled, after vLLM's automatic prefix caching (``vllm/v1/core/
kv_cache_manager.py``, ``block_pool.py``, ``kv_cache_utils.py``: a block is found by a
hash chained over the blocks before it; a block no running request holds stays cached
in a queue of free blocks, evicted least recently freed first, a finished request's
blocks freed tail first; a hit is capped so that the prompt's last token is computed),
which SGLang's radix cache (least recently used leaves evicted) and TensorRT-LLM's KV
cache reuse share in the respects kept here:

- a request's **chain** is its prompt's blocks in order (``Traffic.prefix_blocks``,
  ``block`` tokens each, the last one as long as the prompt leaves it); two chains
  opening with the same ids share those tokens;
- **lookup** at admission: the longest run of the chain's leading blocks the rank
  holds (running requests' or cached free ones), whole blocks only, short of the
  prompt's last token. Those tokens are not prefilled;
- **memory**: a running request's context counts in full, as before, less the tokens
  of its blocks another running request also holds (``dup``: one copy on the GPU; the
  rank takes them off the KV it counts as held).
  Free cached blocks fill what the running requests leave of the rank's KV capacity
  and are evicted, least recently freed first, when the running requests need the
  room: they never hold a request back;
- a request's blocks are **cached** when its whole prompt is computed (the blocks it
  found, and the ones it computed that no other holds) and **freed** when it leaves
  the rank (finished, handed to a decode rank, or preempted), last block first.

Simplified: the blocks a prompt computes are found by others only once its whole
prompt is (vLLM caches each full block as its chunk ends); a block computed twice at
once is kept once; generated tokens are never cached (vLLM caches their full blocks
too, which a preempted request finds again); the cache counts tokens, not the
engine's own pages.
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    """The blocks one rank holds: by running requests (``refs``) and free (``free``,
    least recently freed first)."""

    __slots__ = ("block", "cached", "dup", "free", "held", "refs")

    def __init__(self, block: int) -> None:
        self.block = block
        self.refs: dict[int, int] = {}  # block -> running requests holding it
        self.free: OrderedDict[int, int] = OrderedDict()  # block -> tokens
        self.cached = 0  # tokens of the free blocks
        self.dup = 0  # tokens running requests hold twice or more, beyond the first copy
        self.held: dict[int, list[tuple[int, int]]] = {}  # request -> (block, tokens) it holds

    def lookup(self, chain: tuple[int, ...], prompt: int) -> tuple[int, int, int]:
        """(blocks, tokens, of them held by running requests) of ``chain``'s leading
        blocks found here, for a prompt of ``prompt`` tokens."""
        refs, free, block = self.refs, self.free, self.block
        n = hit = shared = 0
        for blk in chain:
            size = min(block, prompt - hit)
            if hit + size >= prompt:  # the prompt's last token is computed
                break
            if blk in refs:
                shared += size
            elif blk not in free:
                break
            n += 1
            hit += size
        return n, hit, shared

    def acquire(self, r: int, chain: tuple[int, ...], n: int, prompt: int) -> None:
        """Request ``r`` holds ``chain``'s first ``n`` blocks (found by :meth:`lookup`)."""
        held = self.held.setdefault(r, [])
        refs, free, block = self.refs, self.free, self.block
        for k in range(n):
            blk = chain[k]
            size = min(block, prompt - k * block)
            if blk in refs:
                refs[blk] += 1
                self.dup += size
            else:
                self.cached -= free.pop(blk)
                refs[blk] = 1
            held.append((blk, size))

    def computed(self, r: int, chain: tuple[int, ...], prompt: int) -> None:
        """``r``'s whole prompt is computed: the blocks past those it found are cached
        as its own, unless the rank holds them already (a copy of its own then, freed
        with it and never found)."""
        held = self.held.setdefault(r, [])
        refs, free, block = self.refs, self.free, self.block
        for k in range(len(held), len(chain)):
            blk = chain[k]
            if blk in refs or blk in free:
                continue
            size = min(block, prompt - k * block)
            if size <= 0:
                break
            refs[blk] = 1
            held.append((blk, size))

    def release(self, r: int) -> int:
        """``r`` leaves the rank: its blocks no one else holds become free, its last
        block first (evicted first). Returns the tokens by which :attr:`dup` fell
        (blocks it shared that others still hold)."""
        held = self.held.pop(r, None)
        dup = self.dup
        if held:
            refs, free = self.refs, self.free
            for blk, size in reversed(held):
                left = refs[blk] - 1
                if left:
                    refs[blk] = left
                    self.dup -= size
                else:
                    del refs[blk]
                    free[blk] = size
                    self.cached += size
        return dup - self.dup

    def trim(self, room: float) -> None:
        """Evict free blocks, least recently freed first, to ``room`` tokens at most."""
        free = self.free
        while self.cached > room and free:
            self.cached -= free.popitem(last=False)[1]
