"""The closed-loop serving regime, measured serving as input, and fits judged held out."""

from __future__ import annotations

import csv
import dataclasses
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab import ShardlabError
from shardlab.costmodel import evaluate, pool_problems
from shardlab.costmodel.collectives import axis_span
from shardlab.costmodel.engines import ServingCosts, serving_constants, serving_costs
from shardlab.costmodel.modes import ARRAYS, ARRAYS_NS, EXACT
from shardlab.costmodel.regimes import forms
from shardlab.problems.calibration import Calibration
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from shardlab.validation import load_measurements, predict
from shardlab.validation.calibrate import Rows, fit, groups_of, held_out, linearize
from shardlab.validation.serving_sample import SAMPLE, read_sample
from tests.conftest import DATA_DIR, cli_process

IN_FLIGHT = ["decode", "prefill"]


def _problem(engine: str = "trtllm", **workload: object) -> Problem:
    return Problem.build("llama-3.1-8b", "h100x1", "chat", engine=engine, **workload)


def _ttft(p: Problem, running: int, clients: int, budget: int, r: float, s: float) -> float:
    f = forms(p, IN_FLIGHT, np.array([running]), np.array([clients]), np.array([budget]), 0.0,
              arith=ARRAYS)  # fmt: skip
    assert f.ttft is not None
    rnd = r + f.iteration
    return float(f.ttft.at(rnd, s)[0])


def test_the_first_wave_weighs_one_prompt_in_p() -> None:
    """P = 1: the mean of the cohorts of one wave; P -> many: the steady wait of half
    the round under way, the round beside the prefill, and the prompt."""
    r, s = 0.02, 0.05  # round and prompt, seconds
    costs = serving_costs(_problem())
    tau, iota = costs.request_ns * 1e-9, costs.iteration_ns * 1e-9
    # 64 clients, 4 prompts of 1,024 tokens an iteration: 16 cohorts
    one = _ttft(_problem(prompts_per_client=1), 64, 64, 4096, r, s)
    assert one == pytest.approx(tau + (16 + 1) / 2 * (4 * s + 0.5 * (r + iota)))
    many = _ttft(_problem(prompts_per_client=100_000), 64, 64, 4096, r, s)
    assert many == pytest.approx(tau + s + 1.5 * (r + iota), rel=1e-3)
    ten = _ttft(_problem(), 64, 64, 4096, r, s)
    assert many < ten < one


def test_an_engine_that_prefills_alone_waits_half_a_round() -> None:
    r, s = 0.02, 0.05
    p = _problem("sglang", prompts_per_client=100_000)
    costs = serving_costs(p)
    tau, iota = costs.request_ns * 1e-9, costs.iteration_ns * 1e-9
    assert _ttft(p, 8, 8, 8192, r, s) == pytest.approx(tau + s + 0.5 * (r + iota), rel=1e-3)


def test_clients_beyond_the_running_wait_for_a_slot() -> None:
    """n clients on c slots: a request waits n / c - 1 cycles of a running one."""
    r, s, o = 0.02, 0.05, 256
    p = _problem(prompts_per_client=100_000, output_len=o)
    iota = serving_costs(p).iteration_ns * 1e-9
    alone = _ttft(p, 32, 32, 8192, r, s)
    queued = _ttft(p, 32, 96, 8192, r, s)
    cycle = s + 1.5 * (r + iota) + (o - 1) * (r + iota)
    assert queued - alone == pytest.approx(2 * cycle, rel=1e-3)


@settings(max_examples=200, deadline=None)
@given(
    c=st.integers(1, 600),
    more=st.integers(0, 600),
    budget=st.integers(1, 20_000),
    input_len=st.integers(1, 9000),
    output_len=st.integers(2, 4000),
    p=st.integers(1, 50),
    engine=st.sampled_from(["trtllm", "vllm", "sglang"]),
    kinds=st.sampled_from([IN_FLIGHT, ["prefill"]]),
)
def test_exact_and_array_forms_are_one_definition(
    c: int, more: int, budget: int, input_len: int, output_len: int, p: int, engine: str,
    kinds: list[str],
) -> None:  # fmt: skip
    """CP-SAT's fractions and the evaluators' floats come from the same function, and
    with the plan's own clients no coefficient shrinks as it runs more requests (what
    makes a floor model a relaxation of every larger concurrency)."""
    problem = _problem(
        engine, input_len=input_len, output_len=output_len, prompts_per_client=p,
        phase="prefill" if kinds == ["prefill"] else "request",
    )  # fmt: skip
    clients = c + more
    exact = forms(problem, kinds, c, clients, budget, 7, arith=EXACT)
    array = forms(
        problem, kinds, np.array([c]), np.array([clients]), np.array([budget]), 7.0,
        arith=ARRAYS_NS,
    )  # fmt: skip
    for name in ("ttft", "latency", "rate"):
        e, a = getattr(exact, name), getattr(array, name)
        for part in ("round", "prompt", "const"):
            x = getattr(e, part)
            assert isinstance(x, int | Fraction)
            want = float(np.asarray(getattr(a, part)).reshape(-1)[0])
            assert float(x) == pytest.approx(want, rel=1e-12)
            assert x >= 0
    more_running = forms(problem, kinds, c + 1, c + 1, budget, 7, arith=EXACT)
    alone = forms(problem, kinds, c, c, budget, 7, arith=EXACT)
    assert alone.ttft is not None and more_running.ttft is not None
    assert more_running.ttft.round >= alone.ttft.round
    assert more_running.ttft.prompt >= alone.ttft.prompt


