"""Numeric formats of weights and KV cache, and what each costs in bytes."""

from __future__ import annotations

from typing import Literal, get_args

from shardlab.errors import ShardlabError

WeightDtype = Literal["bf16", "fp8", "fp4"]
KVDtype = Literal["bf16", "fp8"]

WEIGHT_DTYPES: tuple[str, ...] = get_args(WeightDtype)
KV_DTYPES: tuple[str, ...] = get_args(KVDtype)

# Bytes per stored value. fp4 is MXFP4/NVFP4: 4-bit values plus one 8-bit scale per
# block of 32 (MXFP4, OCP Microscaling spec v1.0), i.e. 4.25 bits. fp8 block scales
# (one fp32 per 128x128 block in DeepSeek-V3's checkpoint) add < 0.1% and are ignored.
BYTES_PER_VALUE: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "fp4": 4.25 / 8.0}


def check_weight_dtype(value: str, *, where: str) -> WeightDtype:
    if value not in WEIGHT_DTYPES:
        raise ShardlabError(
            f"{where}: unknown weight dtype {value!r}; use one of {', '.join(WEIGHT_DTYPES)}"
        )
    return value  # type: ignore[return-value]


def check_kv_dtype(value: str, *, where: str) -> KVDtype:
    if value not in KV_DTYPES:
        raise ShardlabError(
            f"{where}: unknown KV-cache dtype {value!r}; use one of {', '.join(KV_DTYPES)}"
        )
    return value  # type: ignore[return-value]
