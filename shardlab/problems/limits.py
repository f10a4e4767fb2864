"""The largest sizes shardlab accepts: anything beyond them cannot be meant, and is
refused before anything is allocated for it (each refusal states its limit).

They are far above every real deployment: the deepest released LLMs have under 200
layers, the largest serving deployments thousands of GPUs, an engine a few thousand
requests in flight per GPU.
"""

from __future__ import annotations

import math

from shardlab.errors import ShardlabError

MAX_LAYERS = 1024  # num_hidden_layers of a config.json
MAX_CONFIG_INT = 2**31 - 1  # any other integer of a config.json
MAX_GPUS = 131_072  # a cluster's GPUs
MAX_GPUS_PER_NODE = 1024  # GPUs in one host or one NVLink domain
MAX_BATCH = 1 << 20  # requests in one batch, or in flight
MAX_CONTEXT = 1 << 24  # prompt + output tokens of a model whose config states no maximum


def check_count(
    value: object, limit: int, *, what: str, minimum: int = 1, field: str | None = None
) -> int:
    """``value`` as an integer in ``[minimum, limit]``; refused (naming ``what``, and
    ``field`` for the caller that maps it to its input) if not."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ShardlabError(f"{what} must be an integer, got {value!r}", field=field)
    if value < minimum:
        raise ShardlabError(f"{what} must be at least {minimum:,}, got {value:,}", field=field)
    if value > limit:
        raise ShardlabError(
            f"{what} is {value:,}: more than shardlab takes ({limit:,})", field=field
        )
    return value


def check_finite(
    value: object, *, what: str, positive: bool = False, field: str | None = None
) -> float:
    """``value`` as a finite number (positive if asked); NaN and infinity are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ShardlabError(f"{what} must be a number, got {value!r}", field=field)
    if not math.isfinite(value):
        raise ShardlabError(f"{what} must be a finite number, got {value!r}", field=field)
    if value < 0 or (positive and value == 0):
        sign = "positive" if positive else "non-negative"
        raise ShardlabError(f"{what} must be a {sign} number, got {value!r}", field=field)
    return float(value)
