"""The one exception type for mistakes a user can make.

Every error names the input that is wrong and how to fix it, in the library's own
words: ``field`` is the argument or file field at fault (``"cluster"``,
``"workload.slo_ttft_ms"``, ``"storage"``), never a command-line flag. Only the CLI
knows which flag sets which field; it adds that advice, prints one line and exits 2.
"""

from __future__ import annotations


class ShardlabError(Exception):
    """A problem with the user's input (model, cluster, workload, plan, options)."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None):
        super().__init__(message if fix is None else f"{message}; {fix}")
        self.message = message
        self.field = field
        self.fix = fix


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
