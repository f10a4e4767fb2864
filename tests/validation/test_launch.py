"""What InferenceX launches (shardlab.validation.protocol.inferencex_trtllm_launch), and
its TensorRT-LLM rows replayed under it (shardlab.validation.replay.launch_of)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from shardlab.simulate.schedulers import Holding
from shardlab.validation import load_measurements
from shardlab.validation import replay as replay_module
from shardlab.validation.protocol import inferencex_trtllm_launch
from shardlab.validation.replay import launch_of, replay
from tests.validation.test_protocol import PERCENTILES


def test_the_scripts_launch_rules() -> None:
    """The balance with attention DP on every script; batch waiting only in the B200 FP8
    one at 1024/1024 with 64 to 255 clients; ``max_num_tokens`` the clients, the input
    and 64 rounded up to 64, at least 8192; nothing for a GPU no script runs."""
    launch = inferencex_trtllm_launch
    dp = launch(gpu="h200", weights="fp8", dp_attn=8, input_len=8192, output_len=1024, clients=64)
    assert dp is not None and dp.holding == Holding(
        adp_balance=True, adp_timeout_iters=60, adp_batching_wait_iters=0
    )
    assert dp.max_num_tokens == 8320 and "dsr1_fp8_h200_trt.sh" in dp.source
    more = launch(gpu="h200", weights="fp8", dp_attn=8, input_len=8192, output_len=1024,
                  clients=100)  # fmt: skip
    assert more is not None and more.max_num_tokens == 8384  # 8356 rounded up to 64
    tp = launch(gpu="b200", weights="fp8", dp_attn=1, input_len=1024, output_len=1024, clients=64)
    assert tp is not None and tp.max_num_tokens == 8192
    assert tp.holding == Holding(batch_wait_timeout_iters=40, batch_wait_max_tokens_ratio=0.8)
    for clients in (32, 256):
        other = launch(gpu="b200", weights="fp8", dp_attn=1, input_len=1024, output_len=1024,
                       clients=clients)  # fmt: skip
        assert other is not None and other.holding == Holding()
    fp4 = launch(gpu="b200", weights="fp4", dp_attn=1, input_len=1024, output_len=1024, clients=64)
    assert fp4 is not None and fp4.holding == Holding()
    assert launch(gpu="h100", weights="fp8", dp_attn=8, input_len=1024, output_len=1024,
                  clients=64) is None  # fmt: skip


def test_only_inferencex_aggregated_trtllm_rows_get_its_launch() -> None:
    rows = load_measurements(PERCENTILES).rows
    launched = [m for m in rows if launch_of(m) is not None]
    assert launched and all(m.engine == "trtllm" and m.disagg is None for m in launched)
    assert {m.engine for m in rows if m.disagg is None} - {"trtllm"} == {"sglang"}
    balanced = {m.id for m in launched if launch_of(m).holding.adp_balance}  # type: ignore[union-attr]
    assert balanced == {
        m.id for m in rows if m.engine == "trtllm" and m.disagg is None and m.degrees.dp_attn > 1
    }


def test_a_replay_runs_an_inferencex_row_as_its_script_launched_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same row replayed under the launch and under the engine's defaults: the
    balance holds prompts back, so the median TTFT grows; the TPOT barely moves."""
    path = tmp_path / "ix.csv"
    path.write_text(
        "id,model,cluster,tp,dp_attn,ep,etp,phase,schedule,batch,input_len,output_len,"
        "weight_dtype,kv_dtype,engine,metric,statistic,value,clients,prompts_per_client,"
        "length_range,source\n"
        + "".join(
            f"x,deepseek-v3,b200x8,1,8,8,1,request,inflight,32,1024,1024,fp8,fp8,trtllm,"
            f"{metric},median,{value},32,10,0.8,InferenceX run 1/1 2026-01-01\n"
            for metric, value in (("ttft_ms", 500.0), ("tpot_ms", 10.0))
        )
    )
    rows = load_measurements(path).rows
    mixtral = tmp_path / "mixtral.csv"
    mixtral.write_text(
        path.read_text().replace("deepseek-v3,b200x8,1,8,8", "mixtral-8x7b,b200x4,1,4,4")
    )
    assert launch_of(rows[0]) is not None
    # the scripts are DeepSeek-R1's: another model's row keeps the engine's defaults
    other = dataclasses.replace(rows[0], problem=load_measurements(mixtral).rows[0].problem)
    assert launch_of(other) is None
    tables: dict = {}
    launched = {r.measurement.metric: r.simulated for r in replay(rows, "silicon", tables=tables)}
    monkeypatch.setattr(replay_module, "launch_of", lambda m: None)
    default = {r.measurement.metric: r.simulated for r in replay(rows, "silicon", tables=tables)}
    assert launched["ttft_ms"] > 1.5 * default["ttft_ms"]
    assert launched["tpot_ms"] == pytest.approx(default["tpot_ms"], rel=0.1)
