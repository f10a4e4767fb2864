"""Disaggregated serving: the handoff, a plan's metrics, the JSON, the CLI, and CP-SAT's
disaggregated optimum against exhaustive enumeration of every pair of plans."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from shardlab.costmodel import evaluate_batch
from shardlab.costmodel.disagg import evaluate_disagg, instance_rate
from shardlab.costmodel.handoff import handoff_seconds
from shardlab.errors import ShardlabError
from shardlab.problems import Problem
from shardlab.problems.disagg import (
    DisaggPlan,
    decode_problem,
    fits,
    in_one_domain,
    instance_sizes,
    pairs,
    prefill_problem,
)
from shardlab.solvers import Budget
from shardlab.solvers.cpsat.disagg import solve_disagg
from shardlab.solvers.exhaustive import enumerate_codes
from tests.conftest import run_cli


def brute_force(problem: Problem) -> float:
    """The best served request rate over every pair of pools and every pair of plans
    (each pool's plans enumerated and priced, the prefill plans under the handoff to
    each decode plan's layout): no bounds, no CP-SAT, no pruning."""
    w = problem.workload
    best = 0.0
    for gp, x, gd, y in pairs(problem.cluster):
        one = in_one_domain(problem.cluster, x * gp + y * gd)
        try:
            dp = decode_problem(problem, gd, y)
        except ShardlabError:
            continue
        codes = np.concatenate(
            [c for d in range(dp.space.num_degree_tuples) for c in enumerate_codes(dp.space, d)]
        )
        m = evaluate_batch(dp, codes)
        decode_rates = np.where(m.feasible, instance_rate(problem, dp, m.throughput_tok_s), 0.0)
        layouts = [
            (dp.space.degree_tuples[i].pp, dp.space.degree_tuples[i].tp) for i in codes[:, 0]
        ]
        prefill_best: dict[tuple[int, int], float] = {}
        for layout in set(layouts):
            try:
                pp_problem = prefill_problem(
                    problem, gp, x, decode_pp=layout[0], decode_tp=layout[1], one_domain=one
                )
            except ShardlabError:
                prefill_best[layout] = 0.0
                continue
            space = pp_problem.space
            pcodes = np.concatenate(
                [c for d in range(space.num_degree_tuples) for c in enumerate_codes(space, d)]
            )
            pm = evaluate_batch(pp_problem, pcodes)
            rates = np.where(
                pm.feasible, instance_rate(problem, pp_problem, pm.throughput_tok_s), 0
            )
            prefill_best[layout] = float(rates.max())
        for rd, layout in zip(decode_rates, layouts, strict=True):
            best = max(best, min(x * prefill_best[layout], y * float(rd)))
    assert w.output_len > 1
    return best


# SLOs picked (under this cost model) where the search has work: with none the handoff
# cannot bind; at 181.2 ms the TTFT a 1-GPU prefill instance meets depends on the
# decode layout it hands off to (the decode optimum's layout loses, another wins); at
# 181.0 ms several pairs of pools are evaluated before the rest are pruned.
TINY = {
    "free": {},
    "layouts": {"ttft_ms": 181.2, "tpot_ms": 8.0},
    "pairs": {"ttft_ms": 181.0, "tpot_ms": 10.0},
}


@pytest.mark.slow
@pytest.mark.parametrize("slo", sorted(TINY))
def test_cpsat_disaggregated_optimum_equals_exhaustive_enumeration(slo: str) -> None:
    problem = Problem.build(
        "llama-3.1-8b", "h100x4", "chat", input_len=4096, output_len=128, **TINY[slo]
    )
    r = solve_disagg(problem, budget=Budget(max_evals=None, seconds=600.0))
    truth = brute_force(problem)
    if truth == 0.0:
        assert r.status == "infeasible" and r.plan is None
        return
    assert r.status == "optimal" and r.metrics is not None and r.plan is not None
    assert r.metrics.request_rate == pytest.approx(truth, rel=1e-9)
    # the plan re-evaluates to what the search reported
    again = evaluate_disagg(problem, r.plan)
    assert again.feasible and again.throughput_tok_s == pytest.approx(
        r.metrics.throughput_tok_s, rel=1e-12
    )


def test_handoff_time_follows_bytes_links_and_layouts() -> None:
    base = Problem.build("llama-3.1-70b", "h100x16", "chat", input_len=8192)
    net = prefill_problem(base, 8, 1, decode_pp=1, decode_tp=4, one_domain=False)
    nvl = prefill_problem(base, 4, 1, decode_pp=1, decode_tp=4, one_domain=True)
    assert net.handoff is not None and nvl.handoff is not None
    # Llama-3.1-70B: 80 layers x 8 KV heads x 128 x (K, V) x 2 bytes per token, 8,192 tokens
    assert net.handoff.received_bytes == pytest.approx(80 * 8 * 128 * 2 * 2 * 8192)
    same_layout = float(handoff_seconds(net, 1, 4))
    other = float(handoff_seconds(net, 1, 8))
    assert same_layout > 0 and other > same_layout  # a relayout costs an HBM pass
    assert float(handoff_seconds(nvl, 1, 4)) < same_layout  # NVLink beats the network
    assert float(handoff_seconds(net, 1, 1)) > same_layout  # one sender is the busiest
    longer = prefill_problem(
        Problem.build("llama-3.1-70b", "h100x16", "chat", input_len=16384),
        8,
        1,
        decode_pp=1,
        decode_tp=4,
        one_domain=False,
    )
    assert float(handoff_seconds(longer, 1, 4)) > same_layout
    assert float(handoff_seconds(base, 1, 4)) == 0.0  # no pool, no handoff


def test_ttft_includes_the_handoff_and_throughput_does_not() -> None:
    base = Problem.build("llama-3.1-8b", "h100x8", "chat", input_len=4096)
    with_h = prefill_problem(base, 2, 1, decode_pp=1, decode_tp=2, one_domain=False)
    import dataclasses

    without = dataclasses.replace(with_h, handoff=None)
    codes = with_h.space.sample(64, seed=0)
    a, b = evaluate_batch(with_h, codes), evaluate_batch(without, codes)
    h = handoff_seconds(with_h, *np.array([[d.pp, d.tp] for d in with_h.space.degree_tuples]).T)
    np.testing.assert_allclose(a.ttft_ms - b.ttft_ms, h[codes[:, 0]] * 1e3, rtol=1e-9)
    np.testing.assert_allclose(a.throughput_tok_s, b.throughput_tok_s, rtol=1e-12)


def test_pairs_fit_the_cluster() -> None:
    for cluster in ("h100x4", "h100x16", "h100x64"):
        c = Problem.build("llama-3.1-8b", cluster).cluster
        sizes = instance_sizes(c)
        assert all(s < c.num_gpus for s in sizes)
        for gp, x, gd, y in pairs(c):
            assert gp in sizes and gd in sizes and x * gp + y * gd <= c.num_gpus
    c = Problem.build("llama-3.1-8b", "h100x16").cluster
    assert fits(c, {8: 1, 4: 2}) and not fits(c, {8: 2, 4: 1})


def test_plan_json_round_trips_and_checks_its_cluster(tmp_path: Path) -> None:
    problem = Problem.build(
        "llama-3.1-70b", "h100x16", "chat", input_len=8192, ttft_ms=2000.0, tpot_ms=50.0
    )
    r = solve_disagg(problem, budget=Budget(max_evals=None, seconds=600.0))
    assert r.status == "optimal" and r.plan is not None and r.metrics is not None
    data = r.plan.to_dict(problem.model, cluster=problem.cluster.name)
    for pool in ("prefill", "decode"):
        assert {"degrees", "options", "instances"} <= set(data[pool])
    back = DisaggPlan.from_dict(
        json.loads(json.dumps(data)), problem.model, where="x", cluster=problem.cluster
    )
    assert back == r.plan
    assert evaluate_disagg(problem, back).throughput_tok_s == r.metrics.throughput_tok_s
    other = Problem.build("llama-3.1-70b", "h100x8").cluster
    with pytest.raises(ShardlabError, match="for cluster"):
        DisaggPlan.from_dict(data, problem.model, where="x", cluster=other)
    crowded = {**data, "cluster": ""}
    crowded["prefill"] = {**data["prefill"], "instances": 99}
    with pytest.raises(ShardlabError, match="cannot hold"):
        DisaggPlan.from_dict(crowded, problem.model, where="x", cluster=problem.cluster)


# llama-3.1-8b on two H100 serves chat (1,024 tokens in, 256 out) best disaggregated,
# and short prompts with long outputs (256 in, 1,024 out) aggregated: each outcome of
# the choice is checked.
@pytest.mark.parametrize(
    ("engine", "lengths", "winner"),
    [("trtllm", [], "disagg"), ("vllm", ["--input-len", "256", "--output-len", "1024"], "agg")],
)
def test_solve_best_reports_both_and_writes_the_chosen_plan(
    engine: str, lengths: list[str], winner: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    out = tmp_path / "plan.json"
    problem = ["--model", "llama-3.1-8b", "--cluster", "h100x2", "--engine", engine, *lengths]
    args = ["solve", "--serving", "best", *problem, "--format", "json", "--out", str(out)]
    code, stdout, _ = run_cli(args, capsys, monkeypatch)
    assert code == 0
    data = json.loads(stdout)
    assert data["agg"]["status"] == "optimal" and data["disagg"]["status"] == "optimal"
    agg = data["agg"]["metrics"]["throughput_tok_s"]
    dis = data["disagg"]["metrics"]["throughput_tok_s"]
    assert data["disagg_over_agg"] == pytest.approx(dis / agg)
    assert data["chosen"] == ("disagg" if dis > agg else "agg") == winner
    written = json.loads(out.read_text())
    # the file also records what launch holds it to: the engine and GPU it was priced on
    assert (written.pop("engine"), written.pop("accelerator")) == (engine, "h100")
    assert written == data[winner]["plan"]
    # explain reads the plan file written, either kind, and shows what was chosen
    code, stdout, err = run_cli(["explain", *problem, "--plan", str(out)], capsys, monkeypatch)
    assert code == 0, err
    pools = "prefill pool" in stdout and "decode pool" in stdout
    assert pools == (winner == "disagg")
    assert f"throughput {max(agg, dis):,.0f} tok/s" in stdout


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--serving", "disagg", "--method", "anneal"], "searched by cpsat"),
        (["--serving", "disagg", "--phase", "prefill"], "phase"),
        (["--serving", "disagg", "--schedule", "static"], "in flight"),
        (["--serving", "disagg", "--objective", "latency"], "maximizes throughput"),
        (["--serving", "sideways"], "--serving"),
    ],
)
def test_what_disaggregated_serving_refuses(extra: list[str], needle: str, capsys, monkeypatch):
    code, _, err = run_cli(["solve", "--model", "llama-3.1-8b", *extra], capsys, monkeypatch)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_a_time_limit_ends_the_search_with_its_best_pair_so_far() -> None:
    from shardlab.problems.suite import get_instance
    from tests.conftest import within_limit

    problem = get_instance("deepseek-v3-h100x64-prefill-heavy").problem()
    start = time.perf_counter()
    r = solve_disagg(problem, budget=Budget(max_evals=None, seconds=3.0))
    wall = time.perf_counter() - start
    assert within_limit(wall, 3.0), wall
    assert r.status in ("feasible", "unknown") and "time limit" in r.message
    assert r.facts.get("ran_out_in")


def test_a_cluster_with_too_many_pairs_of_pools_is_refused() -> None:
    c = Problem.build("deepseek-v3", "h100x2048").cluster
    with pytest.raises(ShardlabError, match="pairs of pools"):
        pairs(c)
