"""Optuna: define-by-run Bayesian optimization over the shared search space.

Each trial builds one valid plan of :class:`~shardlab.problems.space.SearchSpace`
through an encoding (below). The plan's integer row goes through
``ctx.evaluator.evaluate`` like every other method's, so it is counted, cached and
budgeted the same way (a cached repeat is told to Optuna but not counted as an
evaluation).

Encodings (option ``encoding``, :mod:`shardlab.solvers.optuna_encodings`)
--------------------------------------------------------------------------
``shared`` (default): the degrees as one integer level per parallel axis, every
operator option as a categorical independent of the degrees (repaired to the canonical
option where the degrees make it invalid) and every pipeline cut as an integer: every
parameter in every trial, so a multivariate sampler fits one joint model and what is
learned under one degree tuple helps the others. ``class``: the degree tuple as one
categorical and the options named per class of tuples with the same valid options
(the encoding of earlier versions; every trial valid without repair). A study keeps
the encoding it was made with.

Trials and the budget
---------------------
The study is driven by ask-and-tell rather than ``study.optimize``: the budget (evaluations,
``Budget.seconds``, an exhausted space, a stalled search) is checked *before* each
``study.ask()``, so the run stops cleanly without a trial that could not be evaluated.
Should the clock run out (or Ctrl-C arrive) inside ``evaluate``, a plan the evaluator
priced is still told COMPLETE and one it did not is told FAIL; no trial is left RUNNING.
(Under ``optimize``, ``BudgetExhausted`` raised in the objective would end the study but
record a FAIL trial with a logged traceback, and ``catch=`` would swallow it and go on.)

Repeats: in a discrete space TPE soon concentrates on its best plans and asks them
again. A repeat is told to Optuna (its value is known; it costs no evaluation), and the
next trial is then an unseen plan one move away from it, queued with
``study.enqueue_trial`` (user attribute ``source="neighbour"``; a wider mutation or a
uniform sample if every such move was priced). Without this, a run spends most of its
trials and time re-asking known plans and can end on the evaluator's stall limit.

Constraints: infeasible plans are told with their real objective value and their
constraint values (``memory``: memory per GPU over HBM, ``ttft`` and ``tpot``: time over
the SLO, relative; ``<= 0`` is feasible, 0 when an SLO does not apply), never a fake
value. On Optuna >= 5 they are stored with ``Trial.set_constraint`` (the samplers'
``constraints_func`` is deprecated there); on older Optuna the values go to the trial's
user attribute ``constraints`` and the sampler's ``constraints_func`` reads them back.
The random sampler ignores constraints; the values are stored all the same.

Storage, resumption and budget
------------------------------
Without ``storage`` the study lives in memory. With any Optuna storage URL (or storage
object) the study ``study`` (default: derived from the problem, see
:func:`default_study_name`) is created with ``load_if_exists``, so a run killed even by
SIGKILL and started again continues the same study: a trial is stored when it is told,
finished trials are never lost, and the one trial running at the kill is told FAIL
once its heartbeat is stale (:mod:`shardlab.solvers.optuna_storage`: by the next run
that opens the study, or by a live worker; until then the samplers skip it, or count it
as a bad trial under constant liar). The study records a fingerprint of the problem
and its search space and refuses to continue for a different problem. Workers that open
a fresh database together may race to create Optuna's tables; opening the study is
retried a few times for that.

A run that opens a study holding finished trials first **replays** their plans into the
evaluator, so the cache, the best plan and the history start where the study stopped,
and the result is always a plan priced by this run's evaluator (its metrics equal
``evaluate(plan)``). Replayed plans **count** toward this run's evaluation budget: the
budget is the number of distinct plans this run knows, as if the runs before it had
been this run. A run killed at 200 of 500 evaluations and started again with the same
``Budget(max_evals=500)`` ends with 500, as an uninterrupted run would; a study that
already holds more distinct plans than the budget is only replayed (up to the budget).
The ``facts`` of the result say how many trials were replayed and told.

Several workers may share one study (a server database such as PostgreSQL; give each a
different seed). Each has its own budget; the trials the others finish while it runs
guide its sampler through the storage (TPE runs with ``constant_liar`` when a storage is
given) but are not priced by its evaluator, so a worker's result is the best plan it
priced (its replay and its own trials); ``facts["study_best_value"]`` is the study's
best feasible value when the worker finished. The study's best over all workers is what
a later run replays.

Determinism: the sampler's seed is derived from ``seed`` and the number of trials the
study held at the start, so one in-memory worker gives the same result for the same
seed, and a resumed run does not repeat the random start-up trials of the run before.

Samplers (option ``sampler``)
-----------------------------
- ``tpe`` (default): ``TPESampler(multivariate=True, n_ei_candidates=4)``, one joint
  model under the shared encoding (``group=True`` under the class encoding, whose
  parameters come and go with the degrees), ``constant_liar`` when a storage is shared.
  Four candidates per trial rather than Optuna's 24: ranking 24 draws from the good
  trials' model by l/g picks the centre of the best plan nearly every time, so the
  search stalls in the first basin it finds (measured in the README). Option
  ``history`` (default ``WINDOW`` = 1,000): TPE models the study's best trials and its
  latest ``history`` ones (:mod:`shardlab.solvers.optuna_history`), so its time per
  trial stays flat instead of growing with the study; its good-trials model is plain
  TPE's, and a study within ``history`` + 25 trials samples exactly as plain TPE.
  ``0`` models every trial (plain TPE).
- ``gp``: ``GPSampler`` (deterministic objective; imports torch when it first fits,
  which this module itself never does). Its fit grows with the cube of the trials: fine
  for a few hundred, not for thousands.
- ``cmaes``: ``CmaEsSampler(with_margin=True)`` over the numeric parameters (the shared
  encoding's degree levels and cuts; the options are sampled independently). It ignores
  the constraints and optimizes one objective only (refused for a Pareto front).
- ``random``: ``RandomSampler``, the black-box floor.
- ``nsga2``: ``NSGAIISampler``; with one objective, a constrained genetic algorithm,
  a few milliseconds per trial.

Optuna's time (``facts["sampler_s"]``: ask, suggest and tell, everything but the cost
model) is reported with every run. OptunaHub's AutoSampler is not offered: ``optunahub``
installs from the package index but fetches the sampler's code from GitHub when it is
loaded, which a machine that reaches only the package index cannot do.

Warm start (option ``warm_start``): ``megatron`` (default) queues the Megatron plan of up
to ``WARM_START`` degree tuples (seeded order) as the first trials, Optuna's way to
start from known configurations (``enqueue_trial``); they are evaluations of the budget
like any other. ``none`` starts from the sampler's own start-up trials.

Pareto mode (workload objective ``pareto``): the study is multi-objective, throughput
per GPU maximized and each of the workload's latency axes (TPOT; TTFT for prefill and
prefill-heavy requests) minimized, with the same constraints; the default sampler is
then ``nsga2`` (every sampler above accepts several objectives). The evaluator keeps
the front of the plans this run priced (:mod:`shardlab.solvers.front`); the result's
plan is the front's highest throughput per GPU.
"""

