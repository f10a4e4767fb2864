"""Where independent tasks run: in-process, local worker processes, or a Ray cluster
(a comparison's runs, a sizing's capacity searches).

Every executor takes the runs as ``(index, task)`` pairs and calls ``done(index,
record)`` in the parent as each finishes (in completion order), so that the caller can
put it on disk at once. When the parent stops (Ctrl-C, an error, SIGKILL) no worker
outlives it: local workers ignore Ctrl-C (the parent decides), are terminated when the
parent leaves, and ask the kernel to kill them if the parent dies without a word
(Linux ``PR_SET_PDEATHSIG``); Ray tasks still running are cancelled.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Literal

from shardlab.errors import ShardlabError

Executor = Literal["local", "ray"]
EXECUTORS: tuple[Executor, ...] = ("local", "ray")
Done = Callable[[int, dict[str, Any]], None]
Work = Callable[[Any], dict[str, Any]]

_PR_SET_PDEATHSIG = 1


def _worker_init(parent: int) -> None:
    """In each local worker: leave Ctrl-C to the parent, and die with it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request took hold
        os._exit(1)


class LocalWorkers:
    """``jobs`` worker processes kept over several batches of tasks: forked at the
    first batch, warm for the next ones (their caches stay), ended by :meth:`close`."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self._pool: ProcessPoolExecutor | None = None

    def run(self, work: Work, tasks: Sequence[tuple[int, Any]], done: Done) -> None:
        if self._pool is None:
            # forked from this process (Python 3.14 defaults to a fork server on Linux,
            # which would be the workers' parent instead: the death signal must follow
            # this one)
            context = multiprocessing.get_context(
                "fork" if sys.platform.startswith("linux") else None
            )
            self._pool = ProcessPoolExecutor(
                max_workers=self.jobs,
                mp_context=context,
                initializer=_worker_init,
                initargs=(os.getpid(),),
            )
        try:
            pending = {self._pool.submit(work, task): i for i, task in tasks}
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    done(pending.pop(f), f.result())
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._pool is None:
            return
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
        for child in multiprocessing.active_children():
            child.terminate()
        for child in multiprocessing.active_children():
            child.join()


def run_local(work: Work, tasks: Sequence[tuple[int, Any]], jobs: int, done: Done) -> None:
    """``jobs`` worker processes (one: in this process)."""
    if jobs <= 1:
        for i, task in tasks:
            done(i, work(task))
        return
    workers = LocalWorkers(jobs)
    try:
        workers.run(work, tasks, done)
    finally:
        workers.close()


def run_ray(work: Work, tasks: Sequence[tuple[int, Any]], address: str | None, done: Done) -> None:
    """One Ray task per run on the cluster at ``address`` (None: Ray's own search,
    ``RAY_ADDRESS`` or a new local cluster). Each task asks for one CPU."""
    if not tasks:  # every run is already on disk
        return
    try:
        import ray
    except ImportError:
        raise ShardlabError(
            "running on Ray needs Ray installed",
            field="executor",
            fix='pip install -e ".[ray]" (or pip install "ray[default]")',
        ) from None
    try:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ShardlabError(
            f"cannot join a Ray cluster at {address} ({exc})",
            field="address",
            fix="start one with 'ray start --head' and give its address (e.g. 127.0.0.1:6379)",
        ) from None
    remote = ray.remote(num_cpus=1)(work)
    pending = {remote.remote(task): i for i, task in tasks}
    try:
        while pending:
            finished, _ = ray.wait(list(pending), num_returns=1)
            for ref in finished:
                done(pending.pop(ref), ray.get(ref))
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)


def run_all(
    work: Work,
    tasks: Sequence[tuple[int, Any]],
    *,
    executor: Executor,
    jobs: int,
    address: str | None,
    done: Done,
) -> None:
    check_executor(executor)
    if executor == "local":
        if address is not None:
            raise ShardlabError(
                "an address is the Ray cluster's", field="address", fix="run on executor 'ray'"
            )
        run_local(work, tasks, jobs, done)
    else:
        run_ray(work, tasks, address, done)


def check_executor(executor: str) -> Executor:
    """``executor`` if it is one of :data:`EXECUTORS`."""
    if executor not in EXECUTORS:
        raise ShardlabError(
            f"executor {executor!r} is not one of {', '.join(EXECUTORS)}", field="executor"
        )
    return executor  # type: ignore[return-value]
