#!/usr/bin/env python
"""AIConfigurator's default problems, side by side with shardlab (offline): its own
aggregated pick, and its estimate of shardlab's pick. Written to CSV; `shardlab
validate --aiconfigurator tests/data/aiconfigurator_default.csv` adds shardlab's score
of its pick.

shardlab's picks (TensorRT-LLM's launchable space, in flight at an offered 8,192):
    for p in "llama70b-h100x8 llama-3.1-70b h100x8" "qwen235b-h200x16 qwen3-235b-a22b h200x16" \
             "deepseek-v3-h200x16 deepseek-v3 h200x16" "deepseek-v3-h100x64 deepseek-v3 h100x64"; do
        set -- $p
        shardlab solve --method cpsat --model $2 --cluster $3 --engine trtllm --space engine \
            --batch 8192 --input-len 1024 --output-len 256 --ttft-ms 2000 --tpot-ms 50 \
            --out tests/data/aiconfigurator_default/$1.json
    done

Then (in a scratch environment: pip install aiconfigurator==0.12.0):
    HF_HUB_OFFLINE=1 nice -n 10 python tests/data/make_aiconfigurator_default.py \
        --out tests/data/aiconfigurator_default.csv

Its pick: ``aiconfigurator.cli.api.cli_default(model, gpus, system, backend="trtllm",
isl=1024, osl=256, ttft=2000, tpot=50)``'s best aggregated configuration. Its score of
shardlab's pick: ``cli_estimate(model, system, mode="agg", ...)`` at the pick's degrees
and requests per attention-DP rank (its batch size counts one pipeline micro-batch:
the requests over the stages; quantization as the checkpoint declares, as
``cli_default`` leaves it).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)  # the package logs a lot at INFO/WARNING

from aiconfigurator.cli.api import cli_default, cli_estimate  # noqa: E402

PROBLEMS = [
    ("llama70b-h100x8", "meta-llama/Meta-Llama-3.1-70B", "h100_sxm", 8),
    ("qwen235b-h200x16", "Qwen/Qwen3-235B-A22B", "h200_sxm", 16),
    ("deepseek-v3-h200x16", "deepseek-ai/DeepSeek-V3", "h200_sxm", 16),
    ("deepseek-v3-h100x64", "deepseek-ai/DeepSeek-V3", "h100_sxm", 64),
]
ISL, OSL, TTFT_MS, TPOT_MS = 1024, 256, 2000.0, 50.0
FIELDS = [
    "problem", "model", "system", "gpus",
    "its_tp", "its_pp", "its_dp", "its_moe_tp", "its_moe_ep", "its_bs", "its_tok_s_gpu",
    "its_ttft_ms", "its_tpot_ms",
    "our_tp", "our_pp", "our_dp", "our_moe_tp", "our_moe_ep", "our_bs",
    "its_tok_s_gpu_of_ours", "its_ttft_ms_of_ours", "its_tpot_ms_of_ours", "wall_s",
]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    picks = Path(args.out).with_suffix("")
    rows = []
    for name, model, system, gpus in PROBLEMS:
        t0 = time.time()
        res = cli_default(
            model_path=model, total_gpus=gpus, system=system, backend="trtllm", isl=ISL,
            osl=OSL, ttft=TTFT_MS, tpot=TPOT_MS, top_n=1,
        )  # fmt: skip
        best = res.best_configs["agg"].iloc[0].to_dict()
        ours = json.loads((picks / f"{name}.json").read_text())
        d = ours["degrees"]
        estimate = cli_estimate(
            model, system, mode="agg", backend_name="trtllm", isl=ISL, osl=OSL,
            batch_size=-(-ours["requests_per_rank"] // d["pp"]), tp_size=d["tp"], pp_size=d["pp"],
            attention_dp_size=d["dp_attn"], moe_tp_size=d["etp"], moe_ep_size=d["ep"],
        )  # fmt: skip
        rows.append(
            {
                "problem": name,
                "model": model,
                "system": system,
                "gpus": gpus,
                "its_tp": best["tp"],
                "its_pp": best["pp"],
                "its_dp": best["dp"],
                "its_moe_tp": best["moe_tp"],
                "its_moe_ep": best["moe_ep"],
                "its_bs": best["bs"],
                "its_tok_s_gpu": round(float(best["tokens/s/gpu"]), 3),
                "its_ttft_ms": round(float(best["ttft"]), 3),
                "its_tpot_ms": round(float(best["tpot"]), 3),
                "our_tp": d["tp"],
                "our_pp": d["pp"],
                "our_dp": d["dp_attn"],
                "our_moe_tp": d["etp"],
                "our_moe_ep": d["ep"],
                "our_bs": ours["requests_per_rank"],
                "its_tok_s_gpu_of_ours": round(float(estimate.raw["tokens/s/gpu"]), 3),
                "its_ttft_ms_of_ours": round(float(estimate.ttft), 3),
                "its_tpot_ms_of_ours": round(float(estimate.tpot), 3),
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
