"""The Optuna solver: the registry checks every solver passes, its parameter layout,
constraints, resumption after SIGKILL (SQLite) and two workers on one study
(PostgreSQL, from ``SHARDLAB_TEST_POSTGRES_URL``; .ci/run starts a server)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import optuna
import pytest
import sqlalchemy
from optuna.trial import FixedTrial, TrialState

import shardlab.solvers.optuna.storage as optuna_storage
from shardlab import Problem, ShardlabError
from shardlab.costmodel import evaluate, evaluate_batch
from shardlab.problems.suite import get_instance
from shardlab.solvers import Budget, available_solvers, get_solver
from shardlab.solvers.choices import choices
from shardlab.solvers.options import Encoding, Sampler
from shardlab.solvers.optuna import (
    ClassLayout,
    OptunaSolver,
    SharedLayout,
    default_study_name,
    layout_for,
    open_storage,
)

SMALL = get_instance("llama8b-h100x2-chat").problem()
BUDGET = 150
POSTGRES_ENV = "SHARDLAB_TEST_POSTGRES_URL"


def run(problem: Problem = SMALL, budget: Budget | None = None, seed: int = 3, **options):
    budget = budget or Budget(max_evals=BUDGET, seconds=120)
    return get_solver("optuna", **options).solve(problem, budget=budget, seed=seed)


def untimed(facts: dict) -> dict:
    """The facts but Optuna's wall time, which no seed fixes."""
    return {k: v for k, v in facts.items() if k != "sampler_s"}


def complete_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


@pytest.fixture(scope="module")
def result():
    return run()


# -- the checks of tests/solvers/test_solvers.py -----------------------------------------------


def test_registered() -> None:
    assert "optuna" in available_solvers()
    assert isinstance(get_solver("optuna"), OptunaSolver)
    with pytest.raises(ShardlabError, match="sampler"):
        get_solver("optuna", sampler="hyperband")
    with pytest.raises(ShardlabError, match="encoding"):
        get_solver("optuna", encoding="onehot")


def test_returns_feasible_plan_whose_metrics_are_the_cost_model(result) -> None:
    assert result.status in ("feasible", "optimal"), result.message
    assert result.plan is not None and result.metrics == evaluate(SMALL, result.plan)
    assert result.metrics.feasible
    SMALL.space.encode(result.plan)
    assert result.n_evals == BUDGET
    assert result.history[-1].best == pytest.approx(result.metrics.objective)
    evals = [h.evals for h in result.history]
    assert evals == sorted(evals)
    assert result.facts["sampler"] == "tpe" and result.facts["storage"] == "memory"


def test_same_seed_same_plan(result) -> None:
    again = run()
    assert again.plan == result.plan and again.n_evals == result.n_evals
    assert untimed(again.facts) == untimed(result.facts)
    assert [h.evals for h in again.history] == [h.evals for h in result.history]


def test_respects_its_budget() -> None:
    r = run(budget=Budget(max_evals=37), seed=0)
    assert r.n_evals <= 37 and r.status in ("feasible", "optimal", "infeasible")
    start = time.perf_counter()
    r = run(budget=Budget(max_evals=None, seconds=1.0), seed=0)
    assert r.status == "feasible" and time.perf_counter() - start < 5
    assert r.wall_s < 2.0


def test_infeasible_problem_is_reported() -> None:
    problem = Problem.build("llama-3.1-70b", "h100x4", "chat", tpot_ms=0.5)
    storage = optuna.storages.InMemoryStorage()
    r = run(problem, Budget(max_evals=60, seconds=120), seed=0, storage=storage)
    assert r.status == "infeasible"
    assert "TPOT" in r.message and "tpot_ms" in r.message
    # Told to Optuna as violated constraints with the real objective, not a fake value.
    study = optuna.load_study(study_name=default_study_name(problem), storage=storage)
    for t in complete_trials(study):
        assert t.constraints["tpot"] > 0
        code = np.array(t.user_attrs["code"])
        assert t.value == pytest.approx(evaluate_batch(problem, code[None]).objective[0])
    assert r.facts["study_best_value"] is None


def test_ctrl_c_returns_the_best_plan_so_far_and_leaves_no_trial_running() -> None:
    def stop(progress) -> None:
        if progress.evals >= 12:
            raise KeyboardInterrupt

    storage = optuna.storages.InMemoryStorage()
    solver = get_solver("optuna", storage=storage, study="ctrl-c")
    r = solver.solve(SMALL, budget=Budget(max_evals=BUDGET), seed=0, callback=stop)
    assert r.status == "interrupted" and r.n_evals == 12
    assert r.plan is not None and r.metrics == evaluate(SMALL, r.plan)
    trials = optuna.load_study(study_name="ctrl-c", storage=storage).get_trials()
    assert {t.state for t in trials} == {TrialState.COMPLETE}  # the 12th priced, then told
    assert len({tuple(t.user_attrs["code"]) for t in trials}) == 12


