"""Markdown tables, the one way every report of shardlab writes them (results/, docs)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

_RULES = {"l": "---", "r": "---:"}


def markdown_table(head: Sequence[str], align: str, rows: Iterable[Sequence[object]]) -> list[str]:
    """A GitHub-flavoured markdown table as lines: the header, the rule, one line per row.

    ``align`` has one letter per column, ``l`` (left) or ``r`` (right: numbers). Cells
    are written as ``str`` gives them, unescaped: a ``|`` inside one must come as ``\\|``.
    """
    if len(align) != len(head) or set(align) - set(_RULES):
        raise ValueError(f"align {align!r}: one of 'l' or 'r' per column of {list(head)}")
    lines = [_line(head, len(head)), "|" + "".join(_RULES[a] + "|" for a in align)]
    lines += [_line([str(c) for c in row], len(head)) for row in rows]
    return lines


def _line(cells: Sequence[str], width: int) -> str:
    if len(cells) != width:
        raise ValueError(f"a row of {len(cells)} cells in a table of {width} columns: {cells}")
    return "| " + " | ".join(cells) + " |"
