"""Optuna: define-by-run Bayesian optimization over the shared search space.

Each trial builds one valid plan of :class:`~shardlab.problems.space.SearchSpace`
through an encoding (below). The plan's integer row goes through
``ctx.evaluator.evaluate`` like every other method's, so it is counted, cached and
budgeted the same way (a cached repeat is told to Optuna but not counted as an
evaluation).

Encodings (option ``encoding``, :mod:`.encodings`)
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
once its heartbeat is stale (:mod:`.storage`: by the next run
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
  latest ``history`` ones (:mod:`.history`), so its time per
  trial stays flat instead of growing with the study; its good-trials model is plain
  TPE's, and a study within ``history`` + 25 trials samples exactly as plain TPE.
  ``0`` models every trial (plain TPE). The same sampler converts each finished trial
  for TPE once and fits the Parzen estimator a block of parameters at a time
  (:mod:`.parzen`), with Optuna's numbers bit for bit: on the 659 parameters of
  moe1.6t-h100x256-chat-layer, 5,000 evaluations take 316 s instead of 2,436 s, the
  same trials and plan for the same seed (measurements in :mod:`.history`).
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

from shardlab.solvers.optuna.encodings import (
    ClassLayout,
    Layout,
    SharedLayout,
    layout_for,
)
from shardlab.solvers.optuna.solver import OptunaSolver
from shardlab.solvers.optuna.storage import check_storage_url, open_storage
from shardlab.solvers.optuna.study import default_study_name, fingerprint

__all__ = [
    "ClassLayout",
    "Layout",
    "OptunaSolver",
    "SharedLayout",
    "check_storage_url",
    "default_study_name",
    "fingerprint",
    "layout_for",
    "open_storage",
]
