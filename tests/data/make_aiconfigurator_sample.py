#!/usr/bin/env python
"""AIConfigurator's own estimates of the measured serving sample's aggregated rows
(offline), written to CSV: the peer next to `shardlab validate --measurements
aiconfigurator-sample --peer tests/data/aiconfigurator_sample.csv`.

A call takes 5-10 s on these machines, so not every row is estimated: the rows on
H100, H200 and B200 are grouped by (system, backend, model) and at most ``--per-group``
(10) taken from each, evenly spaced in the sample's order (the stratified selection
the serving-fidelity issue was measured on).

Run (in a scratch environment: pip install aiconfigurator==0.12.0):
    HF_HUB_OFFLINE=1 nice -n 15 python tests/data/make_aiconfigurator_sample.py \
        --out tests/data/aiconfigurator_sample.csv

Every row is one call of the public Python API
    aiconfigurator.cli.api.cli_estimate(model_path, system, mode="agg", backend_name,
        backend_version, isl, osl, batch_size, tp_size, pp_size, attention_dp_size,
        moe_tp_size, moe_ep_size, gemm_quant_mode, moe_quant_mode)
the programmatic twin of `aiconfigurator cli estimate --estimate-mode agg ...`, with
each row's backend, layout, per-rank batch and quantization; first at the row's own
backend version, then (when the package has no data for it) at the package's default
version, and with the model's id as the package names it where the sample's differs.
Rows the package cannot price are recorded with their error. The sample is read from
the installed aiconfigurator-core (never copied); only the estimates are written.
The output is written as it goes, and a re-run resumes after the rows already there.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import time
import warnings
from importlib import resources

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)  # the package logs a lot at INFO/WARNING

from aiconfigurator.cli.api import cli_estimate  # noqa: E402

SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm")
# the package's model ids where the sample's differ
MODEL_IDS = {
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
}
FIELDS = ["id", "status", "model_id", "version", "aic_ttft_ms", "aic_tpot_ms", "error", "wall_s"]


def _int(text: str, default: int | None = None) -> int | None:
    text = (text or "").strip()
    if not text or text.lower() == "nan":
        return default
    return int(float(text))


FAILED_VERSIONS: set[tuple[str, str, str]] = set()


def estimate(row: dict[str, str]) -> dict[str, object]:
    kwargs: dict[str, object] = {
        "mode": "agg",
        "backend_name": row["backend"],
        "isl": int(row["isl"]),
        "osl": int(row["osl"]),
        "batch_size": _int(row["batch_size"]),
        "tp_size": _int(row["tp_size"], 1),
        "pp_size": _int(row["pp_size"], 1),
        "attention_dp_size": _int(row["attention_dp_size"], 1),
    }
    for key in ("moe_tp_size", "moe_ep_size"):
        value = _int(row[key])
        if value is not None:
            kwargs[key] = value
    for key in ("gemm_quant_mode", "moe_quant_mode"):
        if (row.get(key) or "").strip():
            kwargs[key] = row[key].strip()
    models = [row["model_path"]]
    if row["model_path"] in MODEL_IDS:
        models.append(MODEL_IDS[row["model_path"]])
    own = (row["system"], row["backend"], row["backend_version"].strip())
    versions = [None] if own in FAILED_VERSIONS else [own[2] or None, None]
    last = ""
    for model in dict.fromkeys(models):
        for version in dict.fromkeys(versions):
            try:
                r = cli_estimate(model, row["system"], backend_version=version, **kwargs)
            except Exception as exc:  # record and try the next way
                last = f"{type(exc).__name__}: {str(exc).splitlines()[0][:240]}"
                if version is not None and "version" in last.lower():
                    FAILED_VERSIONS.add(own)
                continue
            return {
                "status": "ok",
                "model_id": model,
                "version": r.backend_version,
                "aic_ttft_ms": round(float(r.ttft), 4),
                "aic_tpot_ms": round(float(r.tpot), 4),
                "error": "",
            }
    return {"status": "failed", "model_id": "", "version": "", "error": last}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--per-group", type=int, default=10)
    args = parser.parse_args()
    sample = resources.files("aiconfigurator_core") / "systems" / "silicon_sample.csv"
    with sample.open() as f:
        agg = [r for r in csv.DictReader(f) if r["mode"] == "agg" and r["system"] in SYSTEMS]
    groups: dict[tuple[str, str, str], list[dict[str, str]]] = {}
    for r in agg:
        groups.setdefault((r["system"], r["backend"], r["model_path"]), []).append(r)
    rows = []
    for members in groups.values():
        step = max(len(members) / args.per_group, 1.0)
        rows += [members[int(i * step)] for i in range(min(args.per_group, len(members)))]
    done: set[str] = set()
    if os.path.exists(args.out):
        with open(args.out) as f:
            done = {r["id"] for r in csv.DictReader(f)}
    new = not done
    with open(args.out, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            w.writeheader()
        start = time.time()
        for i, row in enumerate(rows):
            if row["id"] in done:
                continue
            t0 = time.time()
            out = {"id": row["id"], **estimate(row), "wall_s": 0.0}
            out["wall_s"] = round(time.time() - t0, 2)
            w.writerow(out)
            f.flush()
            if (i + 1) % 50 == 0:
                print(f"{i + 1}/{len(rows)} rows, {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
