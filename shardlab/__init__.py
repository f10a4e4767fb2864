"""shardlab: find how to spread a large language model over a GPU cluster for inference.

The importable face::

    import shardlab
    problem = shardlab.Problem.build(model="deepseek-v3", cluster="h100x64", workload="chat")
    codes = problem.space.sample(8, seed=0)
    plan = problem.space.decode(codes[0])
    metrics = shardlab.evaluate(problem, plan)
    result = shardlab.solve(problem, method="cpsat")   # see shardlab.available_solvers()
"""

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

__version__ = "0.1.0"

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
