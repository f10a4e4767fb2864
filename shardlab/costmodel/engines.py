"""The serving engine's own limits: how much memory its KV cache gets, how many
requests and tokens one iteration takes.

Defaults of TensorRT-LLM (LLM API / ``trtllm-serve``), vLLM 0.24.0 (``vllm serve``)
and SGLang 0.5.14 (``sglang.launch_server``), each with the file it comes from:

- KV-cache share: TensorRT-LLM gives the KV cache ``free_gpu_memory_fraction`` = 0.9 of
  the memory left *free* after weights and buffers (``tensorrt_llm/llmapi/llm_args.py``
  ``KvCacheConfig``); vLLM fits everything in ``gpu_memory_utilization`` = 0.92 of
  *total* memory (``vllm/config/cache.py:67``); SGLang fits weights and KV in
  ``mem_fraction_static`` of total memory, derived from a reserve for activations and
  CUDA graphs (``python/sglang/srt/server_args.py:3276-3322``, :func:`sglang_static`).
- Requests per iteration, per attention-data-parallel rank: TensorRT-LLM
  ``max_batch_size`` = 2048 (``llm_args.py`` ``BaseLlmArgs``); vLLM ``max_num_seqs`` =
  1024 on GPUs of 70 GiB or more other than A100, else 256
  (``vllm/engine/arg_utils.py:2404-2423``); SGLang ``max_running_requests`` derived from
  the KV pool, clamped to [2048, 4096] then to half the pool's tokens
  (``model_runner_kv_cache_mixin.py:981-1018``): 2048 for models of long context.
- Tokens per iteration: TensorRT-LLM ``max_num_tokens`` = 8192 (``BaseLlmArgs``); vLLM
  ``max_num_batched_tokens`` = 8192 on those large GPUs, else 2048 (``arg_utils.py``);
  SGLang ``chunked_prefill_size`` = 4096 below 60 GiB, 8192 below 160 GiB, 16384
  above (``server_args.py:3122-3207``), divided over attention-DP ranks.

Not modeled, for want of a published number: a fixed cost per iteration (scheduling,
sampling; ``shardlab calibrate`` fits one to measurements) and eager decode above the
CUDA-graph batch sizes (TensorRT-LLM 128, vLLM 512, SGLang 256-512).

Memory is then budgeted as the engine does, as one linear inequality per stage (so
the tables and CP-SAT keep it exact): ``weights * weight_scale + (activations +
reserve) * reserve_scale + kv * kv_scale <= HBM``. TensorRT-LLM: the KV cache within
90% of what the rest leaves free (``kv_scale`` 1/0.9); vLLM: everything within 92% of
HBM (all scales 1/0.92); SGLang: weights and KV within ``mem_fraction_static`` of HBM,
whose remainder is its own reserve for activations and graphs (``reserve_scale`` 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.problems.problem import Problem

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class EngineLimits:
    name: str
    max_batch: int  # requests per attention-DP rank
    max_tokens: int  # tokens per iteration per attention-DP rank
    weight_scale: float  # the memory budget (see the module docstring)
    reserve_scale: float
    kv_scale: float


def sglang_static(hbm_bytes: float, tp: int, pp: int, chunk: int, graph_bs: int) -> float:
    """SGLang's ``mem_fraction_static`` when not given (server_args.py:3276-3322; the
    terms for DP attention and prefill CUDA graphs left out)."""
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024  # MiB
    if hbm_bytes > 60 * GIB:
        reserved = max(reserved, 10240)
    gpu_mib = hbm_bytes / MIB
    return round((gpu_mib - reserved) / gpu_mib, 3)


def engine_limits(problem: Problem, tp: int, pp: int, dp_attn: int) -> EngineLimits:
    """The limits of ``problem.engine`` for one degree tuple (its flags override them)."""
    acc = problem.cluster.accelerator
    hbm = acc.hbm_gb * 1e9
    large = hbm >= 70 * GIB and not acc.key.startswith("a100")
    if problem.engine == "vllm":
        batch, tokens = (1024, 8192) if large else (256, 2048)
        share = 0.92
        scales = (1 / share, 1 / share, 1 / share)
    elif problem.engine == "sglang":
        chunk = 4096 if hbm < 60 * GIB else 8192 if hbm < 160 * GIB else 16384
        graph_bs = 512 if hbm >= 160 * GIB or tp >= 4 else 256
        share = sglang_static(hbm, tp, pp, chunk, graph_bs)
        batch, tokens = 2048, max(chunk // dp_attn, 1)
        scales = (1 / share, 0.0, 1 / share)
    else:  # trtllm: the KV cache takes 90% of what weights and buffers leave free
        batch, tokens = 2048, 8192
        scales = (1.0, 1.0, 1 / 0.9)
    return EngineLimits(
        name=problem.engine,
        max_batch=problem.max_batch or batch,
        max_tokens=problem.max_tokens or tokens,
        weight_scale=scales[0],
        reserve_scale=scales[1],
        kv_scale=scales[2],
    )
