#!/usr/bin/env python
"""Grid of aiconfigurator agg estimates (offline), written to CSV.

Run (in a scratch environment: pip install aiconfigurator==0.12.0):
    nice -n 10 python tests/data/make_aiconfigurator_agg.py --out tests/data/aiconfigurator_agg.csv

Every row is one call of the public Python API
    aiconfigurator.cli.api.cli_estimate(model_path, system_name, mode="agg", ...)
which is the programmatic twin of `aiconfigurator cli estimate --estimate-mode agg ...`.
Model configs come from the wheel (aiconfigurator_core/model_configs, the
`DefaultHFModels` set) -- no HuggingFace access.  Mixtral-8x7B ships a config file
but is NOT in DefaultHFModels, so it is passed as a local directory holding that
config.json (created below).
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import shutil
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)  # the package logs a lot at INFO/WARNING

import aiconfigurator_core  # noqa: E402
from aiconfigurator.cli.api import cli_estimate  # noqa: E402

CORE_DIR = os.path.dirname(aiconfigurator_core.__file__)
LOCAL_MODELS = os.path.join(tempfile.gettempdir(), "aiconfigurator-local-models")


def local_model_dir(name: str, packaged_json: str) -> str:
    """Directory with config.json copied from the wheel's model_configs."""
    d = os.path.join(LOCAL_MODELS, name)
    os.makedirs(d, exist_ok=True)
    dst = os.path.join(d, "config.json")
    if not os.path.exists(dst):
        shutil.copy(os.path.join(CORE_DIR, "model_configs", packaged_json), dst)
    return d


MIXTRAL = local_model_dir("Mixtral-8x7B-v0.1", "mistralai--Mixtral-8x7B-v0.1_config.json")

# (label, model_path, extra kwargs, list of parallel configs (tp, pp, dp_attn, moe_tp, moe_ep))
MODELS = [
    (
        "Llama-3.1-8B",
        "meta-llama/Meta-Llama-3.1-8B",
        {},
        [(1, 1, 1, None, None), (2, 1, 1, None, None), (4, 1, 1, None, None)],
    ),
    (
        "Llama-3.1-70B",
        "meta-llama/Meta-Llama-3.1-70B",
        {},
        [(2, 1, 1, None, None), (4, 1, 1, None, None), (8, 1, 1, None, None)],
    ),
    (
        "Qwen3-32B",
        "Qwen/Qwen3-32B",
        {},
        [(1, 1, 1, None, None), (2, 1, 1, None, None), (4, 1, 1, None, None)],
    ),
    (
        "Qwen3-235B-A22B",
        "Qwen/Qwen3-235B-A22B",
        {},
        [(8, 1, 1, 1, 8), (1, 1, 8, 1, 8), (8, 1, 1, 8, 1)],
    ),
    (
        "Qwen3-235B-A22B-FP8",
        "Qwen/Qwen3-235B-A22B-FP8",
        {"kvcache_quant_mode": "fp8"},
        [(8, 1, 1, 1, 8), (1, 1, 8, 1, 8), (4, 1, 1, 1, 4)],
    ),
    (
        "DeepSeek-V3",
        "deepseek-ai/DeepSeek-V3",
        {},
        [(8, 1, 1, 1, 8), (1, 1, 8, 1, 8), (8, 2, 1, 1, 8), (1, 1, 16, 1, 16)],
    ),
    ("Mixtral-8x7B", MIXTRAL, {}, [(2, 1, 1, 2, 1), (2, 1, 1, 1, 2), (4, 1, 1, 1, 4)]),
]
# trtllm on both systems; vllm and sglang on h100_sxm only (runtime budget)
SYSTEM_BACKENDS = [
    ("h100_sxm", "trtllm"),
    ("h200_sxm", "trtllm"),
    ("h100_sxm", "vllm"),
    ("h100_sxm", "sglang"),
]
BATCHES = [1, 8, 64, 256]
SEQS = [(1024, 256), (1000, 1000)]

