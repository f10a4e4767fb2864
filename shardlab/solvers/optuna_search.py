"""Optuna: define-by-run Bayesian optimization over the shared search space.

Each trial builds one valid plan of :class:`~shardlab.problems.space.SearchSpace`:
it suggests the degree tuple first (a categorical over the degree tuples), then the
value of every operator-option variable from the options valid under those degrees
(``space.mask(d)``), then the pipeline cut shifts valid for the chosen ``pp``. Every
trial is therefore a valid plan and none is wasted on repair or rejection. The plan's
integer row goes through ``ctx.evaluator.evaluate`` like every other method's, so it is
counted, cached and budgeted the same way (a cached repeat is told to Optuna but not
counted as an evaluation).

Parameter names: one option class per distinct validity mask
--------------------------------------------------------------
Optuna requires a parameter name to keep one distribution for the whole study, while
the options valid for an operator depend on the degree tuple. The candidate schemes:

- the full cardinality under every name, repaired afterwards: stable, but invalid
  choices map to the same repaired plan, so the sampler learns a distorted landscape
  and "every trial is valid" is lost;
- one index over the valid list under one name: stable bounds need the largest list,
  and index ``i`` means different options under different degrees, so TPE learns noise;
- one name per degree tuple (``d17.dense.qkv_proj``): sound, but nothing learned under
  one degree tuple helps another; DeepSeek-V3 on 64 GPUs has 335 tuples, so each one
  would see a handful of trials;
- **one name per option class (used here)**: the degree tuples are grouped by the
  validity mask of their option variables (which options of which operators are
  allowed), classes are numbered ``c0, c1, ...`` in degree-tuple order, and a
  multi-valued option variable is suggested as ``c{k}.{group}.{op}`` with the class's
  valid option names as categorical choices. The name fixes the choice set, so Optuna's
  one-distribution-per-name rule holds (checked when the names are built). All tuples
  with the same valid options (e.g. every ``tp > 1, dp_attn = 1`` tuple) pool their
  trials: DeepSeek-V3 on 64 GPUs has 4 classes, the small suite instances 3 or 4.

Cut shifts are integers (ordinal, so TPE and GP can interpolate) named
``pp{pp}.cut{j}`` over ``[-s, s]``, ``s`` the largest shift allowed for that ``pp``.
Variables with a single valid value are fixed, not suggested.

Why TPE still learns: with ``multivariate=True, group=True`` TPE splits the parameters
into groups that always occur together, here ``degrees`` / the options of one class /
the cuts of one ``pp``, and fits a joint Parzen estimator per group. The options of a
class are thus modelled jointly (the pairings that avoid a redistribution, such as a
column-parallel QKV with a row-parallel output projection, are learned together), the
degree tuple is learned from every trial, and a class's options from every trial that
used a tuple of that class. GP and NSGA-II model only the parameters present in every
trial (the degree tuple, and an option or cut only when every degree tuple allows a
choice for it); the rest they sample independently.

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
finished trials are never lost, and the one trial running at the kill stays RUNNING
(never evaluated; the samplers skip it, or count it as a bad trial under constant
liar). The study records a fingerprint of the problem and its search space and refuses
to continue for a different problem. Workers that open a fresh database together may
race to create Optuna's tables; opening the study is retried a few times for that.

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

Samplers (option ``sampler``): ``tpe`` (default; ``TPESampler(multivariate=True,
group=True)``), ``gp`` (``GPSampler``, deterministic objective; imports torch when it
first fits, which this module itself never does), ``random`` and ``nsga2``
(``NSGAIISampler``). With the workload's objective, maximized, the study is
single-objective and ``nsga2`` runs as a constrained genetic algorithm.

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
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
import sqlalchemy.exc
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, Trial, TrialState

from shardlab.costmodel import BatchMetrics, evaluate_batch
from shardlab.errors import ShardlabError
from shardlab.problems.problem import Problem
from shardlab.problems.space import MAX_SHIFT, SearchSpace
from shardlab.solvers.base import Outcome, SearchContext, Solver
from shardlab.solvers.evaluator import BudgetExhausted
from shardlab.solvers.front import axes as front_axes
from shardlab.solvers.front import minimized
from shardlab.solvers.moves import mutate, one_move
from shardlab.solvers.registry import register

SAMPLERS: tuple[str, ...] = ("tpe", "gp", "random", "nsga2")
CONSTRAINTS: tuple[str, ...] = ("memory", "ttft", "tpot")

# Study user attributes written by this solver.
ATTR_FINGERPRINT = "shardlab.fingerprint"
ATTR_PROBLEM = "shardlab.problem"
ATTR_CLASSES = "shardlab.option_classes"
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


# -- the parameters of one search space ----------------------------------------------


@dataclass(frozen=True)
class _Param:
    var: int  # variable index in the encoding
    name: str
    choices: tuple[int, ...] = ()  # option parameters: option index of each choice
    labels: tuple[str, ...] = ()  # option parameters: option name of each choice
    low: int = 0  # cut parameters: shift range
    high: int = 0

    @property
    def is_cut(self) -> bool:
        return not self.choices

    def distribution(self) -> BaseDistribution:
        if self.is_cut:
            return IntDistribution(self.low, self.high)
        return CategoricalDistribution(self.labels)


class Layout:
    """How a search space is asked of an Optuna trial: names, choices, fixed values."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.degree_labels = tuple(d.short() for d in space.degree_tuples)
        if len(set(self.degree_labels)) != len(self.degree_labels):
            raise ShardlabError("degree tuples with identical labels; cannot name them")
        class_of: dict[bytes, str] = {}
        self.class_members: dict[str, list[str]] = {}
        self.templates: list[np.ndarray] = []
        self.params: list[tuple[_Param, ...]] = []
        self.classes: list[str] = []
        distributions: dict[str, BaseDistribution] = {}
        op_of = {v: op for v, _, op in space.option_slots()}
        for d, degrees in enumerate(space.degree_tuples):
            mask = space.mask(d)
            key = mask[1 : space.first_cut].tobytes()
            label = class_of.setdefault(key, f"c{len(class_of)}")
            self.classes.append(label)
            self.class_members.setdefault(label, []).append(self.degree_labels[d])
            row = np.zeros(space.n_vars, dtype=np.int64)
            row[0] = d
            params: list[_Param] = []
            for v in range(1, space.n_vars):
                var = space.variables[v]
                valid = np.flatnonzero(mask[v])
                row[v] = valid[0]  # the value when fixed; overwritten when suggested
                if len(valid) < 2:
                    continue
                if var.role == "option":
                    op = op_of[v]
                    p = _Param(
                        var=v,
                        name=f"{label}.{var.name}",
                        choices=tuple(int(i) for i in valid),
                        labels=tuple(op.options[int(i)].name for i in valid),
                    )
                else:
                    if valid[-1] - valid[0] + 1 != len(valid):
                        raise ShardlabError(f"{var.name}: valid cut shifts are not contiguous")
                    p = _Param(
                        var=v,
                        name=f"pp{degrees.pp}.{var.name}",
                        low=int(valid[0]) - MAX_SHIFT,
                        high=int(valid[-1]) - MAX_SHIFT,
                    )
                dist = p.distribution()
                if distributions.setdefault(p.name, dist) != dist:  # Optuna's rule, checked
                    raise ShardlabError(f"parameter {p.name} would change its distribution")
                params.append(p)
            self.templates.append(row)
            self.params.append(tuple(params))
        self.distributions = distributions

    def suggest(self, trial: Trial) -> np.ndarray:
        """Ask ``trial`` for one plan (degrees first, then its valid values); its row."""
        label = trial.suggest_categorical("degrees", self.degree_labels)
        d = self.degree_labels.index(label)
        row = self.templates[d].copy()
        for p in self.params[d]:
            if p.is_cut:
                row[p.var] = MAX_SHIFT + trial.suggest_int(p.name, p.low, p.high)
            else:
                row[p.var] = p.choices[p.labels.index(trial.suggest_categorical(p.name, p.labels))]
        return row

    def params_of(self, row: np.ndarray) -> dict[str, Any]:
        """The trial parameters that :meth:`suggest` turns into ``row``."""
        d = int(row[0])
        out: dict[str, Any] = {"degrees": self.degree_labels[d]}
        for p in self.params[d]:
            if p.is_cut:
                out[p.name] = int(row[p.var]) - MAX_SHIFT
            else:
                out[p.name] = p.labels[p.choices.index(int(row[p.var]))]
        return out


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
            repr([d.short() for d in space.degree_tuples]),
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