@pytest.mark.parametrize("encoding", choices(Encoding))
@pytest.mark.parametrize("sampler", choices(Sampler))
def test_every_sampler_runs(sampler: str, encoding: str) -> None:
    # GP fits a Gaussian process (torch) per trial after 10 random ones: keep it short.
    budget = Budget(max_evals=14 if sampler == "gp" else 40, seconds=120)
    r = run(budget=budget, seed=1, sampler=sampler, encoding=encoding)
    assert r.status == "feasible", r.message
    assert r.metrics == evaluate(SMALL, r.plan) and r.n_evals == budget.max_evals
    assert r.facts["sampler"] == sampler and r.facts["encoding"] == encoding
    assert r.facts["sampler_s"] > 0 and r.facts["trials"] >= r.n_evals


def test_module_does_not_import_torch() -> None:
    code = "import sys, shardlab.solvers.optuna; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# -- the parameter layout --------------------------------------------------------------


@pytest.mark.parametrize("encoding", choices(Encoding))
@pytest.mark.parametrize("instance", ["llama8b-h100x2-chat", "deepseek-v3-h100x64-chat"])
def test_layout_round_trips_every_plan(instance: str, encoding: str) -> None:
    space = get_instance(instance).problem().space
    layout = layout_for(space, encoding)
    rows = space.sample(300, seed=0)
    for row in rows:
        params = layout.params_of(row)
        assert np.array_equal(layout.suggest(FixedTrial(params)), row)
        for name, value in params.items():  # each name has one distribution, holding the value
            dist = layout.distributions[name]
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                assert value in dist.choices
            else:
                assert dist.low <= value <= dist.high
    if isinstance(layout, ClassLayout):
        # Options are named per class of degree tuples that allow the same options.
        assert sum(len(m) for m in layout.class_members.values()) == space.num_degree_tuples
        for name in layout.distributions:
            prefix = name.split(".")[0]
            assert prefix in layout.class_members or prefix.startswith("pp") or name == "degrees"
    else:
        # Every parameter in every trial: one group for a multivariate sampler.
        assert set(params) == set(layout.distributions)


@pytest.mark.parametrize("instance", ["gptoss-h100x4-interactive", "deepseek-v3-h100x64-chat"])
def test_shared_encoding_turns_any_parameters_into_a_valid_plan(instance: str) -> None:
    space = get_instance(instance).problem().space
    layout = SharedLayout(space)
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(300):
        params = {}
        for name, dist in layout.distributions.items():
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                params[name] = dist.choices[rng.integers(len(dist.choices))]
            else:
                params[name] = int(rng.integers(dist.low, dist.high + 1))
        rows.append(layout.suggest(FixedTrial(params)))
        d = space.degree_tuples[rows[-1][0]]
        levels = [layout.axis_values[a].index(getattr(d, a)) for a in layout.axes]
        asked = [params[a] for a in layout.axes]
        # The nearest valid tuple: none is closer in log2 than the one chosen.
        point = [np.log2(layout.axis_values[a][i]) for a, i in zip(layout.axes, asked, strict=True)]
        dist = [
            sum(abs(np.log2(getattr(t, a)) - x) for a, x in zip(layout.axes, point, strict=True))
            for t in space.degree_tuples
        ]
        assert dist[int(rows[-1][0])] == min(dist)  # no valid tuple is nearer in log2
        mask = space.mask(int(rows[-1][0]))
        for o in layout.options:  # a valid option is kept, an invalid one is the canonical
            want = o.labels.index(params[o.name])
            assert rows[-1][o.var] == (want if mask[o.var, want] else 0)
        if levels == asked:
            assert space.degree_index(d) == space.degree_tuples.index(d)
    assert space.is_valid(np.array(rows)).all()


def test_a_study_of_another_encoding_is_refused() -> None:
    storage = optuna.storages.InMemoryStorage()
    run(budget=Budget(max_evals=5), storage=storage, study="enc", encoding="class")
    with pytest.raises(ShardlabError, match="encoding 'class' to continue it"):
        run(budget=Budget(max_evals=5), storage=storage, study="enc", encoding="shared")


