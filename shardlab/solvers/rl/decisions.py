"""The decision sequence a plan is built from, its masks, and the codes it maps to.

One implementation serves the policy (:mod:`shardlab.solvers.rl.policy`) and the
gymnasium environment (:mod:`shardlab.envs.sharding`). A plan is decided in this order:

1. the degrees, one axis at a time: ``pp``, ``tp``, ``dp_attn`` and, for MoE models,
   ``ep`` (``replicas`` and ``etp`` follow from the GPU count and ``ep * etp ==
   tp * dp_attn``), and in an engine space the set of engine ``features``. Each
   axis's candidates are the distinct values that axis takes in
   :attr:`SearchSpace.degree_tuples`; a value is valid when some tuple agrees with it
   and with the axes already chosen, so the four choices always name a valid tuple;
2. one decision per option variable of the space, in the space's order (candidate ``c``
   is option ``c`` of the operator), valid as :meth:`SearchSpace.mask` says for the
   chosen tuple;
3. one decision per cut variable (candidate ``c`` is the encoded value ``c``, a boundary
   move of ``c - MAX_SHIFT`` layers), valid as the mask says (cuts past the chosen
   ``pp`` have the single candidate ``MAX_SHIFT``).

Every step has ``width`` candidate slots; slots past a step's own candidates are never
valid. Actions are slot indices; :meth:`Decisions.to_codes` turns a full action
sequence into the space's encoding and :meth:`Decisions.to_actions` goes back.
numpy only: the environment must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from shardlab.problems.space import SearchSpace

StepKind = Literal["pp", "tp", "dp_attn", "ep", "features", "option", "cut"]


@dataclass(frozen=True, kw_only=True)
class Step:
    kind: StepKind
    name: str  # "pp", ..., "dense.qkv_proj", "cut3"
    var: int  # variable of the encoding this step fills (-1 for degree axes)
    values: tuple[int, ...]  # degree axes: the candidate values; others: 0..cardinality-1


class Decisions:
    """The ordered decisions of one :class:`SearchSpace` and their validity masks."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        axes = space.axes
        # (num_tuples, len(axes)) value of each axis in each valid degree tuple
        self.tuple_values = np.array(
            [[space.axis_value(i, a) for a in axes] for i in range(space.num_degree_tuples)],
            dtype=np.int64,
        )
        steps = [
            Step(kind=a, name=a, var=-1, values=tuple(int(v) for v in np.unique(col)))  # type: ignore[arg-type]
            for a, col in zip(axes, self.tuple_values.T, strict=True)
        ]
        for v, var in enumerate(space.variables):
            if var.role == "degrees":
                continue
            kind: StepKind = "option" if var.role == "option" else "cut"
            steps.append(
                Step(kind=kind, name=var.name, var=v, values=tuple(range(var.cardinality)))
            )
        self.steps: tuple[Step, ...] = tuple(steps)
        self.n_degree_steps = len(axes)
        self.width = max(len(s.values) for s in steps)
        # (n_steps, width) index of each candidate value, for mapping tuples to actions
        self._value_slot = [{v: i for i, v in enumerate(s.values)} for s in steps]

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    # -- masks -----------------------------------------------------------------------

    def degree_mask(self, k: int, prefix: np.ndarray) -> np.ndarray:
        """``(n, width)`` valid slots of degree axis ``k`` after ``prefix`` (``(n, k)`` slots)."""
        prefix = np.atleast_2d(np.asarray(prefix, dtype=np.int64))
        n = len(prefix)
        tv = self.tuple_values
        agree = np.ones((n, len(tv)), dtype=bool)
        for j in range(k):
            chosen = np.asarray(self.steps[j].values)[prefix[:, j]]
            agree &= tv[None, :, j] == chosen[:, None]
        out = np.zeros((n, self.width), dtype=bool)
        for slot, value in enumerate(self.steps[k].values):
            out[:, slot] = (agree & (tv[None, :, k] == value)).any(axis=1)
        return out

    def degree_values(self, degree_actions: np.ndarray) -> np.ndarray:
        """``(n, n_degree_steps)`` the values named by rows of degree-axis slots; a slot
        past an axis's values (an edit policy's "none", no parent yet) reads 0."""
        degree_actions = np.atleast_2d(np.asarray(degree_actions, dtype=np.int64))
        return np.stack(
            [
                np.append(self.steps[k].values, 0)[
                    np.minimum(degree_actions[:, k], len(self.steps[k].values))
                ]
                for k in range(self.n_degree_steps)
            ],
            axis=1,
        )

    def tuple_index(self, values: np.ndarray) -> np.ndarray:
        """Index into ``space.degree_tuples`` of each row of degree-axis values, -1 where
        the row is no valid tuple."""
        match = (self.tuple_values[None, :, :] == np.atleast_2d(values)[:, None, :]).all(axis=2)
        return np.where(match.any(axis=1), match.argmax(axis=1), -1)

    def degree_index(self, degree_actions: np.ndarray) -> np.ndarray:
        """Index into ``space.degree_tuples`` of each row of degree-axis slots."""
        index = self.tuple_index(self.degree_values(degree_actions))
        if (index < 0).any():
            raise ValueError("degree actions do not name a valid degree tuple")
        return index

    def rest_masks(self, degree_index: np.ndarray) -> np.ndarray:
        """``(n, n_steps - n_degree_steps, width)`` valid slots of the option and cut steps."""
        table = self.space.mask_table()[np.asarray(degree_index, dtype=np.int64)][
            :, 1:, : self.width
        ]
        out = np.zeros((len(table), self.n_steps - self.n_degree_steps, self.width), dtype=bool)
        out[:, :, : table.shape[2]] = table
        return out

    def step_mask(self, actions: np.ndarray, t: int) -> np.ndarray:
        """``(width,)`` valid slots of step ``t`` of one episode given its first ``t`` actions."""
        actions = np.asarray(actions, dtype=np.int64)
        if t < self.n_degree_steps:
            return self.degree_mask(t, actions[None, :t])[0]
        d = self.degree_index(actions[None, : self.n_degree_steps])
        return self.rest_masks(d)[0, t - self.n_degree_steps]

    # -- actions <-> codes -----------------------------------------------------------

    def to_codes(self, actions: np.ndarray) -> np.ndarray:
        """``(n, n_vars)`` encodings of ``(n, n_steps)`` complete action sequences."""
        actions = np.atleast_2d(np.asarray(actions, dtype=np.int64))
        k = self.n_degree_steps
        codes = np.empty((len(actions), self.space.n_vars), dtype=np.int64)
        codes[:, 0] = self.degree_index(actions[:, :k])
        codes[:, 1:] = actions[:, k:]  # option and cut slots are the encoded values
        return codes

    def to_actions(self, codes: np.ndarray) -> np.ndarray:
        """``(n, n_steps)`` action sequences of ``(n, n_vars)`` encodings."""
        codes = np.atleast_2d(np.asarray(codes, dtype=np.int64))
        k = self.n_degree_steps
        actions = np.empty((len(codes), self.n_steps), dtype=np.int64)
        tv = self.tuple_values[codes[:, 0]]
        for j in range(k):
            actions[:, j] = [self._value_slot[j][int(v)] for v in tv[:, j]]
        actions[:, k:] = codes[:, 1:]
        return actions
