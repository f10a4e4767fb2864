"""What pricing a plan returns: one plan's metrics and where they come from, many
plans' metrics as arrays, and the feasible (plan, concurrency) points of a batch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

VIOLATIONS = ("memory", "ttft_slo", "tpot_slo")


@dataclass(frozen=True, kw_only=True)
class OpBreakdown:
    """Where one operator's time and memory go (summed over its layers)."""

    step: str  # prefill or decode
    name: str  # "dense.qkv_proj", "head.lm_head", "pipeline.p2p", ...
    option: str  # the chosen option ("mixed" when layers differ)
    layers: int
    compute_ms: float  # FLOP-bound time per micro-batch pass through the replica
    memory_ms: float  # HBM-bound time
    comm_ms: float  # collectives feeding this operator, and its own dispatch
    time_ms: float  # sum over layers of max(compute, memory) + kernels + communication
    weight_gb: float  # on the fullest GPU
    kv_gb: float
    act_gb: float
    # how its kernels were timed: silicon (measured), roofline, or mixed over its layers
    timing: str = "roofline"
    # its own kernels' calibration class (gemm, attention, moe; None: not calibrated);
    # comm_ms is the communication class
    kernel_class: str | None = None


@dataclass(frozen=True, kw_only=True)
class MemoryShare:
    """One share of a GPU's memory budget: ``name`` (weights, kv_cache, activations,
    runtime_reserve, left_free, engine_reserve), its GB, and what sets it."""

    name: str
    gb: float
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class Metrics:
    feasible: bool
    violations: tuple[str, ...]
    objective: float  # higher is better: tokens/s, tokens/s per GPU, or -latency in ms
    ttft_ms: float
    tpot_ms: float
    latency_ms: float
    throughput_tok_s: float
    throughput_tok_s_per_gpu: float
    memory_gb_per_gpu: float
    hbm_gb: float
    num_gpus: int
    requests_in_flight: int  # in the whole cluster
    # requests per attention-DP rank the plan runs with (the engine's max batch size),
    # and the most whose KV cache fits (at most what the workload offers a rank)
    requests_per_rank: int
    capacity_per_rank: int
    weights_gb: float  # parts of the fullest GPU's memory
    kv_cache_gb: float
    activations_gb: float
    # the fullest GPU's memory_gb_per_gpu as shares that add up to it (the parts above,
    # and what the engine's budget reserves or leaves free: costmodel.engines)
    memory_shares: tuple[MemoryShare, ...] = field(default=(), compare=False)
    breakdown: tuple[OpBreakdown, ...] = field(default=(), compare=False)

    def to_dict(self, *, breakdown: bool = False) -> dict:
        data = asdict(self)
        data["violations"] = list(self.violations)
        if breakdown:
            data["breakdown"] = [asdict(b) for b in self.breakdown]
        else:
            data.pop("breakdown")
        return data


@dataclass(frozen=True, kw_only=True)
class BatchMetrics:
    """Metrics of many plans as arrays, one entry per plan."""

    feasible: np.ndarray
    objective: np.ndarray
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    latency_ms: np.ndarray
    throughput_tok_s: np.ndarray
    throughput_tok_s_per_gpu: np.ndarray
    memory_gb_per_gpu: np.ndarray
    num_gpus: np.ndarray
    requests_in_flight: np.ndarray
    requests_per_rank: np.ndarray
    capacity_per_rank: np.ndarray
    weights_gb: np.ndarray
    kv_cache_gb: np.ndarray
    activations_gb: np.ndarray
    memory_violation: np.ndarray
    ttft_violation: np.ndarray
    tpot_violation: np.ndarray

    def __len__(self) -> int:
        return len(self.feasible)


@dataclass(frozen=True, kw_only=True)
class ConcurrencyPoints:
    """Feasible (plan, concurrency) points: ``row`` indexes the codes they came from."""

    row: np.ndarray
    requests_per_rank: np.ndarray
    throughput_tok_s_per_gpu: np.ndarray
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray

    def __len__(self) -> int:
        return len(self.row)
