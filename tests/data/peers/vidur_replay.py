#!/usr/bin/env python
"""Replay the Azure conversation hour through Vidur (vidur==0.0.26), offline, and write
its speed and latency percentiles as JSON for `side_by_side.py`.

Runs with its own venv's python; imports nothing of shardlab (the trace is converted
with the stdlib):

    python3.11 -m venv /work/venvs/vidur
    /work/venvs/vidur/bin/pip install vidur==0.0.26
    cd /work/venvs/vidur && HF_HUB_OFFLINE=1 bin/python \
        /work/wt/peers/tests/data/peers/vidur_replay.py \
        --trace /work/wt/peers/tests/data/traces/AzureLLMInferenceTrace_conv.csv.gz \
        --out-dir /work/wt/peers/results/simulate/peers

The model and GPU are Vidur 0.0.26's defaults, Llama-3-8B on H100 (`h100_dgx` network),
here on one GPU (TP 1, PP 1), with the Sarathi scheduler (chunked prefill, 8,192-token
chunks, 256 requests at most, DynoSim's vLLM budget). Vidur 0.0.26 prices iterations
with models it trains on kernel profiles it takes from the Hugging Face datasets
`project-vajra/dev-staging-meta-llama-llama-3-8b-h100` and `project-vajra/dev-staging-h100-dgx`
(`snapshot_download`), not from its repository. Run offline it needs them in its cache
(`--cache-dir`, Hugging Face's cache layout); without them it stops before simulating,
and this script exits with Vidur's error.

TPOT here is Vidur's `decode_time_execution_plus_preemption_normalized`: (completion -
prefill completion) / decode tokens, so it divides by the output tokens, not by one
fewer. Vidur reports no per-token ITL in its request metrics; the JSON says so.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from azure_trace import TICKS_PER_S, azure_rows

# The request metrics Vidur writes (vidur/metrics/constants.py), in seconds.
TTFT, TPOT, E2E = (
    "prefill_e2e_time",
    "decode_time_execution_plus_preemption_normalized",
    ("request_e2e_time"),
)
TPOT_DEFINITION = "per request (completion - prefill completion) / output tokens"
DATE = "2023-11-16"  # the Azure conversation hour's day; Vidur keeps the rows of one date


def write_vidur_trace(azure: Path, out: Path) -> int:
    """The Azure trace in the columns Vidur's `trace_replay` generator reads (`Date`,
    `Time` in seconds from the first request, `PromptTokenCount`, `CompletionTokenCount`);
    returns the number of requests."""
    count = 0
    with out.open("w", newline="") as o:
        w = csv.writer(o)
        w.writerow(["Date", "Time", "PromptTokenCount", "CompletionTokenCount"])
        for ticks, prompt, output in azure_rows(azure):
            w.writerow([DATE, ticks / TICKS_PER_S, prompt, output])
            count += 1
    return count


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _stats_ms(values_s: list[float]) -> dict[str, float]:
    v = sorted(x * 1000 for x in values_s)
    return {
        "mean": statistics.fmean(v),
        "median": _percentile(v, 0.5),
        "p90": _percentile(v, 0.9),
        "p99": _percentile(v, 0.99),
    }


def summarize(request_metrics: Path) -> dict[str, Any]:
    """TTFT, TPOT and end-to-end statistics (ms) from Vidur's `request_metrics.csv`."""
    with request_metrics.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        "requests": len(rows),
        "summary": {
            "ttft_ms": _stats_ms([float(r[TTFT]) for r in rows]),
            "tpot_ms": _stats_ms([float(r[TPOT]) for r in rows]),
            "itl_ms": None,
            "e2e_ms": _stats_ms([float(r[E2E]) for r in rows]),
        },
    }


def vidur_args(trace: Path, out_dir: Path, cache_dir: Path, max_tokens: int) -> list[str]:
    return [
        "--replica_config_model_name", "meta-llama/Llama-3-8B",
        "--replica_config_device", "h100",
        "--replica_config_network_device", "h100_dgx",
        "--replica_config_tensor_parallel_size", "1",
        "--replica_config_num_pipeline_stages", "1",
        "--cluster_config_num_replicas", "1",
        "--replica_scheduler_config_type", "sarathi",
        "--sarathi_scheduler_config_chunk_size", "8192",
        "--sarathi_scheduler_config_batch_size_cap", "256",
        "--request_generator_config_type", "trace_replay",
        "--trace_request_generator_config_trace_file", str(trace),
        "--trace_request_generator_config_date", DATE,
        "--trace_request_generator_config_prefill_scale_factor", "1",
        "--trace_request_generator_config_decode_scale_factor", "1",
        "--trace_request_generator_config_time_scale_factor", "1",
        "--trace_request_generator_config_max_tokens", str(max_tokens),
        "--random_forrest_execution_time_predictor_config_cache_dir", str(cache_dir),
        "--metrics_config_output_dir", str(out_dir),
        "--no-metrics_config_store_plots",
        "--metrics_config_write_metrics",
        "--metrics_config_store_request_metrics",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", type=Path, required=True, help="an Azure LLM inference trace")
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--work-dir", type=Path, default=Path("vidur_work"))
    p.add_argument("--cache-dir", type=Path, default=Path(".vidur_cache"))
    p.add_argument("--max-tokens", type=int, default=16_384, help="prompt + output cap")
    a = p.parse_args(argv)
    from importlib.metadata import version

    from vidur.config import SimulationConfig
    from vidur.simulator import Simulator
    from vidur.utils.random import set_seeds

    a.work_dir.mkdir(parents=True, exist_ok=True)
    trace = a.work_dir / "azure_conv_vidur.csv"
    write_vidur_trace(a.trace, trace)
    sys.argv = ["vidur", *vidur_args(trace, a.work_dir / "out", a.cache_dir, a.max_tokens)]
    config = SimulationConfig.create_from_cli_args()
    set_seeds(config.seed)
    start = time.perf_counter()
    simulator = Simulator(config)  # trains (or loads) its execution-time predictors
    built = time.perf_counter()
    simulator.run()
    done = time.perf_counter()
    run = summarize(Path(config.metrics_config.output_dir) / "request_metrics.csv")
    record = {
        "peer": "vidur",
        "version": f"vidur {version('vidur')}",
        "engine": "sarathi (chunked prefill 8192, 256 requests)",
        "traffic": a.trace.name.split(".")[0],
        "workers": 1,
        "costs": "Vidur's predictors for Llama-3-8B on one H100 (project-vajra profiles)",
        "tpot_definition": TPOT_DEFINITION,
        "itl_definition": "not reported by Vidur's request metrics",
        "wall_s": done - start,
        "setup_s": built - start,
        "run_s": done - built,
        **run,
    }
    a.out_dir.mkdir(parents=True, exist_ok=True)
    out = a.out_dir / f"vidur-{record['traffic']}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{out}: wall {done - start:.2f} s (setup {built - start:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
