"""Predictions of the cost model against measurements: the published ones, or a user's.

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
  ``cluster`` (8 GPUs of one node) and ``message_bytes``.

Each row is predicted under the scheduling regime it states (in-flight batching with
thousands of queued requests is ``inflight``, capped by the KV cache; a static batch
is ``static``). A file of thousands of rows does not stop at its first bad row: each
row that cannot be read is refused with its reason (:class:`MeasurementSet`), and the
rest are predicted. Measured serving at a fixed concurrency (TTFT and TPOT of a
benchmark's closed loop) comes from :mod:`shardlab.serving_sample`. Approximations of
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
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from shardlab.costmodel import (
    DisaggMetrics,
    Metrics,
    Span,
    at_capacity,
    collective_time,
    degree_tables,
    evaluate,
    evaluate_disagg,
    pool_problems,
    silicon,
)
from shardlab.errors import ShardlabError
from shardlab.files import write_text
from shardlab.problems.calibration import Calibration
from shardlab.problems.catalog import load_model
from shardlab.problems.cluster import Cluster, parse_cluster
from shardlab.problems.disagg import DisaggPlan
from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem
from shardlab.problems.workload import Workload

# What each metric of a model row reads off the prediction, and its unit.
MODEL_METRICS: dict[str, tuple[Callable[[Metrics, Problem], float], str]] = {
    "throughput_tok_s": (lambda m, p: m.throughput_tok_s, "tok/s"),
    "throughput_tok_s_per_gpu": (lambda m, p: m.throughput_tok_s_per_gpu, "tok/s/GPU"),
    "throughput_tok_s_per_node": (
        lambda m, p: m.throughput_tok_s / p.cluster.num_nodes,
        "tok/s per node",
    ),
    "ttft_ms": (lambda m, p: m.ttft_ms, "ms"),
    "tpot_ms": (lambda m, p: m.tpot_ms, "ms"),
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


@dataclass(frozen=True)
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
    per_rank: int | None = None
    mode: str = "agg"
    protocol: str = ""

    @property
    def gpu(self) -> str:
        return self.cluster.accelerator.key


@dataclass(frozen=True)
class Refusal:
    """A row that could not be read, and why."""

    id: str
    line: int | None  # the file's line (None: not a line of a file)
    reason: str


@dataclass(frozen=True)
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


def _int(row: Mapping[str, str], key: str, where: str, default: int | None = None) -> int | None:
    text = (row.get(key) or "").strip()
    if not text:
        return default
    try:
        value = int(float(text))
    except ValueError:
        raise ShardlabError(f"{where}: {key} {text!r} is not an integer") from None
    if value < 1 or value != float(text):
        raise ShardlabError(f"{where}: {key} must be a positive integer, got {text!r}")
    return value


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


def load_measurements(
    path: str | Path | None = None, filters: Mapping[str, list[str]] | None = None
) -> MeasurementSet:
    """Read measurements: shardlab's CSV (see the module docstring; the built-in one
    by default), aiconfigurator-core's measured serving sample (``path`` =
    ``aiconfigurator-sample``) or a CSV in its columns (:mod:`shardlab.serving_sample`;
    ``filters`` keeps some of its rows: gpu, backend, family, mode, protocol). Rows
    that cannot be read are refused, each with its reason; the others are returned."""
    from shardlab.serving_sample import SAMPLE, SAMPLE_COLUMNS, read_sample, sample_rows

    filters = {k: v for k, v in (filters or {}).items() if v}
    if path is not None and str(path) == SAMPLE:
        return read_sample(**filters)
    path = Path(path) if path is not None else builtin_measurements()
    rows = read_csv(path)
    columns = set(rows[0]) if rows else set()
    if rows and columns >= SAMPLE_COLUMNS:
        return sample_rows(rows, str(path), **filters)
    if filters:
        flags = ", ".join(f"--{k}" for k in filters)
        raise ShardlabError(
            f"{flags}: filters rows of measured serving (the sample's columns); "
            f"{str(path)!r} is in shardlab's own columns"
        )
    if not rows:
        raise ShardlabError(f"measurements {str(path)!r}: no rows")
    required = {"id", "metric", "value", "cluster"}
    missing = required - columns
    if missing:
        raise ShardlabError(
            f"measurements {str(path)!r}: missing column(s) {', '.join(sorted(missing))}"
        )
    out, refused = [], []
    for n, row in enumerate(rows, start=2):
        where = f"line {n} ({row.get('id') or 'no id'})"
        try:
            out.append(_measurement(row, path.parent, where))
        except ShardlabError as exc:
            refused.append(Refusal((row.get("id") or "").strip(), n, str(exc)))
    return MeasurementSet(str(path), out, refused)


def _measurement(row: Mapping[str, str], base: Path, where: str) -> Measurement:
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
    common = {
        "id": row["id"].strip(),
        "metric": metric,
        "value": value,
        "unit": (row.get("unit") or "").strip() or UNITS[metric],
        "setup": (row.get("setup") or "").strip(),
        "note": (row.get("note") or "").strip(),
        "source": (row.get("source") or "").strip(),
        "cluster": cluster,
    }
    if metric in COLLECTIVE_METRICS:
        size = _int(row, "message_bytes", where)
        if size is None:
            raise ShardlabError(f"{where}: a collective row needs message_bytes")
        return Measurement(**common, problem=None, degrees=None, message_bytes=size)
    if not (row.get("model") or "").strip() or not (row.get("tp") or "").strip():
        raise ShardlabError(f"{where}: a model row needs model and tp")
    sizes = {k: _int(row, k, where, 1) for k in DEGREE_COLUMNS if k != "etp"}
    ep = sizes["ep"]
    etp = _int(row, "etp", where, sizes["tp"] * sizes["dp_attn"] // ep)
    try:
        degrees = Degrees(**sizes, etp=etp)
        over: dict[str, Any] = {
            k: _int(row, k, where) for k in ("batch", "input_len", "output_len") if row.get(k)
        }
        over |= {k: row[k].strip() for k in ("phase", "schedule", *DTYPE_COLUMNS) if row.get(k)}
        workload = dataclasses.replace(Workload(name=common["id"]), **over)
        model = load_model(_resolve(row["model"].strip(), base))
        engine = (row.get("engine") or "").strip() or None
        problem = Problem(
            model=model, cluster=cluster, workload=workload, engine=engine or "trtllm"
        )
    except (ShardlabError, TypeError) as exc:
        raise ShardlabError(f"{where}: {exc}") from None
    if degrees.num_gpus != cluster.num_gpus:
        raise ShardlabError(
            f"{where}: the degrees use {degrees.num_gpus} GPUs, the cluster has {cluster.num_gpus}"
        )
    return Measurement(
        **common, problem=problem, degrees=degrees, message_bytes=None, engine=engine
    )


@dataclass(frozen=True)
class Row:
    id: str
    description: str
    metric: str
    unit: str
    predicted: float
    measured: float
    note: str
    source: str
    measurement: Measurement | None = field(default=None, compare=False, repr=False)

    @property
    def ratio(self) -> float:
        return self.predicted / self.measured


def problem_of(
    m: Measurement, timing: str, engine: str, calibration: Calibration | None = None
) -> tuple[Problem, str]:
    """The row's problem under ``timing`` (the roofline where nothing is measured), and
    the note that says so."""
    assert m.problem is not None
    used, note = timing, ""
    if timing == "silicon" and not silicon.covers(m.cluster.accelerator.key):
        used, note = "roofline", "no measured kernels: roofline"
    problem = dataclasses.replace(
        m.problem, timing=used, engine=m.engine or engine, calibration=calibration
    )
    return problem, note


def measured_plan(problem: Problem, m: Measurement) -> Plan:
    """The plan a measured row ran: Megatron's options on its degrees, at the requests
    per rank its engine ran (its own, within what the KV cache holds; else every
    offered request the cache holds: "max-throughput" serving)."""
    assert m.degrees is not None
    plan = at_capacity(problem, problem.space.megatron_plan(m.degrees))
    if m.per_rank is not None and plan.concurrency is not None:
        plan = dataclasses.replace(plan, concurrency=min(m.per_rank, plan.concurrency))
    return plan


@lru_cache(maxsize=256)
def _priced(problem: Problem, plan: Plan | DisaggPlan) -> Metrics | DisaggMetrics:
    """A measured setup's metrics (its rows, one per metric, share them)."""
    if isinstance(plan, DisaggPlan):
        return evaluate_disagg(problem, plan, breakdown=False)
    return evaluate(problem, plan, breakdown=False)


