"""What a measured row states beyond its setup: the statistic it reports, the load
protocol it was measured under, and for a disaggregated deployment its pools.

Columns of a measurements CSV (all optional; a file without them reads as before):

- ``statistic``: ``mean`` (blank: mean), ``median``, or a percentile ``pN`` with N in
  (0, 100) (``p90``, ``p99``, ``p99.9``; ``p50`` is the median);
- the load, one of:

  - a closed loop (vLLM's and SGLang's ``--max-concurrency``, InferenceX's protocol):
    ``clients`` and ``prompts_per_client`` (both, positive integers);
  - open arrivals: ``rate`` (requests/s, > 0), ``requests`` (how many were sent:
    ``--num-prompts``) and ``arrival``: ``poisson`` (blank: poisson) or ``gamma:CV``
    with the coefficient of variation of the gaps (> 0; vLLM's ``--burstiness`` is
    1/CV²);

  and ``length_range``: the benchmarks' random range ratio r in (0, 1] (blank: 1, fixed
  lengths), each request's lengths uniform in [r, 1] x the row's ``input_len`` and
  ``output_len``;
- ``serving``: blank or ``agg`` for an aggregated deployment (the degree columns);
  for a disaggregated one, its pools as ``xP(layout) + yD(layout)``: ``x`` prefill
  instances and ``y`` decode instances, each ``layout`` the degrees of one instance as
  ``key=value`` pairs among ``pp``, ``tp``, ``dp_attn``, ``ep``, ``etp`` (omitted: 1,
  and ``etp = tp * dp_attn / ep``), e.g. ``1P(tp=8 ep=8) + 7D(tp=8 ep=8)`` or
  ``2P(tp=1 dp_attn=8 ep=8) + 1D(tp=1 dp_attn=16 ep=16)``. The degree columns are then
  not read; the cluster holds both pools.

A benchmark may also launch its engine other than by the engine's defaults: what
InferenceX's TensorRT-LLM scripts launch is :func:`inferencex_trtllm_launch`, which the
replay applies to those rows (:func:`shardlab.validation.replay.launch_of`).

Each refusal names the row (``where``) and the column, in one line.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from shardlab.errors import ShardlabError
from shardlab.problems.disagg import DisaggPlan, decode_problem, in_one_domain, prefill_problem
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from shardlab.simulate.schedulers import Holding

POOL_KEYS = ("pp", "tp", "dp_attn", "ep", "etp")
_PERCENTILE = re.compile(r"p(\d+(?:\.\d+)?)")
_SERVING = re.compile(r"(\d+)\s*P\s*\(([^)]*)\)\s*\+\s*(\d+)\s*D\s*\(([^)]*)\)")


def _text(row: Mapping[str, str], key: str) -> str:
    return (row.get(key) or "").strip()


def statistic_of(row: Mapping[str, str], where: str) -> str:
    """The row's statistic, normalized: ``mean``, ``median`` or ``pN``."""
    text = _text(row, "statistic").lower() or "mean"
    if text in ("mean", "median"):
        return text
    match = _PERCENTILE.fullmatch(text)
    if match is None:
        raise ShardlabError(
            f"{where}: statistic {text!r} is not mean, median or a percentile pN (p90, p99)",
            field="statistic",
        )
    value = float(match.group(1))
    if not 0 < value < 100:
        raise ShardlabError(
            f"{where}: statistic {text!r}: a percentile must be in (0, 100)", field="statistic"
        )
    return "median" if value == 50 else f"p{match.group(1)}"


def percentile_of(statistic: str) -> float | None:
    """The percentile a statistic is (the median: 50; the mean: None)."""
    if statistic == "mean":
        return None
    return 50.0 if statistic == "median" else float(statistic[1:])


@dataclass(frozen=True, kw_only=True)
class Load:
    """A row's load protocol, as its columns state it (see the module docstring)."""

    clients: int | None = None
    prompts_per_client: int | None = None
    rate: float | None = None
    arrival: Literal["poisson", "gamma"] | None = None  # open arrivals only
    cv: float | None = None  # the gaps' coefficient of variation (gamma only)
    requests: int | None = None  # open arrivals: how many were sent
    length_range: float = 1.0


def count(row: Mapping[str, str], key: str, where: str, default: int | None = None) -> int | None:
    """A positive integer column of a row (blank: ``default``)."""
    text = _text(row, key)
    if not text:
        return default
    try:
        value = int(float(text))
    except (ValueError, OverflowError):
        raise ShardlabError(f"{where}: {key} {text!r} is not an integer", field=key) from None
    if value < 1 or value != float(text):
        raise ShardlabError(f"{where}: {key} must be a positive integer, got {text!r}", field=key)
    return value


