"""The rl solver: valid sampling, shape-free policy, checkpoints, reward, learning."""

from __future__ import annotations

import time
from functools import cache

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shardlab import Problem, ShardlabError  # noqa: E402
from shardlab.envs import ShardingEnv  # noqa: E402
from shardlab.problems.suite import get_instance  # noqa: E402
from shardlab.solvers import Budget, get_solver  # noqa: E402
from shardlab.solvers.choices import choices  # noqa: E402
from shardlab.solvers.evaluator import INFEASIBLE, Evaluator  # noqa: E402
from shardlab.solvers.rl.config import Proposal, RLConfig  # noqa: E402
from shardlab.solvers.rl.decisions import Decisions  # noqa: E402
from shardlab.solvers.rl.policy import Elite, ProblemTensors  # noqa: E402
from shardlab.solvers.rl.reward import fitness_of, rank_rewards, rewards  # noqa: E402
from shardlab.solvers.rl.search import Search, new_policy  # noqa: E402
from shardlab.solvers.rl.train import train_policy  # noqa: E402

INSTANCES = {
    "dense": "llama8b-h100x2-chat",
    "moe": "mixtral8x7b-h100x4-chat",
    "big": "deepseek-v3-h100x64-chat",
}


@cache
def problem_of(key: str) -> Problem:
    """The problems these tests share, built when a test first asks (once per worker);
    ``layer``: Mixtral with options per layer."""
    if key == "layer":
        return Problem.build("mixtral-8x7b", "h100x4", "chat", tie="layer")
    return get_instance(INSTANCES[key]).problem()


