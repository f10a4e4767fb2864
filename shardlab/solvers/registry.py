"""Solvers by name: the built-in ones (imported only when asked for, so heavy
dependencies such as torch load lazily) and third-party ones from the entry-point
group ``shardlab.solvers``. Registering a name twice is refused."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points

from shardlab.errors import ShardlabError
from shardlab.solvers.base import Solver

ENTRY_POINT_GROUP = "shardlab.solvers"

# Built-in methods: module that registers each when imported.
BUILTIN: dict[str, str] = {
    "megatron": "shardlab.solvers.megatron",
    "recipe": "shardlab.solvers.recipe",
    "grid": "shardlab.solvers.grid",
    "random": "shardlab.solvers.random_search",
    "anneal": "shardlab.solvers.anneal",
    "genetic": "shardlab.solvers.genetic",
    "exhaustive": "shardlab.solvers.exhaustive",
    "cpsat": "shardlab.solvers.cpsat.solver",
    "optuna": "shardlab.solvers.optuna.solver",
    "rl": "shardlab.solvers.rl.solver",
}

_REGISTERED: dict[str, type[Solver]] = {}


def register(name: str) -> Callable[[type[Solver]], type[Solver]]:
    """Class decorator: make a :class:`Solver` available as ``name``."""

    def decorate(cls: type[Solver]) -> type[Solver]:
        owner = _REGISTERED[name].__module__ if name in _REGISTERED else BUILTIN.get(name)
        if owner is not None and (name in _REGISTERED or cls.__module__ != owner):
            raise ValueError(f"solver name {name!r} is already registered by {owner}")
        if not (isinstance(cls, type) and issubclass(cls, Solver)):
            raise TypeError(f"{cls!r} is not a shardlab Solver subclass")
        cls.name = name
        _REGISTERED[name] = cls
        return cls

    return decorate


def _entry_points() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_solvers() -> list[str]:
    """Names of every solver that can be asked for."""
    return sorted(set(BUILTIN) | set(_REGISTERED) | set(_entry_points()))


def solver_class(name: str) -> type[Solver]:
    """The solver class registered as ``name``, importing or loading it if needed."""
    if name not in _REGISTERED:
        if name in BUILTIN:
            importlib.import_module(BUILTIN[name])
        else:
            ep = _entry_points().get(name)
            if ep is None:
                raise ShardlabError(
                    f"unknown method {name!r}; available: {', '.join(available_solvers())}"
                )
            loaded = ep.load()  # type: ignore[attr-defined]
            if name not in _REGISTERED:
                register(name)(loaded)
    return _REGISTERED[name]


def get_solver(name: str, **options: object) -> Solver:
    """A fresh instance of the solver called ``name``, with method-specific options."""
    return solver_class(name)(**options)


def accepted_options(name: str) -> tuple[str, ...]:
    """The method-specific options the solver called ``name`` takes."""
    import inspect

    params = inspect.signature(solver_class(name).__init__).parameters.values()
    return tuple(
        p.name
        for p in params
        if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )


def parse_method(spec: str) -> tuple[str, dict[str, str]]:
    """``"optuna:sampler=gp:encoding=class"`` as ``("optuna", {"sampler": "gp", ...})``:
    a method with options, as ``shardlab compare --methods`` takes it."""
    name, *pairs = spec.strip().split(":")
    accepted = accepted_options(name)
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise ShardlabError(
                f"method {spec!r}: write options as METHOD:KEY=VALUE (e.g. optuna:sampler=gp)"
            )
        if key not in accepted:
            takes = ", ".join(accepted) or "none"
            raise ShardlabError(
                f"method {spec!r}: {name} takes no option {key!r} (it takes: {takes})"
            )
        options[key] = value
    get_solver(name, **options)  # a bad value fails here, once, not in every run
    return name, options
