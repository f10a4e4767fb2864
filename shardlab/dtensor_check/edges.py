"""Plan placements as torch placements, and the redistribution a sharded model
runs on every edge between two operators."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from shardlab.dtensor_check.recording import _Where
from shardlab.errors import ShardlabError
from shardlab.problems.operators import (
    OptionSpec,
)
from shardlab.problems.placements import MESH_AXES, Layout
from shardlab.problems.placements import Placement as PlanPlacement

# -- placements -------------------------------------------------------------------------


# How a plan is applied: OptionParallel on the (dp, tp) mesh, or torch's own 1-D styles.
Styles = Literal["mesh", "torch"]


def torch_placement(p: PlanPlacement) -> Any:
    """Our placement as a DTensor placement on ``[batch, seq, features]`` activations."""
    if p.kind == "R":
        return Replicate()
    if p.kind == "P":
        return Partial()
    return Shard(0) if p.dim == "tok" else Shard(-1)


def _same_placement(actual: Any, expected: PlanPlacement, ndim: int) -> bool:
    if expected.kind == "R":
        return isinstance(actual, Replicate)
    if expected.kind == "P":
        return isinstance(actual, Partial)  # _MaskPartial (vocab-parallel embedding) too
    if not isinstance(actual, Shard):
        return False
    dim = actual.dim % ndim
    return dim == 0 if expected.dim == "tok" else dim == ndim - 1


def _layout_str(placements: Sequence[Any]) -> str:
    return "(" + ", ".join(str(p) for p in placements) + ")"


# -- applying a plan --------------------------------------------------------------------


@dataclass(kw_only=True)
class _PlanState:
    """What a sharded model needs at run time: the mesh and every operator's option."""

    mesh: DeviceMesh  # (dp, tp) for styles="mesh", the 1-D tp mesh for styles="torch"
    axes: tuple[str, ...]
    layers: list[dict[str, OptionSpec]]
    head: dict[str, OptionSpec]
    styles: Styles
    entering_from: str = "embedding"

    def placements(self, layout: Layout) -> list[Any]:
        return [
            torch_placement(p) for a, p in zip(MESH_AXES, layout, strict=True) if a in self.axes
        ]


class _Edges:
    """Redistribution between operators, named like ``collectives_of``'s calls."""

    def __init__(self, state: _PlanState | None, layer: int | None) -> None:
        self.s = state
        self.layer = layer

    def _opt(self, name: str) -> OptionSpec:
        assert self.s is not None
        if self.layer is None or name in self.s.head:
            return self.s.head[name]
        return self.s.layers[self.layer][name]

    def _move(self, label: str, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        _Where.label = label
        if self.s is None:
            return x
        assert isinstance(x, DTensor), f"{label}: expected a DTensor, got a plain tensor"
        return x.redistribute(self.s.mesh, self.s.placements(layout))

    def __call__(self, src: str, dst: str, x: torch.Tensor) -> torch.Tensor:
        if self.s is None:
            return x
        label = f"layer{self.layer}: {src} -> {dst}"
        return self._move(label, x, self.s.layers[self.layer][dst].inp)

    def into_residual(self, x: torch.Tensor) -> torch.Tensor:
        if self.s is None:
            return x
        src = self.s.entering_from
        return self._move(f"{src} -> layer{self.layer}.residual", x, self._opt("residual").inp)

    def head(self, src: str, dst: str, x: torch.Tensor) -> torch.Tensor:
        if self.s is None:
            return x
        if src == "token_ids":
            # Token ids enter as TOKEN_IDS_LAYOUT; the cost model lists no edge here.
            _Where.label = "token_ids -> embedding"
            if self.s.styles == "torch" and self._opt("embedding").name == "vocab_sharded":
                return x  # RowwiseParallel(nn.Embedding) takes replicated ids itself
            return x.redistribute(self.s.mesh, self.s.placements(self._opt(dst).inp))
        return self._move(f"{src} -> {dst}", x, self._opt(dst).inp)

    def run(self, op: str, module: nn.Module, *args: torch.Tensor) -> Any:
        """Run operator ``op``; collectives seen while it runs are labelled with it."""
        if self.s is None:
            return module(*args)
        where = f"layer{self.layer}: {op}" if self.layer is not None else op
        _Where.label = where
        if self.s.styles == "torch" and op == "embedding":
            opt = self._opt("embedding")
            if opt.name == "vocab_sharded":
                # RowwiseParallel redistributes its output itself: that is the first edge.
                first = self.s.layers[0]["residual"]
                _Where.label = "embedding -> layer0.residual"
                out = module(*args)
                self._check_out(where, opt, first.inp, out)
                return out
        out = module(*args)
        self._check_out(where, self._opt(op), self._opt(op).out, out)
        return out

    def _check_out(self, where: str, opt: OptionSpec, layout: Layout, out: Any) -> None:
        assert self.s is not None
        want = [p for a, p in zip(MESH_AXES, layout, strict=True) if a in self.s.axes]
        if not isinstance(out, DTensor):
            raise ShardlabError(f"{where} ({opt.name}): returned a plain tensor, not a DTensor")
        got = out.placements
        if not all(_same_placement(g, w, out.ndim) for g, w in zip(got, want, strict=True)):
            raise ShardlabError(
                f"{where} ({opt.name}): DTensor produced {_layout_str(got)}, the option "
                f"declares {'(' + ', '.join(p.short for p in want) + ')'}"
            )
