"""Pareto mode: fronts, their exactness under CP-SAT, Optuna's multi-objective search,
and the CLI's table, figure and JSON."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from shardlab import Problem, ShardlabError
from shardlab.cli import app
from shardlab.costmodel import evaluate, evaluate_batch, evaluate_points
from shardlab.problems.suite import get_instance
from shardlab.problems.workload import Workload
from shardlab.solvers import Budget, solve
from shardlab.solvers.cpsat import SWEEP_STEP
from shardlab.solvers.exhaustive import enumerate_codes
from shardlab.solvers.front import Front, dominates, minimized, nondominated
from shardlab.solvers.pareto import at_batch, concurrency_levels, solve_front
from shardlab.solvers.registry import get_solver

# Points closer than this (relative) may differ between CP-SAT's integer tables and the
# float cost model, and the sweep steps this far below the last latency.
RTOL = 2e-4


def every_plan(problem: Problem) -> np.ndarray:
    space = problem.space
    return np.concatenate(
        [c for d in range(space.num_degree_tuples) for c in enumerate_codes(space, d)]
    )


# -- the front itself ---------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(*[st.integers(0, 6)] * 3),
        min_size=1,
        max_size=40,
    )
)
def test_nondominated_keeps_exactly_the_undominated_points(points) -> None:
    v = np.array(points, dtype=float)
    keep = nondominated(v)
    assert keep.any()
    for i in range(len(v)):
        dominated_by = [j for j in range(len(v)) if (v[j] <= v[i]).all() and (v[j] < v[i]).any()]
        first_equal = min(j for j in range(len(v)) if (v[j] == v[i]).all())
        assert keep[i] == (not dominated_by and first_equal == i)


def test_latency_axes_follow_the_workload() -> None:
    assert Workload(phase="prefill", objective="pareto").latency_axes == ("ttft_ms",)
    assert Workload(phase="decode").latency_axes == ("tpot_ms",)
    assert Workload(input_len=1024, output_len=256).latency_axes == ("tpot_ms",)
    assert Workload(input_len=32768, output_len=512).latency_axes == ("tpot_ms", "ttft_ms")
    assert "Pareto front of throughput per GPU vs TPOT" in Workload(objective="pareto").describe()
    with pytest.raises(ShardlabError, match="objective"):
        Workload(objective="fastest")  # type: ignore[arg-type]


def test_concurrency_levels() -> None:
    assert concurrency_levels(256) == (256, 128, 64, 32, 16, 8, 4, 2, 1)
    assert concurrency_levels(100) == (100, 64, 32, 16, 8, 4, 2, 1)
    assert concurrency_levels(1) == (1,)


def test_pareto_ranks_plans_by_throughput_per_gpu() -> None:
    base = Problem.build("llama-3.1-8b", "h100x2", "chat")
    par = Problem.build("llama-3.1-8b", "h100x2", "chat", objective="pareto")
    codes = base.space.sample(50, seed=0)
    a, b = evaluate_batch(base, codes), evaluate_batch(par, codes)
    np.testing.assert_allclose(b.objective, a.throughput_tok_s_per_gpu)


def test_every_method_reports_the_front_of_the_plans_it_priced() -> None:
    problem = Problem.build("llama-3.1-70b", "h100x4", "chat", objective="pareto")
    r = solve(problem, "random", budget=Budget(max_evals=400), seed=1)
    assert len(r.front) >= 2  # this instance's KV cache limits concurrency: a real trade-off
    tpots = [p.metrics.tpot_ms for p in r.front]
    assert tpots == sorted(tpots)
    for p in r.front:
        assert p.metrics.feasible and p.batch == 256
        assert not any(dominates(problem, q.metrics, p.metrics) for q in r.front)
    assert r.metrics is not None
    assert r.metrics.objective == pytest.approx(
        max(p.metrics.throughput_tok_s_per_gpu for p in r.front)
    )


# -- CP-SAT: exact --------------------------------------------------------------------------


@pytest.mark.slow
def test_cpsat_front_is_the_exhaustive_front_with_two_latency_axes() -> None:
    # long prompts: TPOT and TTFT are both axes; 69,998 plans, all priced here.
    problem = Problem.build("llama-3.1-8b", "h100x2", "long-context", objective="pareto")
    assert problem.workload.latency_axes == ("tpot_ms", "ttft_ms")
    codes = every_plan(problem)
    assert len(codes) == problem.space.num_plans()
    exact = Front(problem)
    exact.add(codes, evaluate_points(problem, codes)[1])
    r = solve(problem, "cpsat", budget=Budget(max_evals=None, seconds=300), seed=0)
    assert r.status == "optimal"
    assert len(exact) >= 2
    got = np.concatenate([minimized(problem, p.metrics) for p in r.front])
    want = exact.values
    # Every CP-SAT point is on the exhaustive front (within the tables' rounding) ...
    for g in got:
        assert not ((want <= g - RTOL * np.abs(g)).all(axis=1)).any(), g
    # ... and covers every exhaustive point within the sweep's resolution: points
    # closer than SWEEP_STEP in TTFT count as one (CpSatSolver._front_by_subproblem).
    for v in want:
        assert ((got <= v + 2 * SWEEP_STEP * np.abs(v)).all(axis=1)).any(), v


# The small instances, at every concurrency level (None) or at some: where the KV cache
# limits concurrency (llama70b-h100x4-chat at 128 and 256) CP-SAT's SLO-bounded solves
# take minutes, too long for CI.
FRONT_LEVELS = {
    "llama8b-h100x2-chat": None,
    "mixtral8x7b-h100x4-chat": None,
    "llama8b-h100x4-latency": None,
    "qwen32b-a100x4-offline": (256,),
    "gptoss-h100x4-interactive": (32,),
    "llama70b-h200x4-prefill": (16, 4, 1),
    "llama70b-h100x4-chat": (64, 8),
}


@pytest.mark.slow
@pytest.mark.parametrize("instance", list(FRONT_LEVELS))
def test_no_optuna_point_dominates_a_cpsat_point(instance: str) -> None:
    problem = get_instance(instance).problem()
    levels = FRONT_LEVELS[instance]
    exact = solve_front(
        problem, "cpsat", budget=Budget(max_evals=None, seconds=600), seed=0, levels=levels
    )
    assert exact.status == "optimal"
    n = len(levels or concurrency_levels(problem.workload.batch))
    found = solve_front(
        problem, "optuna", budget=Budget(max_evals=100 * n, seconds=120), seed=0, levels=levels
    )
    assert found.front
    for o in found.front:
        for c in exact.front:
            assert not dominates(problem, o.metrics, c.metrics, rtol=RTOL), (o, c)
    # and CP-SAT's front covers Optuna's: each Optuna point is matched or dominated
    for o in found.front:
        assert any(
            dominates(problem, c.metrics, o.metrics, rtol=0)
            or np.allclose(minimized(problem, c.metrics), minimized(problem, o.metrics), rtol=RTOL)
            for c in exact.front
        )


def test_cpsat_front_over_levels_is_proven_and_sorted() -> None:
    problem = Problem.build("llama-3.1-8b", "h100x2", "chat", batch=64, objective="pareto")
    r = solve_front(problem, "cpsat", budget=Budget(max_evals=None, seconds=300), seed=0)
    assert r.status == "optimal"
    assert [b for b, _ in r.runs] == [64]  # in flight the concurrency is each plan's own
    assert all(p.plan.requests_per_rank is not None for p in r.front)
    assert len({p.plan.requests_per_rank for p in r.front}) > 1
    tpots = [p.metrics.tpot_ms for p in r.front]
    assert tpots == sorted(tpots)
    for p in r.front:  # every point is priced at its own batch
        assert p.metrics == evaluate(at_batch(problem, p.batch), p.plan)
    for _, level in r.runs:  # the merge keeps what no other level beats
        for q in level.front:
            assert any(
                dominates(problem, p.metrics, q.metrics)
                or (minimized(problem, p.metrics) == minimized(problem, q.metrics)).all()
                for p in r.front
            )
    assert r.megatron and all(m.metrics.feasible for m in r.megatron)


# -- Optuna -------------------------------------------------------------------------------


@pytest.mark.parametrize("sampler", ["nsga2", "tpe", "random"])
def test_optuna_pareto_is_multi_objective(sampler: str) -> None:
    problem = Problem.build("llama-3.1-70b", "h100x4", "chat", objective="pareto")
    r = get_solver("optuna", sampler=sampler).solve(problem, budget=Budget(max_evals=150), seed=0)
    assert r.status == "feasible"
    assert r.facts["sampler"] == sampler
    assert r.facts["study_front_trials"] >= 1
    assert r.front and r.n_evals == 150


def test_optuna_pareto_refuses_a_single_objective_sampler() -> None:
    problem = Problem.build("llama-3.1-8b", "h100x2", "chat", objective="pareto")
    with pytest.raises(ShardlabError, match="cmaes optimizes one objective"):
        get_solver("optuna", sampler="cmaes").solve(problem, budget=Budget(max_evals=5))


def test_optuna_pareto_refuses_a_single_objective_study(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    single = Problem.build("llama-3.1-8b", "h100x2", "chat")
    get_solver("optuna", storage=url, study="x").solve(single, budget=Budget(max_evals=5))
    pareto = dataclasses.replace(
        single, workload=dataclasses.replace(single.workload, objective="pareto")
    )
    with pytest.raises(ShardlabError, match="objective"):
        get_solver("optuna", storage=url, study="x").solve(pareto, budget=Budget(max_evals=5))


# -- the command line -----------------------------------------------------------------------


def test_cli_pareto_json_table_and_figure(tmp_path) -> None:
    runner = CliRunner()
    png = tmp_path / "front.png"
    args = [
        "solve",
        "--method",
        "optuna",
        "--model",
        "llama-3.1-8b",
        "--cluster",
        "h100x2",
        "--batch",
        "16",
        "--objective",
        "pareto",
        "--max-evals",
        "250",
        "--plot",
        str(png),
    ]
    res = runner.invoke(app, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    front = data["pareto"]
    assert front and {"batch", "plan", "metrics"} <= set(front[0])
    tpots = [p["metrics"]["tpot_ms"] for p in front]
    assert tpots == sorted(tpots)
    assert data["plan"] is not None and data["megatron"]
    assert {lv["batch"] for lv in data["levels"]} == {16}
    assert all(p["plan"]["requests_per_rank"] >= 1 for p in front)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.tmp"))
    plan_file = tmp_path / "best.json"
    res = runner.invoke(app, [*args, "--out", str(plan_file)])
    assert res.exit_code == 0, res.output
    assert "Pareto front" in res.stdout and "Megatron plan per batch" in res.stdout
    assert json.loads(plan_file.read_text())["degrees"] == data["plan"]["degrees"]


def test_static_fronts_are_solved_at_every_power_of_two_of_the_batch() -> None:
    problem = Problem.build(
        "llama-3.1-8b", "h100x2", "batch-offline", batch=8, output_len=64, objective="pareto"
    )
    r = solve_front(problem, "cpsat", budget=Budget(max_evals=None, seconds=300), seed=0)
    assert r.status == "optimal"
    assert [b for b, _ in r.runs] == [8, 4, 2, 1]
    assert r.front and all(p.plan.requests_per_rank is None for p in r.front)
    for p in r.front:
        assert p.metrics == evaluate(at_batch(problem, p.batch), p.plan)
