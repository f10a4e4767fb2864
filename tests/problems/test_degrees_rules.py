"""The validity rules of degree tuples and of options under them."""

from __future__ import annotations

import pytest

from shardlab.problems.catalog import load_model
from shardlab.problems.cluster import parse_cluster
from shardlab.problems.degrees import enumerate_degrees, option_valid
from shardlab.problems.operators import layer_ops
from shardlab.problems.plan import Degrees


def test_every_degree_tuple_uses_every_gpu_and_splits_the_heads() -> None:
    model, cluster = load_model("llama-3.1-8b"), parse_cluster("h100x8")
    tuples = enumerate_degrees(model, cluster)
    assert tuples and len(set(tuples)) == len(tuples)
    for d in tuples:
        assert d.num_gpus == 8
        assert model.num_heads % d.tp == 0
        assert d.ep == 1 and d.etp == d.group  # a dense model
    assert Degrees(tp=8, etp=8) in tuples and Degrees(replicas=8) in tuples


def test_moe_degrees_split_experts_and_their_width() -> None:
    """Each stage's GPUs regroup as every (ep, etp) whose ep divides the 8 experts (the
    14,336 width divides by any etp here): all of them, none other."""
    model = load_model("mixtral-8x7b")
    assert model.moe is not None
    for gpus in (8, 16):
        by_group: dict[int, set[tuple[int, int]]] = {}
        for d in enumerate_degrees(model, parse_cluster(f"h100x{gpus}")):
            by_group.setdefault(d.group, set()).add((d.ep, d.etp))
        for group, pairs in by_group.items():
            assert pairs == {(ep, group // ep) for ep in (1, 2, 4, 8) if group % ep == 0}
        assert set(by_group) == {1, 2, 4, 8} | ({16} if gpus == 16 else set())


def test_heads_that_do_not_divide_leave_no_tuple() -> None:
    model = load_model("llama-3.1-8b")  # 32 heads, 8 KV heads (replicated past 8)
    tps = {d.tp for d in enumerate_degrees(model, parse_cluster("h100x16"))}
    assert tps == {1, 2, 4, 8, 16}
    assert not any(d.tp == 3 for d in enumerate_degrees(model, parse_cluster("h100x3")))


def test_an_option_needing_an_axis_of_size_one_is_not_valid() -> None:
    model = load_model("llama-3.1-8b")
    op = next(o for o in layer_ops(model, "dense") if o.name == "qkv_proj")
    column = op.option("column")
    assert option_valid(op, column, Degrees(tp=2, etp=2))
    assert not option_valid(op, column, Degrees(dp_attn=2, etp=2))
    assert option_valid(op, op.options[0], Degrees())  # the canonical option always is


def test_an_option_whose_dimension_does_not_divide_is_not_valid() -> None:
    model = load_model("llama-3.1-8b")
    op = next(o for o in layer_ops(model, "dense") if o.name == "ffn_up")
    column = op.option("column")
    assert op.split_size % 3  # 14,336 does not divide by 3
    assert not option_valid(op, column, Degrees(tp=3, etp=3))
    assert option_valid(op, column, Degrees(tp=4, etp=4))


@pytest.mark.parametrize("model", ["llama-3.1-8b", "deepseek-v3"])
def test_tuples_come_sorted_by_pp_tp_dp_ep(model: str) -> None:
    tuples = enumerate_degrees(load_model(model), parse_cluster("h100x16"))
    keys = [(d.pp, d.tp, d.dp_attn, d.ep) for d in tuples]
    assert keys == sorted(keys)