def test_the_engine_costs_are_the_shipped_fit_unless_calibrated() -> None:
    shipped = serving_constants()
    p = _problem("vllm")
    assert serving_costs(p) == ServingCosts(
        request_ns=round(shipped["vllm"]["request_ms"] * 1e6),
        iteration_ns=round(shipped["vllm"]["iteration_ms"] * 1e6),
        simulated_request_ns=round(
            shipped["vllm"].get("simulated_request_ms", shipped["vllm"]["request_ms"]) * 1e6
        ),
        simulated_iteration_ns=round(
            shipped["vllm"].get("simulated_iteration_ms", shipped["vllm"]["iteration_ms"]) * 1e6
        ),
        prefill_first=False,
    )
    cal = dataclasses.replace(p, calibration=Calibration(request_ms=5.0))
    assert serving_costs(cal).request_ns == 5_000_000
    # the user's own per-request cost is the simulator's too, unless they give one apart
    assert serving_costs(cal).simulated_request_ns == 5_000_000
    both = Calibration(request_ms=5.0, simulated_request_ms=2.0)
    assert serving_costs(dataclasses.replace(p, calibration=both)).simulated_request_ns == 2_000_000
    it = Calibration(iteration_ms=0.5)
    assert serving_costs(dataclasses.replace(p, calibration=it)).simulated_iteration_ns == 500_000
    apart = dataclasses.replace(
        p, calibration=Calibration(iteration_ms=0.5, simulated_iteration_ms=0.25)
    )
    assert serving_costs(apart).simulated_iteration_ns == 250_000
    assert serving_costs(cal).iteration_ns == serving_costs(p).iteration_ns
    plain = evaluate(p, p.space.megatron_plan(Degrees(tp=1)))
    assert evaluate(cal, cal.space.megatron_plan(Degrees(tp=1))).ttft_ms != plain.ttft_ms


# -- measured serving as input -------------------------------------------------------------

SAMPLE_HEADER = (
    "id,silicon_data_source,backend,backend_version,model_path,system,precision,mode,isl,osl,"
    "gemm_quant_mode,moe_quant_mode,batch_size,tp_size,pp_size,attention_dp_size,moe_tp_size,"
    "moe_ep_size,prefill_batch_size,prefill_num_workers,prefill_tp_size,prefill_pp_size,"
    "prefill_attention_dp_size,prefill_moe_tp_size,prefill_moe_ep_size,decode_batch_size,"
    "decode_num_workers,decode_tp_size,decode_pp_size,decode_attention_dp_size,"
    "decode_moe_tp_size,decode_moe_ep_size,silicon_ttft_ms,silicon_tpot_ms\n"
)
# Made-up numbers in the sample's columns: what is read, not what was measured.
OWN_ROWS = (
    "a,db-dump; silicon_concurrency=16,vllm,0.19.0,meta-llama/Llama-3.1-70B,h100_sxm,fp8,agg,"
    "1024,1024,fp8,,16,4,1,1,4,1,,,,,,,,,,,,,,,150,20\n"
    "b,db-dump,trtllm,1.2,deepseek-ai/DeepSeek-V3,h200_sxm,fp8,disagg,1024,1024,fp8,fp8,,,,,,,"
    "1,2,8,1,1,1,8,32,1,8,1,1,1,8,400,30\n"
    "c,db-dump,trtllm,1.2,meta-llama/Llama-3.1-70B,a30,fp8,agg,1024,1024,fp8,,8,4,1,1,4,1,"
    ",,,,,,,,,,,,,,150,20\n"
    "d,db-dump,trtllm,1.2,meta-llama/Llama-3.1-70B,h100_sxm,int4,agg,1024,1024,int4_wo,,8,4,1,"
    "1,4,1,,,,,,,,,,,,,,,150,20\n"
    "e,db-dump,vllm,1.2,meta-llama/Llama-3.1-70B,h100_sxm,fp8,agg,1024,1024,fp8,,8,4,1,1,4,1,"
    ",,,,,,,,,,,,,,,-3,20\n"
    "f,db-dump,trtllm,1.2,deepseek-ai/DeepSeek-V3,h200_sxm,fp8,disagg,1024,1024,fp8,fp8,,,,,,,"
    ",,8,1,1,1,8,,,8,1,1,1,8,400,30\n"
    "g,db-dump,vllm,0.19.0,meta-llama/Llama-3.1-70B,h100_sxm,fp8,agg,1024,1024,fp8,,16,4,1,1,"
    "4,1,,,,,,,,,,,,,,,150,20\n"
)