from __future__ import annotations

import hashlib
import inspect
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import optuna
import sqlalchemy.exc
from optuna.trial import FrozenTrial, Trial, TrialState

from shardlab.costmodel import BatchMetrics, evaluate_batch
from shardlab.errors import ShardlabError
from shardlab.problems.problem import Problem
from shardlab.solvers.base import Outcome, SearchContext, Solver
from shardlab.solvers.evaluator import BudgetExhausted
from shardlab.solvers.front import axes as front_axes
from shardlab.solvers.front import minimized
from shardlab.solvers.moves import mutate, one_move
from shardlab.solvers.optuna_encodings import ENCODINGS, ClassLayout, Layout, layout_for
from shardlab.solvers.optuna_history import WINDOW, WindowedTPESampler
from shardlab.solvers.optuna_storage import (
    STALE_CHECK_TRIALS,
    check_storage_url,
    fail_stale_trials,
    heartbeat,
    open_storage,
)
from shardlab.solvers.registry import register

SAMPLERS: tuple[str, ...] = ("tpe", "gp", "cmaes", "random", "nsga2")
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

# Attempts at opening a study while other workers create the database's tables.
SCHEMA_RETRIES = 4

# Candidates drawn (per kind of move) when looking for an unseen plan after a repeat.
NEIGHBOURS = 64

# Optuna >= 5 stores named constraints on the trial; older versions need constraints_func.
_HAS_SET_CONSTRAINT = hasattr(Trial, "set_constraint")


# -- study identity ------------------------------------------------------------------