@pytest.fixture(autouse=True)
def one_thread():
    """Like the solver: small tensors, and the test machine is shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _random_elite(problem: Problem, dec: Decisions, k: int) -> Elite:
    codes = problem.space.sample(k, seed=1)
    return Elite(actions=dec.to_actions(codes), rewards=np.linspace(0.5, -2.0, k))


@pytest.mark.parametrize("proposal", choices(Proposal))
@pytest.mark.parametrize("key", ["dense", "moe", "layer", "big"])
def test_every_sampled_plan_is_valid(key: str, proposal: str) -> None:
    problem = problem_of(key)
    dec = Decisions(problem.space)
    pt = ProblemTensors.build(problem, dec)
    policy = new_policy(RLConfig(proposal=proposal), 0)
    gen = torch.Generator().manual_seed(0)
    n = 8 if problem.tie == "layer" else 64
    for k, temperature in ((0, 1.0), (16, 5.0)):
        elite = _random_elite(problem, dec, k)
        roll = policy.sample(pt, elite, n, gen, temperature)
        codes = dec.to_codes(roll.actions.numpy())
        assert problem.space.is_valid(codes).all()
        assert np.array_equal(dec.to_actions(codes), roll.actions.numpy())
        # teacher forcing gives back the sampling log-probabilities
        logp, entropy = policy.evaluate(pt, elite, roll)
        assert torch.allclose(logp, roll.logp, atol=1e-4)
        assert (entropy >= 0).all()
    assert len({row.tobytes() for row in codes}) > 1


def test_degree_decisions_reach_exactly_the_valid_tuples() -> None:
    space = problem_of("big").space
    dec = Decisions(space)
    codes = np.zeros((len(space.degree_tuples), space.n_vars), dtype=np.int64)
    codes[:, 0] = np.arange(len(codes))
    actions = dec.to_actions(codes)
    for t in range(dec.n_degree_steps):
        mask = dec.degree_mask(t, actions[:, :t])
        assert mask[np.arange(len(actions)), actions[:, t]].all()
    assert np.array_equal(dec.degree_index(actions[:, : dec.n_degree_steps]), codes[:, 0])
    # values that name no tuple: a half degree, a degree one too large
    off = dec.tuple_values[:2].astype(float)
    off[0, 0] = 0.5
    off[1, 0] = 2 * dec.tuple_values[:, 0].max()
    assert dec.tuple_index(off).tolist() == [-1, -1]
    with pytest.raises(ValueError, match="valid degree tuple"):
        dec.degree_index(np.full((1, dec.n_degree_steps), dec.width))


@pytest.mark.parametrize("proposal", choices(Proposal))
def test_parameter_count_does_not_depend_on_the_problem(proposal: str) -> None:
    def count(problem: Problem) -> int:
        policy = new_policy(RLConfig(proposal=proposal), 0)
        dec = Decisions(problem.space)
        pt = ProblemTensors.build(problem, dec)
        policy.sample(pt, _random_elite(problem, dec, 4), 2, torch.Generator())
        return sum(p.numel() for p in policy.parameters())

    small, big = problem_of("dense"), problem_of("big")
    assert count(small) == count(big)
    assert Decisions(small.space).n_steps != Decisions(big.space).n_steps


def test_penalty_grows_with_the_miss() -> None:
    cfg = RLConfig(reward="log")
    fit = np.array([2000.0, 1000.0, 500.0, INFEASIBLE * 1.01, INFEASIBLE * 1.5, INFEASIBLE * 4])
    r = rewards(fit, 1000.0, cfg)
    assert r[1] == pytest.approx(0.0) and r[0] == pytest.approx(np.log(2))
    assert r[0] > r[1] > r[2] > r[3] > r[4] > r[5]
    assert r[2] > -cfg.infeasible_base >= r[3]
    # latency objectives: the objective is -latency, shorter is better
    lat = rewards(np.array([-5.0, -10.0]), -10.0, cfg)
    assert lat[0] == pytest.approx(np.log(2)) and lat[1] == pytest.approx(0.0)


def test_checkpoint_round_trip_resume_and_errors(tmp_path) -> None:
    out = tmp_path / "policy.pt"
    seen = []
    train_policy(
        [get_instance("llama8b-h100x2-chat")], out=out, evals_per_instance=60, progress=seen.append
    )
    assert out.is_file() and len(seen) == 1 and seen[0].evals == 60
    assert seen[0].position == 1  # the progress bar's count
    assert not list(tmp_path.glob(".*tmp"))  # the temporary file was renamed, not left
    more = train_policy(
        [get_instance("llama8b-h100x2-chat")],
        out=tmp_path / "more.pt",
        evals_per_instance=60,
        rounds=2,
        resume=out,
        progress=seen.append,
    )
    assert len(seen) == 2 and seen[1].round == 1 and seen[1].position == 2  # resumed at 1
    before = torch.load(out, weights_only=True)["state_dict"]
    after = torch.load(more, weights_only=True)["state_dict"]
    assert any(not torch.equal(before[k], after[k]) for k in before)

    problem = get_instance("llama70b-h100x4-chat").problem()
    a = get_solver("rl", policy=str(more)).solve(problem, budget=Budget(max_evals=80), seed=5)
    b = get_solver("rl", policy=str(more)).solve(problem, budget=Budget(max_evals=80), seed=5)
    assert a.plan == b.plan and a.n_evals == b.n_evals
    assert [(h.evals, h.best) for h in a.history] == [(h.evals, h.best) for h in b.history]

    with pytest.raises(ShardlabError, match="does not exist"):
        get_solver("rl", policy=str(tmp_path / "missing.pt"))
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ShardlabError, match="cannot be read"):
        get_solver("rl", policy=str(bad))
    with pytest.raises(ShardlabError, match="reinforce"):
        get_solver("rl", algorithm="a2c")


def test_reinforce_runs() -> None:
    solver = get_solver("rl", algorithm="reinforce")
    r = solver.solve(problem_of("dense"), budget=Budget(max_evals=120), seed=0)
    assert r.status in ("feasible", "optimal") and r.n_evals == 120


def test_ppo_improves_the_mean_reward() -> None:
    """The policy learns: the mean reward of its samples (not the best of them) rises."""
    problem = get_instance("llama70b-h100x8-chat").problem()
    # the plain reward, from the Megatron plans alone: the recipe plans start the elite
    # near the best, where a stall's reheat lowers the mean instead
    cfg = RLConfig(repeat_penalty=0.0, reward="log", start_recipes=False)
    policy = new_policy(cfg, 0)
    ev = Evaluator(problem, None, None, None, time.perf_counter())
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    search = Search(problem, ev, policy, opt, cfg, torch.Generator().manual_seed(0))
    search.start()
    means = []
    original = search.learn

    def record(elite, roll, r):
        means.append(float(np.mean(r)))
        original(elite, roll, r)

    search.learn = record  # type: ignore[method-assign]
    for _ in range(40):
        search.step()
    first, last = means[0], float(np.mean(means[-5:]))
    assert last > first + 0.5, (first, last)


def test_search_does_not_depend_on_its_budget() -> None:
    """Anytime: the first 150 evaluations of a 400-evaluation run are a 150-evaluation run."""
    problem = get_instance("llama70b-h100x4-chat").problem()
    short = get_solver("rl").solve(problem, budget=Budget(max_evals=150), seed=2)
    long = get_solver("rl").solve(problem, budget=Budget(max_evals=400), seed=2)
    assert [(h.evals, h.best) for h in short.history] == [
        (h.evals, h.best) for h in long.history if h.evals <= 150
    ]


def test_an_untrained_edit_stays_close_to_its_parent() -> None:
    """The edit policy proposes elite plans with a few decisions changed (its offsets),
    and every proposal's parent is an elite row."""
    layer = problem_of("layer")
    dec = Decisions(layer.space)
    pt = ProblemTensors.build(layer, dec)
    policy = new_policy(RLConfig(proposal="edit", degree_edit=0.25), 0)
    elite = _random_elite(layer, dec, 8)
    roll = policy.sample(pt, elite, 256, torch.Generator().manual_seed(0))
    parents = elite.actions[roll.parents.numpy()]
    changed = roll.actions.numpy() != parents
    k = dec.n_degree_steps
    assert 0.1 < changed[:, :k].any(1).mean() < 0.5  # degree_edit = 0.25
    assert np.median(changed[:, k:].sum(1)) < 0.25 * (dec.n_steps - k)
    assert (~changed).all(1).mean() < 0.5  # and most proposals do change something


