"""The disaggregated problem's pools: instance sizes, placement, refusals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab.errors import ShardlabError
from shardlab.problems.catalog import load_model
from shardlab.problems.cluster import Cluster, builtin_accelerators, parse_cluster
from shardlab.problems.disagg import (
    check_disagg,
    check_serving,
    fits,
    instance_sizes,
    pair_count,
    pairs,
)
from shardlab.problems.handoff import Handoff, layer_copies, layer_handoff_bytes
from shardlab.problems.problem import Problem


def test_instance_sizes_are_powers_of_two_in_a_node_then_whole_nodes() -> None:
    assert instance_sizes(parse_cluster("h100x8")) == (1, 2, 4)
    assert instance_sizes(parse_cluster("h100x32")) == (1, 2, 4, 8, 16, 24)


def test_fits_places_small_instances_inside_nodes() -> None:
    cluster = parse_cluster("h100x16")  # two nodes of 8
    assert fits(cluster, {8: 2})
    assert fits(cluster, {4: 2, 8: 1})
    assert not fits(cluster, {8: 2, 1: 1})  # 17 GPUs
    assert not fits(cluster, {16: 1, 4: 1})


def test_pairs_fit_and_cover_the_cluster() -> None:
    cluster = parse_cluster("h100x8")
    out = pairs(cluster)
    assert (4, 1, 4, 1) in out and (1, 1, 1, 1) in out
    for gp, x, gd, y in out:
        assert gp * x + gd * y <= 8


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"workload": "prefill"}, "workload.phase"),
        ({"workload": "batch-offline"}, "workload.schedule"),
        ({"workload": "chat", "output_len": 1}, "workload.output_len"),
    ],
)
def test_a_problem_without_a_disaggregated_form_is_refused(overrides: dict, field: str) -> None:
    problem = Problem.build("llama-3.1-8b", "h100x8", **overrides)
    with pytest.raises(ShardlabError) as info:
        check_disagg(problem)
    assert info.value.field == field and "--" not in str(info.value)


def test_check_serving() -> None:
    assert check_serving("best") == "best"
    with pytest.raises(ShardlabError) as info:
        check_serving("split")
    assert info.value.field == "serving"


def test_handoff_bytes_follow_the_kv_cache() -> None:
    model = load_model("llama-3.1-8b")  # 32 layers, 8 KV heads of 128, no window
    per_layer = layer_handoff_bytes(model, 1000, "bf16")
    assert per_layer == pytest.approx([2 * 8 * 128 * 2.0 * 1000] * 32)
    assert layer_handoff_bytes(model, 1000, "fp8") == pytest.approx(per_layer / 2)
    # up to 8 ranks split the 8 KV heads; 16 hold each head twice
    assert set(layer_copies(model, 8)) == {1.0} and set(layer_copies(model, 16)) == {2.0}
    h = Handoff.of(model, 1000, "bf16", decode_pp=1, decode_tp=16, same_domain=False)
    assert h.received_bytes == pytest.approx(2 * per_layer.sum())
    assert "the network" in h.describe()


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(1, 12), per_node=st.sampled_from([1, 2, 3, 4, 5, 6, 8]))
def test_the_pairs_are_counted_as_they_are_listed(nodes: int, per_node: int) -> None:
    """The refusal past MAX_PAIRS counts pairs without listing them (listing 4M took
    16 s before it refused); the count is the list's length, node shapes and all."""
    acc = builtin_accelerators()["h100"]
    c = Cluster(accelerator=acc, num_gpus=nodes * per_node, gpus_per_node=per_node)
    assert pair_count(c) == len(pairs(c))
