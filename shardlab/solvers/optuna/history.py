"""TPE over a bounded history: the best trials of the whole study plus the latest ones.

Optuna's TPE reads every finished trial in Python each time it samples (its parameters,
constraints and values), so its time per trial grows with the study: 18 ms at 1,000
trials, 84 ms at 5,000, 133 ms at 9,000 on llama70b-h100x8-chat, against 18-24 ms
through this view (README). Repeats are trials too, but the solver's neighbour queue
keeps them rare: 5,000 evaluations on moe1.6t-h100x256-chat-layer are 5,005 trials.

Beyond the window, TPE's cost per trial is per parameter. The shared encoding of that
1.6T MoE asks 659 parameters a trial (640 categorical), and there a 5,000-evaluation
run took 2,436 s (results/paper). Profiled over 300 evaluations at c11f355 (108 s under
cProfile), the time went to TPE converting every parameter of every modelled trial on
every sample (28.8 million ``to_internal_repr`` calls, 30 s, the only part that grew
with the study), Optuna's Parzen estimator looping over the 659 parameters (build,
sample, score: 28 s), deep copies of the search space and of each told trial (14 s),
Optuna's per-parameter ``suggest`` bookkeeping, and the study's fingerprint, computed
twice per run (10.5 s, once per run now: :func:`~.study.fingerprint`); the cost model
took 5 s. This sampler now converts each finished trial once
(:meth:`WindowedTPESampler._get_internal_repr`), hands TPE the search space uncopied,
and fits :class:`~.parzen.BlockParzenEstimator`, which computes Optuna's numbers a
block of parameters at a time; the solver tells without the copy. Every proposal is
unchanged. Runs of ``get_solver("optuna").solve(get_instance(
"moe1.6t-h100x256-chat-layer").problem(), budget=Budget(max_evals=N), seed=0)``, wall
time on one core of a shared 2-core VM:

============  ==========  =========  ==========================================
evaluations   c11f355     now        same trials and plan at both commits
============  ==========  =========  ==========================================
300           57 s        35 s       yes (best 62,866 tok/s, 300 trials)
1,000         221 s       55 s       yes (best 63,254 tok/s, 1,002 trials)
2,000                     131 s      (best 63,254 tok/s, 2,002 trials)
5,000         2,436 s*    316 s      (best 63,824 tok/s, 5,005 trials)
============  ==========  =========  ==========================================

(* results/paper, made before the serving model changed; on
moe1.6t-h100x1024-chat-layer 5,000 evaluations now take 348 s, 1,821 s there.) A
trial now costs 37-77 ms at any study size (the mean of the 50 trials before trial 100,
300, 1,000, ... 5,000); it was 121 ms before trial 100 and 378 ms before trial 1,000.
Of a trial at 2,000 trials (median of 20, no profiler), TPE's sampling is 46-52 ms (the
two estimators scoring the 4 candidates 24 ms, building them 8 ms, the conversions of
the new trials and the stacking of the 1,025 modelled ones 7 ms), Optuna's ``suggest``
of the 659 parameters one by one 15 ms, pricing the plan 2 ms.

:class:`WindowedTPESampler` hands TPE a view of the study that holds

- the ``elite`` best trials of the whole study, in TPE's own order (feasible by
  objective, then infeasible by total violation), kept up to date incrementally; for
  several objectives, the feasible non-dominated trials instead;
- the latest ``window`` trials.

TPE's "good" model is fit to at most 25 trials (``min(ceil(0.1 n), 25)``, its default
gamma) and those are the best 25 of the study, so with ``elite >= 25`` the good model is
exactly plain TPE's. Only the "bad" model is fit to the recent window rather than to every
trial, which TPE's default weights already lean towards (older trials weigh less). A
study shorter than ``window + elite`` is seen whole: the first trials sample exactly as
plain TPE does.
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.search_space import IntersectionSearchSpace
from optuna.search_space.intersection import _calculate as _intersect
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from shardlab.solvers.options import TPE_HISTORY
from shardlab.solvers.optuna.parzen import BlockParzenEstimator

# Trials TPE sees besides the elite (see the module docstring).
WINDOW = TPE_HISTORY
ELITE = 25

# Optuna >= 5 names each constraint on the trial (``FrozenTrial.constraints``).
_NAMED_CONSTRAINTS = hasattr(FrozenTrial, "constraints")


def _violation(trial: FrozenTrial) -> float:
    """Total constraint violation, 0 for a feasible (or unconstrained) trial."""
    if _NAMED_CONSTRAINTS:
        values: Any = trial.constraints.values()
    else:  # Optuna 4 keeps the constraints_func values as one list
        values = trial.system_attrs.get("constraints", ())
    return float(sum(c for c in values if c > 0.0))


class _HistoryView:
    """The study as TPE sees it: ``_get_trials`` answers from a bounded history, every
    other attribute is the study's own."""

    def __init__(self, study: Study, trials: list[FrozenTrial]) -> None:
        self._study = study
        self._trials = trials

    def _get_trials(
        self,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
        use_cache: bool = False,
    ) -> list[FrozenTrial]:
        return [t for t in self._trials if states is None or t.state in states]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)


