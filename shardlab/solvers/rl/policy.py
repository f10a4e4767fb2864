"""The policy network: a Transformer encoder over the elite history, a masked
pointer decoder over the decision sequence.

Encoder: one token per elite plan (the mean over its decisions of the decision's
embedding plus the chosen candidate's embedding, plus its normalized reward and rank)
and a learned query token carrying the problem's context features; the query's output
is the context vector. Decoder: a GRU run over the decisions, whose input at each step
is the decision's embedding plus the embedding of the previous step's chosen
candidate, started from the context vector. The logit of a candidate is the scaled dot
product of the decoder's query for that step with the candidate's embedding (pointer
style), masked to the valid candidates. Every size is ``d_model``-based; the problem
only changes how many tokens and candidates there are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from shardlab.problems.problem import Problem
from shardlab.solvers.rl.config import RLConfig
from shardlab.solvers.rl.costs import OptionCosts
from shardlab.solvers.rl.decisions import Decisions
from shardlab.solvers.rl.features import (
    CAND_DIM,
    CONTEXT_DIM,
    ELITE_DIM,
    STEP_DIM,
    candidate_features,
    context_features,
    elite_features,
    step_features,
    step_ops,
)

NEG = -1e9  # logit of an invalid candidate


def mlp(n_in: int, d: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, d), nn.ReLU(), nn.Linear(d, d))


@dataclass(kw_only=True)
class ProblemTensors:
    """The static features of one problem, built once per solve."""

    dec: Decisions
    steps: torch.Tensor  # (T, STEP_DIM)
    cands: torch.Tensor  # (T, W, CAND_DIM)
    context: torch.Tensor  # (CONTEXT_DIM,)
    ops: torch.Tensor  # (T,) each decision's operator in OP_VOCAB (options; else "other")
    costs: OptionCosts  # the candidates' cost features under each degree tuple

    @classmethod
    def build(cls, problem: Problem, dec: Decisions) -> ProblemTensors:
        return cls(
            dec=dec,
            steps=torch.from_numpy(step_features(dec)),
            cands=torch.from_numpy(candidate_features(dec)),
            context=torch.from_numpy(context_features(problem)),
            ops=torch.from_numpy(step_ops(dec)),
            costs=OptionCosts(problem, dec),
        )

    def cost_features(self, degree_index: np.ndarray, held: torch.Tensor) -> torch.Tensor:
        """``(n, T, W, COST_DIM)`` the candidates' costs under each row's degree tuple,
        the rest of its plan at the slots ``held``."""
        return torch.from_numpy(self.costs.features(degree_index, held.numpy()))


@dataclass(kw_only=True)
class Elite:
    """The elite history as the network reads it."""

    actions: np.ndarray  # (K, T) action sequences, best first
    rewards: np.ndarray  # (K,)
    # the best plan seen on each degree tuple (edit's rebase): tuple indices and actions
    tuples: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    bests: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    best_fit: np.ndarray = field(default_factory=lambda: np.zeros(0))  # their fitness


@dataclass(kw_only=True)
class Rollout:
    """Sampled plans and everything needed to recompute their log-probabilities."""

    actions: torch.Tensor  # (B, T)
    masks: torch.Tensor  # (B, T, W) bool
    elite_feats: torch.Tensor  # (B, T, W, ELITE_DIM)
    logp: torch.Tensor  # (B,)


class Policy(nn.Module):
    def __init__(self, config: RLConfig) -> None:
        super().__init__()
        d = config.d_model
        self.d = d
        self.logit_clip = config.logit_clip
        # direct path from the elite's share of a candidate to its logit (see elite_prior)
        self.elite_gain = nn.Parameter(torch.tensor(float(config.elite_prior)))
        self.use_elite_features = config.elite_features
        self.step_embed = mlp(STEP_DIM, d)
        self.cand_embed = mlp(CAND_DIM + ELITE_DIM, d)
        self.query_embed = mlp(CONTEXT_DIM, d)
        self.query_token = nn.Parameter(torch.zeros(d))
        self.elite_proj = nn.Linear(d + 2, d)
        layer = nn.TransformerEncoderLayer(
            d, config.n_heads, config.ff_dim, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, config.n_layers, enable_nested_tensor=False)
        self.h0 = nn.Linear(d, d)
        self.gru = nn.GRU(d, d, batch_first=True)
        self.pointer = nn.Linear(2 * d, d)

    # -- pieces --------------------------------------------------------------------

    def context(self, pt: ProblemTensors, elite: Elite) -> torch.Tensor:
        """``(d,)`` the encoder's reading of the problem and the elite history."""
        query = (self.query_token + self.query_embed(pt.context))[None]
        tokens = [query]
        k = len(elite.actions)
        if k:
            acts = torch.from_numpy(elite.actions)
            t_idx = torch.arange(acts.shape[1])
            chosen = pt.cands[t_idx[None, :], acts]  # (K, T, CAND_DIM)
            zeros = torch.zeros(*chosen.shape[:-1], ELITE_DIM)
            per_step = self.step_embed(pt.steps)[None] + self.cand_embed(
                torch.cat([chosen, zeros], dim=-1)
            )
            r = torch.from_numpy(np.clip(elite.rewards, -10, 10).astype(np.float32))[:, None]
            rank = torch.linspace(0, 1, k)[:, None]
            tokens.append(self.elite_proj(torch.cat([per_step.mean(dim=1), r, rank], dim=1)))
        seq = torch.cat(tokens, dim=0)[None]
        return self.encoder(seq)[0, 0]

    def _step_logits(
        self,
        h: torch.Tensor,
        step_emb: torch.Tensor,
        cand: torch.Tensor,
        ef: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        q = self.pointer(torch.cat([h, step_emb.expand_as(h)], dim=-1))
        logits = (cand * q.unsqueeze(-2)).sum(-1) / math.sqrt(self.d)
        logits = logits + self.elite_gain * ef[..., 0]
        if self.logit_clip > 0:  # bounded logits keep every valid candidate reachable
            logits = self.logit_clip * torch.tanh(logits / self.logit_clip)
        return logits.masked_fill(~mask, NEG)

    read = context  # what every sample of one elite history shares

    # -- sampling --------------------------------------------------------------------

    @torch.no_grad()
    def sample(
        self,
        pt: ProblemTensors,
        elite: Elite,
        n: int,
        gen: torch.Generator,
        temperature: float = 1.0,
        reading: torch.Tensor | None = None,
    ) -> Rollout:
        """``n`` plans decided step by step, each step masked to its valid candidates;
        ``reading``: the elite's :meth:`read` when already made."""
        dec = pt.dec
        n_steps, width = dec.n_steps, dec.width
        ctx = self.context(pt, elite) if reading is None else reading
        h = torch.tanh(self.h0(ctx)).expand(n, self.d).contiguous()[None]
        step_emb = self.step_embed(pt.steps)
        actions = np.zeros((n, n_steps), dtype=np.int64)
        masks = np.zeros((n, n_steps, width), dtype=bool)
        efeats = np.zeros((n, n_steps, width, ELITE_DIM), dtype=np.float32)
        weights = np.exp(elite.rewards - elite.rewards.max()) if len(elite.actions) else None
        logp = torch.zeros(n)
        prev = torch.zeros(n, self.d)
        rest = None
        for t in range(n_steps):
            if t < dec.n_degree_steps:
                masks[:, t] = dec.degree_mask(t, actions[:, :t])
            else:
                if rest is None:
                    rest = dec.rest_masks(dec.degree_index(actions[:, : dec.n_degree_steps]))
                masks[:, t] = rest[:, t - dec.n_degree_steps]
            if weights is not None:
                efeats[:, t] = elite_features(dec, elite.actions, weights, actions, t)
            static = pt.cands[t].expand(n, width, -1)
            ef = torch.from_numpy(efeats[:, t])
            if not self.use_elite_features:
                ef = torch.zeros_like(ef)
            cand = self.cand_embed(torch.cat([static, ef], dim=-1))  # (n, W, d)
            out, h = self.gru((step_emb[t] + prev)[:, None], h)
            logits = self._step_logits(
                out[:, 0], step_emb[t], cand, ef, torch.from_numpy(masks[:, t])
            )
            logq = torch.log_softmax(logits / temperature, dim=-1)
            a = torch.multinomial(logq.exp(), 1, generator=gen)[:, 0]
            # The log-probability under the policy itself, not under the heated sampler:
            # PPO's ratio then starts at 1 and a reheated batch is learned from as if the
            # policy had drawn it. That is biased towards what the sampler explored, on
            # purpose: the true ratio pi/q_T of a hot batch lies far outside the clip
            # range, so PPO would learn nothing from the batches that found new plans.
            logp += torch.log_softmax(logits, dim=-1).gather(1, a[:, None])[:, 0]
            actions[:, t] = a.numpy()
            prev = cand[torch.arange(n), a]
        return Rollout(
            actions=torch.from_numpy(actions),
            masks=torch.from_numpy(masks),
            elite_feats=torch.from_numpy(efeats),
            logp=logp,
        )

    # -- teacher-forced evaluation -----------------------------------------------------

    def evaluate(
        self, pt: ProblemTensors, elite: Elite, roll: Rollout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability ``(B,)`` and summed per-decision entropy ``(B,)`` of a rollout."""
        b, n_steps = roll.actions.shape
        ctx = self.context(pt, elite)
        h0 = torch.tanh(self.h0(ctx)).expand(b, self.d).contiguous()[None]
        step_emb = self.step_embed(pt.steps)  # (T, d)
        ef = roll.elite_feats if self.use_elite_features else torch.zeros_like(roll.elite_feats)
        static = pt.cands.expand(b, *pt.cands.shape)
        cand = self.cand_embed(torch.cat([static, ef], dim=-1))  # (B, T, W, d)
        chosen = cand.gather(2, roll.actions[:, :, None, None].expand(b, n_steps, 1, self.d))[
            :, :, 0
        ]
        prev = torch.cat([torch.zeros(b, 1, self.d), chosen[:, :-1]], dim=1)
        out, _ = self.gru(step_emb[None] + prev, h0)  # (B, T, d)
        logits = self._step_logits(out, step_emb[None], cand, ef, roll.masks)
        logq = torch.log_softmax(logits, dim=-1)
        logp = logq.gather(2, roll.actions[:, :, None])[:, :, 0].sum(1)
        probs = logq.exp()
        entropy = -(probs * logq.masked_fill(~roll.masks, 0.0)).sum(-1).sum(1)
        return logp, entropy