# Finished trials replayed per pass, between two readings of the clock.
REPLAY_CHUNK = 512


def fingerprint(problem: Problem) -> str:
    """Hash of the problem and its encoding: a study holds trials of one problem only."""
    space = problem.space
    text = "\n".join(
        [
            repr(problem),
            repr([(v.name, v.cardinality, v.role) for v in space.variables]),
            repr([space.label(i) for i in range(space.num_degree_tuples)]),
            repr(space.mask_table().tobytes().hex()),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()


def default_study_name(problem: Problem) -> str:
    """``shardlab:<model>:<cluster>:<workload>:<tie>:<hash>``; the hash covers the whole
    problem (SLOs, overrides, dtypes), so changing any of them starts another study."""
    return (
        f"shardlab:{problem.model.name}:{problem.cluster.name}:{problem.workload.name}:"
        f"{problem.tie}:{fingerprint(problem)[:10]}"
    )


def _storage_kind(storage: object) -> str:
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


# -- constraints ---------------------------------------------------------------------


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


def _constraints_from_user_attrs(trial: FrozenTrial) -> Sequence[float]:
    return trial.user_attrs.get(ATTR_CONSTRAINTS, [0.0] * len(CONSTRAINTS))


# -- the solver ----------------------------------------------------------------------


def _accepted(cls: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` without the arguments this Optuna version's ``cls`` does not take."""
    params = inspect.signature(cls).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def _make(cls: Callable[..., Any], **kwargs: Any) -> Any:
    return cls(**_accepted(cls, kwargs))


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence Optuna's experimental-feature warnings and its INFO log for a while."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # CMA-ES ignores the constraints (documented in the module docstring).
            warnings.filterwarnings("ignore", "Constraints have been set, but CmaEsSampler")
            # ask-and-tell drives the heartbeat itself (shardlab.solvers.optuna_storage)
            warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used")
            yield
    finally:
        optuna.logging.set_verbosity(level)


# Warm starts (option ``warm_start``) and how many degree tuples the Megatron one covers.
WARM_STARTS: tuple[str, ...] = ("megatron", "none")
WARM_START = 32

# TPE's settings (see the module docstring for the measurements behind them).
TPE_SETTINGS: dict[str, Any] = {"multivariate": True, "n_startup_trials": 10, "n_ei_candidates": 4}


@register("optuna")
class OptunaSolver(Solver):
    description = (
        "Optuna define-by-run search (TPE by default; gp, cmaes, random, nsga2), "
        "resumable and shareable through an Optuna storage"
    )

    def __init__(
        self,
        sampler: str | None = None,
        storage: str | optuna.storages.BaseStorage | None = None,
        study: str | None = None,
        encoding: str = "shared",
        warm_start: str = "megatron",
        history: int | None = None,
    ) -> None:
        if sampler is not None and sampler not in SAMPLERS:
            raise ShardlabError(f"optuna sampler {sampler!r}: use one of {', '.join(SAMPLERS)}")
        if encoding not in ENCODINGS:
            raise ShardlabError(f"optuna encoding {encoding!r}: use one of {', '.join(ENCODINGS)}")
        self.sampler = sampler  # None: tpe, or nsga2 for a Pareto front
        if isinstance(storage, str):
            check_storage_url(storage)  # refused now, not when the study opens
        self.storage = storage
        self.study_name = study
        self.encoding = encoding
        if warm_start not in WARM_STARTS:
            raise ShardlabError(
                f"optuna warm start {warm_start!r}: use one of {', '.join(WARM_STARTS)}"
            )
        self.warm_start = warm_start
        if history is not None and (not isinstance(history, int) or history < 0):
            raise ShardlabError(
                f"optuna history {history!r}: a number of trials >= 0 (0: every trial)"
            )
        if history is not None and sampler not in (None, "tpe"):
            raise ShardlabError(f"optuna history is TPE's; sampler {sampler} models every trial")
        # tpe: the latest trials modelled besides the best ones; 0: every trial
        self.history = WINDOW if history is None else history

    # -- set-up ----------------------------------------------------------------------

    def _sampler(self, name: str, seed: int) -> optuna.samplers.BaseSampler:
        samplers = optuna.samplers
        cons: dict[str, Any] = (
            {} if _HAS_SET_CONSTRAINT else {"constraints_func": _constraints_from_user_attrs}
        )
        if name == "tpe":
            tpe = _accepted(
                samplers.TPESampler,
                {
                    # The shared encoding asks every parameter in every trial: one joint
                    # model. The class encoding's parameters come and go with the degrees.
                    "group": self.encoding == "class",
                    "seed": seed,
                    "constant_liar": self.storage is not None,
                    **TPE_SETTINGS,
                    **cons,
                },
            )
            if self.history == 0:
                return samplers.TPESampler(**tpe)
            return WindowedTPESampler(window=self.history, **tpe)
        if name == "gp":
            return _make(
                samplers.GPSampler,
                seed=seed,
                deterministic_objective=True,
                warn_independent_sampling=False,
                **cons,
            )
        if name == "cmaes":
            # Numeric parameters only (the shared encoding's degree levels and cuts);
            # the categorical options are sampled independently (uniformly).
            return _make(
                samplers.CmaEsSampler,
                seed=seed,
                warn_independent_sampling=False,
                with_margin=True,  # integer parameters: keep the search from collapsing
            )
        if name == "nsga2":
            return _make(samplers.NSGAIISampler, seed=seed, **cons)
        return samplers.RandomSampler(seed=seed)

    def _open(self, ctx: SearchContext, layout: Layout) -> optuna.Study:
        problem = ctx.problem
        name = self.study_name or default_study_name(problem)
        for attempt in range(SCHEMA_RETRIES):
            try:
                study = optuna.create_study(
                    storage=open_storage(self.storage),
                    sampler=optuna.samplers.RandomSampler(seed=0),  # replaced below
                    study_name=name,
                    directions=directions(problem),
                    load_if_exists=True,
                )
                break
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
                # Workers that open a fresh database together race to create Optuna's
                # tables and types; the loser finds them made and succeeds next time.
                if attempt == SCHEMA_RETRIES - 1:
                    raise
                time.sleep(0.5 * (attempt + 1))
        wanted = [optuna.study.StudyDirection[d.upper()] for d in directions(problem)]
        if study.directions != wanted:
            raise ShardlabError(
                f"study {name!r} optimizes {len(study.directions)} objective(s), this problem "
                f"{len(wanted)} ({', '.join(front_axes(problem)) if pareto(problem) else 'one'})"
                "; choose another --study"
            )
        fp = fingerprint(problem)
        attrs = study.user_attrs
        if ATTR_FINGERPRINT not in attrs:
            trials = study.get_trials(deepcopy=False)
            attrs = study.user_attrs  # another worker may have claimed the study meanwhile
            if ATTR_FINGERPRINT not in attrs:
                if trials:
                    raise ShardlabError(
                        f"study {name!r} already holds trials that shardlab did not make; "
                        "choose another --study"
                    )
                # the fingerprint claims the study, so it is written last: a worker that
                # sees it also sees the encoding (each write commits on its own)
                study.set_user_attr(ATTR_PROBLEM, problem.name)
                study.set_user_attr(ATTR_ENCODING, layout.encoding)
                if isinstance(layout, ClassLayout):
                    study.set_user_attr(ATTR_CLASSES, layout.class_members)
                study.set_user_attr(ATTR_FINGERPRINT, fp)
                attrs = {ATTR_FINGERPRINT: fp, ATTR_ENCODING: layout.encoding}
        if attrs[ATTR_FINGERPRINT] != fp:
            raise ShardlabError(
                f"study {name!r} was made for another problem ({attrs.get(ATTR_PROBLEM)}, or "
                "another version of its model, cluster, workload or search space); choose "
                "another --study or a fresh storage"
            )
        made_with = attrs.get(ATTR_ENCODING, "class")  # studies before encodings had one
        if made_with != layout.encoding:
            raise ShardlabError(
                f"study {name!r} was made with the {made_with} encoding; pass --encoding "
                f"{made_with} to continue it, or choose another --study"
            )
        return study

    # -- the search ------------------------------------------------------------------

    def _search(self, ctx: SearchContext) -> Outcome:
        ev = ctx.evaluator
        with _quiet():
            ev.enter("opening the study")
            layout = layout_for(ctx.space, self.encoding)
            study = self._open(ctx, layout)
            sampler = self.sampler or ("nsga2" if pareto(ctx.problem) else "tpe")
            if sampler == "cmaes" and pareto(ctx.problem):
                raise ShardlabError(
                    "optuna sampler cmaes optimizes one objective; for --objective pareto "
                    "use nsga2 (the default), tpe, gp or random"
                )
            facts: dict[str, Any] = {
                "sampler": sampler,
                "study": study.study_name,
                "storage": _storage_kind(self.storage),
                "replayed_trials": 0,
                "replay_mismatches": 0,
                "trials": 0,
                "repeated_trials": 0,
                "neighbour_trials": 0,
                "warm_start_trials": 0,
                "encoding": layout.encoding,
                **({"history": self.history} if sampler == "tpe" else {}),
                "sampler_s": 0.0,  # Optuna's own time: ask, suggest and tell
            }
            facts["stale_trials_failed"] = fail_stale_trials(study)
            existing = study.get_trials(deepcopy=False)
            facts["running_at_start"] = sum(t.state == TrialState.RUNNING for t in existing)
            base = int(ctx.rng.integers(0, 2**32 - 1))
            seed = int(np.random.SeedSequence([base, len(existing)]).generate_state(1)[0])
            study.sampler = self._sampler(sampler, seed)
            try:
                self._replay(ctx, existing, facts)
                if not existing and self.warm_start == "megatron":
                    self._enqueue_megatron(ctx, study, layout, facts)
                ev.enter("search")
                while True:
                    ctx.evaluator.check_budget()  # before a trial exists: none left unpriced
                    self._trial(ctx, study, layout, facts)
            except BudgetExhausted:
                pass
            facts["study_complete_trials"] = len(
                study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            )
            if pareto(ctx.problem):
                facts["study_front_trials"] = len(study.best_trials)
            else:
                try:
                    facts["study_best_value"] = study.best_value
                except ValueError:  # no feasible trial in the study
                    facts["study_best_value"] = None
        return Outcome(facts=facts)

    def _replay(self, ctx: SearchContext, trials: list[FrozenTrial], facts: dict) -> None:
        """Price the plans of the study's finished trials, in trial order (counted)."""
        done = [t for t in trials if t.state == TrialState.COMPLETE and ATTR_CODE in t.user_attrs]
        if not done:
            return
        codes = np.array([t.user_attrs[ATTR_CODE] for t in done], dtype=np.int64)
        if codes.shape[1:] != (ctx.space.n_vars,) or not ctx.space.is_valid(codes).all():
            raise ShardlabError(
                f"study {facts['study']!r} holds plans outside this search space; "
                "choose another --study"
            )
        ev = ctx.evaluator
        ev.enter(f"replaying the study's {len(done):,} finished trials")
        facts["replayed_trials"] = len(done)
        # A changed cost model would make the stored values stale: say so in the facts.
        was = np.array([t.values[0] for t in done], dtype=float)
        for start in range(0, len(codes), REPLAY_CHUNK):
            part = slice(start, start + REPLAY_CHUNK)
            ev.evaluate(codes[part])  # reads the clock between new degree tuples
            now = evaluate_batch(ctx.problem, codes[part]).objective
            facts["replay_mismatches"] += int(
                (~np.isclose(now, was[part], rtol=1e-9, atol=0.0, equal_nan=True)).sum()
            )

    def _trial(self, ctx: SearchContext, study: optuna.Study, layout: Layout, facts: dict) -> None:
        if facts["trials"] and facts["trials"] % STALE_CHECK_TRIALS == 0:
            facts["stale_trials_failed"] += fail_stale_trials(study)
        start = time.perf_counter()
        trial = study.ask()
        with heartbeat(study, trial._trial_id):
            self._run_trial(ctx, study, layout, facts, trial, start)

    def _run_trial(
        self,
        ctx: SearchContext,
        study: optuna.Study,
        layout: Layout,
        facts: dict,
        trial: Trial,
        start: float,
    ) -> None:
        ev = ctx.evaluator
        try:
            row = layout.suggest(trial)  # the sampler fits when the first value is asked
        except BaseException:
            study.tell(trial, state=TrialState.FAIL)
            raise
        facts["sampler_s"] += time.perf_counter() - start
        key = row.tobytes()
        seen = key in ev.cache
        try:
            ev.evaluate(row[None])
        except BaseException:
            # The budget, the clock or Ctrl-C stopped the run. A plan priced before the
            # stop is told complete (it is the evaluator's, and may be its best); one
            # that was not priced is told failed, so no trial is left running.
            if key in ev.cache:
                self._tell(ctx, study, trial, row, facts, seen)
            else:
                study.tell(trial, state=TrialState.FAIL)
            raise
        self._tell(ctx, study, trial, row, facts, seen)
        if seen:
            self._queue_unseen(ctx, study, layout, row, facts)

    def _enqueue_megatron(
        self, ctx: SearchContext, study: optuna.Study, layout: Layout, facts: dict
    ) -> None:
        """Queue the Megatron plan of up to ``WARM_START`` degree tuples (seeded order).

        Optuna's way to start from known configurations (``enqueue_trial``); each is an
        evaluation of the budget like any other trial. It puts a plan with the standard
        operator pairing under many degree tuples into the first trials, which uniform
        start-up trials almost never draw (a tensor-parallel plan needs every operator's
        option right at once to beat the data-parallel plans, whose options are inert).
        """
        space = ctx.space
        order = ctx.rng.permutation(space.num_degree_tuples)[:WARM_START]
        left = ctx.evaluator.remaining
        if left is not None:  # none left waiting in the storage when the budget ends
            order = order[:left]
        for d in order:
            row = space.encode(space.megatron_plan(space.degree_tuples[int(d)]))
            study.enqueue_trial(layout.params_of(row), user_attrs={ATTR_SOURCE: "megatron"})
        facts["warm_start_trials"] = len(order)

    def _queue_unseen(
        self,
        ctx: SearchContext,
        study: optuna.Study,
        layout: Layout,
        row: np.ndarray,
        facts: dict,
    ) -> None:
        """After a trial that repeated a priced plan, queue an unseen plan next to it.

        In a discrete space TPE soon concentrates on its best plans and asks them again
        and again; a repeat costs no evaluation but a trial, and the runs would spend
        their time (and the stall limit) re-asking. The queued trial (``enqueue_trial``,
        user attribute ``source="neighbour"``) is one move away from the repeated plan
        (a wider mutation, then a uniform sample, if every such move was priced), and is
        told and learned from like any other.
        """
        try:
            ctx.evaluator.check_budget()  # nothing is queued that could not be evaluated
        except BudgetExhausted:
            return
        space, rng, cache = ctx.space, ctx.rng, ctx.evaluator.cache
        rows = np.repeat(row[None], NEIGHBOURS, axis=0)
        moves = (
            lambda: one_move(space, rows, rng, degree_rate=0.1),
            lambda: mutate(space, rows, rng, rate=0.3, degree_rate=0.2),
            lambda: space.sample(NEIGHBOURS, seed=int(rng.integers(0, 2**63 - 1))),
        )
        for move in moves:
            for cand in move():
                if cand.tobytes() not in cache:
                    study.enqueue_trial(
                        layout.params_of(cand), user_attrs={ATTR_SOURCE: "neighbour"}
                    )
                    facts["neighbour_trials"] += 1
                    return

    def _tell(
        self,
        ctx: SearchContext,
        study: optuna.Study,
        trial: Trial,
        row: np.ndarray,
        facts: dict,
        seen: bool,
    ) -> None:
        # The evaluator has priced and counted this row; its full metrics come from the
        # cost model directly (Evaluator.metrics would count a cached call as a stall).
        m = evaluate_batch(ctx.problem, row[None])
        cons = constraint_values(ctx.problem, m)[0]
        trial.set_user_attr(ATTR_CODE, [int(x) for x in row])
        trial.set_user_attr(
            ATTR_METRICS,
            {
                "feasible": bool(m.feasible[0]),
                "memory_gb_per_gpu": float(m.memory_gb_per_gpu[0]),
                "ttft_ms": float(m.ttft_ms[0]),
                "tpot_ms": float(m.tpot_ms[0]),
                "throughput_tok_s": float(m.throughput_tok_s[0]),
            },
        )
        start = time.perf_counter()
        if _HAS_SET_CONSTRAINT:
            for name, value in zip(CONSTRAINTS, cons, strict=True):
                trial.set_constraint(name, float(value))
        else:
            trial.set_user_attr(ATTR_CONSTRAINTS, [float(c) for c in cons])
        if pareto(ctx.problem):
            study.tell(trial, [float(v) for v in front_values(ctx.problem, m)[0]])
        else:
            study.tell(trial, float(m.objective[0]))
        facts["sampler_s"] += time.perf_counter() - start
        facts["trials"] += 1
        facts["repeated_trials"] += int(seen)
