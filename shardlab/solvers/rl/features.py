"""Shape-free features of a problem, its decisions and their candidates (numpy only).

Nothing here has a size that depends on the problem: a decision is described by what
it decides (its kind, the operator, the layer group), a candidate by what it means (a
degree's share of the cluster in log2, an option's name, a boundary move), and the
problem by a fixed list of scalars. The network (:mod:`shardlab.solvers.rl.policy`)
embeds these vectors, so its parameter count is the same for every problem.
"""

from __future__ import annotations

import math

import numpy as np

from shardlab.problems.operators import HEAD_OPS
from shardlab.problems.problem import Problem
from shardlab.problems.space import DEGREE_AXES, MAX_SHIFT
from shardlab.solvers.rl.decisions import Decisions

STEP_KINDS = (*DEGREE_AXES, "option", "cut")
# Operator and option names of shardlab.problems.operators (layer operators, then the
# model's ends); a name outside the vocabulary maps to the last, "other" slot.
OP_VOCAB: tuple[str, ...] = (
    "residual",
    "attn_norm",
    "qkv_proj",
    "attention",
    "o_proj",
    "ffn_norm",
    "ffn_up",
    "ffn_down",
    "router",
    "experts",
    "shared_up",
    "shared_down",
    *(op.name for op in HEAD_OPS),
    "other",
)
OPTION_VOCAB: tuple[str, ...] = (
    "replicated",
    "seq_sharded",
    "column",
    "row",
    "column_full",
    "row_full",
    "head_sharded",
    "vocab_sharded",
    "alltoall",
    "allgather",
    "other",
)
GROUP_KINDS = ("dense", "moe", "head")
PHASES = ("prefill", "decode", "request")
OBJECTIVES = ("throughput", "throughput_per_gpu", "latency", "pareto")

STEP_DIM = len(STEP_KINDS) + len(OP_VOCAB) + len(GROUP_KINDS) + 3
CAND_DIM = 3 + 4 + len(OPTION_VOCAB) + 2
ELITE_DIM = 3  # dynamic candidate features from the elite history
CONTEXT_DIM = 12 + len(PHASES) + len(OBJECTIVES)


def _slot(vocab: tuple[str, ...], name: str) -> int:
    """``name``'s index in ``vocab``; a name outside it takes the last, "other"."""
    return vocab.index(name) if name in vocab else len(vocab) - 1


def _one_hot(vocab: tuple[str, ...], name: str) -> list[float]:
    i = _slot(vocab, name)
    return [1.0 if j == i else 0.0 for j in range(len(vocab))]


def _log2_share(value: int, total: int) -> float:
    return math.log2(value) / math.log2(total) if total > 1 else 0.0


def step_features(dec: Decisions) -> np.ndarray:
    """``(n_steps, STEP_DIM)``: decision kind, operator, layer group kind, where it is."""
    space = dec.space
    groups = {g.key: g for g in space.groups}
    n_layers = space.model.num_layers
    rows = []
    for step in dec.steps:
        kind = [1.0 if step.kind == k else 0.0 for k in STEP_KINDS]
        op = [0.0] * len(OP_VOCAB)
        group = [0.0] * len(GROUP_KINDS)
        position = share = cut_pos = 0.0
        if step.kind == "option":
            var = space.variables[step.var]
            op = _one_hot(OP_VOCAB, var.op)
            g = groups[var.group]
            group = _one_hot(GROUP_KINDS, g.kind)
            if g.layers:  # where the group sits in the model, and how much of it it is
                position = (float(np.mean(g.layers)) + 0.5) / n_layers
                share = len(g.layers) / n_layers
        elif step.kind == "cut":
            cut_pos = (step.var - space.first_cut + 1) / space.max_pp
        rows.append(kind + op + group + [position, share, cut_pos])
    return np.array(rows, dtype=np.float32)