def predict(
    m: Measurement,
    timing: str = "roofline",
    engine: str = "trtllm",
    calibration: Calibration | None = None,
) -> Row:
    """One measurement and its prediction."""
    if m.problem is None:
        return _collective_row(m, timing, engine, calibration)
    problem, used_note = problem_of(m, timing, engine, calibration)
    assert m.degrees is not None
    notes = [x for x in (m.note, used_note) if x]
    w = problem.workload
    desc = m.setup or f"{problem.model.name} on {m.cluster.name}"
    if m.disagg is not None:
        metrics = _priced(problem, measured_disagg(problem, m.disagg))
        desc += f" ({m.disagg.label()})"
    else:
        # measured serving runs what its KV cache holds, not the best concurrency
        metrics = _priced(problem, measured_plan(problem, m))
        desc += f" ({m.degrees.short()})"
    desc += f", {w.schedule} batch {w.batch}, {w.input_len}/{w.output_len}"
    if not metrics.feasible:
        notes.append("predicted infeasible: " + ", ".join(metrics.violations))
    value = MODEL_METRICS[m.metric][0](metrics, problem)
    return Row(m.id, desc, m.metric, m.unit, value, m.value, "; ".join(notes), m.source, m)


def measured_disagg(problem: Problem, plan: DisaggPlan) -> DisaggPlan:
    """A measured disaggregated deployment's plan, each pool within what its KV cache
    holds."""
    prefill, decode = pool_problems(problem, plan)
    return dataclasses.replace(
        plan,
        prefill=_within_capacity(prefill, plan.prefill),
        decode=_within_capacity(decode, plan.decode),
    )


