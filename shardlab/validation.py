"""Predictions of the cost model against published measurements.

``data/measured.csv`` holds measured throughput and latency from public benchmark
reports (rows ``V..``) and collective micro-benchmarks (rows ``C..``), each with its
source. Every row is mapped here to the problem and plan it describes, under the
scheduling regime the row states (in-flight batching with thousands of queued
requests is the ``inflight`` regime capped by the KV cache; a static batch is
``static``), and predicted with :func:`shardlab.evaluate`.

Approximations of the mapping, stated once:
- Llama-3.3-70B has Llama-3.1-70B's shapes; DeepSeek-R1 has DeepSeek-V3's.
- LLaMA-2-70B and the GPT-13B of kipp.ly's arithmetic are given by their shapes
  below; GPT-13B's GELU MLP (2 matrices of 4h) is modeled as a SwiGLU MLP with the
  same parameter count (3 matrices of 8h/3).
- FP8 and FP4 runs use an FP8 KV cache (TensorRT-LLM's quantized benchmark setting).
- The MLPerf row (V24) has a mean prompt of about 300 tokens and mean output of 292.
- C01 and C04 are the very measurements the collective constants were fitted to: they
  check the implementation of the fit, not the model.
"""

from __future__ import annotations

import csv
import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from shardlab.costmodel import evaluate, silicon
from shardlab.costmodel.collectives import Span, collective_time
from shardlab.files import write_text
from shardlab.problems.catalog import load_model
from shardlab.problems.cluster import Cluster, builtin_accelerators
from shardlab.problems.model import Model, model_from_config
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from shardlab.problems.workload import Workload

LLAMA2_70B = {  # meta-llama/Llama-2-70b-hf config.json shapes
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "torch_dtype": "float16",
}
GPT_13B = {  # kipp.ly/transformer-inference-arithmetic 13B: 40 layers, d_model 5120
    "model_type": "llama",
    "hidden_size": 5120,
    "intermediate_size": 13653,
    "num_hidden_layers": 40,
    "num_attention_heads": 40,
    "num_key_value_heads": 40,
    "vocab_size": 50257,
    "torch_dtype": "float16",
}


def _cluster(gpu: str, n: int) -> Cluster:
    accs = builtin_accelerators()
    if gpu == "a100-40":  # NVIDIA A100 datasheet, SXM 40GB: 1,555 GB/s
        acc = dataclasses.replace(
            accs["a100"], key="a100-40", name="A100 SXM 40GB", hbm_gb=40, hbm_gbps=1555
        )
    else:
        acc = accs[gpu]
    return Cluster(accelerator=acc, num_gpus=n, gpus_per_node=8)


@dataclass(frozen=True, kw_only=True)
class Case:
    id: str
    model: Callable[[], Model]
    gpu: str
    degrees: Degrees
    workload: Workload
    metric: Callable[..., float]  # (metrics, problem) -> value in the row's unit
    note: str = ""


def _catalog(name: str) -> Callable[[], Model]:
    return lambda: load_model(name)


def _config(cfg: dict, name: str) -> Callable[[], Model]:
    return lambda: model_from_config(cfg, name=name, source=f"validation:{name}")


def _ifb(batch: int, i: int, o: int, dtype: str) -> Workload:
    return Workload(
        name="ifb",
        phase="request",
        schedule="inflight",
        batch=batch,
        input_len=i,
        output_len=o,
        weight_dtype=dtype,
        kv_dtype="fp8",
    )


def _total(m, p) -> float:
    return m.throughput_tok_s


def _per_gpu(m, p) -> float:
    return m.throughput_tok_s_per_gpu


def _ttft(m, p) -> float:
    return m.ttft_ms


def _tpot(m, p) -> float:
    return m.tpot_ms


def _per_node(m, p) -> float:
    return m.throughput_tok_s / p.cluster.num_nodes


def _tp(n: int) -> Degrees:
    return Degrees(tp=n, etp=n)


