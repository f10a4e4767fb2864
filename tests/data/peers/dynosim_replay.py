#!/usr/bin/env python
"""Replay a trace through Dynamo's DynoSim (the mocker's offline replay), offline, and
write its speed and latency percentiles as JSON for `side_by_side.py`.

Runs with the peers venv's python, not the project's: shardlab is not installed there
and this script imports nothing of it (the trace is converted with the stdlib).

    python3.11 -m venv /work/venvs/peers
    /work/venvs/peers/bin/pip install ai-dynamo-runtime==1.6.1
    /work/venvs/peers/bin/python tests/data/peers/dynosim_replay.py \
        --trace tests/data/traces/AzureLLMInferenceTrace_conv.csv.gz \
        --engine vllm --engine sglang --engine trtllm --repeats 3 --out-dir results/simulate/peers

`--concurrency N` replays the same requests as a closed loop of N clients (DynoSim's
`replay_concurrency`: at most N in flight, the trace's timestamps ignored), the
counterpart of `shardlab simulate --traffic FILE --clients N`.

Each prompt gets fresh hash ids, one per `--block-size` tokens, so no two requests share
a prefix and the prefix cache never hits (the Azure traces carry no prefix ids).

The iteration costs are DynoSim's default "polynomial" timing model, which names no
model or GPU: prefill ms = 4.21e-7 t^2 + 0.01518 t + 16.50 over the batch's new tokens t,
decode ms = max(1, -25.74 u^2 + 54.01 u + 5.74) with u the scheduled requests' context
over the KV capacity. Its per-iteration table inputs (`ais_perf_config`, timing
provider "external") need `aisimulate`, whose registry entry cannot install offline.
So only the scheduling can be compared with shardlab, not the costs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from azure_trace import TICKS_PER_S, azure_rows

ENGINES = ("vllm", "sglang", "trtllm")
# DynoSim's default capacity is 16,384 blocks whatever the block size, so vLLM (64-token
# blocks) holds 1,048,576 tokens, TensorRT-LLM (32) half that and SGLang (1) 16,384;
# the engines are compared at one capacity in tokens, vLLM's default.
DEFAULT_KV_TOKENS = 16_384 * 64
TPOT_DEFINITION = "per request (e2e - ttft) / (output tokens - 1), TTFT excluded"
ITL_DEFINITION = "every gap between consecutive output tokens, pooled over requests"


def write_mooncake(path: Path, rows: Iterator[tuple[int, int, int]], block_size: int) -> int:
    """Mooncake JSONL, one unique hash id per `block_size` tokens of each prompt (no
    prefix sharing); returns the number of requests."""
    next_id, count = 0, 0
    with path.open("w") as out:
        for ticks, prompt, output in rows:
            blocks = math.ceil(prompt / block_size)
            record = {
                "timestamp": ticks / (TICKS_PER_S // 1000),  # ms
                "input_length": prompt,
                "output_length": output,
                "hash_ids": list(range(next_id, next_id + blocks)),
            }
            out.write(json.dumps(record) + "\n")
            next_id += blocks
            count += 1
    return count


def engine_args(engine: str, kv_tokens: int) -> dict[str, Any]:
    """DynoSim's engine settings: its defaults but one KV capacity in tokens."""
    from dynamo._core import _normalize_mocker_config

    block = _normalize_mocker_config({"engine": {"backend": engine}})["engine"]["block_size"]
    if kv_tokens % block:
        raise SystemExit(f"--kv-tokens {kv_tokens} is not a whole number of {block}-token blocks")
    return {"engine": {"backend": engine, "num_gpu_blocks": kv_tokens // block}}


def _stats(summary: dict[str, Any], name: str) -> dict[str, float]:
    return {
        "mean": summary[f"mean_{name}_ms"],
        "median": summary[f"median_{name}_ms"],
        "p90": summary[f"p90_{name}_ms"],
        "p99": summary[f"p99_{name}_ms"],
    }


def replay(
    jsonl: Path,
    *,
    engine: str,
    workers: int,
    block_size: int,
    kv_tokens: int,
    concurrency: int | None,
    repeats: int,
) -> dict[str, Any]:
    from dynamo import _core

    args = engine_args(engine, kv_tokens)
    walls: list[float] = []
    cpus: list[float] = []
    inner: list[float] = []
    summary: dict[str, Any] = {}
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        result = _core.run_mocker_trace_replay(
            [str(jsonl)],
            extra_engine_args=args,
            num_workers=workers,
            trace_block_size=block_size,
            replay_concurrency=concurrency,
        )
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)  # the machine is shared: CPU time too
        summary = result.summary
        inner.append(summary["wall_time_ms"] / 1000)
    return {
        "engine_args": _core._normalize_mocker_config(args),
        "wall_s": statistics.median(walls),
        "wall_s_runs": walls,
        "cpu_s_runs": cpus,
        "replay_wall_s_runs": inner,
        "summary": {
            "ttft_ms": _stats(summary, "ttft"),
            "tpot_ms": _stats(summary, "tpot"),
            "itl_ms": _stats(summary, "itl"),
            "e2e_ms": _stats(summary, "e2e_latency"),
            "throughput_tok_s": summary["output_throughput_tok_s"],
        },
        "requests": summary["completed_requests"],
        "sim_duration_s": summary["duration_ms"] / 1000,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--trace", type=Path, required=True, help="an Azure LLM inference trace (.csv[.gz])"
    )
    p.add_argument(
        "--engine", action="append", choices=ENGINES, help="repeatable; default all three"
    )
    p.add_argument("--workers", type=int, default=1, help="aggregated workers, round robin")
    p.add_argument("--block-size", type=int, default=512, help="tokens per trace hash id")
    p.add_argument(
        "--kv-tokens", type=int, default=DEFAULT_KV_TOKENS, help="KV capacity per worker"
    )
    p.add_argument("--concurrency", type=int, help="a closed loop of this many clients")
    p.add_argument("--repeats", type=int, default=3, help="timed runs (the median is wall_s)")
    p.add_argument("--traffic", help="the traffic's name in the output (default from the file)")
    p.add_argument("--out-dir", type=Path, required=True)
    a = p.parse_args(argv)
    os.environ.setdefault("DYN_LOG", "error")  # SGLang's retractions log one line each
    from importlib.metadata import version

    a.out_dir.mkdir(parents=True, exist_ok=True)
    stem = a.trace.name.split(".")[0]
    traffic = a.traffic or (
        stem if a.concurrency is None else f"{stem}, closed loop of {a.concurrency}"
    )
    jsonl = a.out_dir / f".{stem}.mooncake.jsonl"
    write_mooncake(jsonl, azure_rows(a.trace), a.block_size)
    try:
        for engine in a.engine or ENGINES:
            run = replay(
                jsonl,
                engine=engine,
                workers=a.workers,
                block_size=a.block_size,
                kv_tokens=a.kv_tokens,
                concurrency=a.concurrency,
                repeats=a.repeats,
            )
            record = {
                "peer": "dynosim",
                "version": f"ai-dynamo-runtime {version('ai-dynamo-runtime')}",
                "engine": engine,
                "traffic": traffic,
                "workers": a.workers,
                "concurrency": a.concurrency,
                "costs": "DynoSim's default polynomial timing model (no model or GPU named)",
                "tpot_definition": TPOT_DEFINITION,
                "itl_definition": ITL_DEFINITION,
                **run,
            }
            suffix = "" if a.concurrency is None else f"-closed{a.concurrency}"
            out = a.out_dir / f"dynosim-{engine}-{stem}{suffix}.json"
            out.write_text(json.dumps(record, indent=2) + "\n")
            walls = ", ".join(f"{w:.2f}" for w in run["wall_s_runs"])
            print(f"{out}: {engine}, wall {walls} s")
    finally:
        jsonl.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
