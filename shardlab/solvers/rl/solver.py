"""The ``rl`` solver: the Learning to Shard policy, trained online by PPO on one problem,
optionally starting from a pretrained checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch

from shardlab.solvers.base import Outcome, SearchContext, Solver
from shardlab.solvers.options import RLOptions
from shardlab.solvers.registry import register
from shardlab.solvers.rl.checkpoint import load_checkpoint, load_policy
from shardlab.solvers.rl.search import Search, new_policy


@register("rl")
class RLSolver(Solver):
    description = "Learning to Shard: attention policy over the elite history, trained by PPO"
    anytime: ClassVar[bool] = True  # the search never reads its budget

    Options = RLOptions
    options: RLOptions

    def __init__(self, options: RLOptions | None = None) -> None:
        super().__init__(options)
        config = self.options.config()
        self.policy_path = Path(self.options.policy) if self.options.policy else None
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
