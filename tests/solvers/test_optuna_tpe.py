"""TPE as the Optuna solver runs it: Optuna's numbers, computed without the per-trial
work that made 5,000 evaluations on the 1.6T MoE take 30-40 minutes."""

from __future__ import annotations

import hashlib

import numpy as np
import optuna
import pytest
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers._tpe.parzen_estimator import _ParzenEstimator, _ParzenEstimatorParameters
from optuna.samplers._tpe.sampler import default_weights
from optuna.trial import FrozenTrial

import shardlab.solvers.optuna.study as optuna_study
from shardlab.problems.suite import get_instance
from shardlab.solvers import Budget, get_solver
from shardlab.solvers.optuna import fingerprint
from shardlab.solvers.optuna.history import WindowedTPESampler
from shardlab.solvers.optuna.parzen import BlockParzenEstimator
from shardlab.solvers.optuna.samplers import TPE_SETTINGS, quiet

PARAMETERS = _ParzenEstimatorParameters(
    prior_weight=1.0,
    consider_magic_clip=True,
    consider_endpoints=False,
    weights=default_weights,
    multivariate=True,
)


def _space(rng: np.random.Generator, n_params: int) -> dict[str, BaseDistribution]:
    """Categorical parameters of 1 to 6 choices mixed with integers and floats."""
    space: dict[str, BaseDistribution] = {}
    for j in range(n_params):
        kind = int(rng.integers(0, 5))
        if kind <= 2:
            n = int(rng.integers(1, 7))
            space[f"p{j:02d}"] = CategoricalDistribution([f"o{i}" for i in range(n)])
        elif kind == 3:
            space[f"p{j:02d}"] = IntDistribution(-3, 9)
        else:
            space[f"p{j:02d}"] = FloatDistribution(0.1, 5.0, log=bool(rng.integers(0, 2)))
    return space


def _observations(
    rng: np.random.Generator, space: dict[str, BaseDistribution], n: int
) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, d in space.items():
        if isinstance(d, CategoricalDistribution):
            out[name] = rng.integers(0, len(d.choices), n)
        elif isinstance(d, IntDistribution):
            out[name] = rng.integers(d.low, d.high + 1, n).astype(float)
        else:
            out[name] = rng.uniform(d.low, d.high, n)
    return out


@pytest.mark.parametrize("n", [0, 1, 7, 300])
@pytest.mark.parametrize("prior_weight", [1.0, 0.0])
def test_block_parzen_estimator_is_optunas_bit_for_bit(n: int, prior_weight: float) -> None:
    rng = np.random.default_rng(n)
    parameters = PARAMETERS._replace(prior_weight=prior_weight)
    for case in range(5):
        space = _space(rng, int(rng.integers(1, 40)))
        obs = _observations(rng, space, n)
        weights = rng.uniform(0.1, 1.0, n) if case == 0 and n else None
        theirs = _ParzenEstimator(obs, space, parameters, weights)
        ours = BlockParzenEstimator(obs, space, parameters, weights)
        _same(theirs, ours, space)


def _same(
    theirs: _ParzenEstimator, ours: _ParzenEstimator, space: dict[str, BaseDistribution]
) -> None:
    with np.errstate(divide="ignore"):  # log(0) where a prior weight 0 leaves a zero
        for want, got in zip(
            theirs._mixture_distribution.distributions,
            ours._mixture_distribution.distributions,
            strict=True,
        ):
            assert type(want) is type(got)
            assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))
        for seed in range(3):
            drawn = theirs.sample(np.random.RandomState(seed), 4)
            again = ours.sample(np.random.RandomState(seed), 4)
            assert all(np.array_equal(drawn[k], again[k]) for k in space)
            assert np.array_equal(theirs.log_pdf(drawn), ours.log_pdf(drawn))


