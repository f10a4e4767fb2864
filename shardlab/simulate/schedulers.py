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

TensorRT-LLM's PyTorch executor can also hold a rank's context requests back
(:class:`Holding`, off by default as in the engine; ``PyExecutor._schedule``,
``_balance_adp_requests`` and ``_waiting_requests`` in
``tensorrt_llm/_torch/pyexecutor/py_executor.py``, the knobs in ``llmapi/llm_args.py``):

- **attention-DP balance** (``attention_dp_config.enable_balance``): the ranks of one
  attention-DP group share, every iteration, how many context and generation requests
  each scheduled. Context requests go ahead when every rank has one and room for it
  (fewer generation requests than ``max_batch_size``), then after
  ``batching_wait_iters`` more iterations if every rank is also decoding; when some
  rank has none, they are held, and a counter of such iterations releases them when
  it reaches ``timeout_iters`` (then starts again from 0) or at once when some rank has
  nothing to decode. The counter runs whether or not anything is held, so a prompt
  that finds it part-way waits out only the rest.
- **batch waiting** (``batch_wait_timeout_iters``, ``batch_wait_max_tokens_ratio``),
  only without attention DP and only in an iteration with both context and
  generation requests: context requests are held until the iteration's tokens (the
  context requests' whole prompts and one per decode) reach the ratio of
  ``max_num_tokens``, or for ``batch_wait_timeout_iters`` iterations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shardlab.errors import ShardlabError

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


@dataclass(frozen=True, kw_only=True)
class Holding:
    """When a TensorRT-LLM rank holds its context requests back (module docstring): the
    engine's launch options, each default the engine's own (off)."""

    adp_balance: bool = False  # attention_dp_config.enable_balance
    adp_timeout_iters: int = 50  # attention_dp_config.timeout_iters
    adp_batching_wait_iters: int = 10  # attention_dp_config.batching_wait_iters
    batch_wait_timeout_iters: int = 0  # batch_wait_timeout_iters
    batch_wait_max_tokens_ratio: float = 0.0  # batch_wait_max_tokens_ratio

    def __post_init__(self) -> None:
        for key in ("adp_timeout_iters", "adp_batching_wait_iters", "batch_wait_timeout_iters"):
            if getattr(self, key) < 0:
                raise ShardlabError(f"{key} {getattr(self, key)} is below 0", field=key)
        if not 0.0 <= self.batch_wait_max_tokens_ratio <= 1.0:
            raise ShardlabError(
                f"batch_wait_max_tokens_ratio {self.batch_wait_max_tokens_ratio} is outside [0, 1]",
                field="batch_wait_max_tokens_ratio",
            )

    @property
    def batch_waits(self) -> bool:
        """Batch waiting can hold anything: the engine stops waiting at once when either
        knob is 0 (its iteration count reaches 0, or its tokens reach 0)."""
        return self.batch_wait_timeout_iters > 0 and self.batch_wait_max_tokens_ratio > 0


HOLD_NOTHING = Holding()
