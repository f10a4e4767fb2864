"""The edit policy: a new plan is an elite plan with some of its decisions changed, the
parent, which decisions change and what they become all chosen by the network.

Why not decode every plan from scratch (:mod:`~shardlab.solvers.rl.policy`): with options
chosen per layer a plan is ~700 decisions, and a plan sampled whole from a policy that
has not yet learned each of them is mostly noise; REINFORCE or PPO then credits one
return to 700 choices at once. An edit keeps what the elite history already got right
and puts the learning on the few decisions that change, so its credit is sharp. It is
still the paper's method: an attention policy reads the elite history and proposes
plans, and PPO trains it on the rewards of its proposals; nothing but the network
chooses a change.

Reading the elite history (``elite_encoding="attention"``): every elite decision is a
token (decision embedding + the chosen candidate's embedding + the plan's reward and
rank). For each decision of the sequence, one attention head set reads that decision's
tokens across the K elite plans (so the summary of ``layer17.experts`` is built from
what the elites chose there, weighted by what the network finds relevant, not a mean
over the plan); each plan's token is an attention-pooled sum of its decision tokens,
and a Transformer encoder over the plan tokens and a query token (the problem's
context) scores the parents. ``"mean"`` replaces both attentions by means (the old
encoding, kept for the ablation).

Acting: one parent from the encoder's scores; then every decision's candidates get a
pointer logit (the step's query against the candidate's embedding), plus a learned
gain times the reward-weighted share of elite plans that chose it, plus, on the
parent's own value, a *stay* logit (network output + a fixed offset set so that an
untrained policy changes about ``edits`` option decisions and its degree tuple with
probability ``degree_edit``). Degree axes are drawn first, one at a time and masked to
valid tuples; then *class moves*: a class is one operator in one layer kind (the
attention projection of every MoE layer, say), and a move sets all its decisions to one
value valid for each of them, or keeps them ("keep" carries a stay offset set by
``class_edits``, shifted by a learned ``regroup`` when the degree tuple changed, since
the best options differ between tuples); finally the option and cut decisions are
drawn together, each masked by the chosen tuple (a parent value the new tuple forbids
must change). The decisions are the
same :class:`~shardlab.solvers.rl.decisions.Decisions` the decoder and the gymnasium
environment use, so every proposal is a valid plan and an episode of the environment.
Weights are shared across decisions through what they decide (operator, layer kind,
position), so a change that paid off in one MoE layer raises the same change's
probability in every MoE layer: the learned form of a move by layer kind.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from shardlab.solvers.rl.config import RLConfig
from shardlab.solvers.rl.costs import COST_DIM
from shardlab.solvers.rl.decisions import Decisions
from shardlab.solvers.rl.features import (
    CAND_DIM,
    CONTEXT_DIM,
    OP_VOCAB,
    STEP_DIM,
    decision_classes,
)
from shardlab.solvers.rl.policy import NEG, Elite, ProblemTensors, mlp


@dataclass(kw_only=True)
class EditRollout:
    """Proposed plans and what recomputes their log-probabilities."""

    actions: torch.Tensor  # (B, T)
    parents: torch.Tensor  # (B,) index into the elite (0 when the elite is empty)
    held: torch.Tensor  # (B, T) what each decision stays at: the parent's, or rebased
    rebased: torch.Tensor  # (B,) bool: options taken from the best plan of a new tuple
    retuned: torch.Tensor  # (B,) bool: options re-chosen for a tuple never seen
    cost_feats: torch.Tensor  # (B, T, W, COST_DIM) the candidates' costs (zeros: unused)
    moves: torch.Tensor  # (B, C) class moves: a value slot, or W for "keep"
    move_masks: torch.Tensor  # (B, C, W + 1) bool
    masks: torch.Tensor  # (B, T, W + 1) bool
    logp: torch.Tensor  # (B,)


@dataclass(kw_only=True)
class Scores:
    """What the network makes of one elite history, before any parent is chosen."""

    parent: torch.Tensor  # (K,) parent logits
    base: torch.Tensor  # (T, W + 1) candidate logits (pointer + elite share; last: none)
    stay: torch.Tensor  # (T,) logit added to the held value
    move: torch.Tensor  # (C, W + 1) class-move logits (last: keep)
    regroup: torch.Tensor  # () added to "keep" when the degree tuple changed


@dataclass(kw_only=True)
class Static:
    """Per-problem constants of the edit policy."""

    offsets: torch.Tensor  # (T,) stay offsets
    classes: np.ndarray  # (T,) class of each decision, -1 for none
    members: torch.Tensor  # (C, T) membership, rows summing to 1
    keep_offsets: torch.Tensor  # (C,)


def static_of(pt: ProblemTensors, config: RLConfig) -> Static:
    """The fixed logits of an untrained policy: with zero candidate logits a decision
    with ``n`` values changes with probability ``p`` when its stay logit is
    ``log((n - 1) (1 - p) / p)``. Options and cuts share ``edits`` changes per plan, the
    degree axes the probability ``degree_edit`` of any change, the classes (one per
    operator of a layer kind) ``class_edits`` moves per plan."""
    dec = pt.dec
    k = dec.n_degree_steps
    rest = max(dec.n_steps - k, 1)
    p_rest = min(config.edits / rest, 0.5)
    p_deg = 1.0 - (1.0 - config.degree_edit) ** (1.0 / max(k, 1))

    def offset(n_values: int, p: float) -> float:
        return math.log(max(n_values - 1, 1) * (1.0 - p) / p)

    offsets = [
        offset(len(step.values), p_deg if t < k else p_rest) for t, step in enumerate(dec.steps)
    ]
    classes = decision_classes(dec)
    n_classes = int(classes.max()) + 1 if (classes >= 0).any() else 0
    members = np.zeros((n_classes, dec.n_steps), dtype=np.float32)
    members[classes[classes >= 0], np.flatnonzero(classes >= 0)] = 1.0
    p_class = min(config.class_edits / max(n_classes, 1), 0.5)
    keep = [offset(len(dec.steps[int(np.argmax(row))].values), p_class) for row in members]
    members /= np.maximum(members.sum(1, keepdims=True), 1.0)
    return Static(
        offsets=torch.tensor(offsets, dtype=torch.float32),
        classes=classes,
        members=torch.from_numpy(members),
        keep_offsets=torch.tensor(keep, dtype=torch.float32),
    )


def _draw(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> torch.Tensor:
    """One sample per row of the last axis."""
    flat = torch.softmax(logits / temperature, -1).reshape(-1, logits.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).reshape(logits.shape[:-1])


def _logp(logits: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, -1).gather(-1, chosen[..., None])[..., 0]


def _entropy(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logq = torch.log_softmax(logits, -1)
    return -(logq.exp() * logq.masked_fill(~mask, 0.0)).sum(-1)


def _class_masks(st: Static, masks: np.ndarray) -> np.ndarray:
    """``(n, C, W + 1)``: a class may move to a value valid for every member (and
    always keep)."""
    n, _, w1 = masks.shape
    n_classes = st.members.shape[0]
    out = np.zeros((n, n_classes, w1), dtype=bool)
    for c in range(n_classes):
        out[:, c] = masks[:, st.classes == c].all(axis=1)
    out[:, :, -1] = True
    return out


def _moved(st: Static, held: torch.Tensor, moves: torch.Tensor, keep: int) -> torch.Tensor:
    """The held values after each child's class moves (``moves == keep``: unchanged)."""
    cls = torch.from_numpy(st.classes)
    opt = cls >= 0
    out = held.clone()
    if opt.any():
        target = moves[:, cls[opt]]  # (n, option decisions)
        out[:, opt] = torch.where(target == keep, held[:, opt], target)
    return out