def candidate_features(dec: Decisions) -> np.ndarray:
    """``(n_steps, width, CAND_DIM)``: what each candidate value means (zeros: no slot)."""
    space = dec.space
    n = space.cluster.num_gpus
    node = space.cluster.domain_size
    out = np.zeros((dec.n_steps, dec.width, CAND_DIM), dtype=np.float32)
    ops = {v: op for v, _, op in space.option_slots()}
    for t, step in enumerate(dec.steps):
        for c, value in enumerate(step.values):
            if step.kind in DEGREE_AXES:
                row = [1.0, 0.0, 0.0]
                row += [_log2_share(value, n), float(value == 1), float(value <= node)]
                row += [math.log2(value) / 10.0]
                row += [0.0] * len(OPTION_VOCAB) + [0.0, 0.0]
            elif step.kind == "features":  # an engine's feature set: what options show
                row = [0.0] * 7 + _one_hot(OPTION_VOCAB, "other") + [0.0, 0.0]
            elif step.kind == "option":
                op = ops[step.var]
                row = [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
                row += [*_one_hot(OPTION_VOCAB, op.options[value].name), 0.0, 0.0]
            else:
                row = [0.0, 0.0, 1.0] + [0.0] * 4 + [0.0] * len(OPTION_VOCAB)
                row += [(value - MAX_SHIFT) / MAX_SHIFT, float(value == MAX_SHIFT)]
            out[t, c] = row
    return out


def step_ops(dec: Decisions) -> np.ndarray:
    """``(n_steps,)`` each decision's operator as an index into :data:`OP_VOCAB` (degree
    axes and cuts: the last, "other")."""
    out = np.full(dec.n_steps, len(OP_VOCAB) - 1, dtype=np.int64)
    for t, step in enumerate(dec.steps):
        if step.kind == "option":
            out[t] = _slot(OP_VOCAB, dec.space.variables[step.var].op)
    return out


def context_features(problem: Problem) -> np.ndarray:
    """``(CONTEXT_DIM,)`` scalars describing the model, the cluster and the workload."""
    m, c, w = problem.model, problem.cluster, problem.workload
    params = m.num_params()
    row = [
        math.log10(params.total) / 12.0,
        math.log10(params.active_compute) / 12.0,  # as the shipped policy was trained
        math.log2(c.num_gpus) / 8.0,
        math.log2(c.domain_size) / 4.0,
        float(m.is_moe),
        math.log2(m.num_layers) / 7.0,
        c.accelerator.hbm_gb / 200.0,
        math.log2(w.batch) / 12.0,
        math.log2(w.input_len) / 17.0,
        math.log2(w.output_len) / 17.0,
        float(w.ttft_ms is not None or w.tpot_ms is not None),
        float(problem.tie == "layer"),
    ]
    row += _one_hot(PHASES, w.phase) + _one_hot(OBJECTIVES, w.objective)
    return np.array(row, dtype=np.float32)


def elite_features(
    dec: Decisions, elite_actions: np.ndarray, weights: np.ndarray, actions: np.ndarray, t: int
) -> np.ndarray:
    """``(n, width, ELITE_DIM)`` how the elite history chose step ``t``, per sample.

    For each candidate: the reward-weighted share of the elite plans that agree with the
    sample's earlier decisions of the same block (degree axes: the axes chosen so far;
    options and cuts: the degree tuple) and chose it; the same share over every elite
    plan; whether the best elite plan chose it. ``actions`` are the samples' actions
    so far (``(n, >= t)``); an empty history gives zeros.
    """
    n = len(actions)
    out = np.zeros((n, dec.width, ELITE_DIM), dtype=np.float32)
    if len(elite_actions) == 0:
        return out
    w = weights / weights.sum()
    col = elite_actions[:, t]
    onehot = np.zeros((len(col), dec.width), dtype=np.float32)
    onehot[np.arange(len(col)), col] = 1.0
    out[:, :, 1] = (w @ onehot)[None, :]
    out[np.arange(n), col[0], 2] = 1.0
    if t < dec.n_degree_steps:
        agree = (elite_actions[None, :, :t] == actions[:, None, :t]).all(axis=2)
    else:
        k = dec.n_degree_steps
        agree = (elite_actions[None, :, :k] == actions[:, None, :k]).all(axis=2)
    aw = agree * w[None, :]
    total = aw.sum(axis=1, keepdims=True)
    out[:, :, 0] = np.where(total > 0, (aw @ onehot) / np.maximum(total, 1e-12), 0.0)
    return out


def decision_classes(dec: Decisions) -> np.ndarray:
    """``(n_steps,)`` the class of each option decision, -1 for degree axes and cuts: one
    class per (layer group kind, operator), numbered in order of first appearance, so
    every layer's ``experts`` decision of a MoE model is one class."""
    space = dec.space
    groups = {g.key: g for g in space.groups}
    ids: dict[tuple[str, str], int] = {}
    out = np.full(dec.n_steps, -1, dtype=np.int64)
    for t, step in enumerate(dec.steps):
        if step.kind == "option":
            var = space.variables[step.var]
            out[t] = ids.setdefault((groups[var.group].kind, var.op), len(ids))
    return out


def class_edges(dec: Decisions) -> list[tuple[int, int]]:
    """Pairs of classes (:func:`decision_classes`) that are consecutive operators of one
    layer kind (``qkv_proj`` and ``attention``, ``shared_up`` and ``shared_down``): the
    decisions a resharding edge of the cost model couples."""
    space = dec.space
    groups = {g.key: g for g in space.groups}
    classes = decision_classes(dec)
    kind: dict[int, str] = {}
    for t in np.flatnonzero(classes >= 0):
        kind.setdefault(int(classes[t]), groups[space.variables[dec.steps[t].var].group].kind)
    return [(c, c + 1) for c in range(len(kind) - 1) if kind[c] == kind[c + 1]]
