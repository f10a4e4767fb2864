"""Efficiency factors and fixed costs of the cost model, each with its source.

Every empirical correction is labelled as such. The measurements quoted come from
shardlab's validation notes (``results/validation.md`` lists the sources).
"""

from __future__ import annotations

# -- compute ----------------------------------------------------------------------

# Fraction of dense tensor-core peak reached by large GEMMs, by operand format.
# Empirical: 8xH100 measurements, BF16 GEMMs ~0.8 of peak, FP8 ~0.6-0.7.
# FP4 (B200 only) is taken at the FP8 value: no measurement in our sources.
GEMM_EFFICIENCY: dict[str, float] = {"bf16": 0.80, "fp8": 0.65, "fp4": 0.65}

# Fraction of peak reached by fused attention kernels (FlashAttention-3 class) in
# prefill. Estimate: FA3 reports 600-750 of 989 BF16 TFLOP/s on H100 for long
# sequences; we take the lower end because serving mixes short prompts.
ATTENTION_EFFICIENCY = 0.60

# Fraction of HBM bandwidth reached by memory-bound kernels (weight streaming, KV
# reads, norms). Empirical: weight-streaming GEMMs at small batch reach 0.75-0.8.
HBM_EFFICIENCY = 0.78

# Fixed cost per kernel, in microseconds: launch plus tail under CUDA graphs.
# Estimate within the "few microseconds" of published simulators.
KERNEL_US = 3.0

# Activations travel in bf16.
ACT_BYTES = 2.0

# -- collectives ------------------------------------------------------------------

# Latency of a collective over n ranks inside one NVLink domain, in units of the
# accelerator's ``nvlink_latency_us`` L: all-reduce alpha = L * (n + 2) / 2, a fit of
# NCCL all-reduce floors of 6.2 / 9.5 / 15.5 us on 2 / 4 / 8 H100 (aiconfigurator's
# nccl_perf table, L = 3.1 us). One-pass collectives (all-gather, reduce-scatter,
# all-to-all) take half the steps: alpha = L * (n + 2) / 4.
ALPHA_STEPS = {"all_reduce": 0.5, "all_gather": 0.25, "reduce_scatter": 0.25, "all_to_all": 0.25}

# Bus-bandwidth efficiency by message size (bytes per rank), relative to the link's
# one-way bandwidth. Empirical: NCCL all_reduce bus bandwidth on 8xH100 (NVLS) of 43.7 /
# 234.5 / 361.8 / 466.4 / 478.9 GB/s at 1 MB / 16 MB / 64 MB / 1 GB / 8 GB, with the
# all-reduce latency above taken out, divided by 450 GB/s. Applied to every fabric;
# interpolated in log(size), clamped at the ends.
BUSBW_SIZES = (1 << 20, 16 << 20, 64 << 20, 1 << 30, 8 << 30)
BUSBW_EFFICIENCY = (0.159, 0.597, 0.848, 1.0, 1.0)

# -- MoE --------------------------------------------------------------------------

# Systematic skew of expert popularity on top of the statistical fluctuation of the
# busiest expert-parallel rank. Empirical: public DeepSeek deployments saw 1.5x
# (prefill) to 2.5x (decode) speed-ups from expert load balancing; we take a static
# skew of 1.3 and add the fluctuation sqrt(2 ln(ep) / mean load) of a Poisson load.
EXPERT_SKEW = 1.3

# -- memory -----------------------------------------------------------------------

# Per-GPU memory that holds neither weights nor KV cache: CUDA context, NCCL buffers,
# allocator slack. Empirical: ~0.4 GB + 3.5 GB in production engines.
RUNTIME_RESERVE_GB = 3.9
