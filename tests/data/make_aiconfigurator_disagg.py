#!/usr/bin/env python
"""AIConfigurator's aggregated-versus-disaggregated choice on the problems of shardlab's
``disagg`` suite (offline), written to CSV: the anchor next to results/disagg/.

Run (in a scratch environment: pip install aiconfigurator==0.12.0):
    HF_HUB_OFFLINE=1 nice -n 10 python tests/data/make_aiconfigurator_disagg.py \
        --out tests/data/aiconfigurator_disagg.csv

Every row is one call of the public Python API
    aiconfigurator.cli.api.cli_default(model_path, total_gpus, system, backend="trtllm",
                                       isl, osl, ttft, tpot)
the programmatic twin of `aiconfigurator cli default ...`, which searches both modes
and picks the higher tokens/s/GPU of the whole cluster (output tokens). Models are
the wheel's own configs (DefaultHFModels); everything else is left at its defaults
(measured kernel tables, no MTP, quantization as the checkpoint declares).
"""

from __future__ import annotations

import argparse
import csv
import logging
import time
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)  # the package logs a lot at INFO/WARNING

from aiconfigurator.cli.api import cli_default  # noqa: E402

# (shardlab instance prefix, HF model, system, GPUs): the disagg suite's problems
PROBLEMS = [
    ("deepseek-v3-h200x32", "deepseek-ai/DeepSeek-V3", "h200_sxm", 32),
    ("deepseek-v3-h100x64", "deepseek-ai/DeepSeek-V3", "h100_sxm", 64),
    ("llama70b-h100x16", "meta-llama/Meta-Llama-3.1-70B", "h100_sxm", 16),
    ("qwen235b-h200x16", "Qwen/Qwen3-235B-A22B", "h200_sxm", 16),
]
SHAPES = [("prefill-heavy", 8192, 256), ("decode-heavy", 1024, 2048)]
TTFT_MS, TPOT_MS = 2000.0, 50.0

FIELDS = [
    "instance",
    "model",
    "system",
    "gpus",
    "isl",
    "osl",
    "ttft_ms",
    "tpot_ms",
    "chosen",
    "agg_tok_s_gpu",
    "agg_config",
    "disagg_tok_s_gpu",
    "disagg_config",
    "wall_s",
]


def _agg_config(row: dict) -> str:
    return f"{row['parallel']} bs{row['bs']}"


def _disagg_config(row: dict) -> str:
    return (
        f"{row['(p)workers']}P[{row['(p)parallel']}] + "
        f"{row['(d)workers']}D[{row['(d)parallel']} bs{row['(d)bs']}]"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for prefix, model, system, gpus in PROBLEMS:
        for shape, isl, osl in SHAPES:
            t0 = time.time()
            res = cli_default(
                model_path=model,
                total_gpus=gpus,
                system=system,
                backend="trtllm",
                isl=isl,
                osl=osl,
                ttft=TTFT_MS,
                tpot=TPOT_MS,
                top_n=1,
            )
            best = {mode: df.iloc[0].to_dict() for mode, df in res.best_configs.items()}
            rows.append(
                {
                    "instance": f"{prefix}-{shape}",
                    "model": model,
                    "system": system,
                    "gpus": gpus,
                    "isl": isl,
                    "osl": osl,
                    "ttft_ms": TTFT_MS,
                    "tpot_ms": TPOT_MS,
                    "chosen": res.chosen_exp,
                    "agg_tok_s_gpu": res.best_throughputs.get("agg"),
                    "agg_config": _agg_config(best["agg"]) if "agg" in best else "",
                    "disagg_tok_s_gpu": res.best_throughputs.get("disagg"),
                    "disagg_config": _disagg_config(best["disagg"]) if "disagg" in best else "",
                    "wall_s": round(time.time() - t0, 1),
                }
            )
            print(rows[-1], flush=True)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
