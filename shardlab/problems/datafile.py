"""Tables shipped as package data (``shardlab/problems/data/*.yaml``), read into frozen
dataclasses and validated on load: an entry with an unknown field, a missing one or a
value of the wrong type is refused in one line naming the file, the entry and the field.

A table file maps each entry's name to its fields. Where the dataclass has a ``name``
field the entry's name fills it; a field typed as a tuple of pairs is written as a
mapping (its items, in order).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping
from dataclasses import MISSING, fields
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from shardlab.errors import ShardlabError

T = TypeVar("T")

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Mismatch(Exception):
    """A value that does not fit its field's type."""


@functools.cache
def load_records(source: str | Path, cls: type[T]) -> dict[str, T]:
    """The entries of a table: ``source`` is a file name under the package's data
    folder, or a path. Cached: each table is read once."""
    if isinstance(source, Path):
        where, text = str(source), source.read_text()
    else:
        where = f"shardlab/problems/data/{source}"
        text = (resources.files("shardlab.problems") / "data" / source).read_text()
    try:
        raw = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ShardlabError(f"{where}: not valid YAML ({str(exc)[:120]})") from None
    if not isinstance(raw, Mapping):
        raise ShardlabError(f"{where}: a table must map entry names to their fields")
    for name in raw:
        if not isinstance(name, str):  # YAML reads a bare yes, no or 12 as no string
            raise ShardlabError(
                f"{where}: entry name {name!r} must be a string", fix="quote the name"
            )
    return {name: _record(cls, name, entry, where) for name, entry in raw.items()}


def _record(cls: type[T], name: str, entry: Any, where: str) -> T:
    if not isinstance(entry, Mapping):
        raise ShardlabError(f"{where}: entry {name!r} must map field names to values", field=name)
    hints = get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    for key in entry:
        if key not in known or key == "name":
            raise ShardlabError(
                f"{where}: entry {name!r}: unknown field {key!r}",
                field=f"{name}.{key}",
                fix=f"use one of {', '.join(k for k in known if k != 'name')}",
            )
    values: dict[str, Any] = {"name": name} if "name" in known else {}
    for key, f in known.items():
        if key in values:
            continue
        if key not in entry:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ShardlabError(
                    f"{where}: entry {name!r}: missing field {key!r}", field=f"{name}.{key}"
                )
            continue
        try:
            values[key] = _fit(entry[key], hints[key])
        except _Mismatch:
            raise ShardlabError(
                f"{where}: entry {name!r}: field {key!r} must be {_describe(hints[key])}, "
                f"got {entry[key]!r}",
                field=f"{name}.{key}",
            ) from None
    try:
        return cls(**values)
    except ShardlabError as exc:  # the dataclass's own checks
        raise ShardlabError(
            f"{where}: entry {name!r}: {exc.message}", field=exc.field or name, fix=exc.fix
        ) from None


def _fit(value: Any, hint: Any) -> Any:
    """``value`` as a field of type ``hint`` holds it; raises _Mismatch if it cannot."""
    origin = get_origin(hint)
    if hint is Any:
        return value
    if origin is Literal:
        if not isinstance(value, bool) and value in get_args(hint):
            return value
        raise _Mismatch
    if origin in (Union, types.UnionType):
        for arg in get_args(hint):
            try:
                return _fit(value, arg)
            except _Mismatch:
                continue
        raise _Mismatch
    if hint is type(None):
        if value is None:
            return None
        raise _Mismatch
    if isinstance(value, bool) and hint is not bool:
        raise _Mismatch
    if hint is float and isinstance(value, int | float):
        return float(value)
    if hint in (bool, int, str):
        if isinstance(value, hint):
            return value
        raise _Mismatch
    if origin in (Mapping, dict):
        key_type, value_type = get_args(hint)
        if not isinstance(value, Mapping):
            raise _Mismatch
        return {_fit(k, key_type): _fit(v, value_type) for k, v in value.items()}
    if origin is tuple:
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            if isinstance(value, Mapping) and get_origin(args[0]) is tuple:
                value = list(value.items())
            if not isinstance(value, list):
                raise _Mismatch
            return tuple(_fit(v, args[0]) for v in value)
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise _Mismatch
        return tuple(_fit(v, a) for v, a in zip(value, args, strict=True))
    raise _Mismatch


def _describe(hint: Any) -> str:
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(hint))
    if hint is type(None):
        return "null"
    if origin in (Mapping, dict):
        return "a mapping"
    if origin is tuple:
        return "a list"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        hint, str(hint)
    )
