"""Activation layouts in PyTorch DTensor's vocabulary, and the collective between two.

One pipeline stage of one replica is a 2-D device mesh with axes ``("dp", "tp")``:
``dp`` is attention data parallel (each rank serves different requests) and ``tp`` is
tensor parallel. An activation is a ``[tokens, features]`` matrix whose layout gives a
placement per mesh axis:

- ``Replicate()``: every rank on the axis holds the whole tensor;
- ``Shard(tok)`` / ``Shard(hid)``: split along tokens (whole requests, DTensor
  ``Shard(0)``) or along features (heads, FFN width, vocabulary: ``Shard(-1)``);
- ``Partial()``: every rank holds a summand; the sum is the tensor.

The MoE block regroups the same ``dp * tp`` ranks as ``ep * etp``; its operators state
their input and output layouts on ``("dp", "tp")`` like every other operator and carry
their dispatch inside (DTensor cannot express expert routing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shardlab.errors import ShardlabError

MESH_AXES: tuple[str, str] = ("dp", "tp")

CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


@dataclass(frozen=True, kw_only=True, order=True)
class Placement:
    kind: Literal["R", "S", "P"]
    dim: Literal["", "tok", "hid"] = ""

    def __str__(self) -> str:
        if self.kind == "R":
            return "Replicate()"
        if self.kind == "P":
            return "Partial()"
        return f"Shard({self.dim})"

    @property
    def short(self) -> str:
        return {"R": "R", "P": "P"}.get(self.kind, f"S({self.dim})")


REPLICATE = Placement(kind="R")
SHARD_TOK = Placement(kind="S", dim="tok")
SHARD_HID = Placement(kind="S", dim="hid")
PARTIAL = Placement(kind="P")

Layout = tuple[Placement, Placement]  # placement on ("dp", "tp")


def parse_placement(text: str) -> Placement:
    for p in (REPLICATE, SHARD_TOK, SHARD_HID, PARTIAL):
        if text in (str(p), p.short):
            return p
    raise ShardlabError(f"unknown placement {text!r}; use R, S(tok), S(hid) or P")


def redistribute(src: Placement, dst: Placement) -> CollectiveKind | None:
    """The collective DTensor's ``redistribute`` issues to turn ``src`` into ``dst``.

    ``None`` means no communication: equal placements, or Replicate -> Shard, which
    each rank does by keeping its own slice.
    """
    if src == dst:
        return None
    if src == REPLICATE and dst.kind == "S":
        return None
    if src == PARTIAL and dst == REPLICATE:
        return "all_reduce"
    if src == PARTIAL and dst.kind == "S":
        return "reduce_scatter"
    if src.kind == "S" and dst == REPLICATE:
        return "all_gather"
    if src.kind == "S" and dst.kind == "S":
        return "all_to_all"
    raise ShardlabError(f"no redistribution from {src} to {dst}: operators never need it")


def layout_str(layout: Layout) -> str:
    return "(" + ", ".join(p.short for p in layout) + ")"
