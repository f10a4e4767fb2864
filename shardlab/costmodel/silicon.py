"""Kernel times measured on silicon: aiconfigurator-core's performance database.

The ``silicon`` timing backend prices GEMMs, attention (context and generation, MLA
included), the routed experts and the collectives inside one NVLink domain from the
measured tables aiconfigurator-core ships for H100, H200, B200 and A100, per serving
engine and engine version (``ENGINE_VERSIONS``). Everything else (norms, embedding,
sampler, collectives across nodes, pipeline hops) and every shape or format the
database lacks stays with the roofline; each option cost says which it got.

The database answers one shape at a time (a few microseconds a query). A degree
tuple's tables need an operator's time at every batch size ``b``, so each shape is
queried once on a fixed grid of token counts (:data:`TOKEN_GRID`, every integer to 64,
then 16 points per doubling) and interpolated linearly in between; the package itself
interpolates between its measured points the same way. Past the largest size its
tables hold (:data:`MEASURED_UP_TO`) the package extrapolates on its own terms (its
SGLang MoE at DeepSeek-V3's 32-way prefill came out 3x its TensorRT-LLM one); here
time grows in proportion to the work from the last measured point instead, as a
kernel that large is bound by compute or bandwidth. Curves are cached per process.

Used through aiconfigurator-core's public evaluation surface (``EngineHandle`` and
``build_ops_json``); no data of the package is copied here.
"""

from __future__ import annotations

import logging
import math
from functools import cache, lru_cache
from typing import Any

import numpy as np

# aiconfigurator-core's name of each built-in accelerator.
# Only the systems with measured tables (b60: vLLM's only, collectives on oneCCL, so
# priced by the alpha-beta model here): its h100_pcie, l4, a100_pcie and a30 are
# estimate-only specs (an empty data directory), timed here by the roofline.
SYSTEMS = {
    "h100": "h100_sxm",
    "h200": "h200_sxm",
    "b200": "b200_sxm",
    "a100": "a100_sxm",
    "b300": "b300_sxm",
    "gb200": "gb200",
    "gb300": "gb300",
    "l40s": "l40s",
    "rtxpro6000": "rtx_pro_6000_server",
    "b60": "b60",
}

# Engine versions whose measurements price each accelerator: the "current" slot of
# aiconfigurator-core 0.12.0 (aiconfigurator_core/systems/query_versions.yaml).
ENGINE_VERSIONS = {
    ("h100_sxm", "trtllm"): "1.3.0rc20",
    ("h100_sxm", "vllm"): "0.24.0",
    ("h100_sxm", "sglang"): "0.5.14",
    ("h200_sxm", "trtllm"): "1.3.0rc20",
    ("h200_sxm", "vllm"): "0.24.0",
    ("h200_sxm", "sglang"): "0.5.14",
    ("b200_sxm", "trtllm"): "1.3.0rc20",
    ("b200_sxm", "vllm"): "0.24.0",
    ("b200_sxm", "sglang"): "0.5.14",
    ("b300_sxm", "trtllm"): "1.3.0rc20",
    ("b300_sxm", "vllm"): "0.24.0",
    ("b300_sxm", "sglang"): "0.5.14",
    ("gb200", "trtllm"): "1.3.0rc20",
    ("gb200", "vllm"): "0.24.0",
    ("gb200", "sglang"): "0.5.14",
    ("gb300", "trtllm"): "1.3.0rc20",
    ("gb300", "vllm"): "0.24.0",
    ("gb300", "sglang"): "0.5.14",
    ("l40s", "trtllm"): "1.3.0rc20",
    ("l40s", "vllm"): "0.24.0",
    ("l40s", "sglang"): "0.5.14",
    ("rtx_pro_6000_server", "trtllm"): "1.3.0rc20",
    ("rtx_pro_6000_server", "vllm"): "0.24.0",
    ("rtx_pro_6000_server", "sglang"): "0.5.14",
    ("b60", "vllm"): "0.26.0",
    ("a100_sxm", "trtllm"): "1.0.0",
    ("a100_sxm", "vllm"): "0.14.0",
    ("a100_sxm", "sglang"): "0.5.10",
}


def _grid(top_log2: int) -> np.ndarray:
    """Every integer to 64, then 16 points per doubling up to 2**top_log2."""
    return np.unique(
        np.concatenate([np.arange(1, 65), np.rint(np.exp2(np.arange(6, top_log2 + 1, 1 / 16)))])
    )


# Token counts (or requests, for attention) at which each curve is measured, and
# message sizes in bf16 elements for collectives (the tables reach 512 MiB).
TOKEN_GRID = _grid(22)
MESSAGE_GRID = _grid(28)
# The largest size the h100_sxm trtllm tables measure, per kind of curve: GEMM rows,
# MoE tokens (over all attention-DP ranks), context and generation attention requests,
# collective elements (read off the parquet tables with pyarrow).
MEASURED_UP_TO = {
    "gemm": 32768,
    "moe": 16384,
    "context": 256,
    "generation": 2048,
    "nccl": 1 << 28,
}

