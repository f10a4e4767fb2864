"""``shardlab explain``'s memory line: every share of a GPU's memory budget named, the
shares adding up to the total, the engine's own share as its budget sets it."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import run_cli

ARGS = ["explain", "--model", "llama-3.1-70b", "--cluster", "h100x8", "--tp", "8", "--top", "1"]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_the_memory_shares_add_up_to_the_total(engine: str, capsys, monkeypatch) -> None:
    code, out, err = run_cli([*ARGS, "--engine", engine], capsys, monkeypatch)
    assert code == 0, err
    (line,) = [x for x in out.splitlines() if x.startswith("  memory ")]
    total = float(re.match(r"  memory ([\d.]+) of", line).group(1))
    parts = line.split(" = ")[1]
    # each share is "name GB (what sets it)"; the notes' own numbers are not shares
    shares = [float(g) for g in re.findall(r"(?:^| \+ )[A-Za-z ]+ ([\d.]+)", parts)]
    assert len(shares) == (3 if engine == "sglang" else 5)
    assert sum(shares) == pytest.approx(total, abs=0.005 * (len(shares) + 1))

    code, out, err = run_cli([*ARGS, "--engine", engine, "--format", "json"], capsys, monkeypatch)
    assert code == 0, err
    data = json.loads(out)
    by_name = {s["name"]: s["gb"] for s in data["memory_shares"]}
    total = data["memory_gb_per_gpu"]
    assert sum(by_name.values()) == pytest.approx(total, rel=1e-12)
    assert by_name["weights"] == data["weights_gb"] and by_name["kv_cache"] == data["kv_cache_gb"]
    if engine == "vllm":  # everything within gpu_memory_utilization 0.92 of the budget
        assert by_name["left_free"] == pytest.approx(total * (1 - 0.92), rel=1e-9)
        assert by_name["runtime_reserve"] == 3.9
    elif engine == "trtllm":  # the KV cache takes 0.9 of what the rest leaves free
        assert by_name["left_free"] == pytest.approx(by_name["kv_cache"] * (1 / 0.9 - 1))
    else:  # weights and KV within mem_fraction_static, the rest SGLang's reserve
        static = (by_name["weights"] + by_name["kv_cache"]) / total
        assert 0.7 < static < 0.9 and "activations" not in by_name
        assert f"mem_fraction_static {static:.3f}" in line