def _within_capacity(problem: Problem, plan: Plan) -> Plan:
    held = at_capacity(problem, dataclasses.replace(plan, concurrency=None)).concurrency
    if plan.concurrency is None or held is None:
        return plan
    return dataclasses.replace(plan, concurrency=min(plan.concurrency, held))


def collective_seconds(m: Measurement, timing: str, engine: str) -> float:
    """Seconds of a collective row's all-reduce, uncalibrated."""
    key = m.cluster.accelerator.key
    nbytes = np.array(float(m.message_bytes or 0))
    measured = None
    if timing == "silicon" and silicon.covers(key):
        measured = silicon.kernels(key, engine).collective("all_reduce", 8, nbytes, nccl=True)
    if measured is None:
        measured = collective_time("all_reduce", Span(size=8, local=8), nbytes, m.cluster)
    return float(measured)


def collective_value(m: Measurement, seconds: float) -> float:
    """A collective row's metric from its all-reduce's seconds (bus bandwidth counts the
    2(n-1)/n of the message a ring moves)."""
    if m.metric == "allreduce_busbw_gbps":
        return 2 * 7 / 8 * float(m.message_bytes or 0) / seconds / 1e9
    return seconds * 1e6


def _collective_row(
    m: Measurement, timing: str, engine: str, calibration: Calibration | None
) -> Row:
    seconds = collective_seconds(m, timing, engine)
    if calibration is not None:
        seconds *= calibration.communication
    value = collective_value(m, seconds)
    return Row(
        m.id, m.setup or f"all-reduce on {m.cluster.name}", m.metric, m.unit, value, m.value,
        m.note, m.source,
    )  # fmt: skip


def predict_all(
    timing: str = "roofline",
    engine: str = "trtllm",
    measurements: list[Measurement] | None = None,
    calibration: Calibration | None = None,
) -> list[Row]:
    """Every measurement predicted with ``timing``; rows on an accelerator the measured
    tables do not cover are predicted by the roofline (and say so)."""
    rows = measurements if measurements is not None else load_measurements().rows
    return [predict(m, timing, engine, calibration) for m in rows]


