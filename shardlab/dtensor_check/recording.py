"""What a forward pass records: each collective torch issues, with the edge or
operator it belongs to and its size."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor.debug import CommDebugMode

# -- what is being recorded -------------------------------------------------------------


class _Where:
    """The edge or operator the running code belongs to (read by the recorder)."""

    label = "setup"
    axis: str | None = None  # set around explicit collectives (the MoE dispatch)
    priced_columns: int | None = None  # only this many leading columns are priced


@contextlib.contextmanager
def _explicit(label: str, axis: str, *, priced_columns: int | None = None) -> Iterator[None]:
    """Label the explicit collectives issued inside (the MoE exchange) for the recorder.

    ``priced_columns``: the payload is ``[rows, columns]`` and only its first
    ``priced_columns`` columns are what the cost model prices (the dispatch carries the
    routing metadata in extra columns); the recorder counts ``rows * priced_columns``.
    """
    old = (_Where.label, _Where.axis, _Where.priced_columns)
    _Where.label, _Where.axis, _Where.priced_columns = label, axis, priced_columns
    try:
        yield
    finally:
        _Where.label, _Where.axis, _Where.priced_columns = old


def _kind_of(op_name: str) -> str:
    name = op_name.rsplit(".", 1)[-1]
    if "all_reduce" in name or name.startswith("allreduce"):
        return "all_reduce"
    if "all_gather" in name or name.startswith("allgather"):
        return "all_gather"
    if "reduce_scatter" in name:
        return "reduce_scatter"
    if "all_to_all" in name or "alltoall" in name:
        return "all_to_all"
    return name


@dataclass(frozen=True, kw_only=True)
class _Seen:
    where: str
    kind: str
    axis: str
    elements: int
    dtype: str


class _Recorder(CommDebugMode):
    """``CommDebugMode`` that also records each collective's size, group and edge."""

    def __init__(self, axis_of_group: dict[str, str]) -> None:
        super().__init__()
        self.axis_of_group = axis_of_group
        self.seen: list[_Seen] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = self.get_total_counts()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is not NotImplemented and self.get_total_counts() > before:
            self.seen.append(self._describe(func, args))
        return out

    def _describe(self, func: Any, args: tuple) -> _Seen:
        name = str(func._overloadpacket)
        kind = _kind_of(name)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        # c10d ops take (output, input, ...); functional collectives (input, ...).
        payload = tensors[1] if name.startswith("c10d.") and len(tensors) >= 2 else tensors[0]
        elements = payload.numel()
        if _Where.priced_columns is not None:  # leading columns only (see _explicit)
            elements = elements // payload.shape[-1] * _Where.priced_columns
        group = next((a for a in reversed(args) if isinstance(a, str)), None)
        if kind == "all_gather":
            size = next(a for a in args if isinstance(a, int) and not isinstance(a, bool))
            elements *= size  # the cost model's all-gather message is the gathered output
        axis = _Where.axis or self.axis_of_group.get(str(group), f"group {group}")
        return _Seen(
            where=_Where.label,
            kind=kind,
            axis=axis,
            elements=int(elements),
            dtype=str(payload.dtype),
        )
