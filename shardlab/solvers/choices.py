"""What an option takes, read off its declaration: the values of a ``Literal`` type,
the docstring under a dataclass field, a value written as text read as the field's
type. Nothing heavy is imported, so the CLI lists the options of every method without
loading OR-Tools, Optuna or PyTorch."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from shardlab.errors import ShardlabError

# the types a value written as text (a flag, METHOD:KEY=VALUE) can be read as
TEXT_TYPES: tuple[type, ...] = (bool, int, float, str)


def listed(values: tuple[str, ...], default: str | None = None) -> str:
    """``a, b or c``, the default marked."""
    names = [f"{v} (default)" if v == default else v for v in values]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _members(hint: Any) -> tuple[Any, ...]:
    """The members of a union (``X | None``), or the type itself."""
    return get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)


def choices(hint: Any) -> tuple[str, ...]:
    """The values a ``Literal`` in ``hint`` allows (``Literal["a", "b"] | None``:
    ``("a", "b")``); empty when it has none."""
    return tuple(v for m in _members(hint) if get_origin(m) is Literal for v in get_args(m))


def text_type(hint: Any) -> type | None:
    """The type a value of ``hint`` is read as from text (a ``Literal``'s values are
    ``str``); None when no member of ``hint`` can be written as text."""
    for member in _members(hint):
        if get_origin(member) is Literal:
            return str
        if member in TEXT_TYPES:
            return member
    return None


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The fields' types of a dataclass, resolved."""
    return get_type_hints(cls)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass (and of its bases), its
    lines joined: Python keeps none of them, so they are read from the source."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        for node, after in zip(body.body, body.body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def check_choices(options: Any, what: str) -> None:
    """Refuse a field of the dataclass ``options`` whose value its ``Literal`` does not
    allow, naming the field (``what``: whose options they are, for the message)."""
    for f in dataclasses.fields(options):
        allowed = choices(hints(type(options))[f.name])
        value = getattr(options, f.name)
        if allowed and value is not None and value not in allowed:
            raise ShardlabError(
                f"{what}: {f.name} {value!r} is unknown",
                field=f.name,
                fix=f"use {listed(allowed)}",
            )


def read_text(hint: Any, name: str, value: str, what: str) -> Any:
    """``value`` (text) read as the type ``hint`` of the field ``name``."""
    kind = text_type(hint)
    try:
        if kind is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(value)
            return value.lower() in ("true", "1")
        if kind in (int, float):
            return kind(value)
    except ValueError:
        raise ShardlabError(
            f"{what}: {name}={value!r} is not a {kind.__name__}", field=name
        ) from None
    return value
