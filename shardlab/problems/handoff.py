"""The KV-cache handoff of disaggregated serving, as part of a prefill pool's problem:
what each prompt's cache is and where it goes (its time is the cost model's,
:mod:`shardlab.costmodel.handoff`).

What moves, per request: every layer's cache of the prompt (``input_len`` tokens, at
most a sliding window or chunk of them), a DSA indexer's keys, a linear-attention
layer's fixed state, in the KV dtype. It moves in the KV layout the engines give
each pool's degrees (the disaggregation connectors move KV pages per tensor-parallel
rank): layers over ``pp``; KV heads over ``tp`` while there are as many heads as
ranks, each head on ``tp / kv_heads`` ranks beyond; MLA's latent cache whole on every
rank; a linear layer's state by value heads. A request lives on one attention-DP rank
of each pool: its ``pp * tp`` GPUs send and receive.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.problems.cluster import Accelerator
from shardlab.problems.dtypes import BYTES_PER_VALUE
from shardlab.problems.model import Model

FP32_BYTES = 4.0  # a linear layer's recurrent state
ACT_BYTES = 2.0  # its short-convolution window


def layer_handoff_bytes(model: Model, input_len: int, kv_dtype: str) -> np.ndarray:
    """Bytes of one request's prompt cache in each layer, one unsharded copy."""
    kv = BYTES_PER_VALUE[kv_dtype]
    out = np.zeros(model.num_layers)
    for i, a in enumerate(model.attention_layers):
        if a.linear:
            assert model.linear is not None
            recurrent, conv = model.linear.state_values()
            out[i] = recurrent * FP32_BYTES + conv * ACT_BYTES
            continue
        if a.kv_shared:  # it reads another layer's cache
            continue
        tokens = min(input_len, a.span.tokens) if a.span.tokens else input_len
        per_token = model.kv_cache_values_per_token(a) * kv
        if a.indexer and model.dsa is not None:
            per_token += model.dsa.key_bytes()
        out[i] = per_token * tokens
    return out


def layer_copies(model: Model, tp: int) -> np.ndarray:
    """Copies of each layer's cache one rank of ``tp`` GPUs holds (1: split over tp)."""
    out = np.ones(model.num_layers)
    for i, a in enumerate(model.attention_layers):
        if a.linear:
            assert model.linear is not None
            out[i] = max(tp / model.linear.v_heads, 1.0)
        elif model.mla is not None:
            out[i] = float(tp)
        else:
            out[i] = max(tp / max(a.kv_heads, 1), 1.0)
    return out


@dataclass(frozen=True, kw_only=True)
class Handoff:
    """Where a prefill pool sends each prompt's cache: a decode rank's layout and the
    link between the pools. The prefill pool's TTFT includes its time."""

    decode_pp: int
    decode_tp: int
    same_domain: bool  # both pools in one NVLink domain
    received_bytes: float  # what a decode rank takes in per request, replicas included
    # the decode pool's GPU when it is not the prefill pool's: the cache then crosses
    # the network at the slower of the two GPUs' links and is rewritten in its HBM
    decode_gpu: Accelerator | None = None

    def __post_init__(self) -> None:
        if self.decode_gpu is not None and self.same_domain:
            raise ShardlabError(
                f"handoff to {self.decode_gpu.name}: pools of two GPU types share no NVLink domain",
                field="handoff.same_domain",
                fix="place the pools on separate nodes",
            )

    @staticmethod
    def of(
        model: Model,
        input_len: int,
        kv_dtype: str,
        *,
        decode_pp: int,
        decode_tp: int,
        same_domain: bool,
        decode_gpu: Accelerator | None = None,
    ) -> Handoff:
        bytes_ = layer_handoff_bytes(model, input_len, kv_dtype)
        copies = layer_copies(model, decode_tp)
        return Handoff(
            decode_pp=decode_pp,
            decode_tp=decode_tp,
            same_domain=same_domain,
            received_bytes=float(np.dot(bytes_, copies)),
            decode_gpu=decode_gpu,
        )

    def describe(self) -> str:
        where = "NVLink" if self.same_domain else "the network"
        on = f" of {self.decode_gpu.name}" if self.decode_gpu is not None else ""
        return (
            f"{self.received_bytes / 1e6:,.1f} MB per request to decode ranks{on} of pp "
            f"{self.decode_pp} x tp {self.decode_tp} over {where}"
        )
