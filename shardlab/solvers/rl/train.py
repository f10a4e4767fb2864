"""Pretraining: one policy trained across several problems, saved as a checkpoint.

The checkpoint holds an *initialization*, so it is trained the way it is used (Reptile,
Nichol et al. 2018): on each instance a copy of the meta weights searches exactly as the
solver does from a checkpoint (same loop, same reward, a fresh Adam) for
``evals_per_instance`` evaluations, and the meta weights then move ``meta_lr`` of the way
towards where that search left the copy (annealed linearly to 0 over the run). The
checkpoint is then written (atomically), so an interrupted run loses at most one
instance's work and ``resume=`` continues where it stopped.

Why not one policy trained straight through: a search ends adapted to its problem's
elite (on the small training spaces, to an exhausted neighbourhood, where only large
edits still find new plans), and a policy that starts a new problem in that state
proposes near-random plans. Moving part of the way towards each task's end keeps
what the tasks share and averages out what each one fitted alone.
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
    position: int  # instances finished, counted over every round (a resumed run's too)
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
    meta_lr: float = 0.25,
    resume: str | Path | None = None,
    progress: Callable[[TrainProgress], None] | None = None,
) -> Path:
    """Train one policy on ``instances`` (e.g. ``get_suite("train")``) and save it to ``out``.

    ``resume`` continues from a checkpoint written by this function (its meta weights,
    random state and position); ``rounds`` counts the total, so
    resuming a finished run with a larger ``rounds`` trains further. ``meta_lr`` in
    (0, 1] is the first step towards a task's adapted weights (1: the meta weights
    become the copy's, i.e. plain sequential fine-tuning). Returns ``out``.
    """
    if not instances:
        raise ShardlabError("train_policy: no instances given; use get_suite('train')")
    if evals_per_instance < 1 or rounds < 1:
        raise ShardlabError("train_policy: evals_per_instance and rounds must be at least 1")
    if not 0 < meta_lr <= 1:
        raise ShardlabError(
            f"train_policy: meta_lr {meta_lr} is not a step in (0, 1]",
            field="meta_lr",
            fix="give e.g. 0.25 (1 trains straight through)",
        )
    problems = [_problem(i) for i in instances]
    out = Path(out)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(seed)
        position = 0  # instances finished, counted over all rounds
        if resume is not None:
            policy, config = load_policy(resume, config)
            extra = load_checkpoint(resume).get("extra", {})
            position = int(extra.get("position", 0))
            if "generator" in extra:
                gen.set_state(extra["generator"])
        else:
            config = config or RLConfig()
            policy = new_policy(config, seed)
        task = new_policy(config, seed)  # loaded with the meta weights before each instance
        start = time.perf_counter()
        total = rounds * len(problems)
        while position < total:
            name, problem = problems[position % len(problems)]
            task.load_state_dict(policy.state_dict())
            opt = torch.optim.Adam(task.parameters(), lr=config.lr)  # as the solver starts
            ev = Evaluator(problem, evals_per_instance, None, None, time.perf_counter())
            with contextlib.suppress(BudgetExhausted):  # the end of this instance's share
                Search(problem, ev, task, opt, config, gen).run()
            step = meta_lr * (1 - position / total)
            with torch.no_grad():
                for meta, adapted in zip(policy.parameters(), task.parameters(), strict=True):
                    meta.add_(adapted - meta, alpha=step)
            position += 1
            save_checkpoint(
                out,
                policy,
                config,
                extra={
                    "position": position,
                    "generator": gen.get_state(),
                    "seed": seed,
                    "meta_lr": meta_lr,
                },
            )
            if progress is not None:
                best = ev.best_objective if ev.best_code is not None else None
                progress(
                    TrainProgress(
                        round=(position - 1) // len(problems),
                        instance=name,
                        position=position,
                        evals=ev.n_evals,
                        best=best,
                        seconds=time.perf_counter() - start,
                    )
                )
    finally:
        torch.set_num_threads(threads)
    return out