def test_a_users_file_in_the_samples_columns_reports_its_good_rows(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(SAMPLE_HEADER + OWN_ROWS)
    measured = load_measurements(path)
    assert measured.serving and measured.duplicates == 1  # g repeats a
    assert sorted({m.id for m in measured.rows}) == ["a", "b"]
    reasons = {x.id: x.reason for x in measured.refused}
    assert sorted(reasons) == ["c", "d", "e", "f"]
    assert "system 'a30'" in reasons["c"] and "int4_wo" in reasons["d"]
    assert "silicon_ttft_ms" in reasons["e"] and "worker counts" in reasons["f"]
    a = next(m for m in measured.rows if m.id == "a" and m.metric == "ttft_ms")
    assert a.problem is not None and a.problem.workload.clients == 16
    assert a.degrees == Degrees(tp=4, etp=4) and a.engine == "vllm" and a.family == "llama-3.1"
    b = [m for m in measured.rows if m.id == "b"]
    assert {m.metric for m in b} == {"ttft_ms", "tpot_ms"}
    plan = b[0].disagg
    assert plan is not None and (plan.prefill_instances, plan.decode_instances) == (2, 1)
    assert plan.decode.requests_per_rank == 32 and plan.prefill.requests_per_rank == 1
    rows = {(m.id, m.metric): predict(m, "silicon", "trtllm") for m in measured.rows}
    assert all(r.predicted > 0 for r in rows.values())
    disagg = rows[("b", "ttft_ms")]
    assert "1P(8) + 1D(8)" not in disagg.description and "2P(8) + 1D(8)" in disagg.description


def test_a_tp_times_ep_row_is_read_as_the_run_it_measured(tmp_path: Path) -> None:
    """InferenceX's ``tp 8, ep 8`` written as tp_size 64 (or attention DP 64) with
    moe_tp_size = moe_ep_size = 8 is an 8-GPU run; the same run written as tp_size 8,
    moe_ep_size 8 (the sample's 2026-03-25 rows) repeats it."""
    path = tmp_path / "mine.csv"
    row = (
        "{id},db-dump; silicon_concurrency=64,trtllm,1.2,deepseek-ai/DeepSeek-V3,h200_sxm,fp8,"
        "agg,1024,1024,fp8,fp8,{batch},{tp},1,{dp},{moe_tp},8,,,,,,,,,,,,,,,400,{tpot}\n"
    )
    path.write_text(
        SAMPLE_HEADER
        + row.format(id="tp64", batch=64, tp=64, dp=1, moe_tp=8, tpot=30)
        + row.format(id="tp8", batch=64, tp=8, dp=1, moe_tp=1, tpot=30)
        + row.format(id="dp64", batch=1, tp=1, dp=64, moe_tp=8, tpot=31)
    )
    measured = load_measurements(path)
    assert measured.duplicates == 1 and not measured.refused
    read = {m.id: m for m in measured.rows if m.metric == "tpot_ms"}
    assert sorted(read) == ["dp64", "tp64"]
    assert read["tp64"].degrees == Degrees(tp=8, ep=8)
    assert read["dp64"].degrees == Degrees(dp_attn=8, ep=8)
    for m in read.values():
        assert m.problem is not None and m.problem.cluster.num_gpus == 8
        assert m.problem.workload.clients == 64 and not m.note
    assert read["dp64"].requests_per_rank == 8


def test_filters_keep_the_rows_asked_for_and_refuse_unknown_values(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(SAMPLE_HEADER + OWN_ROWS)
    kept = load_measurements(path, {"mode": ["disagg"], "gpu": ["h200"]})
    assert {m.id for m in kept.rows} == {"b"}
    with pytest.raises(ShardlabError, match="gpu a100x: not one of"):
        load_measurements(path, {"gpu": ["a100x"]})
    with pytest.raises(ShardlabError, match="no row matches gpu b200, family kimi-k2"):
        load_measurements(path, {"gpu": ["b200"], "family": ["kimi-k2"]})
    with pytest.raises(ShardlabError, match="filters rows of measured serving"):
        load_measurements(None, {"family": ["llama-3.1"]})


def test_the_installed_sample_is_read_with_every_refusal_explained() -> None:
    measured = read_sample(gpu=["h100"], family=["llama-3.1"], protocol=["inferencex"])
    assert measured.source == SAMPLE and len(measured.rows) >= 50
    assert {m.metric for m in measured.rows} == {"ttft_ms", "tpot_ms"}
    assert {m.gpu for m in measured.rows} == {"h100"}
    everything = read_sample()
    assert all(x.reason for x in everything.refused)
    # every system of the sample is a catalog GPU: none refused for an unknown GPU
    assert not [x for x in everything.refused if x.reason.startswith("system ")]
    assert {m.gpu for m in everything.rows} == {"h100", "h200", "b200", "b300", "gb200", "gb300"}
    reasons = " ".join(x.reason for x in everything.refused)
    assert "worker counts" in reasons


def test_a_gb200_decode_pool_of_16_gpus_is_priced_inside_its_nvlink_domain(
    tmp_path: Path,
) -> None:
    """GB200 trays hold 4 GPUs on a 72-GPU NVLink domain: a decode pool of 16 GPUs (4
    trays) keeps its expert-parallel all-to-all on NVLink, where pricing the tray as
    the domain would send it over the network."""
    path = tmp_path / "mine.csv"
    path.write_text(
        SAMPLE_HEADER
        + "nvl,db-dump; silicon_concurrency=256,trtllm,1.2,deepseek-ai/DeepSeek-V3,gb200,fp8,"
        "disagg,1024,1024,fp8,fp8,,,,,,,1,1,4,1,1,1,4,16,1,1,1,16,1,16,400,30\n"
    )
    measured = load_measurements(path)
    assert not measured.refused
    tpot = next(m for m in measured.rows if m.metric == "tpot_ms")
    assert tpot.problem is not None and tpot.disagg is not None
    cluster = tpot.problem.cluster
    assert (cluster.num_gpus, cluster.host_size, cluster.domain_size) == (20, 4, 20)
    _, decode = pool_problems(tpot.problem, tpot.disagg)
    d = tpot.disagg.decode.degrees
    assert (d.dp_attn, d.ep, decode.cluster.num_gpus) == (16, 16, 16)
    assert axis_span("ep", d, decode.cluster).nodes == 1  # one domain, over 4 hosts
    on_nvlink = predict(tpot, "silicon", "trtllm").predicted
    trays = dataclasses.replace(cluster, gpus_per_domain=4)  # as if each tray stood alone
    alone = dataclasses.replace(tpot, problem=dataclasses.replace(tpot.problem, cluster=trays))
    assert predict(alone, "silicon", "trtllm").predicted > 1.2 * on_nvlink


def test_a_fit_recovers_the_engine_costs_that_made_the_measurements(tmp_path: Path) -> None:
    """Rows priced with known per-engine costs are explained by the fit, and each model
    family held out is predicted from the others."""
    path = tmp_path / "mine.csv"
    lines = []
    for i, (engine, model, tp) in enumerate(
        [("vllm", "meta-llama/Llama-3.1-8B-Instruct", 1), ("vllm", "Qwen/Qwen3-32B", 2),
         ("sglang", "meta-llama/Llama-3.1-8B-Instruct", 1), ("sglang", "Qwen/Qwen3-32B", 2)]
    ):  # fmt: skip
        for n in (4, 16, 64):
            lines.append(
                f"r{i}-{n},db-dump,{engine},x,{model},h100_sxm,bf16,agg,1024,512,,,{n},{tp},1,1,"
                f"{tp},1,,,,,,,,,,,,,,,100,10\n"
            )
    path.write_text(SAMPLE_HEADER + "".join(lines))
    measured = load_measurements(path)
    truth = {"vllm": (40.0, 0.5), "sglang": (150.0, 1.5)}
    made = [
        dataclasses.replace(
            m,
            value=predict(
                m, "silicon", "trtllm",
                Calibration(request_ms=truth[m.engine][0], iteration_ms=truth[m.engine][1],
                            timing="silicon"),
            ).predicted,
        )
        for m in measured.rows
    ]  # fmt: skip
    rows = Rows([linearize(m, "silicon", "trtllm") for m in made])
    fitted = fit(rows, factors=False, per_engine=True)
    for engine, (request, iteration) in truth.items():
        assert fitted.request_ms[engine] == pytest.approx(request, rel=1e-3)
        assert fitted.iteration_ms[engine] == pytest.approx(iteration, rel=1e-3)
    predicted = held_out(
        rows, groups_of(rows, "family"), lambda r: fit(r, factors=False, per_engine=True)
    )
    assert np.allclose(predicted, rows.measured, rtol=1e-3)


# 12-16 s: the measured sample validated and fitted through the CLI; the fit itself is
# tested on the library above, fast
@pytest.mark.slow
def test_cli_validates_and_fits_measured_serving(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(SAMPLE_HEADER + OWN_ROWS)
    done = cli_process("validate", "--measurements", str(path), "--out", "r/v.md", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "r" / "v.md").read_text()
    assert "By GPU, engine and model family" in report and "| a | ttft_ms |" in report
    with (tmp_path / "r" / "v.csv").open() as f:
        lines = list(csv.DictReader(f))
    assert {(x["id"], x["status"]) for x in lines} >= {("a", "predicted"), ("c", "refused")}
    done = cli_process(
        "calibrate", "--measurements", str(path), "--timing", "silicon", "--engines",
        "--hold-out", "row", "--out", "e.yaml", "--report", "fit.md", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = yaml.safe_load((tmp_path / "e.yaml").read_text())
    assert set(written["engines"]) == {"vllm", "trtllm"}
    assert "leave-one-out" in (tmp_path / "fit.md").read_text()
    # shardlab's own columns filter by GPU alone; another filter is refused in one line
    done = cli_process("validate", "--gpu", "nosuch", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no row on gpu" in done.stderr
    done = cli_process("validate", "--backend", "vllm", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "gpu alone" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("engine", sorted(serving_constants()))
def test_the_shipped_engine_costs_are_the_committed_fit(engine: str) -> None:
    """shardlab/data/serving/engines.yaml is what its own command fits today. An
    engine's costs price only its own rows, so each engine is re-fitted alone."""
    measured = read_sample(protocol=["inferencex"], mode=["agg"], backend=[engine])
    rows = Rows([linearize(m, "silicon", "trtllm") for m in measured.rows])
    fitted = fit(rows, factors=False, per_engine=True)
    shipped = serving_constants()[engine]
    assert fitted.request_ms[engine] == pytest.approx(shipped["request_ms"], abs=0.01)
    assert fitted.iteration_ms[engine] == pytest.approx(shipped["iteration_ms"], abs=0.01)


def test_a_peers_estimates_of_the_same_rows_are_compared_on_the_rows_both_price(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(SAMPLE_HEADER + OWN_ROWS)
    peer = tmp_path / "peer.csv"
    peer.write_text(
        "id,status,aic_ttft_ms,aic_tpot_ms\na,ok,300,10\nb,ok,1,1\nc,failed,,\n"
    )  # b is disaggregated: not compared
    done = cli_process(
        "validate", "--measurements", str(path), "--peer", str(peer), "--out", "v.md",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "v.md").read_text()
    section = report.split("## Against AIConfigurator's own estimates")[1]
    ttft = next(line for line in section.splitlines() if "| ttft_ms |" in line)
    # a's TTFT was measured 150 ms; the peer's 300 is off by 100%, a ratio of 2
    assert "| inferencex | ttft_ms | 1 |" in ttft and "| 100.0% |" in ttft and "| 2.00 |" in ttft
    done = cli_process("validate", "--peer", str(peer), cwd=tmp_path)
    assert done.returncode == 2 and "measured serving" in done.stderr


def test_each_tool_scores_the_others_pick_on_aiconfigurators_default_problems(
    tmp_path: Path,
) -> None:
    """tests/data/aiconfigurator_default.csv (tests/data/make_aiconfigurator_default.py):
    shardlab's picks, re-priced, and AIConfigurator's picks priced by shardlab."""
    from shardlab.validation import side_by_side, write_side_by_side

    grid = DATA_DIR / "aiconfigurator_default.csv"
    rows = side_by_side(grid)
    assert [r["problem"] for r in rows] == [
        "llama70b-h100x8", "qwen235b-h200x16", "deepseek-v3-h200x16", "deepseek-v3-h100x64",
    ]  # fmt: skip
    for r in rows:
        assert r["ours_tok_s_gpu"] > 0 and r["theirs_by_us"] > 0
    write_side_by_side(rows, "test", str(grid), path=tmp_path / "s.md")
    assert (tmp_path / "s.md").read_text().count("\n| ") == 5
