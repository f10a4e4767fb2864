"""The peer-simulator scripts under tests/data/peers: the trace DynoSim replays, and the
side-by-side table (both run here without the peers installed)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "tests" / "data" / "peers"
AZURE_CONV = ROOT / "tests" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv.gz"


def _script(name: str) -> ModuleType:
    if str(PEERS) not in sys.path:  # as when run as a script: its folder comes first
        sys.path.insert(0, str(PEERS))
    spec = importlib.util.spec_from_file_location(f"peers_{name}", PEERS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_azure_trace_becomes_mooncake_with_exact_times_and_no_shared_prefix(
    tmp_path: Path,
) -> None:
    dynosim = _script("dynosim_replay")
    trace = tmp_path / "azure.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,512,109\n"
        "2023-11-16 18:16:00.0000001,513,1\n"
    )
    out = tmp_path / "trace.jsonl"
    assert dynosim.write_mooncake(out, dynosim.azure_rows(trace), 512) == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["timestamp"] for r in rows] == [0.0, 4314.579, 13319.4101]
    assert [r["input_length"] for r in rows] == [374, 512, 513]
    assert [r["output_length"] for r in rows] == [44, 109, 1]
    assert [r["hash_ids"] for r in rows] == [[0], [1], [2, 3]]


def test_the_committed_azure_hour_converts_whole_with_unique_blocks(tmp_path: Path) -> None:
    dynosim = _script("dynosim_replay")
    out = tmp_path / "conv.jsonl"
    assert dynosim.write_mooncake(out, dynosim.azure_rows(AZURE_CONV), 512) == 19_366
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [h for r in rows for h in r["hash_ids"]]
    assert len(ids) == len(set(ids))
    assert all(len(r["hash_ids"]) == math.ceil(r["input_length"] / 512) for r in rows)
    # the hour's span as `shardlab traffic` reads it, exact to 100 ns: 3,501.721937 s
    assert rows[-1]["timestamp"] == 3_501_721.937


def test_the_table_puts_a_peer_beside_shardlab(tmp_path: Path) -> None:
    side = _script("side_by_side")
    stats = {"mean": 52.88, "median": 43.46, "p90": 94.75, "p99": 161.81}
    peer = {
        "peer": "dynosim",
        "version": "ai-dynamo-runtime 1.6.1",
        "engine": "vllm",
        "traffic": "conv",
        "wall_s": 1.2345,
        "summary": {"ttft_ms": stats, "tpot_ms": stats},  # no ITL
    }
    ours = {
        "summary": {
            name: {"mean": 10, "median": 9, "p90": 20, "p99": 30, "p99.9": 40}
            for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
        },
        "wall_s": 0.5,
    }
    (tmp_path / "peer.json").write_text(json.dumps(peer))
    (tmp_path / "ours.json").write_text(json.dumps(ours))
    out = tmp_path / "peers.md"
    side.main(
        [
            "--peer", str(tmp_path / "peer.json"),
            "--shardlab", "vllm", "conv", str(tmp_path / "ours.json"),
            "--out", str(out),
        ]
    )  # fmt: skip
    made, _, table = out.read_text().partition("\n\n| ")
    assert made.startswith("# Simulators side by side\n\nMade by `python ")
    lines = ("| " + table).splitlines()
    assert lines[0].startswith("| simulator | engine | traffic | wall s | TTFT mean |")
    assert lines[0].endswith("| ITL p90 | ITL p99 |")
    assert lines[1] == "|---|---|---|" + "---:|" * 13
    assert lines[2] == (
        "| dynosim (ai-dynamo-runtime 1.6.1) | vllm | conv | 1.23 | "
        + "52.9 | 43.5 | 94.8 | 161.8 | " * 2
        + "n/a | n/a | n/a | n/a |"
    )
    assert lines[3] == "| shardlab | vllm | conv | 0.50 |" + " 10.0 | 9.0 | 20.0 | 30.0 |" * 3
    assert len(lines) == 4


def test_vidur_gets_the_azure_trace_in_its_replay_columns(tmp_path: Path) -> None:
    vidur = _script("vidur_replay")
    trace = tmp_path / "azure.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    out = tmp_path / "vidur.csv"
    assert vidur.write_vidur_trace(trace, out) == 2
    assert out.read_text().splitlines() == [
        "Date,Time,PromptTokenCount,CompletionTokenCount",
        "2023-11-16,0.0,374,44",
        "2023-11-16,4.314579,396,109",
    ]


def test_vidur_request_metrics_become_millisecond_percentiles(tmp_path: Path) -> None:
    vidur = _script("vidur_replay")
    metrics = tmp_path / "request_metrics.csv"
    head = f"Request Id,{vidur.TTFT},{vidur.TPOT},{vidur.E2E}\n"
    # TTFT 0.01 .. 0.11 s over 11 requests: p90 is the 10th of 11 exactly.
    body = "".join(f"{i},{(i + 1) / 100},0.02,{i + 1}\n" for i in range(11))
    metrics.write_text(head + body)
    run = vidur.summarize(metrics)
    assert run["requests"] == 11
    ttft = run["summary"]["ttft_ms"]
    assert ttft["mean"] == 60.0 and ttft["median"] == 60.0 and ttft["p90"] == 100.0
    assert abs(ttft["p99"] - 109.0) < 1e-9  # between the 10th and 11th, 9/10 of the way
    assert run["summary"]["tpot_ms"]["p99"] == 20.0
    assert run["summary"]["e2e_ms"]["median"] == 6000.0
    assert run["summary"]["itl_ms"] is None
