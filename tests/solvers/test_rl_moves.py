"""The edit policy's moves between degree tuples: the recipe start, rebasing on a tuple's
best plan, retuning on a new tuple, re-choosing the axes after a moved one, redrawing
repeats, the parent reward and the candidates' cost features."""

from __future__ import annotations

import time
from functools import cache

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shardlab import Problem, ShardlabError  # noqa: E402
from shardlab.problems.suite import get_instance  # noqa: E402
from shardlab.solvers.evaluator import INFEASIBLE, Evaluator  # noqa: E402
from shardlab.solvers.recipe import recipe_plans  # noqa: E402
from shardlab.solvers.rl.config import RLConfig  # noqa: E402
from shardlab.solvers.rl.costs import OptionCosts  # noqa: E402
from shardlab.solvers.rl.decisions import Decisions  # noqa: E402
from shardlab.solvers.rl.edit import EditRollout  # noqa: E402
from shardlab.solvers.rl.features import class_edges, decision_classes  # noqa: E402
from shardlab.solvers.rl.policy import Elite, ProblemTensors  # noqa: E402
from shardlab.solvers.rl.search import Search, new_policy  # noqa: E402


@cache
def deepseek() -> Problem:
    """A DeepSeek-class model: its engine recipe is attention DP with wide EP."""
    return get_instance("deepseek-v3-h100x64-chat").problem()


@cache
def mixtral_layers() -> Problem:
    return Problem.build("mixtral-8x7b", "h100x4", "chat", tie="layer")


def _sampled(n: int, seed: int) -> tuple[Decisions, OptionCosts, np.ndarray, np.ndarray]:
    """The Mixtral per-layer space's decisions and cost tables, and ``n`` sampled plans
    as codes and as action slots."""
    problem = mixtral_layers()
    dec = Decisions(problem.space)
    codes = problem.space.sample(n, seed=seed)
    return dec, OptionCosts(problem, dec), codes, dec.to_actions(codes)


def _elite(dec: Decisions, actions: np.ndarray, codes: np.ndarray) -> Elite:
    """An elite of the plans ``actions``, ranked in order; ``codes`` the plans seen."""
    tuples, first = np.unique(codes[:, 0], return_index=True)
    return Elite(
        actions=actions,
        rewards=np.linspace(1.0, 0.0, len(actions)),
        tuples=tuples,
        bests=dec.to_actions(codes[first]),
        best_fit=np.zeros(len(tuples)),
    )


