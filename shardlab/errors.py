"""The one exception type for mistakes a user can make.

Every message names the input that is wrong and how to fix it; the CLI prints the
message on one line and exits with status 2.
"""

from __future__ import annotations


class ShardlabError(Exception):
    """A problem with the user's input (model, cluster, workload, plan, options)."""


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was raised while handling, a Ctrl-C: an extension module
    whose initialization a Ctrl-C stops (OR-Tools, numpy) raises ImportError instead."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False
