"""shardlab: find how to spread a large language model over a GPU cluster for inference.

The importable face::

    import shardlab
    problem = shardlab.Problem.build(model="deepseek-v3", cluster="h100x64", workload="chat")
    codes = problem.space.sample(8, seed=0)
    plan = problem.space.decode(codes[0])
    metrics = shardlab.evaluate(problem, plan)
    result = shardlab.solve(problem, method="cpsat")   # see shardlab.available_solvers()

The names load on first use: the console script starts from this package, and a
Ctrl-C while numpy and OR-Tools load must reach its handler (``shardlab.__main__``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> module that defines it
_EXPORTS = {
    "Metrics": "shardlab.costmodel",
    "evaluate": "shardlab.costmodel",
    "ShardlabError": "shardlab.errors",
    **dict.fromkeys(
        (
            "Cluster",
            "Degrees",
            "Model",
            "Plan",
            "Problem",
            "SearchSpace",
            "Workload",
            "load_model",
            "parse_cluster",
        ),
        "shardlab.problems",
    ),
    **dict.fromkeys(("Budget", "SolveResult", "available_solvers", "solve"), "shardlab.solvers"),
}

__all__ = [
    "Budget",
    "Cluster",
    "Degrees",
    "Metrics",
    "Model",
    "Plan",
    "Problem",
    "SearchSpace",
    "ShardlabError",
    "SolveResult",
    "Workload",
    "__version__",
    "available_solvers",
    "evaluate",
    "load_model",
    "parse_cluster",
    "solve",
]

if TYPE_CHECKING:
    from shardlab.costmodel import Metrics, evaluate
    from shardlab.errors import ShardlabError
    from shardlab.problems import (
        Cluster,
        Degrees,
        Model,
        Plan,
        Problem,
        SearchSpace,
        Workload,
        load_model,
        parse_cluster,
    )
    from shardlab.solvers import Budget, SolveResult, available_solvers, solve


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("shardlab")
    except metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value = globals()["__version__"] = _version()
        return value
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shardlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS, "__version__"])