def _positive(text: str, key: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ShardlabError(f"{where}: {key} {text!r} is not a number", field=key) from None
    if not math.isfinite(value) or value <= 0:
        raise ShardlabError(f"{where}: {key} must be > 0, got {text!r}", field=key)
    return value


def load_of(row: Mapping[str, str], where: str) -> Load:
    """The row's load protocol; refused in one line naming the row and the column."""
    clients = count(row, "clients", where)
    prompts = count(row, "prompts_per_client", where)
    requests = count(row, "requests", where)
    rate_text, arrival_text = _text(row, "rate"), _text(row, "arrival").lower()
    length_range = 1.0
    if text := _text(row, "length_range"):
        length_range = _positive(text, "length_range", where)
        if length_range > 1:
            raise ShardlabError(
                f"{where}: length_range must be in (0, 1], got {text!r}", field="length_range"
            )
    if clients is not None or prompts is not None:
        if rate_text or arrival_text or requests is not None:
            raise ShardlabError(
                f"{where}: a closed loop (clients) has no rate, arrival or requests; state "
                "one protocol",
                field="rate",
            )
        if clients is None or prompts is None:
            missing = "prompts_per_client" if clients is not None else "clients"
            raise ShardlabError(
                f"{where}: a closed loop states clients and prompts_per_client; {missing} is blank",
                field=missing,
            )
        return Load(clients=clients, prompts_per_client=prompts, length_range=length_range)
    if not rate_text:
        if arrival_text or requests is not None:
            raise ShardlabError(f"{where}: open arrivals need a rate (requests/s)", field="rate")
        return Load(length_range=length_range)
    rate = _positive(rate_text, "rate", where)
    kind, _, cv_text = (arrival_text or "poisson").partition(":")
    if kind not in ("poisson", "gamma") or (kind == "poisson" and cv_text):
        raise ShardlabError(
            f"{where}: arrival {arrival_text!r} is not poisson or gamma:CV", field="arrival"
        )
    cv = None
    if kind == "gamma":
        if not cv_text:
            raise ShardlabError(
                f"{where}: gamma arrivals state their CV (gamma:CV)", field="arrival"
            )
        try:
            cv = float(cv_text)
        except ValueError:
            cv = math.nan
        if not math.isfinite(cv) or cv <= 0:
            raise ShardlabError(
                f"{where}: arrival {arrival_text!r}: the CV must be a number > 0", field="arrival"
            )
    if requests is None:
        raise ShardlabError(
            f"{where}: open arrivals state how many requests were sent", field="requests"
        )
    arrival = cast(Literal["poisson", "gamma"], kind)
    return Load(rate=rate, arrival=arrival, cv=cv, requests=requests, length_range=length_range)


@dataclass(frozen=True, kw_only=True)
class Pools:
    """A disaggregated row's pools: instances and one instance's degrees each."""

    prefill: Degrees
    prefill_instances: int
    decode: Degrees
    decode_instances: int

    @property
    def num_gpus(self) -> int:
        return (
            self.prefill_instances * self.prefill.num_gpus
            + self.decode_instances * self.decode.num_gpus
        )


def _pool_degrees(text: str, pool: str, where: str) -> Degrees:
    sizes: dict[str, int] = {}
    for pair in text.split():
        key, sep, value = pair.partition("=")
        if not sep or key not in POOL_KEYS or key in sizes:
            raise ShardlabError(
                f"{where}: serving: the {pool} pool's {pair!r} is not one of "
                f"{', '.join(f'{k}=N' for k in POOL_KEYS)} (each once)",
                field="serving",
            )
        if not value.isdigit() or int(value) < 1:
            raise ShardlabError(
                f"{where}: serving: the {pool} pool's {key} must be a positive integer, "
                f"got {value!r}",
                field="serving",
            )
        sizes[key] = int(value)
    tp, dp, ep = sizes.get("tp", 1), sizes.get("dp_attn", 1), sizes.get("ep", 1)
    try:
        return Degrees(
            pp=sizes.get("pp", 1), tp=tp, dp_attn=dp, ep=ep, etp=sizes.get("etp", tp * dp // ep)
        )
    except ShardlabError as exc:
        raise ShardlabError(f"{where}: serving: the {pool} pool: {exc}", field="serving") from None


def pools_of(row: Mapping[str, str], where: str) -> Pools | None:
    """A disaggregated row's pools (None: aggregated)."""
    text = _text(row, "serving")
    if text.lower() in ("", "agg"):
        return None
    match = _SERVING.fullmatch(text)
    if match is None:
        raise ShardlabError(
            f"{where}: serving {text!r} is not agg or xP(layout) + yD(layout), e.g. "
            "'1P(tp=8 ep=8) + 7D(tp=8 ep=8)'",
            field="serving",
        )
    x, y = int(match.group(1)), int(match.group(3))
    if x < 1 or y < 1:
        raise ShardlabError(f"{where}: serving: each pool needs an instance", field="serving")
    return Pools(
        prefill=_pool_degrees(match.group(2), "prefill", where),
        prefill_instances=x,
        decode=_pool_degrees(match.group(4), "decode", where),
        decode_instances=y,
    )


def disagg_plan(
    problem: Problem,
    pools: Pools,
    *,
    prefill_requests: int | None = None,
    decode_requests: int | None = None,
) -> DisaggPlan:
    """The deployment of ``pools`` on ``problem``'s cluster: Megatron's options on each
    pool's degrees (what the engines run), at the requests per rank given (None: what
    the pool's offered load and KV cache make it)."""
    total = pools.num_gpus
    if total > problem.cluster.num_gpus:
        raise ShardlabError(
            f"the pools use {total} GPUs, the cluster has {problem.cluster.num_gpus}",
            field="serving",
        )
    prefill = prefill_problem(
        problem,
        pools.prefill.num_gpus,
        pools.prefill_instances,
        decode_pp=pools.decode.pp,
        decode_tp=pools.decode.tp,
        one_domain=in_one_domain(problem.cluster, total),
    )
    decode = decode_problem(problem, pools.decode.num_gpus, pools.decode_instances)
    return DisaggPlan(
        prefill=dataclasses.replace(
            prefill.space.megatron_plan(pools.prefill), requests_per_rank=prefill_requests
        ),
        prefill_instances=pools.prefill_instances,
        decode=dataclasses.replace(
            decode.space.megatron_plan(pools.decode), requests_per_rank=decode_requests
        ),
        decode_instances=pools.decode_instances,
    )


# InferenceX's runs: each row's ``source`` names its run (tests/data/percentiles/SOURCES.md)
INFERENCEX_RUN = "InferenceX run "


@dataclass(frozen=True, kw_only=True)
class Launch:
    """How a benchmark launched its engine where that differs from the engine's
    defaults in what the simulator models: the options that hold prompts back, and
    the tokens per iteration (``max_num_tokens``; None: the engine's)."""

    holding: Holding
    max_num_tokens: int | None = None
    source: str = ""  # the scripts it was read from


def inferencex_trtllm_launch(
    *, gpu: str, weights: str, dp_attn: int, input_len: int, output_len: int, clients: int
) -> Launch | None:
    """What InferenceX's single-node DeepSeek-R1 TensorRT-LLM scripts launch
    (SemiAnalysisAI/InferenceX ``benchmarks/dsr1_fp8_b200_trt.sh``,
    ``dsr1_fp4_b200_trt.sh`` and ``dsr1_fp8_h200_trt.sh``, as stored at 0a919c5,
    111f031 and 1fc5d73), for a run of ``clients`` at nominal lengths; None for a
    GPU and precision none of them runs. All three write ``attention_dp_config:
    {batching_wait_iters: 0, enable_balance: true, timeout_iters: 60}`` when
    ``DP_ATTENTION`` is true and pass ``--max_num_tokens`` = the clients, the input and
    64 rounded up to 64, at least 8192; the B200 FP8 one also sets
    ``batch_wait_timeout_iters: 40, batch_wait_max_tokens_ratio: 0.8`` at 1024/1024
    with 64 to 255 clients (the engine ignores it with attention DP). Their
    ``stream_interval: 10`` groups the tokens a client receives after the first one,
    which goes out at once (``PyExecutor._handle_responses``): it moves neither TTFT
    nor the end of a request, and is not modelled."""
    scripts = {
        ("b200", "fp8"): "dsr1_fp8_b200_trt.sh",
        ("b200", "fp4"): "dsr1_fp4_b200_trt.sh",
        ("h200", "fp8"): "dsr1_fp8_h200_trt.sh",
    }
    script = scripts.get((gpu, weights))
    if script is None:
        return None
    delay = script == "dsr1_fp8_b200_trt.sh" and (input_len, output_len) == (1024, 1024)
    delay = delay and 64 <= clients < 256
    balance = {"adp_balance": True, "adp_timeout_iters": 60, "adp_batching_wait_iters": 0}
    waiting = {"batch_wait_timeout_iters": 40, "batch_wait_max_tokens_ratio": 0.8}
    holding = Holding(**(balance if dp_attn > 1 else {}), **(waiting if delay else {}))
    tokens = max(8192, math.ceil((clients + input_len + 64) / 64) * 64)
    return Launch(
        holding=holding,
        max_num_tokens=tokens,
        source=f"SemiAnalysisAI/InferenceX benchmarks/{script}",
    )