# Operand formats tried in order for a weight format (the first with data wins).
GEMM_MODES = {"bf16": ("bfloat16",), "fp8": ("fp8", "fp8_block"), "fp4": ("nvfp4",)}
MOE_MODES = {"bf16": ("bfloat16",), "fp8": ("fp8", "fp8_block"), "fp4": ("nvfp4",)}
KV_MODES = {"bf16": "bfloat16", "fp8": "fp8"}
COLLECTIVES = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "all_to_all": "alltoall",
}
# NCCL tables hold groups of these sizes inside one NVLink domain; a rack's tables
# (gb200, gb300) stop at one 4-GPU tray, and the package's values for larger groups
# are its extrapolation, so those are priced by the alpha-beta model on the domain.
NCCL_SIZES = (2, 4, 8)
NCCL_SIZES_OF = {"gb200": (2, 4), "gb300": (2, 4)}


def covers(accelerator_key: str) -> bool:
    """Whether the database has measurements of this accelerator."""
    return accelerator_key in SYSTEMS


def measured_engines(accelerator_key: str) -> dict[str, str]:
    """Engine -> the version whose measurements price this accelerator (none: roofline)."""
    system = SYSTEMS.get(accelerator_key)
    return {e: v for (s, e), v in ENGINE_VERSIONS.items() if s == system}


