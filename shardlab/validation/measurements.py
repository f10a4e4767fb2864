"""Measurements to predict: the published ones, or a user's, read row by row.

A measurements file is a CSV, one row per measured number, which says what was run
and what was measured (``shardlab/data/validation/measured.csv`` holds the published
rows, each with its source):

- ``id``, ``metric``, ``value`` (required), ``unit``, ``setup``, ``note``, ``source``;
- the problem: ``model`` (a catalog name, a HuggingFace id or a config.json path) and
  ``cluster`` (``GPUxCOUNT`` or a cluster YAML path; paths are relative to the CSV),
  the workload ``phase``, ``schedule``, ``batch``, ``input_len``, ``output_len``,
  ``weight_dtype``, ``kv_dtype`` (blank: the defaults of :class:`Workload`), and the
  ``engine`` that was measured (trtllm, vllm or sglang; blank: the one asked for);
- the plan: ``tp`` and, if not 1, ``replicas``, ``pp``, ``dp_attn``, ``ep``, ``etp``
  (Megatron's operator options on those degrees, which is what engines run);
- ``metric``, one of :data:`UNITS`; collectives (``allreduce_*``) need only
  ``cluster`` (8 GPUs of one node) and ``message_bytes``;
- the ``statistic`` the value is (mean, median, a percentile), the load protocol it
  was measured under (``clients`` and ``prompts_per_client``, or ``rate``,
  ``requests`` and ``arrival``; ``length_range``) and, for a disaggregated deployment,
  its pools (``serving``): :mod:`shardlab.validation.protocol`. A row that states a
  protocol builds its requests (:meth:`Measurement.traffic`); the analytic model
  predicts means only, so a row of another statistic has no analytic prediction.

Each row is predicted under the scheduling regime it states (in-flight batching with
thousands of queued requests is ``inflight``, capped by the KV cache; a static batch
is ``static``). A file of thousands of rows does not stop at its first bad row: each
row that cannot be read is refused with its reason (:class:`MeasurementSet`), and the
rest are predicted. Measured serving at a fixed concurrency (TTFT and TPOT of a
benchmark's closed loop) comes from :mod:`shardlab.validation.serving_sample`. Approximations of
the published rows' mapping, stated once:
Llama-3.3-70B has Llama-3.1-70B's shapes and DeepSeek-R1 DeepSeek-V3's; LLaMA-2-70B
and the GPT-13B of kipp.ly's arithmetic are config files next to the CSV (GPT-13B's
GELU MLP as a SwiGLU MLP of the same parameter count); FP8 and FP4 runs use an FP8 KV
cache (TensorRT-LLM's quantized benchmark setting); C01 and C04 are the measurements
the roofline's collective constants were fitted to.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np

from shardlab.costmodel import Metrics
from shardlab.errors import ShardlabError
from shardlab.problems.catalog import load_model
from shardlab.problems.cluster import Cluster, parse_cluster
from shardlab.problems.disagg import DisaggPlan
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from shardlab.problems.refusal import Refusal
from shardlab.problems.traffic import Arrivals, Lengths, Traffic, closed_loop, synthetic_traffic
from shardlab.problems.workload import Workload
from shardlab.validation.protocol import (
    count,
    disagg_plan,
    load_of,
    percentile_of,
    pools_of,
    statistic_of,
)

# What each metric of a model row reads off the prediction, and its unit.
MODEL_METRICS: dict[str, tuple[Callable[[Metrics, Problem], float], str]] = {
    "throughput_tok_s": (lambda m, p: m.throughput_tok_s, "tok/s"),
    "throughput_tok_s_per_gpu": (lambda m, p: m.throughput_tok_s_per_gpu, "tok/s/GPU"),
    "throughput_tok_s_per_node": (
        lambda m, p: m.throughput_tok_s / p.cluster.num_hosts,
        "tok/s per node",
    ),
    "ttft_ms": (lambda m, p: m.ttft_ms, "ms"),
    "tpot_ms": (lambda m, p: m.tpot_ms, "ms"),
    # the mean gap between tokens is the mean decode step, TPOT; a request takes its
    # TTFT and a step per further token
    "itl_ms": (lambda m, p: m.tpot_ms, "ms"),
    "e2e_ms": (lambda m, p: m.ttft_ms + (p.workload.output_len - 1) * m.tpot_ms, "ms"),
}
# An all-reduce over the 8 GPUs of a node: its bus bandwidth or its latency.
COLLECTIVE_METRICS = {"allreduce_busbw_gbps": "GB/s", "allreduce_latency_us": "us"}
UNITS = {**{k: unit for k, (_, unit) in MODEL_METRICS.items()}, **COLLECTIVE_METRICS}
DEGREE_COLUMNS = ("replicas", "pp", "tp", "dp_attn", "ep", "etp")
WORKLOAD_COLUMNS = ("phase", "schedule", "batch", "input_len", "output_len")
DTYPE_COLUMNS = ("weight_dtype", "kv_dtype")


def builtin_measurements() -> Path:
    """The published measurements shipped with shardlab."""
    return Path(str(resources.files("shardlab") / "data" / "validation" / "measured.csv"))


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """One measured number and what it measures."""

    id: str
    metric: str
    value: float
    unit: str
    setup: str
    note: str
    source: str
    cluster: Cluster
    problem: Problem | None  # None for a collective micro-benchmark
    degrees: Degrees | None
    message_bytes: int | None
    engine: str | None = None  # the engine measured (None: the one asked for)
    # a disaggregated deployment's plan (each pool's degrees, instances and requests
    # per rank); ``degrees`` is then the decode pool's
    disagg: DisaggPlan | None = None
    # what the reports group by: the model's family (catalog name), the benchmark's
    # clients per attention-DP rank, the serving mode and the source's protocol
    family: str = ""
    requests_per_rank: int | None = None
    mode: str = "agg"
    protocol: str = ""
    # the statistic ``value`` is (mean, median, pN) and the load it was measured under
    # (:mod:`shardlab.validation.protocol`): a closed loop of ``clients`` x
    # ``prompts_per_client``, or ``requests`` arriving at ``rate`` (``arrival`` poisson
    # or gamma, the gaps' ``cv``), lengths uniform in [``length_range``, 1] x nominal
    statistic: str = "mean"
    clients: int | None = None
    prompts_per_client: int | None = None
    rate: float | None = None
    arrival: Literal["poisson", "gamma"] | None = None
    cv: float | None = None
    requests: int | None = None
    length_range: float = 1.0

    @property
    def gpu(self) -> str:
        return self.cluster.accelerator.key

    @property
    def percentile(self) -> float | None:
        """The percentile ``value`` is (the median: 50; a mean: None)."""
        return percentile_of(self.statistic)

    @property
    def model_family(self) -> str:
        """The row's model family (the catalog name where the row names none)."""
        return self.family or (self.problem.model.name if self.problem is not None else "")

    @property
    def has_load(self) -> bool:
        """Whether the row states the load it was measured under."""
        return self.clients is not None or self.rate is not None

    def load_label(self) -> str:
        """The load in words ("" when the row states none)."""
        if self.clients is not None:
            text = f"{self.clients} clients x {self.prompts_per_client} prompts"
        elif self.rate is not None:
            burst = f" CV {self.cv:g}" if self.arrival == "gamma" else ""
            text = f"{self.requests} requests, {self.arrival}{burst} at {self.rate:g}/s"
        else:
            return ""
        if self.length_range < 1:
            text += f", lengths x[{self.length_range:g}, 1]"
        return text

    def traffic(self, seed: int = 0) -> Traffic:
        """The requests of the row's load: its closed loop, or its arrivals at its rate,
        lengths uniform in [length_range, 1] x its input and output lengths (fixed when
        length_range is 1). Same seed, same requests."""
        if self.problem is None or not self.has_load:
            raise ShardlabError(
                f"measurement {self.id!r} states no load (clients, or rate and requests)",
                field="clients",
            )
        w = self.problem.workload
        lengths = Lengths(
            kind="fixed" if self.length_range == 1 else "uniform",
            input_len=w.input_len,
            output_len=w.output_len,
            range_ratio=self.length_range,
        )
        if self.clients is not None:
            assert self.prompts_per_client is not None
            traffic = closed_loop(
                clients=self.clients,
                prompts_per_client=self.prompts_per_client,
                lengths=lengths,
                seed=seed,
            )
        else:
            assert self.requests is not None and self.arrival in ("poisson", "gamma")
            arrivals = Arrivals(kind=self.arrival, rate=self.rate, cv=self.cv or 1.0)
            traffic = synthetic_traffic(
                requests=self.requests, lengths=lengths, arrivals=arrivals, seed=seed
            )
        return dataclasses.replace(traffic, source=f"measurement {self.id}")


