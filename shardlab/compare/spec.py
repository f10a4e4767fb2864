"""What a comparison is asked to run, checked before any run starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardlab.compare.report import read_anchor
from shardlab.errors import ShardlabError
from shardlab.problems.disagg import Serving, check_serving
from shardlab.problems.problem import Problem
from shardlab.problems.suite import Instance, get_suite

# The methods compared when the caller names none: the metaheuristics.
DEFAULT_METHODS = "random,anneal,genetic"


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Which methods run on which cases: ``methods`` with their default options,
    ``variants`` as ``(label, method, options)``, each on ``engines`` (or the
    problem's), at ``budgets`` evaluations (or one budget)."""

    label: str
    cases: tuple[Instance | Problem, ...]
    methods: tuple[str, ...]
    variants: tuple[tuple[str, str, dict[str, Any]], ...]
    budgets: tuple[int, ...] | None
    engines: tuple[str, ...]
    serving: Serving
    anchor: tuple[dict[str, str], ...] | None


def comparison(
    problem: Problem,
    *,
    methods: str | None = None,
    suite: str | None = None,
    name: str | None = None,
    budgets: str | None = None,
    policy: str | None = None,
    engines: str | None = None,
    vs_free: bool = False,
    serving: str = "agg",
    aiconfigurator: str | None = None,
) -> Comparison:
    """A comparison from its parts as a user writes them (comma-separated lists), every
    part checked: a mistake fails here, not in every run."""
    from shardlab.problems.engines import capability
    from shardlab.solvers.registry import get_solver, parse_method

    serving = check_serving(serving)
    anchor = _anchor(aiconfigurator, serving)
    specs = _method_specs(methods, serving, policy)
    parsed = {spec: parse_method(spec) for spec in specs}
    variants = [(spec, m, opts) for spec, (m, opts) in parsed.items() if opts]
    if policy is not None:
        get_solver("rl", policy=policy)  # a bad checkpoint fails here, not in every run
        variants.append(("rl+policy", "rl", {"policy": policy}))
    engine_list = tuple(_names(engines))
    if engines is not None and not engine_list:
        raise ShardlabError(f"engines {engines!r} names none", field="engines")
    for e in engine_list:
        capability(e)
    if vs_free and problem.space_kind != "engine":
        raise ShardlabError(
            "the free-space optimum is the yardstick of an engine's space, but the problem "
            "searches the free space already",
            field="space",
            fix="compare the engine's space (space 'engine')",
        )
    return Comparison(
        label=name or (suite if suite is not None else "custom"),
        cases=tuple(get_suite(suite)) if suite is not None else (problem,),
        methods=tuple(spec for spec, (_, opts) in parsed.items() if not opts),
        variants=tuple(variants),
        budgets=_budgets(budgets),
        engines=engine_list,
        serving=serving,
        anchor=anchor,
    )


def _names(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def _anchor(path: str | None, serving: Serving) -> tuple[dict[str, str], ...] | None:
    if path is None:
        return None
    if serving != "best":
        raise ShardlabError(
            "AIConfigurator's agg-versus-disagg choices sit beside both serving modes' optima",
            field="aiconfigurator",
            fix="compare serving 'best'",
        )
    return tuple(read_anchor(path))


def _method_specs(methods: str | None, serving: Serving, policy: str | None) -> list[str]:
    if serving == "disagg":
        if methods not in (None, "cpsat"):
            raise ShardlabError(
                "serving 'disagg' runs CP-SAT's disaggregated optimum, not a list of methods",
                field="methods",
                fix="name no methods (or cpsat), or compare serving 'best'",
            )
        return []
    specs = _names(DEFAULT_METHODS if methods is None else methods)
    if not specs and policy is None:
        raise ShardlabError(f"methods {methods!r} names none", field="methods")
    return specs


def _budgets(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        levels = sorted({int(b) for b in _names(text)})
    except ValueError:
        levels = []
    if not levels or levels[0] < 1:
        raise ShardlabError(
            f"budgets {text!r} are not positive integers", field="budgets", fix="e.g. 500,2000"
        )
    return tuple(levels)
