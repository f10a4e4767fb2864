"""The benchmark suite: named problem instances every method is compared on.

Tags: ``small`` instances have at most two million plans (exhaustive search is their
ground truth), ``medium`` ones are too large for that but solved exactly by CP-SAT
with options tied per layer kind, ``large`` ones are at the scale of the Learning to
Shard evaluation (hundreds of GPUs, or options chosen per layer). ``train`` and
``heldout`` split the instances for the RL policy's pretraining and its transfer test.
``slo`` instances are AIConfigurator's default problem (1,024 in, 256 out, TTFT <= 2 s,
TPOT <= 50 ms, in flight) at an offered load of 4,096 requests, where the SLOs decide
each plan's concurrency.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from shardlab.errors import ShardlabError
from shardlab.problems.datafile import load_records
from shardlab.problems.problem import Problem

Size = Literal["small", "medium", "large", "paper", "transfer", "slo", "disagg"]
Split = Literal["train", "heldout"]
SIZES: tuple[str, ...] = get_args(Size)
SPLITS: tuple[str, ...] = get_args(Split)


@dataclass(frozen=True, kw_only=True)
class Instance:
    name: str
    model: str
    cluster: str
    workload: str
    size: Size
    split: Split
    tie: str = "kind"
    overrides: tuple[tuple[str, Any], ...] = field(default=())

    def problem(
        self, timing: str | None = None, engine: str | None = None, space_kind: str = "free"
    ) -> Problem:
        """The instance's problem (``timing``, ``engine``: the problem's defaults if None)."""
        return Problem.build(
            self.model,
            self.cluster,
            self.workload,
            tie=self.tie,  # type: ignore[arg-type]
            space_kind=space_kind,  # type: ignore[arg-type]
            **({"timing": timing} if timing is not None else {}),
            **({"engine": engine} if engine is not None else {}),
            **dict(self.overrides),
        )


# The instances, in data/instances.yaml.
INSTANCES: tuple[Instance, ...] = tuple(load_records("instances.yaml", Instance).values())

SUITES = (*SIZES, *SPLITS, "all")


def get_instance(name: str) -> Instance:
    for inst in INSTANCES:
        if inst.name == name:
            return inst
    raise ShardlabError(
        f"unknown instance {name!r}; instances: {', '.join(i.name for i in INSTANCES)}"
    )


def get_suite(name: str) -> tuple[Instance, ...]:
    """Instances of a suite: a size tag, a split, ``all``, one instance's name, or
    several of these separated by commas (their instances in order, each once)."""
    if "," in name:
        parts = [get_suite(part.strip()) for part in name.split(",") if part.strip()]
        return tuple(dict.fromkeys(i for part in parts for i in part))
    if name == "all":
        return INSTANCES
    if name in SIZES:
        return tuple(i for i in INSTANCES if i.size == name)
    if name in SPLITS:
        return tuple(i for i in INSTANCES if i.split == name)
    if any(i.name == name for i in INSTANCES):
        return (get_instance(name),)
    raise ShardlabError(f"unknown suite {name!r}; suites: {', '.join(SUITES)} or an instance name")