def summarize(rows: list[Row]) -> dict[str, Any]:
    errors = [abs(r.ratio - 1.0) for r in rows]
    worst = max(rows, key=lambda r: max(r.ratio, 1 / r.ratio))
    return {
        "rows": len(rows),
        "median_abs_error": statistics.median(errors),
        "within_25pct": sum(e <= 0.25 for e in errors),
        "worst_id": worst.id,
        "worst_factor": max(worst.ratio, 1 / worst.ratio),
        "beyond_2x": sum(max(r.ratio, 1 / r.ratio) > 2 for r in rows),
        "beyond_1_5x": sum(max(r.ratio, 1 / r.ratio) >= 1.5 for r in rows),
    }


def write_report(
    path: Path, by_timing: dict[str, list[Row]], command: str, source: str
) -> dict[str, dict]:
    """Write the markdown table, the predictions side by side (the first set's rows
    give the setups); return each set's summary numbers."""
    summaries = {name: summarize(rows) for name, rows in by_timing.items()}
    lines = [
        "# Cost model vs measurements",
        "",
        f"Produced by `{command}` from `{source}`; do not edit by hand.",
        "",
    ]
    for name, s in summaries.items():
        lines.append(
            f"- {name}: rows {s['rows']}; median |predicted/measured - 1|: "
            f"{s['median_abs_error']:.1%}; within 25%: {s['within_25pct']}; off by 1.5x or "
            f"more: {s['beyond_1_5x']}; by more than 2x: {s['beyond_2x']}; worst: "
            f"{s['worst_id']} ({s['worst_factor']:.2f}x)"
        )
    names = list(by_timing)
    head = " | ".join(f"{n} predicted | {n} ratio" for n in names)
    lines += [
        "",
        f"| id | setup | metric | measured | {head} | note | source |",
        "|---|---|---|---:|" + "---:|---:|" * len(names) + "---|---|",
    ]
    first = by_timing[names[0]]
    for i, r in enumerate(first):
        cells = " | ".join(
            f"{by_timing[n][i].predicted:,.1f} | {by_timing[n][i].ratio:.2f}" for n in names
        )
        notes = "; ".join(dict.fromkeys(x for n in names if (x := by_timing[n][i].note)))
        lines.append(
            f"| {r.id} | {r.description} | {r.metric} ({r.unit}) | {r.measured:,.1f} | "
            f"{cells} | {notes} | {r.source} |"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "\n".join(lines) + "\n")
    return summaries


# -- agreement with another estimator's grid (AIConfigurator's agg estimates) -------------

# aiconfigurator's model ids of the catalog's models (tests/data/aiconfigurator_agg.csv)
REFERENCE_MODELS = {
    "Llama-3.1-8B": "llama-3.1-8b",
    "Llama-3.1-70B": "llama-3.1-70b",
    "Qwen3-32B": "qwen3-32b",
    "Qwen3-235B-A22B": "qwen3-235b-a22b",
    "Qwen3-235B-A22B-FP8": "qwen3-235b-a22b",
    "DeepSeek-V3": "deepseek-v3",
    "Mixtral-8x7B": "mixtral-8x7b",
}
REFERENCE_SYSTEMS = {v: k for k, v in silicon.SYSTEMS.items()}
REFERENCE_METRICS = ("tpot_ms", "ttft_ms", "tokens_s")


@dataclass(frozen=True)
class Agreement:
    """One reference estimate and shardlab's prediction of the same point."""

    key: str  # model, system, engine, degrees, batch, lengths
    engine: str
    reference: dict[str, float]
    predicted: dict[str, float]