def _followed(held: torch.Tensor, actions: torch.Tensor, none: int) -> torch.Tensor:
    """The degree axes' stay targets under ``degree_follow``: ``held``, but ``none`` (no
    stay logit) on each axis after one whose action left its held value. An axis reads
    only the axes before it, so a partly drawn ``actions`` gives the drawn axes' next."""
    diff = (actions != held).int()
    return torch.where(torch.cumsum(diff, 1) - diff > 0, none, held)


def _conserved(
    dec: Decisions, held: torch.Tensor, actions: torch.Tensor, none: int
) -> torch.Tensor:
    """The degree axes' stay targets under ``conserve``: ``held``, but attention DP's is
    the value that keeps pp * tp * dp_attn (the GPUs of one attention replica) the
    parent's when pp or tp moved, or ``none`` when no candidate does. pp and tp are drawn
    before attention DP, so a partly drawn ``actions`` gives its target in time."""
    names = [step.name for step in dec.steps[: dec.n_degree_steps]]
    if not {"pp", "tp", "dp_attn"} <= set(names):
        return held
    ip, it, ia = (names.index(a) for a in ("pp", "tp", "dp_attn"))
    h, a = dec.degree_values(held.numpy()), dec.degree_values(actions.numpy())
    before, after = h[:, ip] * h[:, it], a[:, ip] * a[:, it]
    gpus = h[:, ia] * before  # 0 without a parent
    per = np.maximum(after, 1)
    target = np.where(gpus % per == 0, gpus // per, 0)
    hit = target[:, None] == np.asarray(dec.steps[ia].values)[None, :]
    slot = np.where(hit.any(1), hit.argmax(1), none)
    out = held.clone()
    moved = (after != before) & (gpus > 0)
    out[:, ia] = torch.from_numpy(np.where(moved, slot, held[:, ia].numpy()))
    return out


class EditPolicy(nn.Module):
    def __init__(self, config: RLConfig) -> None:
        super().__init__()
        d = config.d_model
        self.d = d
        self.config = config
        self.logit_clip = config.logit_clip
        self.attend = config.elite_encoding == "attention"
        self.elite_gain = nn.Parameter(torch.tensor(float(config.elite_prior)))
        self.regroup = nn.Parameter(torch.tensor(float(config.regroup_prior)))
        # per operator, a gain on each candidate's cost features under the chosen degree
        # tuple (:mod:`~shardlab.solvers.rl.costs`): slower options start less likely
        gain = torch.zeros(len(OP_VOCAB), COST_DIM)
        gain[:, 0] = -config.cost_prior
        self.cost_gain = nn.Parameter(gain)
        self.use_costs = config.cost_features
        self.step_embed = mlp(STEP_DIM, d)
        self.cand_embed = mlp(CAND_DIM, d)
        self.query_embed = mlp(CONTEXT_DIM, d)
        self.query_token = nn.Parameter(torch.zeros(d))
        self.reward_embed = nn.Linear(2, d)
        self.per_decision = nn.MultiheadAttention(d, config.n_heads, batch_first=True)
        self.pool = nn.Linear(d, 1)
        layer = nn.TransformerEncoderLayer(
            d, config.n_heads, config.ff_dim, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, config.n_layers, enable_nested_tensor=False)
        self.parent_head = nn.Linear(d, 1)
        self.pointer = nn.Linear(2 * d, d)
        self.stay_head = nn.Sequential(nn.Linear(2 * d, d), nn.ReLU(), nn.Linear(d, 1))
        self.keep_head = nn.Sequential(nn.Linear(2 * d, d), nn.ReLU(), nn.Linear(d, 1))
        for head in (self.stay_head, self.keep_head):  # untrained: the offsets alone
            nn.init.zeros_(head[2].weight)
            nn.init.zeros_(head[2].bias)
        # held with its tensors: keyed by id() alone, a later problem's tensors that
        # reuse a freed id would read the previous problem's offsets
        self._static: tuple[ProblemTensors, Static] | None = None

    def static(self, pt: ProblemTensors) -> Static:
        if self._static is None or self._static[0] is not pt:
            self._static = (pt, static_of(pt, self.config))
        return self._static[1]

    def scores(self, pt: ProblemTensors, elite: Elite) -> Scores:
        st = self.static(pt)
        n_steps, width = pt.cands.shape[:2]
        step = self.step_embed(pt.steps)  # (T, d)
        cand = self.cand_embed(pt.cands)  # (T, W, d)
        query = self.query_token + self.query_embed(pt.context)  # (d,)
        k = len(elite.actions)
        share = torch.zeros(n_steps, width)
        if k:
            acts = torch.from_numpy(elite.actions)  # (K, T)
            chosen = cand[torch.arange(n_steps)[None, :], acts]  # (K, T, d)
            r = torch.from_numpy(np.clip(elite.rewards, -10, 10).astype(np.float32))
            rank = torch.linspace(0, 1, k)
            x = step[None] + chosen + self.reward_embed(torch.stack([r, rank], 1))[:, None]
            if self.attend:
                q = (step + query)[:, None]  # (T, 1, d): one query per decision
                kv = x.transpose(0, 1)  # (T, K, d): that decision in every elite plan
                summary = self.per_decision(q, kv, kv, need_weights=False)[0][:, 0]
                weights = torch.softmax(self.pool(x)[..., 0], dim=1)  # (K, T)
                tokens = (weights[..., None] * x).sum(1)  # (K, d)
            else:
                summary = x.mean(0)
                tokens = x.mean(1)
            w = np.exp(elite.rewards - elite.rewards.max())
            wt = torch.from_numpy((w / w.sum()).astype(np.float32))
            share.scatter_add_(1, acts.T.contiguous(), wt.expand(n_steps, k).contiguous())
            seq = torch.cat([query[None], tokens], 0)[None]
        else:
            summary = torch.zeros(n_steps, self.d)
            seq = query[None, None]
        out = self.encoder(seq)[0]
        ctx, parent = out[0], self.parent_head(out[1:])[:, 0]
        h = torch.cat([summary + ctx, step], dim=-1)  # (T, 2d)
        logits = (cand * self.pointer(h)[:, None]).sum(-1) / math.sqrt(self.d)
        if self.logit_clip > 0:  # bounded logits keep every valid candidate reachable
            logits = self.logit_clip * torch.tanh(logits / self.logit_clip)
        base = torch.cat([logits + self.elite_gain * share, torch.zeros(n_steps, 1)], 1)
        stay = self.stay_head(h)[:, 0] + st.offsets
        # a class moves all its decisions to one value, scored by its members' means
        keep = self.keep_head(st.members @ h)[:, 0] + st.keep_offsets
        move = torch.cat([st.members @ base[:, :width], keep[:, None]], 1)
        return Scores(parent=parent, base=base, stay=stay, move=move, regroup=self.regroup)

    read = scores  # what every sample of one elite history shares

    @staticmethod
    def _decisions(
        s: Scores, held: torch.Tensor, t: slice, mask: torch.Tensor, cost: torch.Tensor | float
    ) -> torch.Tensor:
        """Logits of steps ``t`` given the values ``held`` there (the stay targets) and
        the candidates' ``cost`` logits there."""
        base, stay = s.base[t], s.stay[t]
        onehot = torch.nn.functional.one_hot(held, base.shape[-1]).float()
        return (base + stay[:, None] * onehot + cost).masked_fill(~mask, NEG)

    @staticmethod
    def _moves(
        s: Scores, st: Static, regrouped: torch.Tensor, mask: torch.Tensor, cost: torch.Tensor
    ) -> torch.Tensor:
        """``(n, C, W + 1)`` class-move logits (their members' mean cost logits added),
        "keep" shifted where the tuple changed."""
        move = s.move.expand(len(regrouped), *s.move.shape)
        shift = torch.zeros_like(move)
        shift[..., :-1] = torch.einsum("ct,ntw->ncw", st.members, cost[..., :-1])
        shift[..., -1] = s.regroup * regrouped.float()[:, None]
        return (move + shift).masked_fill(~mask, NEG)

    def _rebase(
        self,
        pt: ProblemTensors,
        elite: Elite,
        held: torch.Tensor,
        tuples: np.ndarray,
        changed: np.ndarray,
        k: int,
    ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """``held`` with the option and cut decisions of each child that moved to another
        degree tuple taken from the best plan seen on that tuple (``rebase``), or, on a
        tuple no plan was seen on, its parent's options re-chosen by the cost tables
        (``retune``): options tuned for the parent's tuple misprice the new one. Which
        children were rebased, and which retuned."""
        rebased = np.zeros(len(held), dtype=bool)
        retuned = np.zeros(len(held), dtype=bool)
        if not len(elite.actions):  # no parents: every decision is drawn, none moved
            return held, rebased, retuned
        row = {int(d): i for i, d in enumerate(elite.tuples)}
        out = held.clone()
        for i in np.flatnonzero(changed):
            j = row.get(int(tuples[i]))
            if j is None:
                retuned[i] = self.config.retune > 0
            elif self.config.rebase:
                out[i, k:] = torch.from_numpy(elite.bests[j, k:])
                rebased[i] = True
        if retuned.any():
            fresh = pt.costs.fastest(tuples[retuned], out[retuned].numpy(), self.config.retune)
            out[torch.from_numpy(retuned)] = torch.from_numpy(fresh)
        return out, rebased, retuned

    def _costs(self, pt: ProblemTensors, feats: torch.Tensor) -> torch.Tensor:
        """``(n, T, W + 1)`` each candidate's cost logit from its cost features ``(n, T,
        W, COST_DIM)`` (0 for the "none" slot)."""
        term = (feats * self.cost_gain[pt.ops][None, :, None, :]).sum(-1)
        return torch.nn.functional.pad(term, (0, 1))

    def _stays(
        self, dec: Decisions, held: torch.Tensor, actions: torch.Tensor, none: int
    ) -> torch.Tensor:
        """The degree axes' stay targets (``none``: no stay logit) for children of
        ``held`` whose degree actions are ``actions``, sampled and teacher-forced alike."""
        if self.config.conserve:
            held = _conserved(dec, held, actions, none)
        if self.config.degree_follow:
            held = _followed(held, actions, none)
        return held

    @torch.no_grad()
    def sample(
        self,
        pt: ProblemTensors,
        elite: Elite,
        n: int,
        gen: torch.Generator,
        temperature: float = 1.0,
        reading: Scores | None = None,
    ) -> EditRollout:
        """``n`` children of ``elite``; ``reading``: its :meth:`read` when already made
        (a redraw of repeated rows reads the same elite with the same weights)."""
        dec = pt.dec
        st = self.static(pt)
        n_steps, width = dec.n_steps, dec.width
        s = self.scores(pt, elite) if reading is None else reading
        logp = torch.zeros(n)
        if len(elite.actions):
            parents = _draw(s.parent[None].expand(n, -1), temperature, gen)
            logp += torch.log_softmax(s.parent, 0)[parents]
            held = torch.from_numpy(elite.actions)[parents]  # (n, T) the parents' slots
        else:  # nothing to edit yet: every decision drawn from the candidate logits
            parents = torch.zeros(n, dtype=torch.int64)
            held = torch.full((n, n_steps), width, dtype=torch.int64)
        actions = np.zeros((n, n_steps), dtype=np.int64)
        masks = np.zeros((n, n_steps, width + 1), dtype=bool)
        k = dec.n_degree_steps
        for t in range(k):
            masks[:, t, :width] = dec.degree_mask(t, actions[:, :t])
            at = self._stays(dec, held[:, :k], torch.from_numpy(actions[:, :k]), width)
            logits = self._decisions(
                s, at[:, t : t + 1], slice(t, t + 1), torch.from_numpy(masks[:, t : t + 1]), 0.0
            )
            a = _draw(logits, temperature, gen)
            logp += _logp(logits, a).sum(1)
            actions[:, t] = a[:, 0].numpy()
        tuples = dec.degree_index(actions[:, :k])
        masks[:, k:, :width] = dec.rest_masks(tuples)
        changed = (actions[:, :k] != held[:, :k].numpy()).any(1)
        held, rebased, retuned = self._rebase(pt, elite, held, tuples, changed, k)
        # what each candidate costs under the child's tuple, the rest of its plan held:
        # kept with the rollout, the learning step reads them again
        if self.use_costs:
            cost_feats = pt.cost_features(tuples, held)
        else:
            cost_feats = torch.zeros(n, n_steps, width, COST_DIM)
        cost = self._costs(pt, cost_feats)
        regrouped = torch.from_numpy(changed & ~rebased & ~retuned)
        move_masks = torch.from_numpy(_class_masks(st, masks))
        move_logits = self._moves(s, st, regrouped, move_masks, cost)
        moves = _draw(move_logits, temperature, gen)
        logp += _logp(move_logits, moves).sum(1)
        based = held
        held = _moved(st, held, moves, width)
        rest_mask = torch.from_numpy(masks[:, k:])
        logits = self._decisions(s, held[:, k:], slice(k, None), rest_mask, cost[:, k:])
        a = _draw(logits, temperature, gen)
        logp += _logp(logits, a).sum(1)
        actions[:, k:] = a.numpy()
        return EditRollout(
            actions=torch.from_numpy(actions),
            parents=parents,
            held=based,
            rebased=torch.from_numpy(rebased),
            retuned=torch.from_numpy(retuned),
            cost_feats=cost_feats,
            moves=moves,
            move_masks=move_masks,
            masks=torch.from_numpy(masks),
            logp=logp,
        )

    def class_moves(
        self, pt: ProblemTensors, code: np.ndarray, sets: list[tuple[int, ...]]
    ) -> np.ndarray:
        """Codes of the plans that a proposal's class moves make of the plan ``code``
        with the classes of one set in ``sets`` moved together: every combination of
        values valid for them on the plan's tuple that moves each of them."""
        st, dec = self.static(pt), pt.dec
        k, width = dec.n_degree_steps, dec.width
        masks = np.zeros((1, dec.n_steps, width + 1), dtype=bool)
        masks[:, k:, :width] = dec.rest_masks(code[:1])
        valid = [np.flatnonzero(m[:width]) for m in _class_masks(st, masks)[0]]
        rows = []
        for classes in sets:
            for values in itertools.product(*(valid[c] for c in classes)):
                row = np.full(len(valid), width)  # "keep" for every other class
                row[list(classes)] = values
                rows.append(row)
        moves = np.array(rows, dtype=np.int64).reshape(-1, len(valid))
        parent = np.repeat(dec.to_actions(code[None]), len(moves), axis=0)
        child = _moved(st, torch.from_numpy(parent), torch.from_numpy(moves), width).numpy()
        # a move must change its class: one already at that value would repeat the plan
        changed = (child != parent).astype(np.float32) @ (st.members.numpy() > 0).T > 0
        return dec.to_codes(child[(changed | (moves == width)).all(axis=1)])

    def evaluate(
        self, pt: ProblemTensors, elite: Elite, roll: EditRollout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability ``(B,)`` and entropy ``(B,)``: the parent's, the degree
        axes', plus the mean entropy of the class moves and of the decisions (a sum over
        ~700 decisions would outweigh the reward)."""
        st = self.static(pt)
        s = self.scores(pt, elite)
        w1 = s.base.shape[1]
        b = len(roll.actions)
        k = pt.dec.n_degree_steps
        logp = torch.zeros(b)
        entropy = torch.zeros(b)
        if len(elite.actions):
            lp = torch.log_softmax(s.parent, 0)
            logp = logp + lp[roll.parents]
            entropy = entropy - (lp.exp() * lp).sum()
        held = roll.held
        at = self._stays(pt.dec, held[:, :k], roll.actions[:, :k], w1 - 1)
        deg = self._decisions(s, at, slice(0, k), roll.masks[:, :k], 0.0)
        changed = (roll.actions[:, :k] != held[:, :k]).any(1)
        regrouped = changed & ~roll.rebased & ~roll.retuned
        cost = self._costs(pt, roll.cost_feats)
        move_logits = self._moves(s, st, regrouped, roll.move_masks, cost)
        moved = _moved(st, held, roll.moves, w1 - 1)
        rest = self._decisions(
            s,
            moved[:, k:],
            slice(k, None),
            roll.masks[:, k:],
            cost[:, k:],
        )
        logp = logp + _logp(deg, roll.actions[:, :k]).sum(1)
        logp = logp + _logp(move_logits, roll.moves).sum(1)
        logp = logp + _logp(rest, roll.actions[:, k:]).sum(1)
        entropy = entropy + _entropy(deg, roll.masks[:, :k]).sum(1)
        if roll.moves.shape[1]:
            entropy = entropy + _entropy(move_logits, roll.move_masks).mean(1)
        entropy = entropy + _entropy(rest, roll.masks[:, k:]).mean(1)
        return logp, entropy
