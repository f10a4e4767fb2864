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
from typing import Any, Literal

from shardlab.errors import ShardlabError
from shardlab.problems.problem import Problem

Size = Literal["small", "medium", "large", "paper", "slo", "disagg"]
Split = Literal["train", "heldout"]


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


INSTANCES: tuple[Instance, ...] = (
    # small: exhaustive search is the ground truth
    Instance(
        name="llama8b-h100x2-chat",
        model="llama-3.1-8b",
        cluster="h100x2",
        workload="chat",
        size="small",
        split="train",
    ),
    Instance(
        name="llama8b-h100x4-latency",
        model="llama-3.1-8b",
        cluster="h100x4",
        workload="latency",
        size="small",
        split="heldout",
    ),
    Instance(
        name="llama70b-h100x4-chat",
        model="llama-3.1-70b",
        cluster="h100x4",
        workload="chat",
        size="small",
        split="train",
    ),
    Instance(
        name="mixtral8x7b-h100x4-chat",
        model="mixtral-8x7b",
        cluster="h100x4",
        workload="chat",
        size="small",
        split="heldout",
    ),
    Instance(
        name="qwen32b-a100x4-offline",
        model="qwen3-32b",
        cluster="a100x4",
        workload="batch-offline",
        size="small",
        split="train",
        overrides=(("batch", 256),),
    ),
    Instance(
        name="gptoss-h100x4-interactive",
        model="gpt-oss-120b",
        cluster="h100x4",
        workload="interactive",
        size="small",
        split="train",
    ),
    Instance(
        name="llama70b-h200x4-prefill",
        model="llama-3.1-70b",
        cluster="h200x4",
        workload="prefill",
        size="small",
        split="heldout",
    ),
    # medium: exact by CP-SAT with options tied per layer kind
    Instance(
        name="llama70b-h100x8-chat",
        model="llama-3.1-70b",
        cluster="h100x8",
        workload="chat",
        size="medium",
        split="train",
    ),
    Instance(
        name="mixtral8x22b-h100x16-decode",
        model="mixtral-8x22b",
        cluster="h100x16",
        workload="decode",
        size="medium",
        split="heldout",
    ),
    Instance(
        name="qwen235b-h200x16-long",
        model="qwen3-235b-a22b",
        cluster="h200x16",
        workload="long-context",
        size="medium",
        split="train",
    ),
    Instance(
        name="deepseek-v3-h100x64-chat",
        model="deepseek-v3",
        cluster="h100x64",
        workload="chat",
        size="medium",
        split="train",
    ),
    Instance(
        name="kimi-k2-h200x64-chat",
        model="kimi-k2",
        cluster="h200x64",
        workload="chat",
        size="medium",
        split="heldout",
    ),
    Instance(
        name="gptoss-b200x8-offline",
        model="gpt-oss-120b",
        cluster="b200x8",
        workload="batch-offline",
        size="medium",
        split="heldout",
    ),
    # large: the scale of the Learning to Shard evaluation
    Instance(
        name="moe1.6t-h100x256-chat",
        model="moe-1.6t",
        cluster="h100x256",
        workload="chat",
        size="large",
        split="heldout",
        overrides=(("batch", 4096),),
    ),
    Instance(
        name="deepseek-v3-h100x64-chat-layer",
        model="deepseek-v3",
        cluster="h100x64",
        workload="chat",
        size="large",
        split="train",
        tie="layer",
    ),
    Instance(
        name="llama405b-h100x32-prefill",
        model="llama-3.1-405b",
        cluster="h100x32",
        workload="prefill",
        size="large",
        split="train",
    ),
    # paper: the Learning to Shard comparison, options per layer on hundreds of GPUs
    *(
        Instance(
            name=f"moe1.6t-h100x{gpus}-chat-layer",
            model="moe-1.6t",
            cluster=f"h100x{gpus}",
            workload="chat",
            size="paper",
            split="heldout",
            tie="layer",
            overrides=(("batch", 4096),),
        )
        for gpus in (256, 512, 1024)
    ),
    # slo: the concurrency is chosen under binding SLOs
    *(
        Instance(
            name=f"{short}-{cluster}-slo",
            model=model,
            cluster=cluster,
            workload="chat",
            size="slo",
            split="heldout",
            overrides=(("batch", 4096), ("ttft_ms", 2000.0), ("tpot_ms", 50.0)),
        )
        for short, model, cluster in (
            ("llama70b", "llama-3.1-70b", "h100x8"),
            ("qwen235b", "qwen3-235b-a22b", "h200x16"),
            ("deepseek-v3", "deepseek-v3", "h200x16"),
        )
    ),
    # disagg: aggregated against disaggregated serving under the same SLOs, on
    # prefill-heavy (8,192 in / 256 out) and decode-heavy (1,024 / 2,048) requests
    *(
        Instance(
            name=f"{short}-{cluster}-{shape}",
            model=model,
            cluster=cluster,
            workload="chat",
            size="disagg",
            split="heldout",
            overrides=(
                ("batch", 4096),
                ("input_len", i),
                ("output_len", o),
                ("ttft_ms", 2000.0),
                ("tpot_ms", 50.0),
            ),
        )
        for short, model, cluster in (
            ("deepseek-v3", "deepseek-v3", "h200x32"),
            ("deepseek-v3", "deepseek-v3", "h100x64"),
            ("llama70b", "llama-3.1-70b", "h100x16"),
            ("qwen235b", "qwen3-235b-a22b", "h200x16"),
        )
        for shape, i, o in (("prefill-heavy", 8192, 256), ("decode-heavy", 1024, 2048))
    ),
)

SUITES = ("small", "medium", "large", "paper", "slo", "disagg", "train", "heldout", "all")


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
    if name in ("small", "medium", "large", "paper", "slo", "disagg"):
        return tuple(i for i in INSTANCES if i.size == name)
    if name in ("train", "heldout"):
        return tuple(i for i in INSTANCES if i.split == name)
    if any(i.name == name for i in INSTANCES):
        return (get_instance(name),)
    raise ShardlabError(f"unknown suite {name!r}; suites: {', '.join(SUITES)} or an instance name")
