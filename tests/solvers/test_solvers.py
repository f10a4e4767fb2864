"""Tests every registered solver passes; a new method is tested by registering it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from shardlab import Problem, ShardlabError
from shardlab.costmodel import evaluate
from shardlab.problems.suite import get_instance, get_suite
from shardlab.solvers import Budget, Solver, available_solvers, get_solver, register, solve
from shardlab.solvers import registry as registry_module
from shardlab.solvers.registry import solver_class
from tests.conftest import shared_result

METHODS = available_solvers()
SMALL = get_instance("llama8b-h100x2-chat").problem()
BUDGET = 300


def budget_for(method: str) -> Budget:
    return Budget(max_evals=200_000 if method == "exhaustive" else BUDGET, seconds=120)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    # one run of every method per session, shared by the xdist workers
    return shared_result(
        tmp_path_factory,
        "solvers-small",
        lambda: {m: solve(SMALL, m, budget=budget_for(m), seed=3) for m in METHODS},
    )


@pytest.mark.parametrize("method", METHODS)
def test_returns_feasible_plan_whose_metrics_are_the_cost_model(method: str, results) -> None:
    r = results[method]
    assert r.status in ("feasible", "optimal"), r.message
    assert r.plan is not None and r.metrics is not None
    assert r.metrics == evaluate(SMALL, r.plan)
    assert r.metrics.feasible
    SMALL.space.encode(r.plan)  # the plan belongs to the space
    if r.history:
        assert r.history[-1].best == pytest.approx(r.metrics.objective)
        evals = [h.evals for h in r.history]
        assert evals == sorted(evals)


@pytest.mark.parametrize("method", METHODS)
def test_respects_its_budget(method: str) -> None:
    r = solve(SMALL, method, budget=Budget(max_evals=37), seed=0)
    assert r.n_evals <= 37
    assert r.status in ("feasible", "optimal", "infeasible")


@pytest.mark.parametrize("method", METHODS)
def test_same_seed_same_plan(method: str, results) -> None:
    again = solve(SMALL, method, budget=budget_for(method), seed=3)
    assert again.plan == results[method].plan
    assert again.metrics == results[method].metrics
    if method != "cpsat":  # CP-SAT's parallel workers report intermediate solutions by timing
        assert again.n_evals == results[method].n_evals


@pytest.mark.parametrize("method", METHODS)
def test_infeasible_problem_is_reported(method: str) -> None:
    problem = Problem.build("llama-3.1-70b", "h100x4", "chat", tpot_ms=0.5)
    r = solve(problem, method, budget=budget_for(method), seed=0)
    assert r.status == "infeasible"
    assert "TPOT" in r.message and "tpot_ms" in r.message  # the input, in its own name


@pytest.mark.parametrize("method", [m for m in METHODS if m != "megatron"])
def test_ctrl_c_returns_the_best_plan_so_far(method: str) -> None:
    def stop(progress) -> None:
        if progress.evals >= 1:
            raise KeyboardInterrupt

    r = get_solver(method).solve(SMALL, budget=budget_for(method), seed=0, callback=stop)
    assert r.status == "interrupted"
    assert r.plan is not None and r.metrics == evaluate(SMALL, r.plan)


@pytest.mark.parametrize(
    "method",
    [m for m in METHODS if solver_class(m).anytime and not solver_class(m).exact],
)
def test_anytime_best_after_n_evaluations_is_a_run_with_budget_n(method: str) -> None:
    # what `shardlab compare --budgets` relies on to read several budgets off one run
    problem = get_instance("llama70b-h100x4-chat").problem()
    longer = solve(problem, method, budget=Budget(max_evals=200), seed=5)
    for n in (30, 120):
        short = solve(problem, method, budget=Budget(max_evals=n), seed=5)
        seen = [h.best for h in longer.history if h.evals <= n]
        assert short.n_evals <= n
        if short.metrics is None or not short.metrics.feasible:
            assert not seen
        else:
            assert seen and seen[-1] == pytest.approx(short.metrics.objective, rel=1e-12)


def test_seed_reproduces_in_another_process() -> None:
    code = (
        "from shardlab.problems.suite import get_instance; from shardlab.solvers import solve, "
        "Budget; r = solve(get_instance('llama8b-h100x2-chat').problem(), 'genetic', "
        "budget=Budget(max_evals=300), seed=3); print(r.metrics.objective)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    here = solve(SMALL, "genetic", budget=Budget(max_evals=300), seed=3)
    assert float(out.stdout) == here.metrics.objective


def test_registry_refuses_duplicates_and_unknown_names() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register("random")(type("Again", (Solver,), {"_search": lambda self, ctx: None}))
    with pytest.raises(ShardlabError, match="unknown method"):
        get_solver("no-such-method")


def test_third_party_solver_through_entry_point(monkeypatch) -> None:
    class FirstPlan(Solver):
        def _search(self, ctx):
            ctx.evaluator.evaluate(ctx.space.sample(1, seed=ctx.seed))

    class FakeEntryPoint:
        name = "first-plan"

        def load(self):
            return FirstPlan

    monkeypatch.setattr(registry_module, "_entry_points", lambda: {"first-plan": FakeEntryPoint()})
    monkeypatch.setattr(registry_module, "_REGISTERED", dict(registry_module._REGISTERED))
    assert "first-plan" in available_solvers()
    r = solve(SMALL, "first-plan", budget=Budget(max_evals=5))
    assert r.n_evals == 1 and r.plan is not None


def test_exhaustive_refuses_large_spaces() -> None:
    with pytest.raises(ShardlabError, match="exhaustive"):
        solve(get_instance("deepseek-v3-h100x64-chat").problem(), "exhaustive")


@pytest.mark.slow
@pytest.mark.parametrize("instance", [i.name for i in get_suite("small")])
def test_no_method_beats_the_exhaustive_optimum(instance: str, exhaustive_optimum) -> None:
    problem = get_instance(instance).problem()
    status, best = exhaustive_optimum(instance)
    assert status == "optimal"
    for method in METHODS:
        if method == "exhaustive":
            continue
        r = solve(problem, method, budget=Budget(max_evals=500, seconds=10), seed=1)
        # every method finds a plan here (each instance has feasible plans), and the
        # objective it reports is its plan's own, so "not better" cannot pass vacuously
        assert r.status in ("optimal", "feasible"), (method, r.status, r.message)
        assert r.plan is not None and r.metrics is not None and r.metrics.feasible, method
        assert evaluate(problem, r.plan, breakdown=False).objective == r.metrics.objective
        assert r.metrics.objective <= best + 1e-9 * abs(best), method
        if r.status == "optimal":  # a proof is the optimum (CP-SAT: within its rounding)
            assert r.metrics.objective == pytest.approx(best, rel=1e-4), method


def test_exhaustive_matches_brute_force_on_a_tiny_space() -> None:
    problem = Problem.build("llama-3.1-8b", "h100x1")
    space = problem.space
    all_codes = np.array(list(np.ndindex(*space.cardinalities)))
    codes = all_codes[space.is_valid(all_codes)]
    assert len(codes) == space.num_plans()
    r = solve(problem, "exhaustive", budget=Budget(max_evals=None))
    assert r.status == "optimal" and r.n_evals == len(codes)


# -- options: one declaration per option -----------------------------------------------


def _bad_values(cls: type) -> dict[str, object]:
    """A value each checkable field refuses: outside its Literal, or a negative count."""
    from shardlab.solvers.choices import choices, hints, text_type

    bad: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        hint = hints(cls)[f.name]
        if choices(hint):
            bad[f.name] = "no-such-value"
        elif text_type(hint) is int:
            bad[f.name] = -5
    return bad


@pytest.mark.parametrize("method", METHODS)
def test_options_are_one_documented_dataclass(method: str) -> None:
    from shardlab.solvers.choices import field_docs
    from shardlab.solvers.options import SolverOptions
    from shardlab.solvers.registry import options_class

    cls = options_class(method)
    assert cls is solver_class(method).Options  # read without importing the method
    assert issubclass(cls, SolverOptions) and dataclasses.is_dataclass(cls)
    params = cls.__dataclass_params__
    assert params.frozen and all(f.kw_only for f in dataclasses.fields(cls))
    undocumented = [f.name for f in dataclasses.fields(cls) if not field_docs(cls).get(f.name)]
    assert not undocumented, f"{method}: fields without a docstring: {undocumented}"


@pytest.mark.parametrize("method", METHODS)
def test_unknown_option_is_refused_naming_the_method_and_its_options(method: str) -> None:
    from shardlab.solvers.registry import options_class

    with pytest.raises(ShardlabError) as info:
        solve(SMALL, method, budget=Budget(max_evals=1), options={"no_such_option": 1})
    e = info.value
    assert e.field == "no_such_option" and repr(method) in str(e)
    taken = [f.name for f in dataclasses.fields(options_class(method))]
    assert f"its options: {', '.join(taken) or 'none'}" in str(e)
    assert str(e).count("no_such_option") == 1  # said once


@pytest.mark.parametrize("method", METHODS)
def test_bad_value_is_refused_by_the_options_naming_the_field(method: str) -> None:
    from shardlab.solvers.registry import options_class

    cls = options_class(method)
    for name, value in _bad_values(cls).items():
        with pytest.raises(ShardlabError) as direct:
            cls(**{name: value})
        assert direct.value.field == name
        with pytest.raises(ShardlabError) as solved:
            solve(SMALL, method, budget=Budget(max_evals=1), options={name: value})
        # the one check: solve refuses it with the options' own error
        assert str(solved.value) == str(direct.value) and solved.value.field == name
        with pytest.raises(ShardlabError) as parsed:
            registry_module.parse_method(f"{method}:{name}={value}")
        assert parsed.value.field == name


@pytest.mark.parametrize("method", METHODS)
def test_every_option_is_a_flag_of_solve_whose_help_names_the_method(method: str) -> None:
    from typer.testing import CliRunner

    from shardlab.cli.app import app
    from shardlab.solvers.choices import choices, hints
    from shardlab.solvers.registry import options_class

    cls = options_class(method)
    help_text = CliRunner().invoke(app, ["solve", "--help"], env={"COLUMNS": "2000"}).output
    lines = {line.split()[1]: line for line in help_text.splitlines() if "│ --" in line}
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        assert flag in lines, f"{method}: no flag {flag} in solve --help"
        assert f"{method}" in lines[flag]
        for value in choices(hints(cls)[f.name]):
            assert value in lines[flag]


def test_methods_options_parse_as_their_types() -> None:
    assert registry_module.parse_method("optuna:history=500:sampler=tpe") == (
        "optuna",
        {"history": 500, "sampler": "tpe"},
    )
    assert registry_module.parse_method("cpsat:workers=2") == ("cpsat", {"workers": 2})


def test_a_bad_rl_knob_is_refused_as_the_knobs_option() -> None:
    # the CLI maps the field to its flag: --knobs, not a flag that does not exist
    for knobs in ("reward=foo", "d_model=63", "lr=fast"):
        with pytest.raises(ShardlabError) as info:
            solve(SMALL, "rl", budget=Budget(max_evals=1), options={"knobs": knobs})
        assert info.value.field == "knobs", knobs