def _search(problem: Problem, cfg: RLConfig) -> Search:
    ev = Evaluator(problem, None, None, None, time.perf_counter())
    policy = new_policy(cfg, 0)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    return Search(problem, ev, policy, opt, cfg, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("start_recipes", [True, False])
def test_the_elite_starts_with_the_recipe_plans(start_recipes: bool) -> None:
    problem = deepseek()
    search = _search(problem, RLConfig(start_recipes=start_recipes))
    search.start()
    recipes = np.array([problem.space.encode(p) for p in recipe_plans(problem)])
    seen = {row.tobytes() for row in search.codes}
    assert len(recipes) and ({r.tobytes() for r in recipes} <= seen) == start_recipes
    # each recipe retuned too: its options re-chosen for its tuple by the cost tables
    dec = search.dec
    fresh = dec.to_codes(search.pt.costs.fastest(recipes[:, 0], dec.to_actions(recipes), 3))
    assert not np.array_equal(fresh, recipes)
    assert ({r.tobytes() for r in fresh} <= seen) == start_recipes


def test_a_move_to_a_seen_tuple_holds_that_tuples_best_options() -> None:
    """A child whose degree tuple differs from its parent's stays at the options of the
    best plan seen on its tuple (rebase), not at its parent's; without rebase, at its
    parent's."""
    problem = mixtral_layers()
    dec = Decisions(problem.space)
    pt = ProblemTensors.build(problem, dec)
    k = dec.n_degree_steps
    codes = problem.space.sample(400, seed=2)
    tuples, first = np.unique(codes[:, 0], return_index=True)
    bests = dec.to_actions(codes[first])
    elite_actions = bests[:4]
    elite = _elite(dec, elite_actions, codes)
    for rebase in (True, False):
        policy = new_policy(RLConfig(degree_edit=0.9, rebase=rebase), 0)
        roll = policy.sample(pt, elite, 128, torch.Generator().manual_seed(0))
        parents = elite_actions[roll.parents.numpy()]
        moved = (roll.actions.numpy()[:, :k] != parents[:, :k]).any(1)
        child = dec.degree_index(roll.actions.numpy()[:, :k])
        held = roll.held.numpy()
        assert moved.sum() > 10
        expected = np.where(
            (rebase & moved)[:, None], bests[np.searchsorted(tuples, child)], parents
        )
        assert np.array_equal(held[:, k:], expected[:, k:])
        assert np.array_equal(roll.rebased.numpy(), rebase & moved)


@pytest.mark.parametrize("retune", [3, 0])
def test_a_move_to_an_unseen_tuple_retunes_its_parents_options(retune: int) -> None:
    """A child on a tuple no plan was seen on starts from its parent's options re-chosen
    by the cost tables (``retune`` rounds); with ``retune=0`` from its parent's own."""
    problem = mixtral_layers()
    dec = Decisions(problem.space)
    pt = ProblemTensors.build(problem, dec)
    k = dec.n_degree_steps
    codes = problem.space.sample(4, seed=3)
    actions = dec.to_actions(codes)
    elite = _elite(dec, actions, codes)
    policy = new_policy(RLConfig(degree_edit=0.9, retune=retune), 0)
    roll = policy.sample(pt, elite, 128, torch.Generator().manual_seed(0))
    parents = actions[roll.parents.numpy()]
    child = dec.degree_index(roll.actions.numpy()[:, :k])
    unseen = ~np.isin(child, elite.tuples)
    assert unseen.sum() > 10
    assert np.array_equal(roll.retuned.numpy(), unseen & (retune > 0))
    held = roll.held.numpy()
    expected = pt.costs.fastest(child[unseen], parents[unseen], retune)
    assert np.array_equal(held[unseen], expected if retune else parents[unseen])
    assert np.array_equal(held[unseen], parents[unseen]) == (retune == 0)


def test_fastest_puts_each_option_at_its_fastest_valid_value() -> None:
    """One round: every option decision at a value of time feature 0 under the held
    plan (the fastest), valid under its tuple; a held value as fast stays; cut and
    degree decisions untouched."""
    dec, costs, codes, actions = _sampled(32, seed=6)
    tuples = codes[:, 0]
    k = dec.n_degree_steps
    out = costs.fastest(tuples, actions, 1)
    option = np.array([s.kind == "option" for s in dec.steps])
    assert np.array_equal(out[:, ~option], actions[:, ~option])
    before = costs.features(tuples, actions)[..., 0]
    rows = np.arange(len(out))[:, None]
    steps = np.flatnonzero(option)
    assert np.all(before[rows, steps[None], out[:, steps]] == 0)
    valid = dec.rest_masks(tuples)[:, steps - k]
    assert np.all(valid[rows, np.arange(len(steps))[None], out[:, steps]])
    at_fastest = before[rows, steps[None], actions[:, steps]] == 0
    assert np.array_equal(out[:, steps][at_fastest], actions[:, steps][at_fastest])
    assert np.array_equal(costs.fastest(tuples, actions, 0), actions)


@pytest.mark.parametrize("name", ["retune", "redraws", "polish"])
def test_counts_must_not_be_negative(name: str) -> None:
    with pytest.raises(ShardlabError, match=name):
        RLConfig(**{name: -1})


def _degree_children(config: RLConfig, sampled: int = 0) -> tuple[Decisions, EditRollout]:
    """256 children on DeepSeek-V3 from an untrained policy, of the recipe plans (all
    pp 1, tp 1) or of ``sampled`` random plans; their sampling log-probabilities are
    checked against teacher forcing."""
    problem = deepseek()
    dec = Decisions(problem.space)
    pt = ProblemTensors.build(problem, dec)
    if sampled:
        codes = problem.space.sample(sampled, seed=0)
    else:
        codes = np.array([problem.space.encode(p) for p in recipe_plans(problem)])
    elite = _elite(dec, dec.to_actions(codes), codes)
    policy = new_policy(config, 0)
    roll = policy.sample(pt, elite, 256, torch.Generator().manual_seed(0))
    logp, _ = policy.evaluate(pt, elite, roll)
    assert torch.allclose(logp, roll.logp, atol=1e-4)
    return dec, roll


def _kept_after_a_move(follow: bool) -> float:
    """Share of the degree axes after the first moved one that keep the parent's value
    (``degree_follow=follow``, ``conserve`` off so the parent's value is the stay)."""
    dec, roll = _degree_children(RLConfig(degree_edit=0.5, degree_follow=follow, conserve=False))
    k = dec.n_degree_steps
    moved = (roll.actions[:, :k] != roll.held[:, :k]).numpy()
    after = np.cumsum(moved, 1) - moved > 0  # an earlier axis moved
    # axes with one valid value after the move keep it either way: not counted
    free = np.stack(
        [dec.degree_mask(t, roll.actions.numpy()[:, :t]).sum(1) > 1 for t in range(k)], 1
    )
    counted = after & free
    assert counted.sum() > 20
    return float((~moved[counted]).mean())


def test_degree_follow_redraws_the_axes_after_a_moved_one() -> None:
    """Without ``degree_follow`` the axes after a moved one mostly keep the parent's
    values (their stay logits); with it they are drawn from their candidate logits."""
    assert _kept_after_a_move(False) > 0.6
    assert _kept_after_a_move(True) < 0.5


def _attention_gpus_kept(conserve: bool) -> float:
    """Over children whose pp * tp left the parent's, the share whose pp * tp * dp_attn
    (the GPUs of one attention replica) is still the parent's."""
    dec, roll = _degree_children(RLConfig(degree_edit=0.5, conserve=conserve), sampled=16)
    names = [step.name for step in dec.steps[: dec.n_degree_steps]]

    def product(slots: np.ndarray, axes: tuple[str, ...]) -> np.ndarray:
        out = np.ones(len(slots), dtype=np.int64)
        for a in axes:
            i = names.index(a)
            out *= np.asarray(dec.steps[i].values)[slots[:, i]]
        return out

    child, parent = roll.actions.numpy(), roll.held.numpy()
    moved = product(child, ("pp", "tp")) != product(parent, ("pp", "tp"))
    assert moved.sum() > 20
    axes = ("pp", "tp", "dp_attn")
    return float((product(child, axes) == product(parent, axes))[moved].mean())


def test_conserve_keeps_the_attention_replica_when_pp_or_tp_moves() -> None:
    """Attention DP's stay logit moves to the value that keeps pp * tp * dp_attn: with
    ``conserve`` most such children keep it (0.70 of 56), without it few (0.11)."""
    assert _attention_gpus_kept(True) > 0.6
    assert _attention_gpus_kept(False) < 0.3


def _repeat_share(redraws: int) -> float:
    """Share of 12 batches' proposals that repeat a plan seen before, on DeepSeek-V3
    with ``redraws`` (``conserve`` and ``probe`` off: measured before them; with both
    0.44 and 0.04); every learned row's
    log-probability is checked against teacher forcing (a redrawn row must be one
    rollout, not a mix of two)."""
    cfg = RLConfig(redraws=redraws, conserve=False, probe=False)
    search = _search(deepseek(), cfg)
    learn = search.learn

    def checked(elite: Elite, roll, r: np.ndarray) -> None:
        logp, _ = search.policy.evaluate(search.pt, elite, roll)
        assert torch.allclose(logp, roll.logp, atol=1e-4)
        learn(elite, roll, r)

    search.learn = checked  # type: ignore[method-assign]
    search.start()
    new = []
    for _ in range(12):
        before = search.ev.n_evals
        search.step()
        new.append(search.ev.n_evals - before)
    return float(1 - np.mean(new) / cfg.batch_size)


def test_repeated_proposals_are_drawn_again() -> None:
    """Early on most of an edit policy's children repeat an elite plan (0.68 of them
    here); drawn again up to 4 times, a third as many are left (0.22)."""
    without = _repeat_share(0)
    assert without > 0.5
    assert _repeat_share(4) < without / 2


def test_the_parent_reward_pays_for_beating_the_parent() -> None:
    """Under "parent" a plan below the whole elite that beats its own parent scores
    above one that does not; under "rank" the two score the same."""
    problem = mixtral_layers()
    rewards = {}
    for reward in ("rank", "parent"):
        search = _search(problem, RLConfig(reward=reward, batch_size=8))
        search.start()
        codes = problem.space.sample(64, seed=5)
        search._record(codes, search.ev.evaluate(codes))
        captured = {}
        search.learn = lambda elite, roll, r, c=captured: c.update(roll=roll, r=r)  # type: ignore[method-assign]
        search.step()
        rewards[reward] = captured
    r_rank, r_parent = rewards["rank"]["r"], rewards["parent"]["r"]
    # the same seed proposes the same batch: the rewards differ only by the parent term
    assert np.array_equal(rewards["rank"]["roll"].actions, rewards["parent"]["roll"].actions)
    assert not np.allclose(r_rank, r_parent)


def test_cost_features_rank_the_valid_options_and_read_the_neighbours() -> None:
    dec, costs, codes, actions = _sampled(16, seed=4)
    tuples = codes[:, 0]
    f = costs.features(tuples, actions)
    k = dec.n_degree_steps
    option = np.array([s.kind == "option" for s in dec.steps])
    assert f.shape == (16, dec.n_steps, dec.width, 2)
    assert np.all(f[:, ~option] == 0) and np.all(f >= 0) and np.all(np.isfinite(f))
    valid = np.stack([dec.rest_masks(np.array([d]))[0] for d in tuples])  # (n, T - k, W)
    time_ = f[:, k:, :, 0]
    assert np.all(time_[~valid] == 0)
    # the fastest valid option of every option decision is at 0
    rows = option[k:]
    masked = np.where(valid, time_, np.inf)[:, rows]
    has = valid[:, rows].any(-1)
    assert np.all(masked.min(-1)[has] == 0)
    # an option's time counts the redistributions to its neighbours at their held values
    changed = actions.copy()
    changed[:, k:][:, rows] = 0
    assert not np.array_equal(costs.features(tuples, changed)[..., 0], f[..., 0])


def test_rank_penalties_sit_just_below_the_feasible_rewards() -> None:
    """Under a rank reward an infeasible plan scores just below 0, not -5: far below, it
    teaches the policy to flee the memory limit, where large models' best plans sit."""
    rank, log = RLConfig(reward="rank"), RLConfig(reward="log")
    assert rank.infeasible_base == 0.5 and log.infeasible_base == 5.0
    assert RLConfig(reward="rank", infeasible_base=2.0).infeasible_base == 2.0
    assert INFEASIBLE < 0


@pytest.mark.parametrize("probe", [True, False])
def test_the_best_tuples_neighbours_are_probed_once(probe: bool) -> None:
    """After the start the best plan's tuple has its neighbours evaluated (pp or tp
    times or over 2 with attention DP the other way, EP times or over 2), each a valid
    plan with the best plan's options retuned for it; without ``probe``, none is."""
    problem = deepseek()
    search = _search(problem, RLConfig(probe=probe))
    search.start()
    tv = search.dec.tuple_values
    names = problem.space.axes
    d = int(search.codes[int(np.argmax(search.fit)), 0])

    def one_step(t: np.ndarray) -> bool:
        ratio = t / tv[d]
        pp, tp, dp, ep = (ratio[names.index(a)] for a in ("pp", "tp", "dp_attn", "ep"))
        attn = {pp, tp, dp} <= {0.5, 1.0, 2.0} and pp * tp * dp == 1 and dp != 1 and ep == 1
        expert = pp == tp == dp == 1 and ep in (0.5, 2.0)
        return bool((attn and (pp == 1) != (tp == 1)) or expert)

    near = [j for j in range(len(tv)) if one_step(tv[j].astype(float))]
    assert sorted(search._neighbours(d)) == near and len(near) >= 2
    probed = np.isin(search.codes[:, 0], near)
    assert probed.any() == probe
    assert problem.space.is_valid(search.codes[probed]).all()
    if probe:  # probed again, a better neighbour is probed in turn, until the best stays
        for _ in range(50):
            n = len(search.codes)
            search._probe()
            if len(search.codes) == n:
                break
        d = int(search.codes[int(np.argmax(search.fit)), 0])
        assert len(search.codes) == n and np.isin(search._neighbours(d), search.codes[:, 0]).all()


def _changed_classes(search: Search, best: np.ndarray, row: np.ndarray) -> list[int]:
    """The classes whose decisions differ between ``best`` and ``row``, each of them
    set to one value in ``row``."""
    k = search.dec.n_degree_steps
    classes = decision_classes(search.dec)[k:]
    assert (row[0] == best[0]) and (row[1:][classes < 0] == best[1:][classes < 0]).all()
    out = []
    for c in range(int(classes.max()) + 1):
        now = row[1:][classes == c]
        if (now != best[1:][classes == c]).any():
            assert len(set(now.tolist())) == 1  # the whole class moved to one option
            out.append(c)
    return out


def _class_moves(search: Search, best: np.ndarray, edges: bool) -> np.ndarray:
    """The plans polish's single (or edge) class moves make of ``best``."""
    return search.policy.class_moves(search.pt, best, search._move_sets[edges])


def test_class_moves_move_one_class_or_the_two_of_an_edge() -> None:
    """Every single move of a per-layer plan sets one class to one valid option (each
    valid option that changes the plan, once); every edge move sets the two classes of
    one edge, consecutive operators of one layer kind."""
    problem = mixtral_layers()
    search = _search(problem, RLConfig())
    # the sampled plan with the most valid options (on TP 1 most operators have one)
    best = max(problem.space.sample(32, seed=3), key=lambda r: len(_class_moves(search, r, False)))
    k = search.dec.n_degree_steps
    classes = decision_classes(search.dec)[k:]
    valid = search.dec.rest_masks(best[:1])[0]
    expected = 0
    for c in range(int(classes.max()) + 1):
        for v in np.flatnonzero(valid[classes == c].all(axis=0)):
            expected += bool((best[1:][classes == c] != v).any())
    singles = _class_moves(search, best, edges=False)
    assert len(singles) == expected > 0
    assert [len(_changed_classes(search, best, r)) for r in singles] == [1] * expected
    assert problem.space.is_valid(singles).all()
    edges = class_edges(search.dec)
    # Mixtral's eight MoE-layer operators, then the head's four: no edge between them
    assert edges == [(c, c + 1) for c in (*range(7), 8, 9, 10)] == search._move_sets[True]
    pairs = _class_moves(search, best, edges=True)
    changed = [tuple(_changed_classes(search, best, r)) for r in pairs]
    assert set(changed) <= set(edges) and len(set(changed)) > 1
    assert problem.space.is_valid(pairs).all()
    assert len({r.tobytes() for r in pairs}) == len(pairs)


@pytest.mark.parametrize("polish", [2, 0])
def test_polish_waits_for_a_stall_then_descends_until_no_move_is_better(polish: int) -> None:
    """``polish`` iterations without a better plan, then the best plan's class moves and
    edge moves, and each better plan's, until every move of the best is evaluated and
    none is better; with 0, no move is evaluated."""
    problem = mixtral_layers()
    search = _search(problem, RLConfig(polish=polish, probe=False))
    search.start()
    n = len(search.codes)
    search._polish()  # the first reading of the best: no stall yet
    search._polish()
    assert len(search.codes) == n  # one stalled iteration
    search._polish()
    assert (len(search.codes) > n) == bool(polish)
    best = search.codes[int(np.argmax(search.fit))]
    moves = np.concatenate([_class_moves(search, best, edges=e) for e in (False, True)])
    seen = {r.tobytes() for r in search.codes}
    assert all(r.tobytes() in seen for r in moves) == bool(polish)
    if polish:
        n = len(search.codes)
        search._polish()  # the best's moves are done: nothing more until it improves
        assert len(search.codes) == n