def against_reference(
    path: str | Path, timing: str, *, every: int = 1, engines: tuple[str, ...] | None = None
) -> list[Agreement]:
    """Predict the ok rows of an AIConfigurator ``agg`` grid (one in ``every``): the same
    model, GPUs, degrees, per-rank batch and lengths, in flight, megatron's options."""
    rows = [r for r in csv.DictReader(Path(path).read_text().splitlines()) if r["status"] == "ok"]
    out = []
    for r in rows[::every]:
        engine = r["backend"]
        if engines is not None and engine not in engines:
            continue
        tp, pp, dp = int(r["tp"]), int(r["pp"]), int(r["dp_attn"])
        ep = int(r["moe_ep"] or 1)
        etp = int(r["moe_tp"] or tp * dp // ep)
        degrees = Degrees(pp=pp, tp=tp, dp_attn=dp, ep=ep, etp=etp)
        quant = "bf16" if r["weight_quant"] == "bfloat16" else "fp8"
        kv = "bf16" if r["kv_quant"] == "bfloat16" else "fp8"
        b = int(r["batch_size"])  # per attention-DP rank and pipeline micro-batch
        workload = Workload(
            name="reference",
            phase="request",
            schedule="inflight",
            batch=b * dp * pp,
            input_len=int(r["isl"]),
            output_len=int(r["osl"]),
            weight_dtype=quant,
            kv_dtype=kv,
        )
        gpu = REFERENCE_SYSTEMS[r["system"]]
        problem = Problem.build(
            REFERENCE_MODELS[r["model"]],
            f"{gpu}x{degrees.num_gpus}",
            workload,
            timing=timing,
            engine=engine,
        )
        if degree_tables(problem, degrees).batching.per_dp_max < b * pp:
            continue  # the engine takes fewer per iteration (its token budget): not the point
        plan = dataclasses.replace(problem.space.megatron_plan(degrees), concurrency=b * pp)
        m = evaluate(problem, plan)
        if "memory" in m.violations:
            continue  # the KV cache holds fewer: not the same point
        out.append(
            Agreement(
                key=f"{r['model']} {r['system']} {engine} {degrees.short()} b={b} "
                f"{r['isl']}/{r['osl']}",
                engine=engine,
                reference={k: float(r[k]) for k in REFERENCE_METRICS},
                predicted={
                    "tpot_ms": m.tpot_ms,
                    "ttft_ms": m.ttft_ms,
                    "tokens_s": m.throughput_tok_s,
                },
            )
        )
    return out


def agreement_summary(rows: list[Agreement]) -> dict[str, float]:
    """Median |predicted / reference - 1| per metric."""
    return {
        k: statistics.median(abs(a.predicted[k] / a.reference[k] - 1.0) for a in rows)
        for k in REFERENCE_METRICS
    }


def write_agreement(path: Path, by_timing: dict[str, list[Agreement]], command: str) -> None:
    """Median errors per timing backend, overall and per engine, as markdown."""
    lines = [
        "# Agreement with AIConfigurator's agg estimates",
        "",
        f"Produced by `{command}`; do not edit by hand. The reference grid and the command "
        "that made it are in `tests/data/`. Each row: the same model, GPUs, degrees, "
        "per-rank batch and lengths, in flight. Median |shardlab / AIConfigurator - 1|:",
        "",
        "| timing | engine | points | TPOT | TTFT | throughput |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for timing, rows in by_timing.items():
        engines = sorted({a.engine for a in rows})
        for engine in ["all", *engines]:
            sub = rows if engine == "all" else [a for a in rows if a.engine == engine]
            s = agreement_summary(sub)
            lines.append(
                f"| {timing} | {engine} | {len(sub)} | {s['tpot_ms']:.1%} | {s['ttft_ms']:.1%} "
                f"| {s['tokens_s']:.1%} |"
            )
    lines += [
        "",
        "TTFT is defined differently: AIConfigurator multiplies the prefill iterations by a "
        "queueing factor (its backends' `_ttft_queuing_factor`: 2 to 4, vLLM's 1 + "
        "log2(b) / 8) and adds a dispatch cost per layer for vLLM; shardlab's TTFT is the "
        "closed loop's mean over a benchmark's requests (its first wave of 10 prompts per "
        "client prefilled cohort after cohort) plus each engine's fitted cost per request "
        "(`shardlab/costmodel/regimes.py`, `shardlab/data/serving/engines.yaml`).",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "\n".join(lines) + "\n")


# -- AIConfigurator's default problems, each tool scoring the other's pick --------------

SIDE_BY_SIDE_COLUMNS = frozenset({"problem", "its_tok_s_gpu", "its_tok_s_gpu_of_ours"})
SIDE_BY_SIDE_PROBLEMS = {  # shardlab's model and cluster of each problem
    "llama70b-h100x8": ("llama-3.1-70b", "h100x8"),
    "qwen235b-h200x16": ("qwen3-235b-a22b", "h200x16"),
    "deepseek-v3-h200x16": ("deepseek-v3", "h200x16"),
    "deepseek-v3-h100x64": ("deepseek-v3", "h100x64"),
}


def side_by_side(path: str | Path) -> list[dict[str, Any]]:
    """Each problem of ``path`` (``tests/data/make_aiconfigurator_default.py``): its
    pick and ours, each scored by both tools (per-GPU output tokens/s, the SLOs)."""
    from shardlab.problems.plan import Plan, read_plan_file

    path = Path(path)
    out = []
    for r in read_csv(path):
        model, cluster = SIDE_BY_SIDE_PROBLEMS[r["problem"]]
        problem = Problem.build(
            model,
            cluster,
            "chat",
            engine="trtllm",
            space_kind="engine",
            batch=8192,
            input_len=1024,
            output_len=256,
            ttft_ms=2000.0,
            tpot_ms=50.0,
        )
        ours_file = path.with_suffix("") / f"{r['problem']}.json"
        ours = Plan.from_dict(read_plan_file(ours_file), problem.model)
        mine = evaluate(problem, ours, breakdown=False)
        tp, pp, dp = (int(r[f"its_{k}"]) for k in ("tp", "pp", "dp"))
        ep, etp = int(r["its_moe_ep"]), int(r["its_moe_tp"])
        if problem.model.moe is None:
            ep, etp = 1, tp * dp
        replicas = problem.cluster.num_gpus // (tp * pp * dp)
        d = Degrees(replicas=replicas, pp=pp, tp=tp, dp_attn=dp, ep=ep, etp=etp)
        theirs_plan = dataclasses.replace(
            problem.space.megatron_plan(d), concurrency=int(r["its_bs"]) * pp
        )
        theirs = evaluate(problem, theirs_plan, breakdown=False)
        out.append(
            {
                "problem": r["problem"],
                "ours": ours.degrees.short(),
                "ours_per_rank": ours.concurrency,
                "ours_tok_s_gpu": mine.throughput_tok_s_per_gpu,
                "ours_by_it": float(r["its_tok_s_gpu_of_ours"]),
                "ours_it_slo": f"{float(r['its_ttft_ms_of_ours']):,.0f} / "
                f"{float(r['its_tpot_ms_of_ours']):.1f}",
                "theirs": d.short(),
                "theirs_per_rank": theirs_plan.concurrency,
                "theirs_tok_s_gpu": float(r["its_tok_s_gpu"]),
                "theirs_by_us": theirs.throughput_tok_s_per_gpu,
                "theirs_by_us_slo": f"{theirs.ttft_ms:,.0f} / {theirs.tpot_ms:.1f}",
                "theirs_by_us_feasible": theirs.feasible,
            }
        )
    return out


def write_side_by_side(path: Path, rows: list[dict[str, Any]], command: str, source: str) -> None:
    lines = [
        "# AIConfigurator's default problems: each tool scores the other's pick",
        "",
        f"Produced by `{command}` from `{source}` (its picks and its scores of ours, made by "
        "`tests/data/make_aiconfigurator_default.py`); do not edit by hand. Each problem: "
        "1,024 in / 256 out, TTFT <= 2 s, TPOT <= 50 ms, TensorRT-LLM; tokens/s are output "
        "tokens per GPU; TTFT / TPOT in ms.",
        "",
        "| problem | shardlab's pick | its tok/s/GPU by shardlab | by AIConfigurator | "
        "AIConfigurator's TTFT / TPOT of it | AIConfigurator's pick | its tok/s/GPU by "
        "AIConfigurator | by shardlab | shardlab's TTFT / TPOT of it | AIConfigurator's score "
        "of shardlab's pick / its own | shardlab's score of its pick / shardlab's |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mark = "" if r["theirs_by_us_feasible"] else " (misses an SLO)"
        lines.append(
            f"| {r['problem']} | {r['ours']} at {r['ours_per_rank']} per rank | "
            f"{r['ours_tok_s_gpu']:,.1f} | {r['ours_by_it']:,.1f} | {r['ours_it_slo']} | "
            f"{r['theirs']} at {r['theirs_per_rank']} per rank | {r['theirs_tok_s_gpu']:,.1f} | "
            f"{r['theirs_by_us']:,.1f} | {r['theirs_by_us_slo']}{mark} | "
            f"{r['ours_by_it'] / r['theirs_tok_s_gpu']:.2f} | "
            f"{r['theirs_by_us'] / r['ours_tok_s_gpu']:.2f} |"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "\n".join(lines) + "\n")