COLUMNS = [
    "model",
    "model_path",
    "system",
    "backend",
    "version",
    "weight_quant",
    "moe_quant",
    "kv_quant",
    "fmha_quant",
    "tp",
    "pp",
    "dp_attn",
    "moe_tp",
    "moe_ep",
    "num_gpus",
    "batch_size",
    "isl",
    "osl",
    "ctx_tokens",
    "ttft_ms",
    "tpot_ms",
    "tokens_s_per_gpu",
    "tokens_s",
    "tokens_s_per_user",
    "concurrency",
    "memory_gb",
    "kv_cache_warning",
    "status",
    "error",
    "elapsed_s",
    "function",
]


def call_repr(model_path, system, kwargs):
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return f"cli_estimate({model_path!r}, {system!r}, {args})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/aiconfigurator_agg.csv")
    ap.add_argument("--limit", type=int, default=0, help="stop after N rows (0 = all)")
    args = ap.parse_args()

    jobs = []
    for label, mp, extra, pcfgs in MODELS:
        for system, backend in SYSTEM_BACKENDS:
            if True:
                for tp, pp, dp, etp, ep in pcfgs:
                    for bs in BATCHES:
                        for isl, osl in SEQS:
                            kw = dict(
                                mode="agg",
                                backend_name=backend,
                                isl=isl,
                                osl=osl,
                                batch_size=bs,
                                tp_size=tp,
                                pp_size=pp,
                                attention_dp_size=dp,
                            )
                            if etp is not None:
                                kw["moe_tp_size"] = etp
                            if ep is not None:
                                kw["moe_ep_size"] = ep
                            kw.update(extra)
                            jobs.append((label, mp, system, kw))
    if args.limit:
        jobs = jobs[: args.limit]

    t_start = time.perf_counter()
    n_ok = 0
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for i, (label, mp, system, kw) in enumerate(jobs):
            row = dict(
                model=label,
                model_path=mp,
                system=system,
                backend=kw["backend_name"],
                tp=kw["tp_size"],
                pp=kw["pp_size"],
                dp_attn=kw["attention_dp_size"],
                moe_tp=kw.get("moe_tp_size", ""),
                moe_ep=kw.get("moe_ep_size", ""),
                batch_size=kw["batch_size"],
                isl=kw["isl"],
                osl=kw["osl"],
                function=call_repr(mp, system, kw),
            )
            t0 = time.perf_counter()
            try:
                r = cli_estimate(mp, system, **kw)
                raw = r.raw
                row.update(
                    version=raw.get("version"),
                    weight_quant=raw.get("gemm"),
                    moe_quant=raw.get("moe"),
                    kv_quant=raw.get("kvcache"),
                    fmha_quant=raw.get("fmha"),
                    num_gpus=raw.get("num_total_gpus"),
                    moe_tp=raw.get("moe_tp"),
                    moe_ep=raw.get("moe_ep"),
                    ctx_tokens=raw.get("ctx_tokens"),
                    ttft_ms=round(float(raw["ttft"]), 4),
                    tpot_ms=round(float(raw["tpot"]), 4),
                    tokens_s_per_gpu=round(float(raw["tokens/s/gpu"]), 3),
                    tokens_s=round(float(raw["tokens/s"]), 3),
                    tokens_s_per_user=round(float(raw["tokens/s/user"]), 3),
                    concurrency=raw.get("concurrency"),
                    memory_gb=round(float(raw["memory"]), 3),
                    kv_cache_warning="yes" if r.kv_cache_warning else "",
                    status="ok",
                )
                n_ok += 1
            except Exception as e:  # record and continue
                row.update(
                    status="failed", error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                )
            row["elapsed_s"] = round(time.perf_counter() - t0, 3)
            w.writerow(row)
            f.flush()
            if (i + 1) % 20 == 0:
                print(
                    f"{i + 1}/{len(jobs)} rows, {n_ok} ok, {time.perf_counter() - t_start:.0f}s",
                    flush=True,
                )
    print(f"done: {len(jobs)} rows, {n_ok} ok, {time.perf_counter() - t_start:.0f}s -> {args.out}")


if __name__ == "__main__":
    main()
