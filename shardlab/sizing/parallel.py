"""A sizing's capacity searches side by side, on an executor (local processes or Ray).

Two kinds of work run side by side, both certain to be needed (nothing speculative:
a capacity the sequential search would prune is not solved either):

- *each GPU type's own search* (:meth:`Parallel.search`): the cheapest deployment of
  one type reads only that type's capacities, so the types' searches are independent;
  each runs whole in a worker (a :class:`~shardlab.sizing.size.Sizer` of its own,
  given the ceilings known so far), and the capacities it solved come back to the
  parent's, for the search over mixes of types that follows;
- *a wave of ceilings* (:meth:`Capacities.prefetch`): the instance shapes' bounds the
  refusal check or the aggregated pruning reads next.

Every worker builds the same instance problems and runs the same seeded CP-SAT solves
with the same CP-SAT workers as one process would, so each capacity, and so the answer,
is the one a single process finds (tested). A time limit goes to each worker as the
seconds left when its work starts. Local workers are forked at a sizing's first wave
and kept, warm, until :meth:`Parallel.close` (the end of one rate's sizing).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from shardlab.errors import ShardlabError
from shardlab.executors import LocalWorkers, check_executor, run_ray
from shardlab.problems.cluster import Accelerator
from shardlab.problems.problem import Problem
from shardlab.sizing.capacity import Capacities, Key

if TYPE_CHECKING:
    from shardlab.sizing.deployment import Deployment
    from shardlab.sizing.size import Sizer


class Parallel:
    """Where a wave runs: ``jobs`` at once, on ``executor`` (``address``: Ray's)."""

    def __init__(self, *, executor: str = "local", jobs: int = 1, address: str | None = None):
        self.executor = check_executor(executor)
        if not isinstance(jobs, int) or jobs < 1:
            raise ShardlabError(f"jobs {jobs!r}: give a whole number of at least 1", field="jobs")
        if address is not None and self.executor != "ray":
            raise ShardlabError(
                "an address is the Ray cluster's", field="address", fix="run on executor 'ray'"
            )
        self.jobs = jobs
        self.address = address
        self._local = LocalWorkers(jobs)

    @property
    def side_by_side(self) -> bool:
        """Whether waves run at all (one local job: every search in this process)."""
        return self.executor == "ray" or self.jobs > 1

    def run(self, caps: Capacities, keys: list[Key]) -> None:
        """Compute ``keys`` in workers and keep each in ``caps`` as it finishes."""
        left = None if caps.deadline is None else caps.deadline - time.perf_counter()
        tasks = [
            (i, (caps.problem, caps.accelerators, caps.seed, left, key))
            for i, key in enumerate(keys)
        ]

        def done(i: int, record: dict[str, Any]) -> None:
            caps.keep(keys[i], record["value"])

        self._dispatch(_work, tasks, done)

    def search(self, sizer: Sizer, rate: float, gpus: list[str]) -> dict[str, Deployment | None]:
        """Each of ``gpus``' own cheapest deployment at ``rate``, one search per type in
        workers; what they solved is kept in ``sizer.caps``."""
        caps = sizer.caps
        left = None if caps.deadline is None else caps.deadline - time.perf_counter()
        known = dict(caps.items())
        alone = dataclasses.replace(sizer, progress=None, jobs=1, executor="local", address=None)
        found: dict[str, Deployment | None] = {}

        def done(i: int, record: dict[str, Any]) -> None:
            found[gpus[i]] = record["best"]
            for key, value in record["kept"]:
                if not caps.known(key):
                    caps.keep(key, value)
            caps.unproven.update(record["unproven"])

        self._dispatch(
            _search, [(i, (alone, known, left, rate, g)) for i, g in enumerate(gpus)], done
        )
        return found

    def _dispatch(self, work: Any, tasks: list[tuple[int, Any]], done: Any) -> None:
        if self.executor == "ray":
            run_ray(work, tasks, self.address, done)
        else:
            self._local.run(work, tasks, done)

    def close(self) -> None:
        """End the local workers (the next wave forks new ones)."""
        self._local.close()


def _work(
    task: tuple[Problem, dict[str, Accelerator], int, float | None, Key],
) -> dict[str, Any]:
    """In a worker: one key's value, from a sizing's problem of its own."""
    problem, accelerators, seed, left, key = task
    deadline = None if left is None else time.perf_counter() + left
    caps = Capacities(problem, accelerators, seed=seed, deadline=deadline)
    return {"value": caps.compute(key)}


def _search(task: tuple[Sizer, dict[Key, Any], float | None, float, str]) -> dict[str, Any]:
    """In a worker: one GPU type's own cheapest deployment, and what it solved."""
    sizer, known, left, rate, gpu = task
    caps = sizer.caps
    if left is not None:
        caps.deadline = time.perf_counter() + left
    for key, value in known.items():
        caps.keep(key, value)
    before = set(known)
    best = sizer._best(rate, [gpu])
    kept = [(k, v) for k, v in caps.items() if k not in before]
    return {"best": best, "kept": kept, "unproven": caps.unproven}