CASES: tuple[Case, ...] = (
    Case(
        id="V01",
        model=_catalog("llama-3.1-70b"),
        gpu="h100",
        degrees=_tp(2),
        workload=_ifb(3000, 1000, 1000, "fp8"),
        metric=_total,
    ),
    Case(
        id="V02",
        model=_catalog("llama-3.1-70b"),
        gpu="h200",
        degrees=_tp(1),
        workload=_ifb(3000, 1000, 1000, "fp8"),
        metric=_total,
    ),
    Case(
        id="V03",
        model=_catalog("llama-3.1-70b"),
        gpu="b200",
        degrees=_tp(1),
        workload=_ifb(3000, 1000, 1000, "fp4"),
        metric=_total,
    ),
    Case(
        id="V04",
        model=_catalog("llama-3.1-405b"),
        gpu="h100",
        degrees=_tp(8),
        workload=_ifb(3000, 1000, 1000, "fp8"),
        metric=_total,
    ),
    Case(
        id="V05",
        model=_catalog("llama-3.1-405b"),
        gpu="h200",
        degrees=_tp(8),
        workload=_ifb(3000, 1000, 1000, "fp8"),
        metric=_total,
    ),
    Case(
        id="V09",
        model=_catalog("llama-3.1-70b"),
        gpu="h100",
        degrees=_tp(1),
        workload=_ifb(3000, 128, 2048, "fp8"),
        metric=_total,
    ),
    Case(
        id="V10",
        model=_catalog("llama-3.1-70b"),
        gpu="h100",
        degrees=_tp(2),
        workload=_ifb(3000, 128, 2048, "fp8"),
        metric=_total,
    ),
    Case(
        id="V11",
        model=_catalog("llama-3.1-70b"),
        gpu="h100",
        degrees=_tp(4),
        workload=_ifb(3000, 128, 2048, "fp8"),
        metric=_total,
    ),
    Case(
        id="V12",
        model=_catalog("llama-3.1-70b"),
        gpu="h100",
        degrees=_tp(8),
        workload=_ifb(3000, 128, 2048, "fp8"),
        metric=_total,
    ),
    Case(
        id="V16",
        model=_config(LLAMA2_70B, "llama-2-70b"),
        gpu="h100",
        degrees=_tp(2),
        workload=Workload(
            name="static64",
            phase="request",
            schedule="static",
            batch=64,
            input_len=2048,
            output_len=2048,
            weight_dtype="fp8",
            kv_dtype="fp8",
        ),
        metric=_per_gpu,
    ),
    Case(
        id="V18",
        model=_config(LLAMA2_70B, "llama-2-70b"),
        gpu="h100",
        degrees=_tp(4),
        workload=Workload(
            name="ttft",
            phase="prefill",
            schedule="static",
            batch=1,
            input_len=2048,
            output_len=1,
            weight_dtype="fp8",
            kv_dtype="fp8",
        ),
        metric=_ttft,
    ),
    Case(
        id="V20",
        model=_config(GPT_13B, "gpt-13b"),
        gpu="a100-40",
        degrees=_tp(1),
        workload=Workload(
            name="prefill",
            phase="prefill",
            schedule="static",
            batch=1,
            input_len=512,
            output_len=10,
        ),
        metric=_ttft,
    ),
    Case(
        id="V21",
        model=_config(GPT_13B, "gpt-13b"),
        gpu="a100-40",
        degrees=_tp(1),
        workload=Workload(
            name="decode", phase="decode", schedule="static", batch=1, input_len=512, output_len=10
        ),
        metric=_tpot,
    ),
    Case(
        id="V22",
        model=_config(GPT_13B, "gpt-13b"),
        gpu="a100-40",
        degrees=_tp(2),
        workload=Workload(
            name="decode", phase="decode", schedule="static", batch=1, input_len=512, output_len=10
        ),
        metric=_tpot,
    ),
    Case(
        id="V24",
        model=_config(LLAMA2_70B, "llama-2-70b"),
        gpu="h200",
        degrees=Degrees(replicas=8, tp=1, etp=1),
        workload=Workload(
            name="offline",
            phase="request",
            schedule="inflight",
            batch=8 * 806,
            input_len=300,
            output_len=292,
            weight_dtype="fp8",
            kv_dtype="fp8",
        ),
        metric=_total,
        note="mean prompt ~300 tokens (not verified by the source)",
    ),
    Case(
        id="V29",
        model=_catalog("deepseek-v3"),
        gpu="h200",
        degrees=Degrees(tp=1, dp_attn=8, ep=8, etp=1),
        workload=_ifb(1024, 1024, 2048, "fp8"),
        metric=_total,
    ),
    Case(
        id="V31",
        model=_catalog("deepseek-v3"),
        gpu="h100",
        degrees=Degrees(tp=1, dp_attn=32, ep=32, etp=1),
        workload=Workload(
            name="prefill",
            phase="prefill",
            schedule="static",
            batch=32 * 4,
            input_len=4096,
            output_len=1,
            weight_dtype="fp8",
        ),
        metric=_per_node,
        note="16,384 prompt tokens per GPU = 4 prompts of 4,096",
    ),
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

    @property
    def ratio(self) -> float:
        return self.predicted / self.measured


def _measured() -> dict[str, dict[str, str]]:
    text = (resources.files("shardlab") / "data" / "measured.csv").read_text()
    return {r["id"]: r for r in csv.DictReader(text.splitlines())}


def _collective_rows(data: dict[str, dict[str, str]], timing: str, engine: str) -> list[Row]:
    accs = builtin_accelerators()
    rows = []
    for cid, gpu, nbytes, kind in (
        ("C01", "h100", 1 << 30, "busbw"),
        ("C02", "a100", 1 << 30, "busbw"),
        ("C03", "h100", 1 << 20, "latency"),
        ("C04", "h100", 1 << 10, "latency"),
    ):
        r = data[cid]
        cluster = Cluster(accelerator=accs[gpu], num_gpus=8, gpus_per_node=8)
        measured = None
        if timing == "silicon" and silicon.covers(gpu):
            measured = silicon.kernels(gpu, engine).collective("all_reduce", 8, np.array(nbytes))
        if measured is None:
            measured = collective_time("all_reduce", Span(8, 8), np.array(nbytes), cluster)
        t = float(measured)
        predicted = 2 * 7 / 8 * nbytes / t / 1e9 if kind == "busbw" else t * 1e6
        rows.append(
            Row(
                cid,
                f"{r['model']}, 8 GPUs, {r['input_len']}",
                r["metric"],
                r["unit"],
                predicted,
                float(r["value"]),
                "fitted to this row" if cid in ("C01", "C04") else "",
                r["source"],
            )
        )
    return rows


def predict_all(timing: str = "roofline", engine: str = "trtllm") -> list[Row]:
    """Every row predicted with ``timing``; rows on an accelerator the measured tables
    do not cover are predicted by the roofline (and say so)."""
    data = _measured()
    rows = []
    for case in CASES:
        r = data[case.id]
        n = case.degrees.num_gpus
        cluster = _cluster(case.gpu, n)
        note = case.note
        used = timing
        if timing == "silicon" and not silicon.covers(cluster.accelerator.key):
            used = "roofline"
            note = (note + "; " if note else "") + "no measured kernels: roofline"
        problem = Problem(
            model=case.model(), cluster=cluster, workload=case.workload, timing=used, engine=engine
        )
        plan = problem.space.megatron_plan(case.degrees)
        m = evaluate(problem, plan)
        if not m.feasible:
            note = (
                (note + "; " if note else "") + "predicted infeasible: " + ", ".join(m.violations)
            )
        desc = (
            f"{r['model']} {r['precision']} on {n}x {r['gpu']} ({case.degrees.short()}), "
            f"{case.workload.schedule} batch {case.workload.batch}, "
            f"{case.workload.input_len}/{case.workload.output_len}"
        )
        rows.append(
            Row(
                case.id,
                desc,
                r["metric"],
                r["unit"],
                case.metric(m, problem),
                float(r["value"]),
                note,
                r["source"],
            )
        )
    return rows + _collective_rows(data, timing, engine)


def summarize(rows: list[Row]) -> dict[str, float]:
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


def write_report(path: Path, by_timing: dict[str, list[Row]], command: str) -> dict[str, dict]:
    """Write the markdown table, the timing backends side by side (the first one's
    rows give the setups); return each backend's summary numbers."""
    summaries = {name: summarize(rows) for name, rows in by_timing.items()}
    lines = [
        "# Cost model vs published measurements",
        "",
        f"Produced by `{command}` from `shardlab/data/measured.csv`; do not edit by hand.",
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