def _make(cls: Callable[..., Any], **kwargs: Any) -> Any:
    """``cls(**kwargs)`` without the arguments this Optuna version does not take."""
    accepted = inspect.signature(cls).parameters
    return cls(**{k: v for k, v in kwargs.items() if k in accepted})


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence Optuna's experimental-feature warnings and its INFO log for a while."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield
    finally:
        optuna.logging.set_verbosity(level)


@register("optuna")
class OptunaSolver(Solver):
    description = (
        "Optuna define-by-run search (TPE by default; gp, random, nsga2), "
        "resumable and shareable through an Optuna storage"
    )

    def __init__(
        self,
        sampler: str | None = None,
        storage: str | optuna.storages.BaseStorage | None = None,
        study: str | None = None,
    ) -> None:
        if sampler is not None and sampler not in SAMPLERS:
            raise ShardlabError(f"optuna sampler {sampler!r}: use one of {', '.join(SAMPLERS)}")
        self.sampler = sampler  # None: tpe, or nsga2 for a Pareto front
        self.storage = storage
        self.study_name = study

    # -- set-up ----------------------------------------------------------------------

    def _sampler(self, name: str, seed: int) -> optuna.samplers.BaseSampler:
        samplers = optuna.samplers
        cons: dict[str, Any] = (
            {} if _HAS_SET_CONSTRAINT else {"constraints_func": _constraints_from_user_attrs}
        )
        if name == "tpe":
            return _make(
                samplers.TPESampler,
                multivariate=True,
                group=True,
                seed=seed,
                constant_liar=self.storage is not None,
                **cons,
            )
        if name == "gp":
            return _make(
                samplers.GPSampler,
                seed=seed,
                deterministic_objective=True,
                warn_independent_sampling=False,
                **cons,
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
                    storage=self.storage,
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
                study.set_user_attr(ATTR_FINGERPRINT, fp)
                study.set_user_attr(ATTR_PROBLEM, problem.name)
                study.set_user_attr(ATTR_CLASSES, layout.class_members)
                attrs = {ATTR_FINGERPRINT: fp}
        if attrs[ATTR_FINGERPRINT] != fp:
            raise ShardlabError(
                f"study {name!r} was made for another problem ({attrs.get(ATTR_PROBLEM)}, or "
                "another version of its model, cluster, workload or search space); choose "
                "another --study or a fresh storage"
            )
        return study

    # -- the search ------------------------------------------------------------------

    def _search(self, ctx: SearchContext) -> Outcome:
        ev = ctx.evaluator
        with _quiet():
            ev.enter("opening the study")
            layout = Layout(ctx.space)
            study = self._open(ctx, layout)
            sampler = self.sampler or ("nsga2" if pareto(ctx.problem) else "tpe")
            facts: dict[str, Any] = {
                "sampler": sampler,
                "study": study.study_name,
                "storage": _storage_kind(self.storage),
                "replayed_trials": 0,
                "replay_mismatches": 0,
                "trials": 0,
                "repeated_trials": 0,
                "neighbour_trials": 0,
            }
            existing = study.get_trials(deepcopy=False)
            facts["running_at_start"] = sum(t.state == TrialState.RUNNING for t in existing)
            base = int(ctx.rng.integers(0, 2**32 - 1))
            seed = int(np.random.SeedSequence([base, len(existing)]).generate_state(1)[0])
            study.sampler = self._sampler(sampler, seed)
            try:
                self._replay(ctx, existing, facts)
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
        ev = ctx.evaluator
        trial = study.ask()
        try:
            row = layout.suggest(trial)
        except BaseException:
            study.tell(trial, state=TrialState.FAIL)
            raise
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
        if _HAS_SET_CONSTRAINT:
            for name, value in zip(CONSTRAINTS, cons, strict=True):
                trial.set_constraint(name, float(value))
        else:
            trial.set_user_attr(ATTR_CONSTRAINTS, [float(c) for c in cons])
        if pareto(ctx.problem):
            study.tell(trial, [float(v) for v in front_values(ctx.problem, m)[0]])
        else:
            study.tell(trial, float(m.objective[0]))
        facts["trials"] += 1
        facts["repeated_trials"] += int(seen)