def test_trials_hold_the_plan_its_metrics_and_its_constraints() -> None:
    storage = optuna.storages.InMemoryStorage()
    problem = Problem.build("llama-3.1-70b", "h100x4", "chat", tpot_ms=60)
    r = run(problem, Budget(max_evals=60), seed=2, storage=storage, study="s")
    study = optuna.load_study(study_name="s", storage=storage)
    trials = complete_trials(study)
    assert len(trials) == len(study.get_trials()) == r.facts["trials"]
    codes = np.array([t.user_attrs["code"] for t in trials])
    assert len({c.tobytes() for c in codes}) == r.n_evals == 60
    m = evaluate_batch(problem, codes)
    layout = layout_for(problem.space, "shared")
    feasible = []
    for i, t in enumerate(trials):
        assert t.value == pytest.approx(m.objective[i], rel=1e-12)  # batch-size ulps
        # The trial's parameters are the plan (an invalid option stands for its canonical).
        assert np.array_equal(layout.suggest(FixedTrial(t.params)), codes[i])
        assert set(t.constraints) == {"memory", "ttft", "tpot"}
        assert all(v <= 0 for v in t.constraints.values()) == bool(m.feasible[i])
        assert t.user_attrs["metrics"]["feasible"] == bool(m.feasible[i])
        feasible.append(bool(m.feasible[i]))
    assert any(feasible) and not all(feasible)  # both kinds were told
    assert study.best_value == r.facts["study_best_value"]
    assert study.best_value == pytest.approx(r.metrics.objective, rel=1e-12)


def test_a_study_of_another_problem_is_refused() -> None:
    storage = optuna.storages.InMemoryStorage()
    run(budget=Budget(max_evals=5), storage=storage, study="shared")
    other = Problem.build("llama-3.1-8b", "h100x2", "chat", tpot_ms=40)
    with pytest.raises(ShardlabError, match="another problem"):
        run(other, Budget(max_evals=5), storage=storage, study="shared")


def test_default_study_name_follows_the_problem() -> None:
    name = default_study_name(SMALL)
    assert name.startswith("shardlab:llama-3.1-8b:h100x2:chat:kind:")
    assert name == default_study_name(get_instance("llama8b-h100x2-chat").problem())
    assert name != default_study_name(Problem.build("llama-3.1-8b", "h100x2", tpot_ms=40))


def test_resuming_replays_the_finished_trials_and_counts_them() -> None:
    storage = optuna.storages.InMemoryStorage()
    first = run(budget=Budget(max_evals=30), seed=4, storage=storage)
    second = run(budget=Budget(max_evals=50), seed=4, storage=storage)
    assert second.facts["replayed_trials"] == first.facts["trials"]
    assert second.facts["replay_mismatches"] == 0
    assert second.n_evals == 50  # 30 replayed + 20 new: the same total as one run of 50
    assert second.objective >= first.objective * (1 - 1e-12)
    assert second.metrics == evaluate(SMALL, second.plan)
    # A study holding more plans than the budget is only replayed, up to the budget.
    third = run(budget=Budget(max_evals=20), seed=4, storage=storage)
    assert third.n_evals == 20 and third.facts["trials"] == 0
    assert third.metrics == evaluate(SMALL, third.plan)


