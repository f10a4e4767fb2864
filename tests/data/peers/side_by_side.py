#!/usr/bin/env python
"""The peer simulators' runs and shardlab's, one markdown table: who, engine, traffic,
wall seconds, and the mean, median, p90 and p99 of TTFT, TPOT and ITL (ms).

Runs with the project's python. The peers' JSON files come from `dynosim_replay.py`
and `vidur_replay.py`; shardlab's from `shardlab simulate ... --json > FILE`, named with
the engine and traffic they ran (shardlab's JSON does not carry them):

    python tests/data/peers/side_by_side.py \
        --peer results/simulate/peers/dynosim-*.json \
        --shardlab vllm AzureLLMInferenceTrace_conv results/simulate/shardlab-vllm-conv.json \
        --out results/simulate/peers.md

A value a run does not report is shown as "n/a".
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shardlab.files import markdown_table, write_text

METRICS = ("ttft_ms", "tpot_ms", "itl_ms")
STATS = ("mean", "median", "p90", "p99")
HEAD = [
    "simulator",
    "engine",
    "traffic",
    "wall s",
    *(f"{m.split('_')[0].upper()} {s}" for m in METRICS for s in STATS),
]


def _number(value: object, digits: int) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, int | float) else "n/a"


def row(who: str, engine: str, traffic: str, run: dict[str, Any]) -> list[str]:
    summary = run.get("summary", {})
    cells = [who, engine, traffic, _number(run.get("wall_s"), 2)]
    for metric in METRICS:
        stats = summary.get(metric) or {}
        cells += [_number(stats.get(s), 1) for s in STATS]
    return cells


def table(peers: Sequence[Path], shardlab: Sequence[tuple[str, str, Path]]) -> str:
    rows = []
    for path in peers:
        run = json.loads(path.read_text())
        who = f"{run['peer']} ({run['version']})" if run.get("version") else run["peer"]
        rows.append(row(who, run["engine"], run["traffic"], run))
    for engine, traffic, path in shardlab:
        rows.append(row("shardlab", engine, traffic, json.loads(path.read_text())))
    lines = markdown_table(HEAD, "lll" + "r" * (len(HEAD) - 3), rows)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--peer", type=Path, nargs="+", default=[], help="peer JSON files")
    p.add_argument(
        "--shardlab",
        nargs=3,
        action="append",
        default=[],
        metavar=("ENGINE", "TRAFFIC", "FILE"),
        help="a `shardlab simulate --json` output, its engine and traffic (repeatable)",
    )
    p.add_argument("--out", type=Path, required=True, help="the markdown file to write")
    args = sys.argv[1:] if argv is None else argv
    a = p.parse_args(args)
    shardlab = [(engine, traffic, Path(file)) for engine, traffic, file in a.shardlab]
    command = shlex.join(["python", "tests/data/peers/side_by_side.py", *args])
    head = f"# Simulators side by side\n\nMade by `{command}`.\n\n"
    write_text(a.out, head + table(a.peer, shardlab))
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
