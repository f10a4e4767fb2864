"""shardlab.solve: the one entry every caller goes through, and the Solution it returns."""

from __future__ import annotations

import json

import pytest

from shardlab import Problem
from shardlab.errors import ShardlabError
from shardlab.solvers import Budget, get_solver, solve
from shardlab.solvers.base import quality

PROBLEM = Problem.build("llama-3.1-8b", "h100x2")
FEW = Budget(max_evals=200)


def test_the_megatron_baseline_is_the_rules_plan_priced_as_a_solve_prices() -> None:
    s = solve(PROBLEM, "random", budget=FEW, seed=1)
    rule = get_solver("megatron").solve(PROBLEM, seed=1)
    assert s.megatron is not None and s.megatron.plan == rule.plan
    assert s.megatron.metrics == rule.metrics
    assert s.megatron.ratio == quality(s.metrics.objective, rule.metrics.objective)
    assert s.to_dict()["baseline"]["ratio"] == s.megatron.ratio
    assert solve(PROBLEM, "random", budget=FEW, seed=1, baseline=False).megatron is None


def test_same_seed_same_solution() -> None:
    a = solve(PROBLEM, "anneal", budget=FEW, seed=3, baseline=False)
    b = solve(PROBLEM, "anneal", budget=FEW, seed=3, baseline=False)
    assert a.plan == b.plan and a.objective == b.objective


def test_the_objective_given_replaces_the_workloads() -> None:
    s = solve(PROBLEM, "random", objective="throughput_per_gpu", budget=FEW, baseline=False)
    assert s.problem.workload.objective == "throughput_per_gpu"
    assert s.objective == pytest.approx(s.metrics.throughput_tok_s_per_gpu)


def test_an_unmet_slo_is_reported_not_raised() -> None:
    tight = Problem.build("llama-3.1-8b", "h100x2", tpot_ms=0.01)
    s = solve(tight, "random", budget=FEW, baseline=False)
    assert s.status == "infeasible" and s.unmet() and "tpot" in s.unmet().lower()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"vs_free": True}, "space"),  # the free space compared with itself
        ({"objective": "pareto", "serving": "disagg"}, "serving"),
        ({"serving": "best", "method": "random"}, "method"),  # pools must be proven
    ],
)
def test_what_cannot_be_solved_is_refused_with_its_field(kwargs: dict, field: str) -> None:
    method = kwargs.pop("method", "cpsat")
    with pytest.raises(ShardlabError) as e:
        solve(PROBLEM, method, **kwargs)
    assert e.value.field == field


def test_an_option_the_method_does_not_take_is_refused_before_a_search() -> None:
    with pytest.raises(ShardlabError, match="'sampler' does not apply to method 'random'") as e:
        solve(PROBLEM, "random", options={"sampler": "gp"})
    assert e.value.field == "sampler"


def test_the_written_plan_is_the_chosen_one() -> None:
    s = solve(PROBLEM, "random", budget=FEW, baseline=False)
    # with the engine and GPU it was priced for, which launch holds it to
    assert json.loads(s.plan_json()) == s.plan.to_dict(
        PROBLEM.model, cluster="h100x2", engine=PROBLEM.engine, accelerator="h100"
    )