class _SharedIntersectionSearchSpace(IntersectionSearchSpace):
    """Optuna's intersection search space, handed out without a deep copy.

    Optuna deep-copies every distribution of the search space on every trial (21 ms a
    trial at 659 parameters); TPE only reads them, and each is the one its trials hold.
    """

    def calculate(self, study: Study, use_cache: bool = False) -> dict[str, BaseDistribution]:
        if self._study_id is None:
            self._study_id = study._study_id
        elif self._study_id != study._study_id:
            raise ValueError("`IntersectionSearchSpace` cannot handle multiple studies.")
        self._search_space, self._cached_trial_number = _intersect(
            study._get_trials(deepcopy=False, use_cache=use_cache),
            self._include_pruned,
            self._search_space,
            self._cached_trial_number,
        )
        return dict(sorted((self._search_space or {}).items(), key=lambda x: x[0]))


class WindowedTPESampler(optuna.samplers.TPESampler):
    """``TPESampler`` fit to the study's ``elite`` best and ``window`` latest trials,
    each finished trial's parameters turned into TPE's numbers once."""

    def __init__(self, *, window: int = WINDOW, elite: int = ELITE, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if window < 1 or elite < 1:
            raise ValueError("window and elite must be positive")
        self._window = window
        self._elite_size = elite
        self._seen: set[int] = set()
        self._elite: list[FrozenTrial] = []
        self._search_space = _SharedIntersectionSearchSpace(include_pruned=True)
        self._parzen_estimator_cls = BlockParzenEstimator
        # per search space (its parameter names): trial id -> the trial's internal
        # values, or None when it lacks a parameter of the space (one study per
        # sampler, as the elite and Optuna's own search-space cache assume)
        self._rows: dict[tuple[str, ...], dict[int, np.ndarray | None]] = {}
        self._kinds: dict[tuple[str, ...], list[np.dtype]] = {}

    def _get_internal_repr(
        self,
        trials: list[FrozenTrial],
        search_space: dict[str, BaseDistribution],
        study: Study | None = None,
    ) -> dict[str, np.ndarray]:
        """TPE's own, but a finished trial is converted once, not on every sample.

        TPE converts every parameter of every trial it models, in Python, twice a
        trial: ~660,000 conversions a trial at 1,000 trials of 659 parameters, most of
        the sampler's time. A finished trial's parameters never change, so its row is
        kept; a running trial (constant liar) is converted each time as TPE does.
        """
        names = tuple(search_space)
        known = self._rows.setdefault(names, {})
        rows: list[np.ndarray] = []
        for t in trials:
            row = known.get(t._trial_id, _UNKNOWN) if t.state.is_finished() else _UNKNOWN
            if row is _UNKNOWN:
                row = self._row(t, search_space, study)
                if t.state.is_finished():
                    known[t._trial_id] = row
            if row is not None:
                rows.append(row)
        if not rows:
            return {name: np.asarray([]) for name in names}
        table = np.stack(rows)
        # TPE's own column types (option indices are integers)
        kinds = self._kinds[names]
        return {name: table[:, i].astype(kinds[i], copy=False) for i, name in enumerate(names)}

    def _row(
        self, trial: FrozenTrial, search_space: dict[str, BaseDistribution], study: Study | None
    ) -> np.ndarray | None:
        """``trial``'s values as TPE converts them, None when it lacks a parameter."""
        args = () if study is None else (study,)  # older Optuna passes no study
        columns = super()._get_internal_repr([trial], search_space, *args)
        if any(len(c) == 0 for c in columns.values()):
            return None
        self._kinds.setdefault(tuple(search_space), [c.dtype for c in columns.values()])
        return np.array([c[0] for c in columns.values()], dtype=float)

    # The one place TPE reads the trials it models; everything else is TPE's own.
    def _sample(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        trials = study._get_trials(deepcopy=False, states=None, use_cache=True)
        if len(trials) <= self._window + self._elite_size:
            return super()._sample(study, trial, search_space)
        return super()._sample(
            _HistoryView(study, self._history(study, trials)), trial, search_space
        )

    def _history(self, study: Study, trials: list[FrozenTrial]) -> list[FrozenTrial]:
        done = (TrialState.COMPLETE, TrialState.PRUNED)
        fresh = [t for t in trials if t.state in done and t._trial_id not in self._seen]
        if fresh:
            self._seen.update(t._trial_id for t in fresh)
            self._update_elite(study, fresh)
        recent = trials[-self._window :]
        ids = {t._trial_id for t in recent}
        older = [t for t in self._elite if t._trial_id not in ids]
        return sorted(older, key=lambda t: t.number) + recent

    def _update_elite(self, study: Study, fresh: Sequence[FrozenTrial]) -> None:
        directions = study.directions
        if len(directions) == 1:
            sign = 1.0 if directions[0] == StudyDirection.MINIMIZE else -1.0
            complete = [t for t in fresh if t.state == TrialState.COMPLETE]

            def order(t: FrozenTrial) -> tuple[float, float]:
                # TPE's: feasible by objective, then infeasible by total violation.
                violation = _violation(t)
                return violation, (sign * t.value if violation == 0 else 0.0)

            self._elite = heapq.nsmallest(self._elite_size, [*self._elite, *complete], key=order)
            return
        signs = [1.0 if d == StudyDirection.MINIMIZE else -1.0 for d in directions]
        front = list(self._elite)
        for t in fresh:
            if t.state != TrialState.COMPLETE or _violation(t) > 0:
                continue
            v = [s * x for s, x in zip(signs, t.values, strict=True)]
            keyed = [(f, [s * x for s, x in zip(signs, f.values, strict=True)]) for f in front]
            if any(_dominates(w, v) or w == v for _, w in keyed):
                continue
            front = [f for f, w in keyed if not _dominates(v, w)] + [t]
        self._elite = front


_UNKNOWN: Any = object()


def _dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a`` no worse than ``b`` on every (minimized) value and better on one."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(
        x < y for x, y in zip(a, b, strict=True)
    )
