"""The gymnasium environment: API checks, masks, and rewards equal to the solver's."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from shardlab.envs import ENV_ID, ShardingEnv
from shardlab.problems.suite import get_instance
from shardlab.solvers.rl.config import RLConfig
from shardlab.solvers.rl.reward import fitness_of, megatron_reference, rewards


@pytest.mark.parametrize("instance", ["llama8b-h100x2-chat", "mixtral8x7b-h100x4-chat"])
def test_check_env_passes(instance: str) -> None:
    check_env(ShardingEnv(instance=instance), skip_render_check=True)
    env = gymnasium.make(ENV_ID, instance=instance)
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs) and "action_mask" in info


def _episode(env: ShardingEnv, seed: int) -> tuple[float, dict, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=seed)
    masks, done, reward = [], False, 0.0
    while not done:
        masks.append(info["action_mask"])
        action = int(rng.choice(np.flatnonzero(info["action_mask"])))
        _, reward, done, truncated, info = env.step(action)
        assert not truncated
    return reward, info, masks


def test_masks_match_the_valid_values_and_the_reward_is_the_solvers() -> None:
    problem = get_instance("mixtral8x7b-h100x4-chat").problem()
    env = ShardingEnv(problem)
    space, dec = problem.space, env.decisions
    for seed in range(10):
        reward, info, masks = _episode(env, seed)
        codes = info["codes"][None]
        assert space.is_valid(codes).all()
        d = int(codes[0, 0])
        for t in range(dec.n_degree_steps, dec.n_steps):  # options and cuts: the space's mask
            var = dec.steps[t].var
            width = space.cardinalities[var]
            assert np.array_equal(masks[t][:width].astype(bool), space.mask(d)[var, :width])
            assert not masks[t][width:].any()
        chosen = dec.to_actions(codes)[0]
        for t in range(dec.n_degree_steps):  # degree axes: the values some valid tuple agrees with
            values = dec.steps[t].values
            ok = {
                values.index(getattr(tup, dec.steps[t].kind))
                for tup in space.degree_tuples
                if all(
                    getattr(tup, dec.steps[j].kind) == dec.steps[j].values[chosen[j]]
                    for j in range(t)
                )
            }
            assert set(np.flatnonzero(masks[t])) == ok
        fit = fitness_of(problem, codes)
        assert info["fitness"] == fit[0]
        expected = rewards(fit, megatron_reference(problem), RLConfig())[0]
        assert reward == pytest.approx(expected)


def test_invalid_action_ends_the_episode_with_the_documented_penalty() -> None:
    env = ShardingEnv(instance="llama8b-h100x2-chat", invalid_action_reward=-7.0)
    _, info = env.reset(seed=0)
    bad = int(np.flatnonzero(info["action_mask"] == 0)[0])
    _, reward, terminated, truncated, info = env.step(bad)
    assert terminated and not truncated and reward == -7.0 and info["invalid_action"]
    assert not info["action_mask"].any()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
