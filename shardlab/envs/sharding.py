"""``ShardingEnv``: building one sharding plan as a gymnasium episode.

One step is one decision of :class:`shardlab.solvers.rl.decisions.Decisions` (degree
axes, then one option per operator variable, then the pipeline cuts); the action is
the slot of the chosen candidate (``Discrete(width)``). ``info["action_mask"]`` (int8,
one entry per slot) says which slots are valid at the current step, given the
decisions already made; following it, every episode ends in a valid plan.

Observation: the actions taken so far, ``width`` standing for "not decided yet"
(``MultiDiscrete([width + 1] * n_steps)``).

Reward: 0 until the last decision, then the ``rl`` solver's reward of the plan
(:func:`shardlab.solvers.rl.reward.rewards`: log of the objective relative to the
Megatron plan's, or a penalty graded by the miss when infeasible). The final ``info``
holds ``codes`` (the plan's encoding) and ``fitness`` (what the evaluator would say).

Invalid actions (a slot the mask rules out, or outside ``Discrete(width)``) end the
episode at once with ``reward = invalid_action_reward`` (default -10, below every plan's
reward) and ``info["invalid_action"] = True``; nothing is priced. Stepping a finished
episode raises ``RuntimeError``; call ``reset()``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from shardlab.problems.problem import Problem
from shardlab.problems.suite import get_instance
from shardlab.solvers.rl.config import RLConfig
from shardlab.solvers.rl.decisions import Decisions
from shardlab.solvers.rl.reward import fitness_of, megatron_reference, rewards

DEFAULT_INSTANCE = "llama8b-h100x2-chat"


class ShardingEnv(gym.Env[np.ndarray, int]):
    metadata = {"render_modes": []}  # noqa: RUF012 (gymnasium's class attribute)

    def __init__(
        self,
        problem: Problem | None = None,
        *,
        instance: str = DEFAULT_INSTANCE,
        config: RLConfig | None = None,
        invalid_action_reward: float = -10.0,
    ) -> None:
        self.problem = problem if problem is not None else get_instance(instance).problem()
        self.config = config or RLConfig()
        self.invalid_action_reward = float(invalid_action_reward)
        self.decisions = Decisions(self.problem.space)
        self.reference = megatron_reference(self.problem)
        d = self.decisions
        self.action_space = spaces.Discrete(d.width)
        self.observation_space = spaces.MultiDiscrete(np.full(d.n_steps, d.width + 1))
        self._actions = np.full(d.n_steps, d.width, dtype=np.int64)
        self._t = 0
        self._done = True

    # -- helpers -----------------------------------------------------------------------

    def action_mask(self) -> np.ndarray:
        """int8 ``(width,)``: 1 for the slots valid at the current step (zeros when done)."""
        if self._done or self._t >= self.decisions.n_steps:
            return np.zeros(self.decisions.width, dtype=np.int8)
        return self.decisions.step_mask(self._actions[: self._t], self._t).astype(np.int8)

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"action_mask": self.action_mask(), "step": self._t}
        if self._t < self.decisions.n_steps:
            step = self.decisions.steps[self._t]
            info["decision"] = step.name
            info["candidates"] = step.values
        return info

    # -- gymnasium API -----------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._actions = np.full(self.decisions.n_steps, self.decisions.width, dtype=np.int64)
        self._t = 0
        self._done = False
        return self._actions.copy(), self._info()

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("the episode has ended; call reset() before step()")
        a = int(action)
        mask = self.action_mask()
        if not (0 <= a < len(mask)) or not mask[a]:
            self._done = True
            info = self._info() | {"invalid_action": True}
            return self._actions.copy(), self.invalid_action_reward, True, False, info
        self._actions[self._t] = a
        self._t += 1
        if self._t < self.decisions.n_steps:
            return self._actions.copy(), 0.0, False, False, self._info()
        self._done = True
        codes = self.decisions.to_codes(self._actions[None])
        fit = fitness_of(self.problem, codes)
        reward = float(rewards(fit, self.reference, self.config)[0])
        info = self._info() | {"codes": codes[0], "fitness": float(fit[0])}
        return self._actions.copy(), reward, True, False, info
