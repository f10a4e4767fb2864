"""The Optuna solver: ask-and-tell trials on the shared evaluator, with replay,
warm starts and unseen neighbours after a repeat (see the package docstring)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from shardlab.costmodel import evaluate_batch
from shardlab.errors import ShardlabError
from shardlab.solvers.base import Outcome, SearchContext, Solver
from shardlab.solvers.evaluator import BudgetExhausted
from shardlab.solvers.moves import mutate, one_move
from shardlab.solvers.options import OptunaOptions
from shardlab.solvers.optuna.encodings import Layout, layout_for
from shardlab.solvers.optuna.samplers import HAS_SET_CONSTRAINT, make_sampler, quiet
from shardlab.solvers.optuna.storage import (
    STALE_CHECK_TRIALS,
    fail_stale_trials,
    heartbeat,
)
from shardlab.solvers.optuna.study import (
    ANOTHER_STUDY,
    ATTR_CODE,
    ATTR_CONSTRAINTS,
    ATTR_METRICS,
    ATTR_SOURCE,
    CONSTRAINTS,
    constraint_values,
    front_values,
    open_study,
    pareto,
    storage_kind,
    tell,
)
from shardlab.solvers.registry import register

# Finished trials replayed per pass, between two readings of the clock.
REPLAY_CHUNK = 512

# Candidates drawn (per kind of move) when looking for an unseen plan after a repeat.
NEIGHBOURS = 64

# Warm starts (option ``warm_start``) and how many degree tuples the Megatron one covers.
WARM_START = 32


@register("optuna")
class OptunaSolver(Solver):
    description = (
        "Optuna define-by-run search (TPE by default; gp, cmaes, random, nsga2), "
        "resumable and shareable through an Optuna storage"
    )

    Options = OptunaOptions
    options: OptunaOptions

    # -- set-up ----------------------------------------------------------------------

    # -- the search ------------------------------------------------------------------

    def _search(self, ctx: SearchContext) -> Outcome:
        ev, opts = ctx.evaluator, self.options
        with quiet():
            ev.enter("opening the study")
            layout = layout_for(ctx.space, opts.encoding)
            study = open_study(ctx.problem, opts.storage, opts.study, layout)
            sampler = opts.sampler or ("nsga2" if pareto(ctx.problem) else "tpe")
            if sampler == "cmaes" and pareto(ctx.problem):
                raise ShardlabError(
                    "optuna sampler cmaes optimizes one objective, not a Pareto front",
                    field="sampler",
                    fix="use nsga2 (the default for a front), tpe, gp or random",
                )
            facts: dict[str, Any] = {
                "sampler": sampler,
                "study": study.study_name,
                "storage": storage_kind(opts.storage),
                "replayed_trials": 0,
                "replay_mismatches": 0,
                "trials": 0,
                "repeated_trials": 0,
                "neighbour_trials": 0,
                "warm_start_trials": 0,
                "encoding": layout.encoding,
                **({"history": opts.tpe_history} if sampler == "tpe" else {}),
                "sampler_s": 0.0,  # Optuna's own time: ask, suggest and tell
            }
            facts["stale_trials_failed"] = fail_stale_trials(study)
            existing = study.get_trials(deepcopy=False)
            facts["running_at_start"] = sum(t.state == TrialState.RUNNING for t in existing)
            base = int(ctx.rng.integers(0, 2**32 - 1))
            seed = int(np.random.SeedSequence([base, len(existing)]).generate_state(1)[0])
            study.sampler = make_sampler(
                sampler,
                seed,
                encoding=opts.encoding,
                shared=opts.storage is not None,
                history=opts.tpe_history,
            )
            try:
                self._replay(ctx, existing, facts)
                if not existing and opts.warm_start == "megatron":
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
                f"study {facts['study']!r} holds plans outside this search space",
                field="study",
                fix=ANOTHER_STUDY,
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
        if HAS_SET_CONSTRAINT:
            for name, value in zip(CONSTRAINTS, cons, strict=True):
                trial.set_constraint(name, float(value))
        else:
            trial.set_user_attr(ATTR_CONSTRAINTS, [float(c) for c in cons])
        if pareto(ctx.problem):
            tell(study, trial, [float(v) for v in front_values(ctx.problem, m)[0]])
        else:
            tell(study, trial, float(m.objective[0]))
        facts["sampler_s"] += time.perf_counter() - start
        facts["trials"] += 1
        facts["repeated_trials"] += int(seen)
