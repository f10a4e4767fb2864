"""Each built-in method's own options, one frozen dataclass per method: the one
declaration of an option. The solver class carries it (``CpSatSolver.Options``), the
registry reads it, constructing it validates the values (once), and the CLI's flags and
their help are generated from it. This module imports nothing heavy, so the CLI lists
the options without loading OR-Tools, Optuna or PyTorch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from shardlab.errors import ShardlabError
from shardlab.solvers.choices import check_choices
from shardlab.solvers.rl.config import Algorithm, Proposal, RLConfig

Sampler = Literal["tpe", "gp", "cmaes", "random", "nsga2"]
Encoding = Literal["shared", "class"]
WarmStart = Literal["megatron", "none"]
# an optuna.storages.BaseStorage (not imported here: Optuna loads slowly)
OptunaStorage = Any

# TPE's default window: the latest trials it models besides the best ones
TPE_HISTORY = 1000


@dataclass(frozen=True, kw_only=True)
class SolverOptions:
    """A method's options; a method without any takes this empty one. Subclasses
    declare each option as a field with its docstring, and a field whose values are a
    ``Literal`` is checked against them here."""

    def __post_init__(self) -> None:
        check_choices(self, f"{self.method} options")

    @property
    def method(self) -> str:
        """Whose options these are, for messages (the class name without "Options")."""
        return type(self).__name__.removesuffix("Options").lower() or "solver"


@dataclass(frozen=True, kw_only=True)
class CpSatOptions(SolverOptions):
    """CP-SAT's options."""

    workers: int | None = None
    """Search workers of each CP-SAT solve (default: all cores)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 1):
            raise ShardlabError(
                f"cpsat options: workers must be a whole number of at least 1, got "
                f"{self.workers!r}",
                field="workers",
            )


@dataclass(frozen=True, kw_only=True)
class OptunaOptions(SolverOptions):
    """Optuna's options (see :mod:`shardlab.solvers.optuna`)."""

    sampler: Sampler | None = None
    """The sampler (default: tpe, or nsga2 for a Pareto front)."""
    encoding: Encoding = "shared"
    """How a plan becomes trial parameters: shared (the degrees per axis, the options
    per operator) or class (the degree tuple, the options per class of tuples)."""
    warm_start: WarmStart = "megatron"
    """The first trials: megatron (the Megatron plans of up to 32 degree tuples) or
    none (the sampler's own)."""
    history: int | None = None
    """How many of the latest trials TPE models besides the best ones (default 1000; 0:
    every trial); the tpe sampler's only."""
    storage: str | OptunaStorage | None = None
    """Where the study lives: a storage URL (sqlite:///study.db, postgresql://...), or
    an Optuna storage object (default: in memory)."""
    study: str | None = None
    """The study's name (default: derived from the problem)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        history = self.history
        if history is not None and (
            not isinstance(history, int) or isinstance(history, bool) or history < 0
        ):
            raise ShardlabError(
                f"optuna options: history {history!r} is not a number of trials >= 0 "
                "(0: every trial)",
                field="history",
            )
        if history is not None and self.sampler not in (None, "tpe"):
            raise ShardlabError(
                f"optuna options: history is TPE's; sampler {self.sampler} models every trial",
                field="history",
            )
        if isinstance(self.storage, str):
            # refused now, not when the study opens (imports Optuna: a storage is given)
            from shardlab.solvers.optuna.storage import check_storage_url

            check_storage_url(self.storage)

    @property
    def tpe_history(self) -> int:
        """The window TPE models (the default when none is given)."""
        return TPE_HISTORY if self.history is None else self.history


@dataclass(frozen=True, kw_only=True)
class RLOptions(SolverOptions):
    """The rl solver's options; every knob of the policy is :class:`RLConfig`'s."""

    policy: str | None = None
    """Start from this policy checkpoint (`shardlab train-policy` writes one)."""
    algorithm: Algorithm = RLConfig.algorithm
    """The policy-gradient update: ppo (clipped surrogate) or reinforce (a moving
    baseline)."""
    proposal: Proposal = RLConfig.proposal
    """How the policy proposes a plan: edit (changes chosen decisions of an elite plan)
    or decode (builds each plan from scratch)."""
    knobs: str | None = None
    """Other knobs of the policy as NAME=VALUE;... (e.g. lr=0.0005;ppo_epochs=1), any
    field of RLConfig."""

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            self.config()  # a bad knob is refused now, not when the policy is built
        except ShardlabError as exc:  # the knob at fault is given through knobs
            raise ShardlabError(str(exc), field="knobs") from None

    def config(self) -> RLConfig:
        """The policy's knobs: these options over :class:`RLConfig`'s defaults (built
        whole, so that knobs left unset take the defaults of the proposal chosen)."""
        from shardlab.solvers.rl.config import parse_knobs

        changes: dict[str, Any] = {"algorithm": self.algorithm, "proposal": self.proposal}
        if self.knobs is not None:
            changes |= parse_knobs(self.knobs)
        return RLConfig(**changes)


NoOptions = SolverOptions

# The built-in methods that take options (the others take none): read without
# importing the method, which the registry checks is the class's own ``Options``.
BUILTIN_OPTIONS: dict[str, type[SolverOptions]] = {
    "cpsat": CpSatOptions,
    "optuna": OptunaOptions,
    "rl": RLOptions,
}