def _objective(trial: optuna.Trial) -> float:
    """60 categorical parameters of 2-4 choices, two integers and a float."""
    total = 0.0
    for j in range(60):
        choice = trial.suggest_categorical(f"op{j:02d}", ["a", "b", "c", "d"][: 2 + j % 3])
        total += (j % 7) * ("abcd".index(choice) == j % (2 + j % 3))
    total += trial.suggest_int("tp", 0, 5) + trial.suggest_int("cut", -4, 4) ** 2 / 4
    x = trial.suggest_float("x", 0.0, 1.0)
    trial.set_user_attr("x", x)
    return total - (x - 0.3) ** 2


def _trials(sampler: optuna.samplers.BaseSampler, n: int) -> list[FrozenTrial]:
    with quiet():
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.optimize(_objective, n_trials=n)
    return study.get_trials(deepcopy=False)


def test_windowed_tpe_samples_as_plain_tpe_within_its_window() -> None:
    # the cached conversions, the blocked estimator and the uncopied search space
    # change no proposal of TPE on a study it sees whole
    settings = {**TPE_SETTINGS, "seed": 7}
    plain = _trials(optuna.samplers.TPESampler(**settings), 80)
    ours = _trials(WindowedTPESampler(window=1000, **settings), 80)
    assert [t.params for t in plain] == [t.params for t in ours]


def test_a_finished_trial_is_converted_for_tpe_once(monkeypatch) -> None:
    # TPE converted every parameter of every trial on every sample: its time per
    # trial grew with the study (~660,000 conversions a trial at 1,000 trials of the
    # 1.6T MoE). Each trial's own suggestions convert each parameter a few times.
    calls = [0]
    convert = CategoricalDistribution.to_internal_repr

    def counted(self: CategoricalDistribution, value: object) -> float:
        calls[0] += 1
        return convert(self, value)

    monkeypatch.setattr(CategoricalDistribution, "to_internal_repr", counted)
    n = 60
    _trials(WindowedTPESampler(window=1000, **TPE_SETTINGS, seed=0), n)
    assert calls[0] <= 5 * 60 * n


def test_tpe_reads_the_trials_distributions_without_copying_them() -> None:
    # Optuna's intersection search space deep-copies every distribution for every
    # trial (21 ms a trial at 659 parameters); TPE only reads them
    trials = _trials(WindowedTPESampler(window=1000, **TPE_SETTINGS, seed=0), 12)
    sampler = WindowedTPESampler(window=1000, **TPE_SETTINGS, seed=0)
    with quiet():
        study = optuna.create_study(direction="maximize", sampler=sampler)
        for t in trials:
            study.add_trial(t)
        space = sampler.infer_relative_search_space(study, trials[-1])
    held = study.get_trials(deepcopy=False)[-1].distributions
    assert space and all(space[name] is held[name] for name in space)


def test_the_solver_tells_a_priced_trial_without_copying_it(monkeypatch) -> None:
    # Study.tell returns a deep copy of the told trial (26 ms at 659 parameters), which
    # the solver never read
    told = [0]
    tell = optuna.Study.tell

    def counted(self: optuna.Study, trial: object, values: object = None, **kw: object) -> object:
        told[0] += values is not None
        return tell(self, trial, values, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(optuna.Study, "tell", counted)
    problem = get_instance("llama8b-h100x2-chat").problem()
    r = get_solver("optuna").solve(problem, budget=Budget(max_evals=60), seed=1)
    assert r.facts["trials"] >= 60 and r.n_evals == 60
    assert told[0] == 0


def test_the_fingerprint_is_the_hash_of_the_whole_text(monkeypatch) -> None:
    # hashed a chunk at a time now; a study's name (and so resuming it) depends on it
    monkeypatch.setattr(optuna_study, "FINGERPRINT_CHUNK", 1000)  # several chunks
    problem = get_instance("mixtral8x7b-h100x4-chat").problem()
    space = problem.space
    text = "\n".join(
        [
            repr(problem),
            repr([(v.name, v.cardinality, v.role) for v in space.variables]),
            repr([space.label(i) for i in range(space.num_degree_tuples)]),
            repr(space.mask_table().tobytes().hex()),
        ]
    )
    assert fingerprint(problem) == hashlib.sha256(text.encode()).hexdigest()