class Kernels:
    """One accelerator and engine's measured kernels, as curves over token counts."""

    def __init__(self, accelerator_key: str, engine: str) -> None:
        logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
        from aiconfigurator_core.sdk import common, operations
        from aiconfigurator_core.sdk.engine import EngineHandle, build_ops_json
        from aiconfigurator_core.sdk.perf_database import get_database

        self.system = SYSTEMS[accelerator_key]
        self.engine = engine
        self.version = ENGINE_VERSIONS[(self.system, engine)]
        self._common = common
        self._ops = operations
        self._build = build_ops_json
        db = get_database(self.system, engine, self.version)
        self._handle = EngineHandle.for_database(db)
        self._db = db
        self._curves: dict[tuple, tuple[np.ndarray, np.ndarray] | None] = {}

    # -- one curve per shape ---------------------------------------------------------

    def _curve(
        self,
        key: tuple,
        make: Any,
        *,
        up_to: float,
        grid: np.ndarray = TOKEN_GRID,
        attention: tuple[bool, int] | None = None,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """(grid, milliseconds) of the op ``make()`` builds at the points of ``grid`` up to
        ``up_to``: token counts, or for ``attention=(context, length)`` requests of that
        many new (context) or cached (generation) tokens. None when the database has no
        data for it."""
        if key in self._curves:
            return self._curves[key]
        grid = grid[grid <= max(up_to, 2)]
        curve: tuple[np.ndarray, np.ndarray] | None
        try:
            op = make()
            ops_json = self._build([op])
            evaluate = self._handle.evaluate_ops_json
            if attention is None:
                rows = [
                    evaluate(ops_json, is_context=True, batch_size=1, s=1, x=int(x)) for x in grid
                ]
            else:
                context, length = attention
                rows = [
                    evaluate(ops_json, is_context=context, batch_size=int(b), s=length)
                    for b in grid
                ]
            ms = np.array([r[0][1] for r in rows], dtype=float)
            curve = (grid, ms) if np.isfinite(ms).all() and (ms >= 0).all() else None
        except (RuntimeError, ValueError, KeyError):  # no data for this shape or format
            curve = None
        self._curves[key] = curve
        return curve

    @staticmethod
    def _at(curve: tuple[np.ndarray, np.ndarray], points: np.ndarray) -> np.ndarray:
        """Seconds at ``points``: linear between grid points, in proportion past the last."""
        grid, ms = curve
        x = np.asarray(points, dtype=float)
        out = np.where(x > grid[-1], ms[-1] * x / grid[-1], np.interp(x, grid, ms))
        return out * 1e-3

    def _first(self, modes: tuple[str, ...], build: Any) -> tuple[np.ndarray, np.ndarray] | None:
        for mode in modes:
            curve = build(mode)
            if curve is not None:
                return curve
        return None

    # -- the kernels the cost model asks for ---------------------------------------------

    def gemm(self, n: int, k: int, dtype: str, tokens: np.ndarray) -> np.ndarray | None:
        """Seconds of a (tokens x k) @ (k x n) GEMM with weights in ``dtype``."""
        if n < 1 or k < 1:
            return None
        q = self._common.GEMMQuantMode

        def build(mode: str) -> np.ndarray | None:
            return self._curve(
                ("gemm", n, k, mode),
                lambda: self._ops.GEMM("gemm", 1, n, k, getattr(q, mode)),
                up_to=MEASURED_UP_TO["gemm"],
            )

        curve = self._first(GEMM_MODES.get(dtype, ()), build)
        return None if curve is None else self._at(curve, tokens)

    def attention(
        self,
        *,
        context: bool,
        heads: int,
        kv_heads: int,
        head_dim: int,
        kv_dtype: str,
        window: int,
        length: float,
        requests: np.ndarray,
        mla: bool,
    ) -> np.ndarray | None:
        """Seconds of attention for ``requests`` requests per GPU: a prefill of
        ``length`` new tokens each (context) or one decode token each over ``length``
        cached tokens (generation)."""
        c = self._common
        kv = getattr(c.KVCacheQuantMode, KV_MODES[kv_dtype])
        tokens = max(round(length), 1)
        key = ("attn", context, heads, kv_heads, head_dim, kv_dtype, window, mla, tokens)

        def make(fmha: str) -> Any:
            f = getattr(c.FMHAQuantMode, fmha)
            ops = self._ops
            if mla:
                if context:
                    return ops.ContextMLA("attn", 1, heads, kv, f)
                return ops.GenerationMLA("attn", 1, heads, kv)
            if context:
                return ops.ContextAttention(
                    "attn", 1, heads, kv_heads, kv, f, window_size=window, head_size=head_dim
                )
            return ops.GenerationAttention(
                "attn", 1, heads, kv_heads, kv, window_size=window, head_size=head_dim
            )

        curve = self._first(
            ("bfloat16", "fp8"),  # engines without a bf16 prefill kernel over fp8 KV
            lambda fmha: self._curve(
                (*key, fmha),
                lambda: make(fmha),
                up_to=MEASURED_UP_TO["context" if context else "generation"],
                attention=(context, tokens),
            ),
        )
        return None if curve is None else self._at(curve, requests)

    def experts(
        self,
        *,
        hidden: int,
        ffn: int,
        top_k: int,
        num_experts: int,
        ep: int,
        etp: int,
        dp: int,
        dtype: str,
        alpha: float,
        tokens_per_dp: np.ndarray,
    ) -> np.ndarray | None:
        """Seconds of the routed experts' GEMMs for ``tokens_per_dp`` tokens on each
        attention-data-parallel rank, under the database's power-law expert load."""
        q = self._common.MoEQuantMode
        distribution = f"power_law_{alpha:g}"

        def build(mode: str) -> np.ndarray | None:
            return self._curve(
                ("moe", hidden, ffn, top_k, num_experts, ep, etp, dp, mode, distribution),
                lambda: self._ops.MoE(
                    "moe",
                    1,
                    hidden,
                    ffn,
                    top_k,
                    num_experts,
                    etp,
                    ep,
                    getattr(q, mode),
                    distribution,
                    dp,
                ),
                up_to=MEASURED_UP_TO["moe"] / dp,
            )

        curve = self._first(MOE_MODES.get(dtype, ()), build)
        return None if curve is None else self._at(curve, tokens_per_dp)

    def collective(
        self, kind: str, ranks: int, nbytes: np.ndarray, *, nccl: bool = False
    ) -> np.ndarray | None:
        """Seconds of a collective over ``ranks`` GPUs of one node as the engine runs it,
        with the message as :mod:`shardlab.costmodel.collectives` defines it (``nccl``:
        NCCL's own, as its micro-benchmarks measure it)."""
        if ranks not in NCCL_SIZES_OF.get(self.system, NCCL_SIZES) or kind not in COLLECTIVES:
            return None
        op = COLLECTIVES[kind]
        half = self._common.CommQuantMode.half
        # one bf16 element per "token": the grid runs over message sizes in elements
        curve = self._curve(
            ("nccl", op, ranks),
            lambda: self._ops.NCCL("nccl", 1, op, 1, ranks, half),
            up_to=MEASURED_UP_TO["nccl"],
            grid=MESSAGE_GRID,
        )
        elements = np.maximum(np.asarray(nbytes, dtype=float) / 2.0, 1.0)
        measured = None if curve is None else self._at(curve, elements)
        if kind != "all_reduce" or nccl:
            return measured
        # All three engines all-reduce inside a node with their own one-/two-shot
        # kernels, and hand large messages to NCCL (vLLM and SGLang above
        # custom_all_reduce's max_size, TensorRT-LLM's AUTO strategy by size): the
        # faster of the two measured tables stands for that switch.
        custom = self._curve(
            ("custom_all_reduce", ranks),
            lambda: self._ops.CustomAllReduce("custom_all_reduce", 1, 1, ranks),
            up_to=MEASURED_UP_TO["nccl"],
            grid=MESSAGE_GRID,
        )
        if custom is None:
            return measured
        own = self._at(custom, elements)
        return own if measured is None else np.minimum(own, measured)


@lru_cache(maxsize=16)
def kernels(accelerator_key: str, engine: str) -> Kernels:
    """The measured kernels of one accelerator under one engine (loaded once)."""
    return Kernels(accelerator_key, engine)


@cache
def moe_alpha(model_name: str) -> float:
    """The power-law exponent of expert load aiconfigurator assumes for a model family:
    1.01 for DeepSeek-style models, 1.2 for the others (its models/*.py)."""
    name = model_name.lower()
    return 1.01 if any(s in name for s in ("deepseek", "kimi")) else 1.2


def gemm_shape(params_local: float, k_local: float) -> tuple[int, int]:
    """(n, k) of the GEMM holding ``params_local`` weights with ``k_local`` inputs."""
    k = max(round(k_local), 1)
    return max(math.ceil(params_local / k), 1), k
