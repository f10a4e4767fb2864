"""Which runs a comparison makes, and running them (resumable, on any executor)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shardlab.compare.journal import Journal
from shardlab.compare.runs import DISAGG_OPTIMUM, FREE_OPTIMUM, Case, Task, run_task, task_key
from shardlab.executors import Executor, run_all
from shardlab.problems.problem import Problem
from shardlab.problems.suite import Instance
from shardlab.problems.traffic import Traffic
from shardlab.solvers.certify import TRIES
from shardlab.solvers.registry import solver_class


def _budgets_of(method: str, max_evals: int | None, budgets: Sequence[int] | None) -> list:
    """The evaluation budgets ``method`` is run with."""
    if not budgets:
        return [max_evals]
    cls = solver_class(method)
    if cls.exact or method == "megatron" or cls.anytime:
        return [max(budgets)]
    return sorted(budgets)


def run_comparison(
    cases: Sequence[Instance | Problem],
    methods: Sequence[str],
    seeds: int,
    *,
    max_evals: int | None,
    seconds: float | None,
    jobs: int,
    on_done: Callable[[dict[str, Any]], None] | None = None,
    budgets: Sequence[int] | None = None,
    variants: Sequence[tuple[str, str, dict[str, object]]] = (),
    timing: str | None = None,
    engine: str | None = None,
    engines: Sequence[str] = (),
    space_kind: str = "free",
    vs_free: bool = False,
    journal: Journal | None = None,
    executor: Executor = "local",
    address: str | None = None,
    on_resume: Callable[[int, int], None] | None = None,
    serving: str = "agg",
    traffic: Traffic | None = None,
    tries: int = TRIES,
) -> list[dict[str, Any]]:
    """Every run of ``cases`` (suite instances, or problems) as a dict; with
    ``budgets``, one record per run and budget (see the module docstring), each with its
    ``budget``. ``variants`` are extra methods run
    with options, as ``(label, method, options)`` (e.g. ``rl`` from a pretrained policy).
    Each instance is run on ``engine``, or on each of ``engines`` (results then name it
    ``instance/engine``), every method searching ``space_kind``; ``vs_free`` adds CP-SAT
    over the free space (``cpsat@free``), whose optimum the others are then a fraction of.

    Runs go to ``executor`` (:mod:`shardlab.executors`: ``jobs`` local processes, or
    the Ray cluster at ``address``). With a ``journal`` every run is put on disk as it
    finishes and runs already there are not run again; ``on_resume(reused, total)``
    hears how many. ``serving`` ``disagg`` runs CP-SAT's disaggregated optimum
    (``cpsat/disagg``) instead of ``methods`` (megatron's aggregated plan stays, the
    reference); ``best`` runs it beside them. ``traffic`` and ``tries``: a problem's
    percentile SLOs are certified under that traffic, by walks of that many plans.
    """
    runs = _runs(methods, variants, space_kind, vs_free, serving)
    tasks = [
        Task(
            case=case,
            method=m,
            seed=s,
            max_evals=b,
            seconds=seconds,
            options=tuple(sorted(opts.items())),
            label=label,
            timing=timing,
            engine=eng,
            space_kind=space,
            per_engine=bool(engines),
            serving=mode,
        )
        for case in (Case.of(c, traffic, tries) for c in cases)
        for eng in (engines or [engine])
        for label, m, opts, space, mode in runs
        for b in _budgets_of(m, max_evals, budgets)
        for s in (range(seeds) if m != "megatron" else range(1))
    ]
    return _run_all(tasks, budgets, journal, executor, jobs, address, on_done, on_resume)


# (label, method, options, space, serving) of one kind of run
Run = tuple[str, str, dict[str, object], str, str]


def _runs(
    methods: Sequence[str],
    variants: Sequence[tuple[str, str, dict[str, object]]],
    space_kind: str,
    vs_free: bool,
    serving: str,
) -> list[Run]:
    """The kinds of run on every case: the methods, megatron (always: the reference),
    the variants, the free optimum and the disaggregated one when asked for."""
    runs: list[Run] = [(m, m, {}, space_kind, "agg") for m in dict.fromkeys([*methods, "megatron"])]
    runs += [(label, m, opts, space_kind, "agg") for label, m, opts in variants]
    if vs_free and space_kind != "free":
        runs.append((FREE_OPTIMUM, "cpsat", {}, "free", "agg"))
    if serving == "disagg":
        runs = [r for r in runs if r[1] == "megatron"]
    if serving in ("disagg", "best"):
        runs.append((DISAGG_OPTIMUM, "cpsat", {}, space_kind, "disagg"))
    return runs


def _run_all(
    tasks: list[Task],
    budgets: Sequence[int] | None,
    journal: Journal | None,
    executor: Executor,
    jobs: int,
    address: str | None,
    on_done: Callable[[dict[str, Any]], None] | None,
    on_resume: Callable[[int, int], None] | None,
) -> list[dict[str, Any]]:
    """Run the tasks the journal lacks; every task's record, in order."""
    keys = [task_key(t) for t in tasks]
    finished: dict[int, dict[str, Any]] = {}
    if journal is not None:
        # a run that failed (an exception) is run again
        finished = {
            i: journal.runs[k]
            for i, k in enumerate(keys)
            if k in journal and journal.runs[k].get("status") != "error"
        }
    if on_resume is not None:
        on_resume(len(finished), len(tasks))

    def done(i: int, record: dict[str, Any]) -> None:
        if journal is not None:
            journal.add(keys[i], record)
        finished[i] = record
        if on_done:
            on_done(record)

    todo = [(i, t) for i, t in enumerate(tasks) if i not in finished]
    run_all(run_task, todo, executor=executor, jobs=jobs, address=address, done=done)
    # each carries its key, so that results.json can start a journal (Journal.start_from)
    results = [{**finished[i], "key": keys[i]} for i in range(len(tasks))]
    if not budgets:
        return results
    return [rec for r in results for rec in _at_budgets(r, budgets)]


def _at_budgets(run: dict[str, Any], budgets: Sequence[int]) -> list[dict[str, Any]]:
    """The records of one run at the budgets it stands for."""
    cls = solver_class(run["solver"])
    if cls.exact or run["solver"] == "megatron":
        return [{**run, "budget": None}]
    if not cls.anytime:
        return [{**run, "budget": run["task_max_evals"]}]
    out = []
    for b in sorted(budgets):
        if b >= run["n_evals"]:
            out.append({**run, "budget": b})
            continue
        seen = [h for h in run["history"] if h[0] <= b]
        out.append(
            {
                **run,
                "budget": b,
                "objective": seen[-1][2] if seen else None,
                "throughput_tok_s": None,  # the history keeps objectives only
                "n_evals": b,
                "wall_s": None,  # not timed at this budget
                "history": seen,
                "plan": None,
            }
        )
    return out
