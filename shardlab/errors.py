"""The one exception type for mistakes a user can make.

Every message names the input that is wrong and how to fix it; the CLI prints the
message on one line and exits with status 2.
"""

from __future__ import annotations


class ShardlabError(Exception):
    """A problem with the user's input (model, cluster, workload, plan, options)."""
