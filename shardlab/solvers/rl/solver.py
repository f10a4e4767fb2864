"""The ``rl`` solver: the Learning to Shard policy, trained online by PPO on one problem,
optionally starting from a pretrained checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch

from shardlab.errors import ShardlabError
from shardlab.solvers.base import Outcome, SearchContext, Solver
from shardlab.solvers.choices import ALGORITHMS
from shardlab.solvers.registry import register
from shardlab.solvers.rl.checkpoint import load_checkpoint, load_policy
from shardlab.solvers.rl.config import RLConfig, parse_knobs
from shardlab.solvers.rl.search import Search, new_policy


@register("rl")
class RLSolver(Solver):
    description = "Learning to Shard: attention policy over the elite history, trained by PPO"
    anytime: ClassVar[bool] = True  # the search never reads its budget

    def __init__(
        self,
        *,
        policy: str | Path | None = None,
        algorithm: str | None = None,
        proposal: str | None = None,
        knobs: str | None = None,
        config: RLConfig | None = None,
    ) -> None:
        changes: dict[str, Any] = {}
        if algorithm is not None:
            if algorithm not in ALGORITHMS:
                raise ShardlabError(
                    f"rl algorithm {algorithm!r} is unknown; use 'ppo' or 'reinforce'"
                )
            changes["algorithm"] = algorithm
        if proposal is not None:
            changes["proposal"] = proposal
        if knobs is not None:
            changes |= parse_knobs(knobs)
        # built whole, so that knobs left unset take the default of the proposal chosen
        config = (
            RLConfig(**changes)
            if config is None
            else RLConfig.from_dict(config.to_dict() | changes)
        )
        self.policy_path = Path(policy) if policy is not None else None
        self._state: dict[str, Any] | None = None
        if self.policy_path is not None:
            # load now so a bad path fails before any search, and every solve starts
            # from the same weights
            net, config = load_policy(self.policy_path, config)
            self._state = {k: v.clone() for k, v in net.state_dict().items()}
        self.config = config

    def _search(self, ctx: SearchContext) -> Outcome:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # small tensors; and the benchmark machine is shared
        try:
            ctx.evaluator.enter("setting up the policy")
            seed = int(ctx.rng.integers(0, 2**62))
            policy = new_policy(self.config, seed)
            if self._state is not None:
                policy.load_state_dict(self._state)
            gen = torch.Generator().manual_seed(int(ctx.rng.integers(0, 2**62)))
            opt = torch.optim.Adam(policy.parameters(), lr=self.config.lr)
            search = Search(ctx.problem, ctx.evaluator, policy, opt, self.config, gen)
            ctx.evaluator.enter("search")
            search.run()  # ends with BudgetExhausted (or KeyboardInterrupt): base catches it
        finally:
            torch.set_num_threads(threads)
        return Outcome()


__all__ = ["RLSolver", "load_checkpoint"]
