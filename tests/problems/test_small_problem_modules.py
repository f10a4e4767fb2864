"""Direct tests of the small modules of problems: limits, dtypes, placements and the
cached hash."""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass

import pytest

from shardlab.errors import ShardlabError
from shardlab.problems.cached_hash import CachedHash
from shardlab.problems.dtypes import BYTES_PER_VALUE, check_kv_dtype, check_weight_dtype
from shardlab.problems.limits import check_count, check_finite
from shardlab.problems.placements import (
    PARTIAL,
    REPLICATE,
    SHARD_HID,
    SHARD_TOK,
    Placement,
    layout_str,
    parse_placement,
    redistribute,
)


@pytest.mark.parametrize(
    ("value", "words"),
    [(True, "must be an integer"), (2.0, "must be an integer"), (0, "at least 1"), (11, "(10)")],
)
def test_check_count_refuses(value: object, words: str) -> None:
    with pytest.raises(ShardlabError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_count(value, 10, what="thing")


def test_check_count_takes_the_bounds() -> None:
    assert check_count(10, 10, what="thing") == 10
    assert check_count(0, 10, what="thing", minimum=0) == 0


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, "1", None, False])
def test_check_finite_refuses(value: object) -> None:
    with pytest.raises(ShardlabError, match="thing"):
        check_finite(value, what="thing")


def test_check_finite_positive() -> None:
    assert check_finite(0, what="x") == 0.0 and isinstance(check_finite(3, what="x"), float)
    with pytest.raises(ShardlabError, match="positive"):
        check_finite(0, what="x", positive=True)


def test_dtypes() -> None:
    assert check_weight_dtype("fp4", where="w") == "fp4"
    assert check_kv_dtype("fp8", where="w") == "fp8"
    with pytest.raises(ShardlabError, match="weight dtype"):
        check_weight_dtype("int4", where="w")
    with pytest.raises(ShardlabError, match="KV-cache dtype"):
        check_kv_dtype("fp4", where="w")
    # fp4 is 4 bits plus an 8-bit scale per 32 values
    assert BYTES_PER_VALUE["fp4"] == pytest.approx((4 + 8 / 32) / 8)
    assert BYTES_PER_VALUE["bf16"] == 2 * BYTES_PER_VALUE["fp8"]


@pytest.mark.parametrize(
    ("src", "dst", "collective"),
    [
        (REPLICATE, REPLICATE, None),
        (REPLICATE, SHARD_TOK, None),
        (PARTIAL, REPLICATE, "all_reduce"),
        (PARTIAL, SHARD_HID, "reduce_scatter"),
        (SHARD_TOK, REPLICATE, "all_gather"),
        (SHARD_TOK, SHARD_HID, "all_to_all"),
    ],
)
def test_redistribute(src: Placement, dst: Placement, collective: str | None) -> None:
    assert redistribute(src, dst) == collective


def test_nothing_redistributes_into_a_partial_sum() -> None:
    with pytest.raises(ShardlabError, match="no redistribution"):
        redistribute(REPLICATE, PARTIAL)


def test_placements_parse_from_both_spellings() -> None:
    for p in (REPLICATE, SHARD_TOK, SHARD_HID, PARTIAL):
        assert parse_placement(str(p)) == p == parse_placement(p.short)
    assert layout_str((REPLICATE, SHARD_HID)) == "(R, S(hid))"
    with pytest.raises(ShardlabError, match="unknown placement"):
        parse_placement("S(batch)")


@dataclass(frozen=True, kw_only=True)
class _Keyed(CachedHash):
    a: int
    b: tuple[int, ...]
    __hash__ = CachedHash.__hash__


def test_cached_hash_equals_the_field_hash_and_is_not_pickled() -> None:
    x = _Keyed(a=1, b=(2, 3))
    assert hash(x) == hash((1, (2, 3))) == hash(_Keyed(a=1, b=(2, 3)))
    assert "_hash" in x.__dict__  # computed once, then kept
    copy = pickle.loads(pickle.dumps(x))
    assert "_hash" not in copy.__dict__ and copy == x and hash(copy) == hash(x)