@dataclass(frozen=True, kw_only=True)
class MeasurementSet:
    """The rows of a source that could be read, and the ones refused."""

    source: str
    rows: list[Measurement]
    refused: list[Refusal] = field(default_factory=list)
    duplicates: int = 0  # rows that repeat another's setup and measurement, counted once
    serving: bool = False  # benchmark rows of measured serving (TTFT and TPOT each)

    def __post_init__(self) -> None:
        if not self.rows:
            first = f"; the first: {self.refused[0].reason}" if self.refused else ""
            raise ShardlabError(
                f"measurements {self.source!r}: no row could be read "
                f"({len(self.refused)} refused{first})"
            )


def _resolve(text: str, base: Path) -> str:
    """A path relative to the measurements file, or the text itself (a name)."""
    candidate = base / text
    return str(candidate) if text.endswith((".json", ".yaml", ".yml")) else text


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file, refused in one line when it cannot be read."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ShardlabError(f"measurements {str(path)!r}: cannot read it ({exc})") from None
    try:
        return list(csv.DictReader(text.splitlines()))
    except csv.Error as exc:
        raise ShardlabError(f"measurements {str(path)!r}: not a CSV file ({exc})") from None


def measurement_of(row: Mapping[str, str], base: Path, where: str) -> Measurement:
    metric = (row.get("metric") or "").strip()
    if metric not in UNITS:
        raise ShardlabError(f"{where}: metric {metric!r} is not one of {', '.join(UNITS)}")
    try:
        value = float(row["value"])
    except (TypeError, ValueError):
        raise ShardlabError(f"{where}: value {row.get('value')!r} is not a number") from None
    if not np.isfinite(value) or value <= 0:
        raise ShardlabError(f"{where}: value must be a positive number, got {row['value']!r}")
    try:
        cluster = parse_cluster(_resolve(row["cluster"].strip(), base))
    except ShardlabError as exc:
        raise ShardlabError(f"{where}: {exc}") from None
    common: dict[str, Any] = {
        "id": row["id"].strip(),
        "metric": metric,
        "value": value,
        "unit": (row.get("unit") or "").strip() or UNITS[metric],
        "setup": (row.get("setup") or "").strip(),
        "note": (row.get("note") or "").strip(),
        "source": (row.get("source") or "").strip(),
        "cluster": cluster,
        "statistic": statistic_of(row, where),
    }
    load = load_of(row, where)
    common |= dataclasses.asdict(load)
    if metric in COLLECTIVE_METRICS:
        size = count(row, "message_bytes", where)
        if size is None:
            raise ShardlabError(f"{where}: a collective row needs message_bytes")
        return Measurement(**common, problem=None, degrees=None, message_bytes=size)
    pools = pools_of(row, where)
    if not (row.get("model") or "").strip() or (
        pools is None and not (row.get("tp") or "").strip()
    ):
        raise ShardlabError(f"{where}: a model row needs model and tp (or serving)")
    sizes: dict[str, Any] = {}
    if pools is None:
        sizes = {k: count(row, k, where, 1) for k in DEGREE_COLUMNS if k != "etp"}
        sizes["etp"] = count(row, "etp", where, sizes["tp"] * sizes["dp_attn"] // sizes["ep"])
    try:
        # a disaggregated row's degrees are its decode pool's
        degrees = Degrees(**sizes) if pools is None else pools.decode
        over: dict[str, Any] = {
            k: count(row, k, where) for k in ("batch", "input_len", "output_len") if row.get(k)
        }
        over |= {k: row[k].strip() for k in ("phase", "schedule", *DTYPE_COLUMNS) if row.get(k)}
        if load.clients is not None:
            # the closed loop the row ran: its clients are the requests offered
            over |= {"clients": load.clients, "prompts_per_client": load.prompts_per_client}
            over.setdefault("batch", load.clients)
        workload = dataclasses.replace(Workload(name=common["id"]), **over)
        model = load_model(_resolve(row["model"].strip(), base))
        engine = (row.get("engine") or "").strip() or None
        problem = Problem(
            model=model, cluster=cluster, workload=workload, engine=engine or "trtllm"
        )
        plan = None if pools is None else disagg_plan(problem, pools)
    except (ShardlabError, TypeError) as exc:
        raise ShardlabError(f"{where}: {exc}") from None
    if pools is None and degrees.num_gpus != cluster.num_gpus:
        raise ShardlabError(
            f"{where}: the degrees use {degrees.num_gpus} GPUs, the cluster has {cluster.num_gpus}"
        )
    per_rank = None
    if load.clients is not None and pools is None:
        # the clients spread over the replicas' attention-DP ranks
        per_rank = -(-load.clients // (degrees.replicas * degrees.dp_attn))
    return Measurement(
        **common,
        problem=problem,
        degrees=degrees,
        message_bytes=None,
        engine=engine,
        disagg=plan,
        mode="agg" if pools is None else "disagg",
        requests_per_rank=per_rank,
    )
