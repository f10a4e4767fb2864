"""How a plan of the search space is asked of an Optuna trial: two encodings.

Optuna requires a parameter name to keep one distribution for the whole study, while
the options valid for an operator depend on the degree tuple. Both encodings respect
that rule (checked when their names are built) and both round-trip every valid plan
(:meth:`params_of` then :meth:`suggest` gives the row back).

``shared`` (the default): every parameter is present in every trial
    - the degrees as one integer per parallel axis that varies (``pp``, ``tp``,
      ``dp_attn``, ``ep``): the index of the axis's value among the values valid tuples
      take (its log2 on a power-of-two cluster), so TPE, GP and CMA-ES can interpolate
      between 2-way and 8-way instead of learning 300 unrelated labels; a combination
      that is no valid tuple is mapped to the nearest valid one (L1 distance in log2,
      ties to the first in the space's order);
    - every operator option as a categorical over all the operator's options, whatever
      the degrees; an option invalid under the chosen degrees is repaired to the
      operator's canonical one (``SearchSpace.repair``: the option that would shard an
      axis of size 1 *is* the canonical plan);
    - every pipeline cut as an integer shift, clipped to the shifts valid for the
      chosen ``pp``.
    What is learned about ``ffn_up=column`` under one degree tuple helps every other,
    and since all parameters occur together, a multivariate sampler fits one joint
    model (one group), which is also what keeps TPE's cost per trial down.
    Several parameter vectors map to one plan; the evaluator's cache counts such
    repeats once, and the solver's neighbour queue turns them into unseen plans.

``class``: one name per option class (the encoding of earlier versions)
    The degree tuple is one categorical. Degree tuples are grouped by the validity
    mask of their option variables, numbered ``c0, c1, ...`` in degree-tuple order, and
    a multi-valued option variable is suggested as ``c{k}.{group}.{op}`` with the
    class's valid option names as choices; cut shifts are named ``pp{pp}.cut{j}`` over
    the valid range of that ``pp``. Every trial is a valid plan, no repair, but
    parameters occur only under some degree tuples, so TPE splits them into groups,
    GP and CMA-ES model only the degree label, and statistics are pooled only within
    a class.

Variables with a single valid value everywhere are fixed, not suggested.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import BaseTrial

from shardlab.errors import ShardlabError
from shardlab.problems.space import MAX_SHIFT, SearchSpace
from shardlab.solvers.choices import choices, listed
from shardlab.solvers.options import Encoding


class Layout(Protocol):
    """What the solver needs of an encoding."""

    encoding: str
    distributions: dict[str, BaseDistribution]

    def suggest(self, trial: BaseTrial) -> np.ndarray: ...

    def params_of(self, row: np.ndarray) -> dict[str, Any]: ...


def layout_for(space: SearchSpace, encoding: str) -> Layout:
    if encoding == "shared":
        return SharedLayout(space)
    if encoding == "class":
        return ClassLayout(space)
    raise ShardlabError(
        f"optuna encoding {encoding!r} is unknown",
        field="encoding",
        fix=f"use {listed(choices(Encoding))}",
    )


def _register(distributions: dict[str, BaseDistribution], name: str, dist: BaseDistribution):
    if distributions.setdefault(name, dist) != dist:  # Optuna's rule, checked
        raise ShardlabError(f"parameter {name} would change its distribution")


# -- shared ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Option:
    var: int
    name: str
    labels: tuple[str, ...]


class SharedLayout:
    """Degrees per axis, options per operator, cuts as shifts: see the module docstring."""

    encoding = "shared"

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        n = space.num_degree_tuples
        # replicas and etp follow from the axes; an engine space adds its feature sets
        at = [{a: space.axis_value(i, a) for a in space.axes} for i in range(n)]
        values = {a: sorted({v[a] for v in at}) for a in space.axes}
        self.axes = tuple(a for a in space.axes if len(values[a]) > 1)
        self.axis_values = {a: tuple(values[a]) for a in self.axes}
        self._log2 = np.array(
            [[math.log2(v[a] + (a == "features")) for a in self.axes] for v in at], dtype=float
        ).reshape(n, len(self.axes))
        self._index_of = {
            tuple(self.axis_values[a].index(v[a]) for a in self.axes): i for i, v in enumerate(at)
        }
        self._nearest: dict[tuple[int, ...], int] = {}
        distributions: dict[str, BaseDistribution] = {}
        for a in self.axes:
            _register(distributions, a, IntDistribution(0, len(self.axis_values[a]) - 1))
        masks = space.mask_table()
        ops = {v: op for v, _, op in space.option_slots()}
        self.options: list[_Option] = []
        self.cuts: list[tuple[int, str, int]] = []  # (var, name, largest shift)
        for v in range(1, space.n_vars):
            var = space.variables[v]
            ever = masks[:, v].any(axis=0)
            if ever.sum() < 2:
                continue
            if var.role == "option":
                labels = tuple(o.name for o in ops[v].options)
                self.options.append(_Option(var=v, name=var.name, labels=labels))
                _register(distributions, var.name, CategoricalDistribution(labels))
            else:
                valid = np.flatnonzero(ever)
                shift = int(max(MAX_SHIFT - valid[0], valid[-1] - MAX_SHIFT))
                self.cuts.append((v, var.name, shift))
                _register(distributions, var.name, IntDistribution(-shift, shift))
        self.distributions = distributions

    def degree_index(self, levels: tuple[int, ...]) -> int:
        """The degree tuple at these axis levels, or the nearest valid one."""
        d = self._index_of.get(levels)
        if d is not None:
            return d
        d = self._nearest.get(levels)
        if d is None:
            point = np.array(
                [
                    math.log2(self.axis_values[a][i] + (a == "features"))
                    for a, i in zip(self.axes, levels, strict=True)
                ]
            )
            d = int(np.abs(self._log2 - point).sum(axis=1).argmin())
            self._nearest[levels] = d
        return d

    def suggest(self, trial: BaseTrial) -> np.ndarray:
        levels = tuple(trial.suggest_int(a, 0, len(self.axis_values[a]) - 1) for a in self.axes)
        row = np.full(self.space.n_vars, 0, dtype=np.int64)
        row[0] = self.degree_index(levels)
        row[self.space.first_cut :] = MAX_SHIFT
        for o in self.options:
            row[o.var] = o.labels.index(trial.suggest_categorical(o.name, o.labels))
        for v, name, shift in self.cuts:
            row[v] = MAX_SHIFT + trial.suggest_int(name, -shift, shift)
        return self.space.repair(row)[0]

    def params_of(self, row: np.ndarray) -> dict[str, Any]:
        d = int(row[0])
        out: dict[str, Any] = {
            a: self.axis_values[a].index(self.space.axis_value(d, a)) for a in self.axes
        }
        for o in self.options:
            out[o.name] = o.labels[int(row[o.var])]
        for v, name, _ in self.cuts:
            out[name] = int(row[v]) - MAX_SHIFT
        return out


# -- class -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Param:
    var: int  # variable index in the encoding
    name: str
    choices: tuple[int, ...] = ()  # option parameters: option index of each choice
    labels: tuple[str, ...] = ()  # option parameters: option name of each choice
    low: int = 0  # cut parameters: shift range
    high: int = 0

    @property
    def is_cut(self) -> bool:
        return not self.choices

    def distribution(self) -> BaseDistribution:
        if self.is_cut:
            return IntDistribution(self.low, self.high)
        return CategoricalDistribution(self.labels)


class ClassLayout:
    """The degree tuple as a label, options per class of tuples: see the module docstring."""

    encoding = "class"

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.degree_labels = tuple(space.label(i) for i in range(space.num_degree_tuples))
        if len(set(self.degree_labels)) != len(self.degree_labels):
            raise ShardlabError("degree tuples with identical labels; cannot name them")
        class_of: dict[bytes, str] = {}
        self.class_members: dict[str, list[str]] = {}
        self.templates: list[np.ndarray] = []
        self.params: list[tuple[_Param, ...]] = []
        self.classes: list[str] = []
        distributions: dict[str, BaseDistribution] = {
            "degrees": CategoricalDistribution(self.degree_labels)
        }
        ops = {v: op for v, _, op in space.option_slots()}
        for d, degrees in enumerate(space.degree_tuples):
            mask = space.mask(d)
            key = mask[1 : space.first_cut].tobytes()
            label = class_of.setdefault(key, f"c{len(class_of)}")
            self.classes.append(label)
            self.class_members.setdefault(label, []).append(self.degree_labels[d])
            row = np.zeros(space.n_vars, dtype=np.int64)
            row[0] = d
            params: list[_Param] = []
            for v in range(1, space.n_vars):
                var = space.variables[v]
                valid = np.flatnonzero(mask[v])
                row[v] = valid[0]  # the value when fixed; overwritten when suggested
                if len(valid) < 2:
                    continue
                if var.role == "option":
                    op = ops[v]
                    p = _Param(
                        var=v,
                        name=f"{label}.{var.name}",
                        choices=tuple(int(i) for i in valid),
                        labels=tuple(op.options[int(i)].name for i in valid),
                    )
                else:
                    if valid[-1] - valid[0] + 1 != len(valid):
                        raise ShardlabError(f"{var.name}: valid cut shifts are not contiguous")
                    p = _Param(
                        var=v,
                        name=f"pp{degrees.pp}.{var.name}",
                        low=int(valid[0]) - MAX_SHIFT,
                        high=int(valid[-1]) - MAX_SHIFT,
                    )
                _register(distributions, p.name, p.distribution())
                params.append(p)
            self.templates.append(row)
            self.params.append(tuple(params))
        self.distributions = distributions

    def suggest(self, trial: BaseTrial) -> np.ndarray:
        label = trial.suggest_categorical("degrees", self.degree_labels)
        d = self.degree_labels.index(label)
        row = self.templates[d].copy()
        for p in self.params[d]:
            if p.is_cut:
                row[p.var] = MAX_SHIFT + trial.suggest_int(p.name, p.low, p.high)
            else:
                row[p.var] = p.choices[p.labels.index(trial.suggest_categorical(p.name, p.labels))]
        return row

    def params_of(self, row: np.ndarray) -> dict[str, Any]:
        d = int(row[0])
        out: dict[str, Any] = {"degrees": self.degree_labels[d]}
        for p in self.params[d]:
            if p.is_cut:
                out[p.name] = int(row[p.var]) - MAX_SHIFT
            else:
                out[p.name] = p.labels[p.choices.index(int(row[p.var]))]
        return out
