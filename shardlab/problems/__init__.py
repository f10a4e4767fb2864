"""What is solved: model, cluster, workload and its traffic, problem, plan and the search
space."""

from shardlab.problems.catalog import CATALOG, load_model
from shardlab.problems.cluster import Accelerator, Cluster, builtin_accelerators, parse_cluster
from shardlab.problems.hf_config import model_from_config
from shardlab.problems.model import Model, ParamCount
from shardlab.problems.plan import PLAN_SCHEMA, Degrees, Plan
from shardlab.problems.problem import Problem
from shardlab.problems.space import SearchSpace
from shardlab.problems.traces import read_trace
from shardlab.problems.traffic import Traffic, closed_loop, summarize, synthetic_traffic
from shardlab.problems.workload import PRESETS, Workload, get_workload

__all__ = [
    "CATALOG",
    "PLAN_SCHEMA",
    "PRESETS",
    "Accelerator",
    "Cluster",
    "Degrees",
    "Model",
    "ParamCount",
    "Plan",
    "Problem",
    "SearchSpace",
    "Traffic",
    "Workload",
    "builtin_accelerators",
    "closed_loop",
    "get_workload",
    "load_model",
    "model_from_config",
    "parse_cluster",
    "read_trace",
    "summarize",
    "synthetic_traffic",
]
