"""Pretraining: one policy trained across several problems, saved as a checkpoint.

Rounds go over the instances in order; on each instance the policy searches exactly as
the solver does (same loop, same reward) for ``evals_per_instance`` evaluations, then
the checkpoint is written (atomically), so an interrupted run loses at most one
instance's work and ``resume=`` continues where it stopped.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from shardlab.errors import ShardlabError
from shardlab.problems.problem import Problem
from shardlab.problems.suite import Instance
from shardlab.solvers.evaluator import BudgetExhausted, Evaluator
from shardlab.solvers.rl.checkpoint import load_checkpoint, load_policy, save_checkpoint
from shardlab.solvers.rl.config import RLConfig
from shardlab.solvers.rl.search import Search, new_policy


@dataclass(frozen=True, kw_only=True)
class TrainProgress:
    round: int  # 0-based
    instance: str
    evals: int
    best: float | None  # best objective found on this instance (None: nothing feasible)
    seconds: float  # since train_policy started


def _problem(item: Instance | Problem) -> tuple[str, Problem]:
    if isinstance(item, Problem):
        return item.name, item
    return item.name, item.problem()


def train_policy(
    instances: Sequence[Instance | Problem],
    *,
    out: str | Path,
    config: RLConfig | None = None,
    seed: int = 0,
    evals_per_instance: int = 500,
    rounds: int = 1,
    resume: str | Path | None = None,
    progress: Callable[[TrainProgress], None] | None = None,
) -> Path:
    """Train one policy on ``instances`` (e.g. ``get_suite("train")``) and save it to ``out``.

    ``resume`` continues from a checkpoint written by this function (its weights,
    optimizer state, random state and position); ``rounds`` counts the total, so
    resuming a finished run with a larger ``rounds`` trains further. Returns ``out``.
    """
    if not instances:
        raise ShardlabError("train_policy: no instances given; use get_suite('train')")
    if evals_per_instance < 1 or rounds < 1:
        raise ShardlabError("train_policy: evals_per_instance and rounds must be at least 1")
    problems = [_problem(i) for i in instances]
    out = Path(out)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(seed)
        position = 0  # instances finished, counted over all rounds
        if resume is not None:
            policy, config = load_policy(resume, config)
            data = load_checkpoint(resume)
            extra = data.get("extra", {})
            position = int(extra.get("position", 0))
            if "generator" in extra:
                gen.set_state(extra["generator"])
        else:
            config = config or RLConfig()
            policy = new_policy(config, seed)
        opt = torch.optim.Adam(policy.parameters(), lr=config.lr)
        if resume is not None and data.get("optimizer") is not None:
            opt.load_state_dict(data["optimizer"])
        start = time.perf_counter()
        while position < rounds * len(problems):
            name, problem = problems[position % len(problems)]
            ev = Evaluator(problem, evals_per_instance, None, None, time.perf_counter())
            with contextlib.suppress(BudgetExhausted):  # the end of this instance's share
                Search(problem, ev, policy, opt, config, gen).run()
            position += 1
            save_checkpoint(
                out,
                policy,
                config,
                optimizer=opt,
                extra={"position": position, "generator": gen.get_state(), "seed": seed},
            )
            if progress is not None:
                best = ev.best_objective if ev.best_code is not None else None
                progress(
                    TrainProgress(
                        round=(position - 1) // len(problems),
                        instance=name,
                        evals=ev.n_evals,
                        best=best,
                        seconds=time.perf_counter() - start,
                    )
                )
    finally:
        torch.set_num_threads(threads)
    return out
