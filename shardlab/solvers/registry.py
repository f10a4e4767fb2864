"""Solvers by name: the built-in ones (imported only when asked for, so heavy
dependencies such as torch load lazily) and third-party ones from the entry-point
group ``shardlab.solvers``. Registering a name twice is refused.

A method's own options are its class's ``Options`` dataclass
(:mod:`shardlab.solvers.options`): read here without importing a built-in method, and
built from the keywords a caller gives, which checks them."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import fields
from importlib.metadata import entry_points

from shardlab.errors import ShardlabError
from shardlab.solvers.base import Solver
from shardlab.solvers.choices import hints, read_text
from shardlab.solvers.options import BUILTIN_OPTIONS, SolverOptions

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
        if name in BUILTIN and cls.Options is not BUILTIN_OPTIONS.get(name, SolverOptions):
            raise TypeError(f"{name}: its Options are not the ones BUILTIN_OPTIONS lists")
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


def options_class(name: str) -> type[SolverOptions]:
    """The options dataclass of the solver called ``name`` (a built-in method's without
    importing it)."""
    if name in BUILTIN and name not in _REGISTERED:
        return BUILTIN_OPTIONS.get(name, SolverOptions)
    return solver_class(name).Options


def method_options(name: str, given: Mapping[str, object] | None = None) -> SolverOptions:
    """The options of the method ``name`` from ``given`` (field name to value): a key the
    method does not take is refused naming the method and its options, and constructing
    the options checks every value (the one place they are checked)."""
    cls = options_class(name)
    taken = tuple(f.name for f in fields(cls))
    for key in given or {}:
        if key not in taken:
            raise ShardlabError(
                f"option {key!r} does not apply to method {name!r}",
                field=key,
                fix=f"its options: {', '.join(taken) or 'none'}",
            )
    return cls(**(given or {}))


def get_solver(name: str, **options: object) -> Solver:
    """A fresh instance of the solver called ``name``, with method-specific options."""
    return solver_class(name)(method_options(name, options))


def parse_method(spec: str) -> tuple[str, dict[str, object]]:
    """``"optuna:sampler=gp:history=500"`` as ``("optuna", {"sampler": "gp", "history":
    500})``: a method with options, as ``shardlab compare --methods`` takes it, each value
    read as its option's type and checked once, here."""
    name, *pairs = spec.strip().split(":")
    cls = options_class(name)
    kinds = hints(cls)
    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise ShardlabError(
                f"method {spec!r}: write options as METHOD:KEY=VALUE (e.g. optuna:sampler=gp)"
            )
        options[key] = (
            read_text(kinds[key], key, value, f"method {spec!r}") if key in kinds else value
        )
    method_options(name, options)  # a bad value fails here, once, not in every run
    return name, options
