#!/usr/bin/env python
"""InferenceX's DeepSeek-R1 serving runs, with their percentiles, in shardlab's
measurement columns: `measured_percentiles.csv` next to this script (SOURCES.md says
where the JSON comes from and what each choice below rests on).

Input: the JSON of inferencex.semianalysis.com's ``/api/v1/benchmarks`` and
``/api/v1/benchmarks/history`` for DeepSeek-R1-0528, as captured in the InferenceX-app
repository's Cypress fixtures (``packages/app/cypress/fixtures/api/benchmarks.json``
and ``benchmarks-history.json``), one or more captures. Run from the repository root,
with MIRROR a clone of that repository (SOURCES.md names the commits and blobs):

    F=packages/app/cypress/fixtures/api
    for c in 528c4146b8f502fcbce8df7870a935a970cbae25 cac6246e9fef70841e48e1434cbf10bb9a2802a8; do
        git -C MIRROR show $c:$F/benchmarks.json > /tmp/b-${c:0:8}.json
        git -C MIRROR show $c:$F/benchmarks-history.json > /tmp/h-${c:0:8}.json
    done
    J="/tmp/b-528c4146.json /tmp/b-cac6246e.json /tmp/h-528c4146.json /tmp/h-cac6246e.json"
    python tests/data/percentiles/make_measured_percentiles.py $J \
        > tests/data/percentiles/measured_percentiles.csv
    python tests/data/percentiles/make_measured_percentiles.py --gpus mi300x,mi325x,mi355x $J \
        > tests/data/percentiles/measured_percentiles_amd.csv
    python tests/data/percentiles/make_measured_percentiles.py --gpus b300,gb200,gb300 $J \
        > tests/data/percentiles/measured_percentiles_blackwell.csv

Kept: runs on the GPUs asked for (``--gpus``; by default H100, H200 and B200, the
first file) without speculative decoding (shardlab does not model MTP), aggregated or
disaggregated, served by an engine shardlab models (:data:`ENGINES`: not AMD's ATOM,
nor ``mori-sglang``, SGLang development builds with AMD's MoRI for expert dispatch
and the KV-cache transfer, see SOURCES.md), and stating their workers. A run that
appears in more than one capture (same layout, load, date and GitHub run) is written
once, from the capture that states the most statistics. One row per (run, metric,
statistic): TTFT, TPOT and end-to-end latency at the mean, median, p90 and p99 the
run states (not ITL: see METRICS).
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterable
from typing import Any

GPUS = ("h100", "h200", "b200")
# GPUs per host where a host is not 8: a disaggregated run's cluster is its pools' GPUs
# rounded up to whole hosts
HOST = {"gb200": 4, "gb300": 4}
ENGINES = {"trt": "trtllm", "dynamo-trt": "trtllm", "sglang": "sglang", "dynamo-sglang": "sglang"}
# ITL is left out: the engines stream tokens in chunks (their stream interval, not
# stated per run), so InferenceX's ITL is a gap between chunks, 5 to 100 x its TPOT
METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms"}
STATISTICS = ("mean", "median", "p90", "p99")
# InferenceX's closed loop: 10 prompts per client, lengths uniform in [0.8, 1] x nominal
PROMPTS_PER_CLIENT = 10
LENGTH_RANGE = 0.8
RUN_KEYS = (
    "hardware", "framework", "model", "precision", "spec_method", "disagg",
    "prefill_tp", "prefill_ep", "prefill_dp_attention", "prefill_num_workers",
    "decode_tp", "decode_ep", "decode_dp_attention", "decode_num_workers",
    "isl", "osl", "conc", "date", "run_url",
)  # fmt: skip
COLUMNS = (
    "id", "setup", "model", "cluster", "replicas", "pp", "tp", "dp_attn", "ep", "etp",
    "phase", "schedule", "batch", "input_len", "output_len", "weight_dtype", "kv_dtype",
    "engine", "metric", "statistic", "value", "unit", "clients", "prompts_per_client",
    "length_range", "rate", "arrival", "requests", "serving", "note", "source",
)  # fmt: skip


def layout(tp: int, ep: int, dp_attention: bool) -> dict[str, int]:
    """InferenceX's (tp, ep, dp-attention) in shardlab's degrees: with DP attention
    every rank holds its own attention (attention TP 1, DP tp), the experts are split
    over the same ranks ``ep`` ways and tensor-split the rest."""
    return {
        "tp": 1 if dp_attention else tp,
        "dp_attn": tp if dp_attention else 1,
        "ep": ep,
        "etp": tp // ep,
    }


def pool(count: int, degrees: dict[str, int], kind: str) -> str:
    inner = " ".join(f"{k}={v}" for k, v in degrees.items() if v != 1 or k == "tp")
    return f"{count}{kind}({inner})"


def stated(r: dict[str, Any]) -> bool:
    """Whether a run states its deployment: a disaggregated one its workers (a few
    GB200 runs give 0 prefill and decode workers of 20 to 72 GPUs)."""
    return not r["disagg"] or (r["prefill_num_workers"] > 0 and r["decode_num_workers"] > 0)


def runs(paths: Iterable[str], gpus: Iterable[str] = GPUS) -> list[dict[str, Any]]:
    """Every kept run on ``gpus`` once, in a stable order."""
    kept: dict[tuple, dict[str, Any]] = {}
    gpus = tuple(gpus)
    for path in paths:
        with open(path) as f:
            for r in json.load(f):
                if (
                    r["hardware"] not in gpus
                    or r["spec_method"] != "none"
                    or r["framework"] not in ENGINES
                    or not stated(r)
                ):
                    continue
                key = tuple(r.get(k) for k in RUN_KEYS)
                if key not in kept or len(r["metrics"]) > len(kept[key]["metrics"]):
                    kept[key] = r
    order = ("hardware", "framework", "precision", "disagg", "isl", "osl", "conc", "date")
    return sorted(kept.values(), key=lambda r: tuple(str(r[k]) for k in order))


def rows_of(n: int, r: dict[str, Any]) -> list[dict[str, Any]]:
    engine = ENGINES[r["framework"]]
    weights = r["precision"]
    # the KV cache's format, as shardlab reads the measured serving sample: TensorRT-LLM's
    # quantized recipes set an fp8 cache, SGLang's "auto" keeps bf16
    kv = "fp8" if engine == "trtllm" else "bf16"
    gpu = r["hardware"]
    decode = layout(r["decode_tp"], r["decode_ep"], r["decode_dp_attention"])
    base: dict[str, Any] = {c: "" for c in COLUMNS}
    base |= {
        "id": f"IX{n:03d}",
        "model": "deepseek-v3",
        "phase": "request",
        "schedule": "inflight",
        "batch": r["conc"],
        "input_len": r["isl"],
        "output_len": r["osl"],
        "weight_dtype": weights,
        "kv_dtype": kv,
        "engine": engine,
        "unit": "ms",
        "clients": r["conc"],
        "prompts_per_client": PROMPTS_PER_CLIENT,
        "length_range": LENGTH_RANGE,
    }
    if r["disagg"]:
        prefill = layout(r["prefill_tp"], r["prefill_ep"], r["prefill_dp_attention"])
        x, y = r["prefill_num_workers"], r["decode_num_workers"]
        gpus = x * r["prefill_tp"] + y * r["decode_tp"]
        host = HOST.get(gpu, 8)
        base["cluster"] = f"{gpu}x{-(-gpus // host) * host if gpus > host else gpus}"
        base["serving"] = f"{pool(x, prefill, 'P')} + {pool(y, decode, 'D')}"
        where = f"disaggregated, {gpus} GPUs"
    else:
        base["cluster"] = f"{gpu}x{r['decode_tp']}"
        base |= {"replicas": 1, "pp": 1, **decode}
        where = "aggregated"
    image = (r.get("image") or "").removeprefix("nvcr.io/nvidia/").removeprefix("lmsysorg/")
    base["setup"] = (
        f"DeepSeek-R1-0528 {weights.upper()}, {gpu.upper()}, {r['framework']}"
        f"{f' ({image})' if image else ''}, {where}"
    )
    if not image:
        base["note"] = "the engine's version is not stated"
    run = r["run_url"].removeprefix("https://github.com/SemiAnalysisAI/InferenceX/actions/runs/")
    base["source"] = f"InferenceX run {run.replace('/attempts/', '/')} {r['date']}"
    out = []
    for short, metric in METRICS.items():
        for statistic in STATISTICS:
            value = r["metrics"].get(f"{statistic}_{short}")
            if value is None:
                continue
            out.append(
                {**base, "metric": metric, "statistic": statistic, "value": f"{value * 1e3:.6g}"}
            )
    return out


def main(args: list[str]) -> None:
    gpus = GPUS
    if args[:1] == ["--gpus"]:
        gpus, args = tuple(args[1].split(",")), args[2:]
    writer = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for n, r in enumerate(runs(args, gpus), start=1):
        writer.writerows(rows_of(n, r))


if __name__ == "__main__":
    main(sys.argv[1:])