def test_rank_reward_is_the_share_of_the_elite_beaten() -> None:
    cfg = RLConfig(reward="rank")
    elite = np.array([30.0, 20.0, 10.0, 10.0])
    fit = np.array([40.0, 20.0, 5.0, INFEASIBLE * 2])
    r = rank_rewards(fit, elite, cfg)
    assert r[:3] == pytest.approx([1.0, 0.5 + 0.125, 0.0])
    assert r[3] == pytest.approx(rewards(fit[3:], None, cfg)[0]) and r[3] < 0


def test_elite_keeps_several_degree_tuples() -> None:
    problem = get_instance("mixtral8x7b-h100x4-chat").problem()
    cfg = RLConfig(elite_per_degrees=2, elite_size=6)
    search = Search(
        problem,
        Evaluator(problem, None, None, None, time.perf_counter()),
        new_policy(cfg, 0),
        None,
        cfg,
        torch.Generator().manual_seed(0),
    )
    codes = problem.space.sample(200, seed=3)
    search._record(codes, search.ev.evaluate(codes))
    rows = search._elite_rows()
    tuples = search.codes[rows, 0]
    assert len(rows) == 6 and np.bincount(tuples).max() <= 2
    assert np.all(np.diff(search.fit[rows]) <= 0)  # best first


