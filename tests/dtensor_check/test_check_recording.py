"""shardlab.dtensor_check.recording: collective kinds by op name, and the labels around
explicit collectives."""

from __future__ import annotations

import pytest

from shardlab.dtensor_check.recording import _explicit, _kind_of, _Where


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("c10d.allreduce_", "all_reduce"),
        ("_c10d_functional.all_reduce", "all_reduce"),
        ("c10d.allgather_into_tensor_coalesced_", "all_gather"),
        ("_c10d_functional.all_gather_into_tensor", "all_gather"),
        ("_c10d_functional.reduce_scatter_tensor", "reduce_scatter"),
        ("c10d.alltoall_base_", "all_to_all"),
        ("_c10d_functional.all_to_all_single", "all_to_all"),
        ("c10d.broadcast_", "broadcast_"),
    ],
)
def test_each_collective_op_has_the_cost_models_kind(op: str, kind: str) -> None:
    assert _kind_of(op) == kind


def test_explicit_labels_its_block_and_restores_the_label_after() -> None:
    before = (_Where.label, _Where.axis, _Where.priced_columns)
    with _explicit("layer0: experts dispatch", "ep", priced_columns=64):
        assert (_Where.label, _Where.axis, _Where.priced_columns) == (
            "layer0: experts dispatch", "ep", 64,
        )  # fmt: skip
        with pytest.raises(RuntimeError), _explicit("inner", "tp"):
            raise RuntimeError
        assert _Where.label == "layer0: experts dispatch"
    assert (_Where.label, _Where.axis, _Where.priced_columns) == before