# -- separate processes ----------------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import json, sys
    import shardlab.solvers.optuna
    from shardlab.problems.suite import get_instance
    from shardlab.solvers import Budget, get_solver

    url, study, seed, max_evals = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    r = get_solver("optuna", storage=url, study=study).solve(
        get_instance("llama8b-h100x2-chat").problem(),
        budget=Budget(max_evals=max_evals, seconds=300),
        seed=seed,
    )
    print(json.dumps({"objective": r.objective, "n_evals": r.n_evals, "status": r.status,
                      "facts": r.facts}), flush=True)
    if len(sys.argv) > 5:  # wait for the other worker, then read the study's best
        import optuna, pathlib, time
        pathlib.Path(sys.argv[5]).touch()
        deadline = time.time() + 120
        while not pathlib.Path(sys.argv[6]).exists() and time.time() < deadline:
            time.sleep(0.2)
        print(json.dumps(optuna.load_study(study_name=study, storage=url).best_value))
    """
)


def running_trials(url: str, study: str) -> int:
    trials = optuna.load_study(study_name=study, storage=url).get_trials(deepcopy=False)
    return sum(t.state == TrialState.RUNNING for t in trials)


def wait_for_complete_trials(url: str, study: str, n: int, proc: subprocess.Popen) -> int:
    deadline = time.time() + 120
    while time.time() < deadline:
        assert proc.poll() is None, "the worker ended before it could be killed"
        if not Path(url.removeprefix("sqlite:///")).exists():
            time.sleep(0.3)  # opening the storage first would race the worker's schema set-up
            continue
        try:
            done = len(complete_trials(optuna.load_study(study_name=study, storage=url)))
        except KeyError:  # the study is not created yet
            done = 0
        except sqlalchemy.exc.SQLAlchemyError:  # the worker is still creating the schema
            done = 0
        if done >= n:
            return done
        time.sleep(0.3)
    raise AssertionError(f"fewer than {n} trials stored in 120 s")


@pytest.mark.slow
def test_killed_run_resumes_without_losing_a_finished_trial(tmp_path: Path, monkeypatch) -> None:
    url, study = f"sqlite:///{tmp_path / 'optuna.db'}", "resume"
    proc = subprocess.Popen([sys.executable, "-c", WORKER, url, study, "5", "100000"])
    try:
        wait_for_complete_trials(url, study, 20, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    before = {
        t.number: (t.value, t.params, t.user_attrs["code"])
        for t in complete_trials(optuna.load_study(study_name=study, storage=url))
    }
    distinct = len({tuple(code) for _, _, code in before.values()})
    # The killed worker's trial in flight, if the kill caught one, and one more that a
    # worker lost the same way (asked, marked alive once, never told).
    orphan = optuna.load_study(study_name=study, storage=open_storage(url)).ask()
    orphan.study._storage.record_heartbeat(orphan._trial_id)
    running = running_trials(url, study)
    assert 1 <= running <= 2
    # Stale after a second here (a minute in use): a resumed run fails them.
    monkeypatch.setattr(optuna_storage, "HEARTBEAT_S", 1)
    monkeypatch.setattr(optuna_storage, "GRACE_S", 1)
    time.sleep(2.5)
    best_before = max(
        t.value
        for t in complete_trials(optuna.load_study(study_name=study, storage=url))
        if all(v <= 0 for v in t.constraints.values())
    )

    r = run(budget=Budget(max_evals=distinct + 15), seed=5, storage=url, study=study)
    assert r.facts["replayed_trials"] == len(before) and r.facts["replay_mismatches"] == 0
    assert r.facts["stale_trials_failed"] == running and r.facts["running_at_start"] == 0
    assert running_trials(url, study) == 0  # none left RUNNING
    after = {
        t.number: (t.value, t.params, t.user_attrs["code"])
        for t in complete_trials(optuna.load_study(study_name=study, storage=url))
    }
    assert all(after.get(k) == v for k, v in before.items())  # no finished trial lost
    assert len(after) > len(before) and len(after) == len(before) + r.facts["trials"]
    assert r.n_evals == distinct + 15
    assert r.status == "feasible" and r.metrics == evaluate(SMALL, r.plan)
    assert r.objective >= best_before * (1 - 1e-12)


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get(POSTGRES_ENV),
    reason=f"needs a PostgreSQL server: set {POSTGRES_ENV} (.ci/run starts one on loopback)",
)
def test_two_workers_share_one_postgres_study(tmp_path: Path) -> None:
    url, study = os.environ[POSTGRES_ENV], f"two-workers-{uuid.uuid4().hex[:8]}"
    done = [tmp_path / "a.done", tmp_path / "b.done"]
    budgets = (25, 35)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url, study, str(seed), str(budget), *paths],
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed, budget, paths in ((1, budgets[0], done), (2, budgets[1], done[::-1]))
    ]
    outs = [p.communicate(timeout=300)[0].splitlines() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    results = [json.loads(o[0]) for o in outs]
    seen_best = [json.loads(o[1]) for o in outs]
    try:
        shared = optuna.load_study(study_name=study, storage=url)
        trials = complete_trials(shared)
        assert [r["n_evals"] for r in results] == list(budgets)
        assert all(r["status"] == "feasible" for r in results)
        # Every trial a worker told is in the study, and nothing else is.
        assert len(trials) == sum(r["facts"]["trials"] for r in results)
        assert len(shared.get_trials()) == len(trials)  # none left running or waiting
        # Both see the same best at the end: the better of the two workers' results.
        assert seen_best[0] == seen_best[1] == shared.best_value
        best = max(r["objective"] for r in results)
        assert shared.best_value == pytest.approx(best, rel=1e-12)
    finally:
        optuna.delete_study(study_name=study, storage=url)


# -- TPE over a bounded history ----------------------------------------------------------


def _filled_study(n: int, directions: list[str], seed: int = 0) -> optuna.Study:
    """A study of ``n`` finished trials of one float parameter, about a third infeasible."""
    rng = np.random.default_rng(seed)
    dist = optuna.distributions.FloatDistribution(0.0, 1.0)
    study = optuna.create_study(directions=directions)
    for _ in range(n):
        values = rng.normal(size=len(directions)).tolist()
        violation = float(rng.choice([0.0, 0.0, rng.uniform(0.01, 2.0)]))
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": float(rng.uniform())},
                distributions={"x": dist},
                values=values,
                system_attrs={"constraints:memory": violation if violation else -0.5},
            )
        )
    return study


def _tpe_order(t: optuna.trial.FrozenTrial) -> tuple[float, float]:
    violation = sum(v for v in t.constraints.values() if v > 0)
    return (violation, -t.value if violation == 0 else 0.0)


def test_windowed_tpe_sees_the_best_trials_of_the_whole_study_and_the_latest() -> None:
    from shardlab.solvers.optuna.history import WindowedTPESampler

    study = _filled_study(700, ["maximize"])
    sampler = WindowedTPESampler(window=100, elite=25, seed=0)
    trials = study.get_trials(deepcopy=False)
    history = sampler._history(study, trials)
    ids = [t._trial_id for t in history]
    assert len(ids) == len(set(ids)) <= 125
    best = sorted(trials, key=_tpe_order)[:25]
    assert {t._trial_id for t in best} <= set(ids)
    assert {t._trial_id for t in trials[-100:]} <= set(ids)
    # Incremental: trials told afterwards enter the elite when they beat it.
    study.add_trial(
        optuna.trial.create_trial(
            params={"x": 0.5},
            distributions={"x": optuna.distributions.FloatDistribution(0.0, 1.0)},
            value=99.0,
            system_attrs={"constraints:memory": -0.5},
        )
    )
    for _ in range(200):  # push it out of the window
        study.add_trial(trials[0])
    history = sampler._history(study, study.get_trials(deepcopy=False))
    assert max(t.value for t in history) == 99.0


def test_windowed_tpe_keeps_the_feasible_front_of_a_multi_objective_study() -> None:
    from shardlab.solvers.optuna.history import WindowedTPESampler

    study = _filled_study(400, ["maximize", "minimize"], seed=1)
    sampler = WindowedTPESampler(window=50, seed=0)
    trials = study.get_trials(deepcopy=False)
    history = {t._trial_id for t in sampler._history(study, trials)}
    feasible = [t for t in trials if all(v <= 0 for v in t.constraints.values())]
    front = [
        t
        for t in feasible
        if not any(
            (u.values[0] >= t.values[0] and u.values[1] <= t.values[1])
            and (u.values[0] > t.values[0] or u.values[1] < t.values[1])
            for u in feasible
        )
    ]
    assert front and {t._trial_id for t in front} <= history


def test_a_short_study_samples_exactly_as_plain_tpe() -> None:
    # Within window + elite trials the windowed sampler is TPE itself: same proposals.
    plans = []
    for history in (0, 1000):
        r = run(budget=Budget(max_evals=60, seconds=120), seed=5, history=history)
        improvements = [(h.evals, h.best) for h in r.history]
        plans.append((r.plan, improvements, r.facts.pop("history")))
    assert plans[0][:2] == plans[1][:2] and (plans[0][2], plans[1][2]) == (0, 1000)


def test_history_must_be_a_count() -> None:
    with pytest.raises(ShardlabError, match="history"):
        OptunaSolver.Options(history=-1)
    with pytest.raises(ShardlabError, match="TPE's"):
        OptunaSolver.Options(sampler="nsga2", history=10)


def test_a_trial_never_marked_alive_is_failed_once_stale(tmp_path: Path, monkeypatch) -> None:
    """A worker killed inside ``study.ask()`` leaves a RUNNING trial with no heartbeat,
    which Optuna's own stale check skips; ours fails it once it is older than the grace,
    and leaves a trial that is marked alive (or too young) running."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=open_storage(url))
    unmarked = study.ask()  # killed before its first heartbeat
    alive = study.ask()
    monkeypatch.setattr(optuna_storage, "GRACE_S", 1)
    assert optuna_storage.fail_stale_trials(study) == 0  # both younger than the grace
    time.sleep(1.5)
    study._storage.record_heartbeat(alive._trial_id)
    assert optuna_storage.fail_stale_trials(study) == 1
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states == {unmarked.number: TrialState.FAIL, alive.number: TrialState.RUNNING}
