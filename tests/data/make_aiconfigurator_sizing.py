#!/usr/bin/env python
"""AIConfigurator's answer to "how many GPUs does this deployment need for a target
request rate" (offline), aggregated and disaggregated, for shardlab to compare its own
sizing against.

In a scratch environment (outside the repo; PyPI only, no HuggingFace downloads):
    python3.11 -m venv /tmp/aic-venv && /tmp/aic-venv/bin/pip install -q aiconfigurator==0.12.0
    HF_HUB_OFFLINE=1 nice -n 10 /tmp/aic-venv/bin/python tests/data/make_aiconfigurator_sizing.py \
        --out tests/data/aiconfigurator_sizing.csv

Its answer: ``aiconfigurator.cli.api.cli_recommend(model, system, target_request_rate=R,
backend="trtllm", database_mode="SILICON", isl=1024, osl=256, ttft=2000, tpot=50)``,
which is what ``aiconfigurator cli default --model M --system S --backend trtllm --isl
1024 --osl 256 --ttft 2000 --tpot 50 --target-request-rate R`` runs when ``--total-gpus``
is omitted (with ``--total-gpus`` the rate is ignored; ``cli recommend`` would default
to ``--database-mode HYBRID``). It sweeps one replica's configurations (up to 64 GPUs a
replica), keeps those with TPOT within the target, and takes ``replicas_needed =
ceil(R / seq/s)`` copies of one configuration, ``total_gpus_needed = replicas_needed x
num_total_gpus``, fewest GPUs first. ``seq/s`` is one replica's closed-loop rate at its
concurrency (``concurrency / request_latency``), not a rate under Poisson arrivals.
One row per (problem, serving mode): its rank-1 configuration; numbers as it returns
them, empty where it returns none (a disaggregated replica is ``prefill_workers``
prefill and ``decode_workers`` decode workers). A mode with no configuration is a row
with only ``error``: it widens a replica's GPU budget (8, 16, 32, 64) only while a mode
fails for lack of memory, so disaggregated DeepSeek-V3 (needing two multi-GPU workers)
returns none once aggregated fits in one budget.
"""

from __future__ import annotations

import argparse
import csv
import logging
import time
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)  # the package logs a lot at INFO/WARNING

import aiconfigurator  # noqa: E402
from aiconfigurator.cli.api import cli_recommend  # noqa: E402

PROBLEMS = [
    ("meta-llama/Meta-Llama-3.1-70B", "h200_sxm", 20.0),
    ("meta-llama/Meta-Llama-3.1-70B", "h100_sxm", 20.0),
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", 50.0),
    ("deepseek-ai/DeepSeek-V3", "b200_sxm", 50.0),
    ("deepseek-ai/DeepSeek-V3", "h100_sxm", 50.0),
]
BACKEND, DATABASE_MODE = "trtllm", "SILICON"
ISL, OSL, TTFT_MS, TPOT_MS = 1024, 256, 2000.0, 50.0
FIELDS = [
    "model", "system", "backend", "database_mode", "isl", "osl", "ttft_ms", "tpot_ms",
    "target_rate_rps", "serving", "chosen", "gpus_needed", "replicas", "gpus_per_replica",
    "tp", "pp", "dp", "moe_tp", "moe_ep", "bs",
    "prefill_workers", "prefill_tp", "prefill_pp", "prefill_dp", "prefill_moe_tp",
    "prefill_moe_ep", "prefill_bs",
    "decode_workers", "decode_tp", "decode_pp", "decode_dp", "decode_moe_tp",
    "decode_moe_ep", "decode_bs",
    "replica_concurrency", "replica_rate_rps", "pred_ttft_ms", "pred_tpot_ms",
    "pred_tok_s_user", "pred_tok_s_gpu", "perf_db_version", "error", "wall_s",
    "aiconfigurator_version",
]  # fmt: skip
SAME = {"tp": "tp", "pp": "pp", "dp": "dp", "moe_tp": "moe_tp", "moe_ep": "moe_ep", "bs": "bs"}
PREFILL = {f"prefill_{k}": f"(p){k}" for k in ["workers", *SAME]}
DECODE = {f"decode_{k}": f"(d){k}" for k in ["workers", *SAME]}
COMMON = {
    "gpus_needed": "total_gpus_needed",
    "replicas": "replicas_needed",
    "gpus_per_replica": "num_total_gpus",
    "replica_concurrency": "concurrency",
    "replica_rate_rps": "seq/s",
    "pred_ttft_ms": "ttft",
    "pred_tpot_ms": "tpot",
    "pred_tok_s_user": "tokens/s/user",
    "pred_tok_s_gpu": "tokens/s/gpu",
}


def _cell(value):
    if isinstance(value, float):
        return round(value, 3)
    return value.item() if hasattr(value, "item") else value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for model, system, rate in PROBLEMS:
        base = {
            "model": model, "system": system, "backend": BACKEND, "database_mode": DATABASE_MODE,
            "isl": ISL, "osl": OSL, "ttft_ms": TTFT_MS, "tpot_ms": TPOT_MS,
            "target_rate_rps": rate, "aiconfigurator_version": aiconfigurator.__version__,
        }  # fmt: skip
        t0 = time.time()
        try:
            res = cli_recommend(
                model_path=model, system=system, target_request_rate=rate, backend=BACKEND,
                database_mode=DATABASE_MODE, isl=ISL, osl=OSL, ttft=TTFT_MS, tpot=TPOT_MS,
                top_n=1,
            )  # fmt: skip
        except Exception as exc:  # record what it could not do, and go on
            rows.append({**base, "error": f"{type(exc).__name__}: {exc}"[:300]})
            rows[-1]["wall_s"] = round(time.time() - t0, 1)
            print(rows[-1], flush=True)
            continue
        wall = round(time.time() - t0, 1)
        for serving in ("agg", "disagg"):
            row = {**base, "serving": serving, "wall_s": wall}
            outcome = res.outcomes.get(serving)
            df = res.best_configs.get(serving)
            if df is None or df.empty:
                err = outcome.error if outcome is not None else None
                row["error"] = f"no configuration returned ({err or 'and no error'})"[:300]
            else:
                best = df.iloc[0].to_dict()
                row["chosen"] = int(res.chosen_exp == serving)
                cols = {**COMMON, **(SAME if serving == "agg" else {**PREFILL, **DECODE})}
                row.update({k: _cell(best[v]) for k, v in cols.items() if v in best})
                row["perf_db_version"] = best.get("version", best.get("(d)version"))
            rows.append(row)
            print(row, flush=True)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
