"""shardlab: find how to spread a large language model over a GPU cluster for inference.

The importable face::

    import shardlab
    problem = shardlab.Problem.build(model="deepseek-v3", cluster="h100x64", workload="chat")
    codes = problem.space.sample(8, seed=0)
    plan = problem.space.decode(codes[0])
"""

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

__version__ = "0.1.0"

__all__ = [
    "Cluster",
    "Degrees",
    "Model",
    "Plan",
    "Problem",
    "SearchSpace",
    "ShardlabError",
    "Workload",
    "__version__",
    "load_model",
    "parse_cluster",
]
