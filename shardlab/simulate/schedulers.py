"""Each engine's scheduler, as its code and documentation describe it, in the few
rules the simulator steps by (sources in ``/docs/traffic.md``):

- **vLLM V1**: one token budget per step (``max_num_batched_tokens``) shared by the
  running requests' decodes, one token each, and prefill chunks, first come first
  served; at most ``max_num_seqs`` running; a request is admitted when its prompt's
  KV blocks (16 tokens) fit; when a decode step finds no free block the request
  admitted last is preempted and recomputed (its prompt and the tokens it made
  prefilled again).
- **TensorRT-LLM** (``GUARANTEED_NO_EVICT``, its default capacity policy): the same
  mixed iterations under ``max_num_tokens`` and ``max_batch_size``, but a request is
  admitted only when its prompt and its whole output fit the KV cache (blocks of 32
  tokens), so that nothing is ever paused.
- **SGLang**: prefill batches of their own, ahead of decoding, up to the chunked
  prefill size; a request is admitted when the running requests' tokens plus
  ``new_token_ratio`` times what they have left to generate fit the cache (pages of
  one token); the ratio starts at 0.7 and decays to 0.14 of that over 600 decode
  steps, and goes back to 0.7 when a decode step finds no room and retracts the
  request admitted last (recomputed, as vLLM's).

The simulator knows each request's output length; engines do not. TensorRT-LLM
reserves for the request's ``max_tokens``, which benchmarks set to the output length
they ask for: the same thing. Blocks are counted in tokens with half a block of
slack per request (the mean of the last block's unused part).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Admission = Literal["prompt", "reserve", "ratio"]

# SGLang's new-token ratio (python/sglang/global_config.py: default_init_new_token_ratio,
# default_min_new_token_ratio_factor, default_new_token_ratio_decay_steps)
RATIO_START = 0.7
RATIO_FLOOR = RATIO_START * 0.14
RATIO_STEPS = 600


@dataclass(frozen=True, kw_only=True)
class Rules:
    """How one engine schedules a rank's requests."""

    engine: str
    mixed: bool  # prompts and decodes share iterations (else prefill batches of their own)
    admission: Admission
    block: int  # KV cache tokens per block (page)
    preempts: bool  # a decode step that finds no room preempts a request


RULES = {
    "vllm": Rules(engine="vllm", mixed=True, admission="prompt", block=16, preempts=True),
    "trtllm": Rules(engine="trtllm", mixed=True, admission="reserve", block=32, preempts=False),
    "sglang": Rules(engine="sglang", mixed=False, admission="ratio", block=1, preempts=True),
}
