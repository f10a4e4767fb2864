"""shardlab.solve: the one entry every caller goes through, and the Solution it returns."""

from __future__ import annotations

import json
import time

import pytest

from shardlab import Problem
from shardlab.errors import ShardlabError
from shardlab.problems.disagg import DisaggPlan
from shardlab.solvers import Budget, get_solver, solve
from shardlab.solvers.base import quality
from shardlab.solvers.options import CpSatOptions, SolverOptions

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


# An engine's space on a small problem: the free-space comparison applies, and CP-SAT
# proves each mode in seconds.
ENGINE = Problem.build("llama-3.1-8b", "h100x2", engine="vllm", space_kind="engine")
RATE = Problem.build("llama-3.1-8b", "h100x2", rate=5.0, objective="request_rate")


@pytest.fixture
def no_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any search fails the test: a refusal comes before one."""

    def searched(*args: object, **kwargs: object) -> None:
        raise AssertionError("a search ran before the refusal")

    from shardlab.solvers import pareto
    from shardlab.solvers.base import Solver
    from shardlab.solvers.cpsat import disagg

    monkeypatch.setattr(Solver, "solve", searched)
    monkeypatch.setattr(disagg.DisaggSearch, "run", searched)
    monkeypatch.setattr(pareto, "solve_front", searched)


@pytest.mark.parametrize(
    ("problem", "kwargs", "field"),
    [
        (PROBLEM, {"vs_free": True}, "space"),  # the free space compared with itself
        (PROBLEM, {"objective": "pareto", "serving": "disagg"}, "serving"),
        (ENGINE, {"objective": "pareto", "vs_free": True}, "vs_free"),  # a front has no ratio
        (PROBLEM, {"serving": "best", "method": "random"}, "method"),  # pools must be proven
        (PROBLEM, {"serving": "disagg", "method": "anneal"}, "method"),
        (PROBLEM, {"serving": "sideways"}, "serving"),
        (PROBLEM, {"serving": "disagg", "objective": "latency"}, "workload.objective"),
        (PROBLEM, {"serving": "disagg", "budget": Budget(max_evals=50)}, "max_evals"),
        (PROBLEM, {"serving": "best", "budget": Budget(max_evals=50)}, "max_evals"),
        (RATE, {"serving": "disagg"}, "rate"),
        (RATE, {"objective": "pareto"}, "workload.objective"),
        (PROBLEM, {"method": "random", "options": {"sampler": "gp"}}, "sampler"),
    ],
)
def test_what_a_mode_cannot_honour_is_refused_before_a_search(
    problem: Problem, kwargs: dict, field: str, no_search: None
) -> None:
    method = kwargs.pop("method", "cpsat")
    with pytest.raises(ShardlabError) as e:
        solve(problem, method, **kwargs)
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


def test_without_a_baseline_a_front_prices_no_megatron_plan() -> None:
    kw = {"objective": "pareto", "budget": FEW}
    assert solve(PROBLEM, "random", **kw).pareto.megatron
    assert solve(PROBLEM, "random", baseline=False, **kw).pareto.megatron == ()


@pytest.mark.parametrize("serving", ["disagg", "best"])
def test_both_baselines_measure_the_chosen_plan_in_every_serving_mode(serving: str) -> None:
    s = solve(ENGINE, "cpsat", serving=serving, vs_free=True)
    assert s.status == "optimal" and s.metrics is not None
    assert s.megatron is not None and s.megatron.metrics is not None
    assert s.megatron.ratio == quality(s.objective, s.megatron.metrics.objective)
    free = s.free
    assert free is not None and free.metrics is not None and not free.partial
    assert free.status == "optimal" and free.space == "free"
    # the free space holds the engine's: its optimum is at least the chosen plan's
    assert free.ratio == pytest.approx(free.metrics.objective / s.objective, rel=1e-12)
    assert free.ratio >= 1 - 1e-9
    # searched in the chosen plan's serving mode
    assert isinstance(free.plan, DisaggPlan) == (s.chosen == "disagg")
    data = s.to_dict()
    assert data["baseline"]["ratio"] == s.megatron.ratio
    assert data["free"]["ratio"] == free.ratio and data["free"]["partial"] is False


def test_the_free_baseline_spends_what_is_left_of_the_time_and_says_it_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The free space's search used to get 600 s of its own after the solve's limit."""
    from shardlab.solvers.base import Solver
    from tests.conftest import within_limit

    given: list[tuple[str, Budget]] = []
    searched = Solver.solve

    def spy(self: Solver, problem: Problem, **kwargs: object) -> object:
        given.append((problem.space_kind, kwargs["budget"]))
        return searched(self, problem, **kwargs)

    monkeypatch.setattr(Solver, "solve", spy)
    problem = Problem.build("llama-3.1-70b", "h100x8", engine="vllm", space_kind="engine")
    limit = 3.0
    # a command whose start-up took most of its limit: 0.5 s left for the solve
    started = time.perf_counter() - (limit - 0.5)
    budget = Budget(max_evals=None, seconds=limit, started=started)
    s = solve(problem, "random", budget=budget, vs_free=True)
    wall = time.perf_counter() - started
    # the free space's CP-SAT search runs on the command's clock
    free_budget = dict(given)["free"]
    assert (free_budget.seconds, free_budget.started) == (limit, started)
    assert within_limit(wall, limit), wall
    assert s.free is not None and s.free.partial and s.free.status in ("feasible", "unknown")
    assert "time limit" in s.free.message
    assert s.to_dict()["free"]["partial"] is True


def test_a_result_of_each_mode_answers_the_result_protocol() -> None:
    from shardlab.solvers.solution import Result

    fields = [n for n in dir(Result) if not n.startswith("_")]
    assert {"status", "message", "wall_s", "n_evals", "plan", "metrics", "facts"} <= set(fields)
    solutions = [
        solve(PROBLEM, "random", budget=FEW, baseline=False),
        solve(PROBLEM, "random", objective="pareto", budget=FEW, baseline=False),
        solve(PROBLEM, "cpsat", serving="disagg", baseline=False),
    ]
    for s in solutions:
        for r in s.results:
            for name in fields:
                value = getattr(r, name)
                assert value is not None or name in ("plan", "metrics"), (type(r), name)
        assert s.n_evals == s.result.n_evals >= 1 and s.plan is not None


def test_a_request_is_checked_when_built_and_run_as_solve_runs_it() -> None:
    from shardlab.solvers import SolveRequest, run

    with pytest.raises(ShardlabError) as e:
        SolveRequest(
            problem=PROBLEM,
            serving="disagg",
            budget=Budget(max_evals=50),
            options=CpSatOptions(),
        )
    assert e.value.field == "max_evals"
    request = SolveRequest.of(PROBLEM, "anneal", budget=FEW, seed=3, baseline=False)
    assert request.mode == "agg" and request.options == SolverOptions()
    with pytest.raises(ShardlabError) as e:  # another method's options, built by hand
        SolveRequest(problem=PROBLEM, method="anneal", budget=FEW, options=CpSatOptions())
    assert e.value.field == "options"
    a, b = run(request), solve(PROBLEM, "anneal", budget=FEW, seed=3, baseline=False)
    assert a.plan == b.plan and a.objective == b.objective
