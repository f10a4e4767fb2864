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

Serving costs no kernel table holds, fitted per engine to measured serving
(:data:`SERVING_CONSTANTS`, written by ``shardlab calibrate --engines``; each number
says what it was fitted on and how it generalizes): a fixed cost per request (HTTP,
tokenization, detokenization and the first streamed chunk, in TTFT) and per
iteration (scheduling and sampling, in every round). How an engine schedules a new
prompt (:mod:`shardlab.costmodel.regimes`): TensorRT-LLM and vLLM prefill it in an
iteration that also decodes the running requests (chunked prefill under the token
budget); SGLang runs prefill batches of their own, ahead of decoding
(``python/sglang/srt/managers/scheduler.py``, ``get_next_batch_to_run``: a new
prefill batch first, unless mixed chunks are turned on). Not modeled: eager decode
above the CUDA-graph batch sizes (TensorRT-LLM 128, vLLM 512, SGLang 256-512).

Memory is then budgeted as the engine does, as one linear inequality per stage (so
the tables and CP-SAT keep it exact): ``weights * weight_scale + (activations +
reserve) * reserve_scale + kv * kv_scale <= HBM``. TensorRT-LLM: the KV cache within
90% of what the rest leaves free (``kv_scale`` 1/0.9); vLLM: everything within 92% of
HBM (all scales 1/0.92); SGLang: weights and KV within ``mem_fraction_static`` of HBM,
whose remainder is its own reserve for activations and graphs (``reserve_scale`` 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

from shardlab.costmodel.metrics import MemoryShare
from shardlab.problems.problem import Problem

GIB = 1 << 30
MIB = 1 << 20

# Engines that run a new prompt's prefill as a batch of its own, ahead of decoding.
PREFILL_FIRST = ("sglang",)


def serving_constants_path() -> str:
    """The fitted per-engine serving costs shipped with shardlab."""
    return str(resources.files("shardlab") / "data" / "serving" / "engines.yaml")


@cache
def serving_constants() -> dict[str, dict[str, float]]:
    """Per engine, ``request_ms`` and ``iteration_ms``, and ``simulated_request_ms``
    and ``simulated_iteration_ms`` where they were fitted through the simulator (see
    the module docstring)."""
    with open(serving_constants_path()) as f:
        raw = yaml.safe_load(f)
    return {e: {k: float(v) for k, v in raw["engines"][e].items()} for e in raw["engines"]}


def serving_constants_yaml(
    request_ms: dict[str, float],
    iteration_ms: dict[str, float],
    header: list[str],
    simulated_request_ms: dict[str, float] | None = None,
    simulated_iteration_ms: dict[str, float] | None = None,
) -> str:
    """The file :func:`serving_constants` reads, with ``header`` as its comments (what
    it was fitted on, by which command, how well it generalizes)."""
    engines: dict[str, dict[str, float]] = {
        e: {"request_ms": round(request_ms[e], 3), "iteration_ms": round(iteration_ms[e], 3)}
        for e in sorted(request_ms)
    }
    for key, fitted in (
        ("simulated_request_ms", simulated_request_ms),
        ("simulated_iteration_ms", simulated_iteration_ms),
    ):
        for e, ms in (fitted or {}).items():
            if e in engines:
                engines[e][key] = round(ms, 3)
    comments = "".join(f"# {line}\n" for line in header)
    return comments + yaml.safe_dump({"engines": engines}, sort_keys=False)


def to_ns(ms: float) -> int:
    """Milliseconds as whole nanoseconds: the scalar, batched and exact paths add the
    same constant."""
    return round(ms * 1e6)


@dataclass(frozen=True, kw_only=True)
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


def memory_shares(
    limits: EngineLimits, *, weights: float, kv: float, act: float, reserve: float, total: float
) -> tuple[MemoryShare, ...]:
    """``total`` (one GPU's budget, as :func:`engine_limits` scales it) as shares that
    add up to it: weights, KV cache, and, where the engine charges them, the activation
    workspace and the runtime reserve; the rest is what the engine's budget leaves free
    (vLLM's 1 - ``gpu_memory_utilization``, TensorRT-LLM's 1 - ``free_gpu_memory_fraction``
    of the memory the rest leaves) or, on SGLang, its own reserve for activations and
    CUDA graphs (1 - ``mem_fraction_static``), which holds the workspace."""
    shares = [MemoryShare(name="weights", gb=weights), MemoryShare(name="kv_cache", gb=kv)]
    if limits.reserve_scale > 0:
        shares += [
            MemoryShare(name="activations", gb=act),
            MemoryShare(
                name="runtime_reserve", gb=reserve, note="CUDA context, NCCL buffers, allocator"
            ),
        ]
    rest = max(total - sum(s.gb for s in shares), 0.0)
    if limits.name == "sglang":
        note = f"1 - mem_fraction_static {1 / limits.weight_scale:.3f}; activations {act:.2f} in it"
        shares.append(MemoryShare(name="engine_reserve", gb=rest, note=note))
    elif limits.name == "vllm":
        note = f"1 - gpu_memory_utilization {1 / limits.weight_scale:.2f}"
        shares.append(MemoryShare(name="left_free", gb=rest, note=note))
    else:
        note = f"1 - free_gpu_memory_fraction {1 / limits.kv_scale:.2f} of what the rest leaves"
        shares.append(MemoryShare(name="left_free", gb=rest, note=note))
    return tuple(shares)


@dataclass(frozen=True, kw_only=True)
class ServingCosts:
    """What an engine adds to the kernels' times when it serves (the same under every
    degree tuple)."""

    request_ns: int  # fixed cost per request, in TTFT
    iteration_ns: int  # fixed cost per iteration, in every round
    # the costs the simulator adds, per request and per iteration: fitted through the
    # simulator, whose queueing and prefill stalls the forms lack
    # (shardlab.validation.simulated_costs)
    simulated_request_ns: int
    simulated_iteration_ns: int
    prefill_first: bool  # new prompts run as a prefill batch of their own


def serving_costs(problem: Problem) -> ServingCosts:
    """The engine's fitted costs, or the calibration's where it has its own."""
    fitted = serving_constants()[problem.engine]
    cal = problem.calibration
    request_ms, iteration_ms = fitted["request_ms"], fitted["iteration_ms"]
    simulated_ms = fitted.get("simulated_request_ms", request_ms)
    simulated_it = fitted.get("simulated_iteration_ms", iteration_ms)
    if cal is not None:  # a user's own fit replaces the shipped one
        request_ms = request_ms if cal.request_ms is None else cal.request_ms
        iteration_ms = iteration_ms if cal.iteration_ms is None else cal.iteration_ms
        # the user's own costs are the simulator's too, unless given apart
        if cal.simulated_request_ms is not None:
            simulated_ms = cal.simulated_request_ms
        elif cal.request_ms is not None:
            simulated_ms = cal.request_ms
        if cal.simulated_iteration_ms is not None:
            simulated_it = cal.simulated_iteration_ms
        elif cal.iteration_ms is not None:
            simulated_it = cal.iteration_ms
    return ServingCosts(
        request_ns=to_ns(request_ms),
        iteration_ns=to_ns(iteration_ms),
        simulated_request_ns=to_ns(simulated_ms),
        simulated_iteration_ns=to_ns(simulated_it),
        prefill_first=problem.engine in PREFILL_FIRST,
    )
