"""The reference model's plain dense modules: RMSNorm, a SwiGLU FFN's up projection
and the sampler."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class SwiGLUUp(nn.Module):
    """Gate and up projections of a SwiGLU FFN and the activation (``ffn_up``)."""

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, width, bias=False)
        self.up = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.gate(x)) * self.up(x)


class Sampler(nn.Module):
    """Reads the logits in its layout and returns them (sampling itself is local)."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits
