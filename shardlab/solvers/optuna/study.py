"""A study's identity and opening: its name, the fingerprint that claims it for one
problem, its directions and the values and constraints it is told."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np
import optuna
import sqlalchemy.exc
from optuna.storages import BaseStorage
from optuna.study._tell import _tell_with_warning
from optuna.trial import Trial

from shardlab.costmodel import BatchMetrics
from shardlab.errors import ShardlabError
from shardlab.problems.problem import Problem
from shardlab.solvers.front import axes as front_axes
from shardlab.solvers.front import minimized
from shardlab.solvers.optuna.encodings import ClassLayout, Layout
from shardlab.solvers.optuna.storage import (
    open_storage,
    schema_race,
)

CONSTRAINTS: tuple[str, ...] = ("memory", "ttft", "tpot")

# Study user attributes written by this solver.
ATTR_FINGERPRINT = "shardlab.fingerprint"
ATTR_PROBLEM = "shardlab.problem"
ATTR_CLASSES = "shardlab.option_classes"  # class encoding: the degree tuples of each class
ATTR_ENCODING = "shardlab.encoding"
# Trial user attributes.
ATTR_CODE = "code"
ATTR_METRICS = "metrics"
ATTR_CONSTRAINTS = "constraints"
ATTR_SOURCE = "source"  # "neighbour" on trials queued after a repeat

# How a refusal of a study says to go on.
ANOTHER_STUDY = "give another study name"

# Attempts at opening a study while other workers create the database's tables.
SCHEMA_RETRIES = 4


# Bytes of the validity mask hashed at a time (its hex text is twice as long).
FINGERPRINT_CHUNK = 1 << 24


def fingerprint(problem: Problem) -> str:
    """Hash of the problem and its encoding: a study holds trials of one problem only.

    The SHA-256 of the lines ``repr(problem)``, the variables, the degree labels and
    ``repr`` of the validity mask's hex text. The mask is hashed a chunk at a time: on
    moe1.6t-h100x256-chat-layer it is 462 MB, and its text built whole (hex, repr,
    encode: three ~0.9 GB copies) took 5.9 s where this takes 2.6 s, once per run.
    """
    space = problem.space
    head = "\n".join(
        [
            repr(problem),
            repr([(v.name, v.cardinality, v.role) for v in space.variables]),
            repr([space.label(i) for i in range(space.num_degree_tuples)]),
        ]
    )
    digest = hashlib.sha256(f"{head}\n'".encode())  # the hex text's repr is quoted
    mask = memoryview(np.ascontiguousarray(space.mask_table())).cast("B")
    for start in range(0, len(mask), FINGERPRINT_CHUNK):
        digest.update(mask[start : start + FINGERPRINT_CHUNK].hex().encode())
    digest.update(b"'")
    return digest.hexdigest()


def default_study_name(problem: Problem, fp: str | None = None) -> str:
    """``shardlab:<model>:<cluster>:<workload>:<tie>:<hash>``; the hash covers the whole
    problem (SLOs, overrides, dtypes), so changing any of them starts another study
    (``fp``: the problem's :func:`fingerprint`, when known)."""
    return (
        f"shardlab:{problem.model.name}:{problem.cluster.name}:{problem.workload.name}:"
        f"{problem.tie}:{(fp or fingerprint(problem))[:10]}"
    )


def storage_kind(storage: object) -> str:
    if storage is None:
        return "memory"
    if isinstance(storage, str):
        return storage.split(":", 1)[0]  # never the credentials
    return type(storage).__name__


def pareto(problem: Problem) -> bool:
    return problem.workload.objective == "pareto"


def directions(problem: Problem) -> list[str]:
    """The study's directions: the objective, or throughput per GPU and each latency."""
    if not pareto(problem):
        return ["maximize"]
    return ["maximize", *["minimize"] * len(problem.workload.latency_axes)]


def front_values(problem: Problem, m: BatchMetrics) -> np.ndarray:
    """``(n, 1 + axes)`` values a Pareto study is told, in the study's directions."""
    values = minimized(problem, m)
    values[:, 0] = -values[:, 0]
    return values


def constraint_values(problem: Problem, m: BatchMetrics) -> np.ndarray:
    """``(n, 3)`` relative excess of memory, TTFT and TPOT (``<= 0`` where satisfied).

    Positive exactly where the cost model flags the violation, so Optuna's feasibility
    (every constraint ``<= 0``) is the cost model's.
    """
    w = problem.workload
    mem = m.memory_gb_per_gpu / problem.cluster.accelerator.hbm_gb - 1.0
    cols = [np.where(m.memory_violation, np.maximum(mem, 1e-3), np.minimum(mem, 0.0))]
    for slo, value, flag in (
        (w.ttft_ms, m.ttft_ms, m.ttft_violation),
        (w.tpot_ms, m.tpot_ms, m.tpot_violation),
    ):
        if slo is None:
            cols.append(np.where(flag, 1e-3, 0.0))
            continue
        rel = value / slo - 1.0
        cols.append(np.where(flag, np.maximum(rel, 1e-3), np.minimum(rel, 0.0)))
    return np.stack(cols, axis=1)


def tell(study: optuna.Study, trial: Trial, values: float | list[float]) -> None:
    """``study.tell(trial, values)`` without the deep copy of the told trial that
    ``tell`` returns and nothing here reads (26 ms a trial at 659 parameters)."""
    _tell_with_warning(study=study, trial=trial, value_or_values=values)


# -- opening -------------------------------------------------------------------------


def open_study(
    problem: Problem, storage: str | BaseStorage | None, name: str | None, layout: Layout
) -> optuna.Study:
    """The study ``name`` (default: :func:`default_study_name`) in ``storage``, created
    or continued, and claimed for ``problem`` and ``layout``'s encoding; refused when
    another problem, encoding or program made it."""
    fp = fingerprint(problem)
    name = name or default_study_name(problem, fp)
    study = _create(problem, storage, name)
    wanted = [optuna.study.StudyDirection[d.upper()] for d in directions(problem)]
    if study.directions != wanted:
        raise ShardlabError(
            f"study {name!r} optimizes {len(study.directions)} objective(s), this problem "
            f"{len(wanted)} ({', '.join(front_axes(problem)) if pareto(problem) else 'one'})",
            field="study",
            fix=ANOTHER_STUDY,
        )
    attrs = _claim(study, problem, layout, fp)
    if attrs[ATTR_FINGERPRINT] != fp:
        raise ShardlabError(
            f"study {name!r} was made for another problem ({attrs.get(ATTR_PROBLEM)}, or "
            "another version of its model, cluster, workload or search space)",
            field="study",
            fix=f"{ANOTHER_STUDY}, or a fresh storage",
        )
    made_with = attrs.get(ATTR_ENCODING, "class")  # studies before encodings had one
    if made_with != layout.encoding:
        raise ShardlabError(
            f"study {name!r} was made with the {made_with} encoding",
            field="encoding",
            fix=f"use encoding {made_with!r} to continue it, or {ANOTHER_STUDY}",
        )
    return study


def _create(problem: Problem, storage: str | BaseStorage | None, name: str) -> optuna.Study:
    for attempt in range(SCHEMA_RETRIES):
        try:
            return optuna.create_study(
                storage=open_storage(storage),
                sampler=optuna.samplers.RandomSampler(seed=0),  # replaced by the solver
                study_name=name,
                directions=directions(problem),
                load_if_exists=True,
            )
        except sqlalchemy.exc.DatabaseError as exc:
            # Workers that open a fresh database together race to create Optuna's
            # tables and types; the loser finds them made and succeeds next time.
            if not schema_race(exc) or attempt == SCHEMA_RETRIES - 1:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def _claim(study: optuna.Study, problem: Problem, layout: Layout, fp: str) -> dict[str, Any]:
    """The study's attributes; a study nobody claimed yet is claimed for ``problem``
    (its fingerprint ``fp``)."""
    attrs = study.user_attrs
    if ATTR_FINGERPRINT in attrs:
        return attrs
    trials = study.get_trials(deepcopy=False)
    attrs = study.user_attrs  # another worker may have claimed the study meanwhile
    if ATTR_FINGERPRINT in attrs:
        return attrs
    if trials:
        raise ShardlabError(
            f"study {study.study_name!r} already holds trials that shardlab did not make",
            field="study",
            fix=ANOTHER_STUDY,
        )
    # the fingerprint claims the study, so it is written last: a worker that sees it
    # also sees the encoding (each write commits on its own)
    study.set_user_attr(ATTR_PROBLEM, problem.name)
    study.set_user_attr(ATTR_ENCODING, layout.encoding)
    if isinstance(layout, ClassLayout):
        study.set_user_attr(ATTR_CLASSES, layout.class_members)
    study.set_user_attr(ATTR_FINGERPRINT, fp)
    return {ATTR_FINGERPRINT: fp, ATTR_ENCODING: layout.encoding}