@pytest.mark.parametrize("proposal", choices(Proposal))
def test_the_environment_replays_every_proposal(proposal: str) -> None:
    """What the policy proposes is an episode of the gymnasium environment: each action
    is allowed by the environment's mask, and its final reward is the solver's."""
    problem = get_instance("mixtral8x7b-h100x4-chat").problem()
    env = ShardingEnv(problem)
    dec = env.decisions
    pt = ProblemTensors.build(problem, dec)
    policy = new_policy(RLConfig(proposal=proposal), 0)
    roll = policy.sample(pt, _random_elite(problem, dec, 4), 6, torch.Generator().manual_seed(1))
    for actions in roll.actions.numpy():
        _, info = env.reset(seed=0)
        for a in actions:
            assert info["action_mask"][a]
            _, _, done, _, info = env.step(int(a))
        assert done and np.array_equal(info["codes"], dec.to_codes(actions[None])[0])
        assert info["fitness"] == fitness_of(problem, info["codes"][None])[0]


def test_knobs_left_unset_take_the_proposals_defaults() -> None:
    edit, decode = RLConfig(), RLConfig(proposal="decode")
    assert (edit.reward, edit.entropy_coef, edit.elite_per_degrees) == ("parent", 0.0, 1)
    assert (decode.reward, decode.entropy_coef, decode.elite_per_degrees) == ("log", 0.05, 0)
    # the penalty follows the reward: just below its feasible range
    assert (edit.infeasible_base, decode.infeasible_base) == (0.5, 5.0)
    assert get_solver("rl", proposal="decode").config == decode
    tuned = get_solver("rl", knobs="proposal=decode;reward=rank;lr=0.001").config
    assert (tuned.proposal, tuned.reward, tuned.lr, tuned.entropy_coef) == (
        "decode",
        "rank",
        0.001,
        0.05,
    )
    assert RLConfig.from_dict(edit.to_dict()) == edit
    with pytest.raises(ShardlabError, match="NAME=VALUE"):
        get_solver("rl", knobs="learning_rate=0.1")
    with pytest.raises(ShardlabError, match="not a int"):
        get_solver("rl", knobs="ppo_epochs=two")
    with pytest.raises(ShardlabError, match="proposal"):
        RLConfig(proposal="beam")  # type: ignore[arg-type]


def test_pretraining_steps_the_meta_weights_part_of_the_way(tmp_path) -> None:
    """Reptile: on one instance and one round, the checkpoint is the initial weights
    moved ``meta_lr`` of the way towards the weights the instance's search ended with,
    and ``meta_lr=1`` is that search's end itself."""
    instance = [get_instance("llama8b-h100x2-chat")]
    full = train_policy(instance, out=tmp_path / "full.pt", evals_per_instance=80, meta_lr=1.0)
    half = train_policy(instance, out=tmp_path / "half.pt", evals_per_instance=80, meta_lr=0.5)
    start = new_policy(RLConfig(), 0).state_dict()
    adapted = torch.load(full, weights_only=True)["state_dict"]
    mixed = torch.load(half, weights_only=True)["state_dict"]
    assert any(not torch.equal(start[k], adapted[k]) for k in start)
    for k in start:
        torch.testing.assert_close(mixed[k], (start[k] + adapted[k]) / 2)
    with pytest.raises(ShardlabError, match="meta_lr"):
        train_policy(instance, out=tmp_path / "no.pt", meta_lr=0.0)
    assert not (tmp_path / "no.pt").exists()


def test_a_converged_policy_still_spends_its_budget(tmp_path) -> None:
    """On a small space a trained policy's neighbourhood of the elite runs out; the
    reheat must then widen its proposals, not repeat the elite until time runs out."""
    problem = get_instance("llama8b-h100x2-chat")
    out = train_policy([problem], out=tmp_path / "p.pt", evals_per_instance=400, rounds=2)
    r = get_solver("rl", policy=str(out)).solve(
        problem.problem(), budget=Budget(max_evals=400, seconds=120), seed=0
    )
    assert r.n_evals == 400
