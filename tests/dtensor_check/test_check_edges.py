"""shardlab.dtensor_check.edges: a plan's placements as DTensor placements, and which
DTensor placements a plan's placement accepts."""

from __future__ import annotations

import pytest
from torch.distributed.tensor import Partial, Replicate, Shard

from shardlab.dtensor_check.edges import _same_placement, torch_placement
from shardlab.problems.placements import PARTIAL, REPLICATE, SHARD_HID, SHARD_TOK


def test_each_plan_placement_is_its_dtensor_placement() -> None:
    assert torch_placement(REPLICATE) == Replicate()
    assert torch_placement(PARTIAL) == Partial()
    assert torch_placement(SHARD_TOK) == Shard(0)  # whole requests
    assert torch_placement(SHARD_HID) == Shard(-1)  # features


@pytest.mark.parametrize(
    ("actual", "expected", "same"),
    [
        (Shard(0), SHARD_TOK, True),
        (Shard(2), SHARD_HID, True),  # the last dim of [batch, seq, features]
        (Shard(-1), SHARD_HID, True),
        (Shard(1), SHARD_HID, False),
        (Shard(1), SHARD_TOK, False),
        (Replicate(), SHARD_TOK, False),
        (Replicate(), REPLICATE, True),
        (Partial(), PARTIAL, True),
        (Partial(), REPLICATE, False),
    ],
)
def test_a_dtensor_placement_matches_the_plans_only_on_its_dim(
    actual: object, expected: object, same: bool
) -> None:
    assert _same_placement(actual, expected, 3) is same  # type: ignore[arg-type]
