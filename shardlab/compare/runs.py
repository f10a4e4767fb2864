"""One run of a comparison: what defines it (its key), and its record."""

from __future__ import annotations

import dataclasses
import gc
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardlab.costmodel import forget_tables
from shardlab.problems.problem import Problem
from shardlab.problems.suite import Instance
from shardlab.problems.traffic import Traffic
from shardlab.solvers import Budget, solve
from shardlab.solvers.certify import TRIES

# The label of CP-SAT over the free space in a comparison of engine spaces.
FREE_OPTIMUM = "cpsat@free"

# The label of the disaggregated optimum (shardlab.solvers.cpsat.disagg).
DISAGG_OPTIMUM = "cpsat/disagg"


@dataclass(frozen=True, kw_only=True)
class Case:
    """What a comparison runs on: a suite instance, or the caller's own problem (its
    timing, engine and space set per run)."""

    name: str
    instance: Instance | None = None
    problem: Problem | None = None
    # SLOs at a percentile: the traffic the simulator certifies plans under (None: the
    # workload's own) and the most plans a walk tries (shardlab.solvers.certify)
    traffic: Traffic | None = None
    tries: int = TRIES

    @classmethod
    def of(
        cls, source: Instance | Problem, traffic: Traffic | None = None, tries: int = TRIES
    ) -> Case:
        if isinstance(source, Instance):
            return cls(name=source.name, instance=source)
        name = source.name.replace(" ", "").replace(",", "-")
        if traffic is not None:  # a journal's runs under another traffic are other runs
            name += f"@{Path(traffic.source).name}-{traffic.requests}"
        return cls(name=name, problem=source, traffic=traffic, tries=tries)

    def build(self, timing: str | None, engine: str | None, space_kind: str) -> Problem:
        if self.instance is not None:
            return self.instance.problem(timing, engine, space_kind)
        assert self.problem is not None
        p = self.problem.with_space(space_kind)  # type: ignore[arg-type]
        return dataclasses.replace(p, timing=timing or p.timing, engine=engine or p.engine)


@dataclass(frozen=True, kw_only=True)
class Task:
    case: Case
    method: str  # the registered solver
    seed: int
    max_evals: int | None
    seconds: float | None
    options: tuple[tuple[str, object], ...] = ()  # method-specific solver options
    label: str = ""  # the name results carry (default: the method)
    timing: str | None = None  # the instance's kernel timing (None: the problem default)
    engine: str | None = None  # the serving engine (None: the problem default)
    space_kind: str = "free"  # the space searched: every sharding, or the engine's
    per_engine: bool = False  # several engines compared: name the instance with it
    serving: str = "agg"  # one pool of replicas, or prefill and decode pools

    @property
    def name(self) -> str:
        return self.label or self.method

    @property
    def instance_name(self) -> str:
        """The instance as results name it: with its engine when several are compared."""
        return self.case.name + (f"/{self.engine}" if self.per_engine else "")

    @property
    def budget(self) -> Budget:
        if self.serving == "disagg":  # its evaluations are the pools' CP-SAT solves
            return Budget(max_evals=None, seconds=self.seconds) if self.seconds else Budget.exact()
        return Budget(max_evals=self.max_evals, seconds=self.seconds)


def task_key(task: Task) -> str:
    """What defines a run (a journal's key): a run with the same key is the same run."""
    # (keys of aggregated runs are those before disaggregated serving existed)
    serving = {"serving": task.serving} if task.serving != "agg" else {}
    return json.dumps(
        {
            **serving,
            "instance": task.instance_name,
            "label": task.name,
            "method": task.method,
            "options": [[k, str(v)] for k, v in task.options],
            "seed": task.seed,
            "max_evals": task.max_evals,
            "seconds": task.seconds,
            "timing": task.timing,
            "engine": task.engine,
            "space": task.space_kind,
        },
        sort_keys=True,
    )


def run_task(task: Task) -> dict[str, Any]:
    """One solve, as a JSON-ready dict (runs in a worker process). The cost model's
    tables are dropped after it, as a fresh process would start: a worker runs many
    runs, and the tables of every degree tuple of every instance piled up (a worker of
    the paper suite reached 14 GB and was killed)."""
    try:
        return _run(task)
    finally:
        forget_tables()
        gc.collect()


def _run(task: Task) -> dict[str, Any]:
    problem = task.case.build(task.timing, task.engine, task.space_kind)
    try:
        s = solve(
            problem,
            task.method,
            serving=task.serving,  # type: ignore[arg-type]
            budget=task.budget,
            seed=task.seed,
            options=dict(task.options),
            baseline=False,
            traffic=task.case.traffic,
            tries=task.case.tries,
        )
    except Exception as exc:  # a failing run is recorded; the comparison goes on
        return _failed(task, exc)
    feasible = s.metrics is not None and s.status in ("optimal", "feasible")
    cert = s.certificate  # SLOs at a percentile: the plan is the walk's certified one
    if cert is not None and cert.certified is None:
        feasible = False
    facts = s.facts
    if task.serving == "disagg":
        facts = {**facts, "label": s.plan.label() if s.plan else None}
    return {
        **_record(task),
        "status": s.status,
        "message": s.message,
        "objective": s.objective if feasible else None,
        "throughput_tok_s": s.metrics.throughput_tok_s if feasible and s.metrics else None,
        "n_evals": s.n_evals,
        "wall_s": s.wall_s,
        "history": [list(h) for h in s.history],
        "plan": s.to_dict()["plan"],
        "facts": _jsonable(facts),
        **({"certificate": _jsonable(cert.to_dict())} if cert is not None else {}),
    }


def _record(task: Task) -> dict[str, Any]:
    """What every record of a run says of its task."""
    return {
        "task_max_evals": task.max_evals,
        "instance": task.instance_name,
        "engine": task.engine,
        "space": task.space_kind,
        "method": task.name,
        "solver": task.method,
        "seed": task.seed,
    }


def _failed(task: Task, exc: Exception) -> dict[str, Any]:
    """The record of a run that raised."""
    return {
        **_record(task),
        "status": "error",
        "message": f"{type(exc).__name__}: {exc}",
        "objective": None,
        "throughput_tok_s": None,
        "n_evals": 0,
        "wall_s": 0.0,
        "history": [],
        "plan": None,
        "facts": {},
    }


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
