"""The reference model's routed experts, and their DeepEP-style all-to-all dispatch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from shardlab.dtensor_check.recording import _explicit

# The count exchange before the dispatch sends one value of this type per destination
# rank; the cost model prices it as COUNT_BYTES per value (checked in predicted_calls).
COUNT_DTYPE = torch.int32


@dataclass(kw_only=True)
class _ExpertSharding:
    option: str  # alltoall | allgather
    ep: int
    etp: int
    rank: int  # rank inside the stage group (dp major, tp minor)
    layer: int


class Experts(nn.Module):
    """Routed SwiGLU experts (Mixtral-style top-k softmax over the chosen logits)."""

    def __init__(self, num_experts: int, top_k: int, hidden: int, width: int) -> None:
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.w_gate = nn.Parameter(torch.empty(num_experts, width, hidden))
        self.w_up = nn.Parameter(torch.empty(num_experts, width, hidden))
        self.w_down = nn.Parameter(torch.empty(num_experts, hidden, width))
        self.sharding: _ExpertSharding | None = None

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top, idx = logits.topk(self.top_k, dim=-1)
        return top.softmax(-1), idx

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Local expert ``e`` (an index into the local weights) on rows ``x``."""
        return (F.silu(x @ self.w_gate[e].T) * (x @ self.w_up[e].T)) @ self.w_down[e].T

    def _contributions(self, x: torch.Tensor, logits: torch.Tensor, first: int) -> torch.Tensor:
        """Sum over a token's chosen experts that are local (``first``.. onward)."""
        shape = x.shape
        x2, lg = x.reshape(-1, shape[-1]), logits.reshape(-1, self.num_experts)
        w, idx = self.route(lg)
        out = torch.zeros_like(x2)
        for e in range(self.w_gate.shape[0]):
            rows, slots = torch.nonzero(idx == first + e, as_tuple=True)
            if len(rows):
                y = self.expert(e, x2[rows]) * w[rows, slots, None]
                out.index_add_(0, rows, y)
        return out.view(shape)

    def forward(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        s = self.sharding
        if s is None:
            return self._contributions(x, logits, 0)
        local = self.w_gate.shape[0]
        if s.option == "allgather":
            # Every rank sees every token and adds its own experts' (slices') share.
            return self._contributions(x, logits, (s.rank // s.etp) * local)
        return self._alltoall(x, logits, s)

    def _alltoall(self, x: torch.Tensor, logits: torch.Tensor, s: _ExpertSharding) -> torch.Tensor:
        """DeepEP-style dispatch: a token goes once to each rank owning one of its experts.

        Three ``all_to_all_single`` calls, as ``collectives_of`` predicts:

        - ``experts counts``: rows per destination rank, one ``COUNT_DTYPE`` (int32)
          value per rank (DeepEP's notify step before a dropless dispatch);
        - ``experts dispatch``: one row per (token, destination rank) holding the hidden
          state followed by ``2 * top_k`` routing columns (the local expert ids, -1
          where the expert lives elsewhere, and their weights), which DeepEP sends
          inside the same dispatch kernel. The recorder counts only the ``hidden``
          columns (``priced_columns``): the cost model does not price the routing
          metadata, small next to the hidden rows;
        - ``experts combine``: each row's weighted sum over the receiver's experts
          back to its sender, which adds them up.
        """
        shape = x.shape
        h = shape[-1]
        x2 = x.reshape(-1, h)
        n_tok, k = x2.shape[0], self.top_k
        w, idx = self.route(logits.reshape(-1, self.num_experts))
        local = self.w_gate.shape[0]
        dest = idx // local  # rank of each chosen expert
        hit = torch.zeros(s.ep, n_tok, dtype=torch.bool)
        hit[dest, torch.arange(n_tok).unsqueeze(1).expand(-1, k)] = True
        pair_rank, pair_tok = torch.nonzero(hit, as_tuple=True)  # grouped by rank
        mine = dest[pair_tok] == pair_rank.unsqueeze(1)
        ids = torch.where(mine, idx[pair_tok] - (pair_rank * local).unsqueeze(1), -1)
        weights = torch.where(mine, w[pair_tok], 0.0)
        # Local expert ids (< num_experts) are exact in the float buffer.
        send = torch.cat([x2[pair_tok], ids.to(x2.dtype), weights], 1)
        send_counts = torch.bincount(pair_rank, minlength=s.ep).to(COUNT_DTYPE)
        recv_counts = torch.empty_like(send_counts)
        where = f"layer{s.layer}: experts"
        with _explicit(f"{where} counts", "ep"):
            dist.all_to_all_single(recv_counts, send_counts)
        send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
        recv = send.new_empty(sum(recv_splits), h + 2 * k)
        with _explicit(f"{where} dispatch", "ep", priced_columns=h):
            dist.all_to_all_single(recv, send, recv_splits, send_splits)
        recv_x = recv[:, :h]
        recv_ids, recv_w = recv[:, h : h + k].round().long(), recv[:, h + k :]
        out = torch.zeros_like(recv_x)
        for e in range(local):
            rows, slots = torch.nonzero(recv_ids == e, as_tuple=True)
            if len(rows):
                out.index_add_(0, rows, self.expert(e, recv_x[rows]) * recv_w[rows, slots, None])
        back = x2.new_empty(send.shape[0], h)
        with _explicit(f"{where} combine", "ep"):
            dist.all_to_all_single(back, out, send_splits, recv_splits)
        y = torch.zeros_like(x2)
        y.index_add_(0, pair_tok, back)
        return y.view(shape)
