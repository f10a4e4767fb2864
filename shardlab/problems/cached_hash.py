"""A hash computed once, for frozen dataclasses that key the cost model's caches."""

from __future__ import annotations

import dataclasses
from functools import cached_property
from typing import Any


class CachedHash:
    """Mixed into a frozen dataclass (which then keeps this ``__hash__``): its hash is
    asked for on every cache lookup and recursing through its fields costs more than
    the lookup. Not pickled: string hashes differ between processes."""

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        assert dataclasses.is_dataclass(self)
        # the fields the dataclass's own hash would take (those its equality compares)
        fields = [f for f in dataclasses.fields(self) if (f.compare if f.hash is None else f.hash)]
        return hash(tuple(getattr(self, f.name) for f in fields))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state
