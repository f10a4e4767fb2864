"""The two numeric modes the serving regimes are written in, once for both.

- **exact**: Python integers and :class:`~fractions.Fraction` coefficients, times in
  integer nanoseconds: a CP-SAT subproblem fixes its degrees and requests per rank, so
  its forms are numbers, scaled to integers without rounding;
- **arrays**: numpy arrays with one entry per plan (or per plan and concurrency), times
  in seconds (the evaluators) or in nanoseconds (exact search's bounds).

:mod:`shardlab.costmodel.regimes` takes an :class:`Arith` and calls only its
operations where the modes differ; everything else (``+``, ``*``, ``//``) is the same
Python on both. The array mode applies numpy's own ufuncs to whole arrays: no Python
runs per plan.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from fractions import Fraction
from typing import Generic, TypeAlias, TypeVar

import numpy as np

Exact: TypeAlias = int | Fraction
"""A number of the exact mode."""

Vector: TypeAlias = np.ndarray | float
"""A number of the array mode: an array of plans, or a scalar numpy broadcasts."""

Number = TypeVar("Number", Exact, Vector)
"""A number of one mode or the other, the same throughout one call."""


class Arith(ABC, Generic[Number]):
    """The operations whose spelling differs between the modes."""

    def __init__(self, per_ns: float) -> None:
        self.per_ns = per_ns  # the mode's unit of time per nanosecond

    @abstractmethod
    def ratio(self, a: Number | int, b: Number | int) -> Number:
        """``a / b`` without rounding where the mode allows it."""

    @abstractmethod
    def number(self, x: Fraction) -> Number:
        """A constant of the regimes in the mode's numbers."""

    @abstractmethod
    def minimum(self, a: Number | int, b: Number | int) -> Number: ...

    @abstractmethod
    def maximum(self, a: Number | int, b: Number | int) -> Number: ...

    @abstractmethod
    def clip(self, x: Number, lo: Number | int, hi: Number | int) -> Number:
        """``x`` within ``[lo, hi]`` (``lo <= hi``)."""

    def zeros(self, like: Number) -> Number:
        """0 in the shape of ``like``."""
        return 0 * like


class _Exact(Arith[Exact]):
    def ratio(self, a: Exact, b: Exact) -> Exact:
        return Fraction(a, b)

    def number(self, x: Fraction) -> Exact:
        return x

    def minimum(self, a: Exact, b: Exact) -> Exact:
        return min(a, b)

    def maximum(self, a: Exact, b: Exact) -> Exact:
        return max(a, b)

    def clip(self, x: Exact, lo: Exact, hi: Exact) -> Exact:
        return max(lo, min(x, hi))


class _Arrays(Arith[Vector]):
    def ratio(self, a: Vector, b: Vector) -> Vector:
        return np.asarray(a, dtype=float) / b

    def number(self, x: Fraction) -> Vector:
        return float(x)

    def minimum(self, a: Vector, b: Vector) -> Vector:
        return np.minimum(a, b)

    def maximum(self, a: Vector, b: Vector) -> Vector:
        return np.maximum(a, b)

    def clip(self, x: Vector, lo: Vector, hi: Vector) -> Vector:
        return np.clip(x, lo, hi)


EXACT: Arith[Exact] = _Exact(per_ns=1)
"""Integers and fractions, times in ns: CP-SAT's subproblems."""

ARRAYS: Arith[Vector] = _Arrays(per_ns=1e-9)
"""Arrays of plans, times in seconds: the evaluators and calibration."""

ARRAYS_NS: Arith[Vector] = _Arrays(per_ns=1)
"""Arrays of plans, times in ns: exact search's bounds."""
