"""shardlab.launch's placement of a disaggregated plan's instances on nodes, and what it
refuses."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from shardlab.errors import ShardlabError
from shardlab.launch.servers import _disagg_spots, build_disagg_launch, tiling
from shardlab.problems.problem import Problem


@dataclass(kw_only=True)
class _Plan:
    """What the placement reads of a disaggregated plan: instances and their GPUs."""

    prefill_gpus: int
    prefill_instances: int
    decode_gpus: int
    decode_instances: int

    def gpus(self, pool: str) -> int:
        return getattr(self, f"{pool}_gpus")


def test_whole_node_instances_come_first_and_smaller_ones_fill_nodes() -> None:
    plan = _Plan(prefill_gpus=4, prefill_instances=3, decode_gpus=16, decode_instances=1)
    spots, nodes = _disagg_spots(plan, 8)  # type: ignore[arg-type]
    # (pool, instance, first node, slot, first GPU, shares the node)
    assert spots == [
        ("decode", 0, 0, 0, 0, False),
        ("prefill", 0, 2, 0, 0, True),
        ("prefill", 1, 2, 1, 4, True),
        ("prefill", 2, 3, 0, 0, True),
    ]
    assert nodes == 4


def test_an_instance_of_a_whole_node_shares_it_with_none() -> None:
    plan = _Plan(prefill_gpus=8, prefill_instances=1, decode_gpus=2, decode_instances=2)
    spots, nodes = _disagg_spots(plan, 8)  # type: ignore[arg-type]
    assert spots == [
        ("prefill", 0, 0, 0, 0, False),
        ("decode", 0, 1, 0, 0, True),
        ("decode", 1, 1, 1, 2, True),
    ]
    assert nodes == 2


def test_tiling_gives_servers_per_node_or_nodes_per_server() -> None:
    assert tiling(8, 2) == (4, 1)
    assert tiling(8, 8) == (1, 1)
    assert tiling(8, 24) == (0, 3)
    for gpus in (3, 12):
        with pytest.raises(ShardlabError, match="use degrees"):
            tiling(8, gpus)


def test_tensorrt_llm_disaggregated_launch_is_refused_naming_the_engine() -> None:
    problem = Problem.build("llama-3.1-8b", "h100x8", engine="trtllm")
    with pytest.raises(ShardlabError) as caught:
        build_disagg_launch(problem, None, model_path="m")  # type: ignore[arg-type]
    assert caught.value.field == "engine" and "--" not in str(caught.value)
    assert "vllm or sglang" in (caught.value.fix or "")
