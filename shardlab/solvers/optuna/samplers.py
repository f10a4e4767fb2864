"""Optuna's samplers as this solver configures them, and quiet while they run."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial

from shardlab.solvers.optuna.history import WindowedTPESampler
from shardlab.solvers.optuna.study import ATTR_CONSTRAINTS, CONSTRAINTS

# Optuna >= 5 stores named constraints on the trial; older versions need constraints_func.
HAS_SET_CONSTRAINT = hasattr(Trial, "set_constraint")

# TPE's settings (see the module docstring for the measurements behind them).
TPE_SETTINGS: dict[str, Any] = {"multivariate": True, "n_startup_trials": 10, "n_ei_candidates": 4}


def _constraints_from_user_attrs(trial: FrozenTrial) -> Sequence[float]:
    return trial.user_attrs.get(ATTR_CONSTRAINTS, [0.0] * len(CONSTRAINTS))


def _accepted(cls: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` without the arguments this Optuna version's ``cls`` does not take."""
    params = inspect.signature(cls).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def _make(cls: Callable[..., Any], **kwargs: Any) -> Any:
    return cls(**_accepted(cls, kwargs))


@contextmanager
def quiet() -> Iterator[None]:
    """Silence Optuna's experimental-feature warnings and its INFO log for a while."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # CMA-ES ignores the constraints (documented in the module docstring).
            warnings.filterwarnings("ignore", "Constraints have been set, but CmaEsSampler")
            # ask-and-tell drives the heartbeat itself (.storage)
            warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used")
            yield
    finally:
        optuna.logging.set_verbosity(level)


def make_sampler(
    name: str, seed: int, *, encoding: str, shared: bool, history: int
) -> optuna.samplers.BaseSampler:
    """Sampler ``name`` seeded with ``seed``, for a study of ``encoding`` (``shared``:
    in a storage other workers may share; ``history``: TPE's window, 0 for every
    trial)."""
    samplers = optuna.samplers
    cons: dict[str, Any] = (
        {} if HAS_SET_CONSTRAINT else {"constraints_func": _constraints_from_user_attrs}
    )
    if name == "tpe":
        tpe = _accepted(
            samplers.TPESampler,
            {
                # The shared encoding asks every parameter in every trial: one joint
                # model. The class encoding's parameters come and go with the degrees.
                "group": encoding == "class",
                "seed": seed,
                "constant_liar": shared,
                **TPE_SETTINGS,
                **cons,
            },
        )
        if history == 0:
            return samplers.TPESampler(**tpe)
        return WindowedTPESampler(window=history, **tpe)
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
