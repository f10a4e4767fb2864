"""What every option cost of one degree tuple shares (:class:`CostContext`: shapes,
rates, collectives and redistributions), and what one option costs (:class:`OptionCost`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shardlab.costmodel import silicon
from shardlab.costmodel.collectives import Span, axis_span, collective_time
from shardlab.costmodel.constants import GEMM_EFFICIENCY, HBM_EFFICIENCY
from shardlab.costmodel.silicon import Kernels
from shardlab.costmodel.steps import kv_context
from shardlab.problems.dtypes import BYTES_PER_VALUE
from shardlab.problems.operators import OptionSpec
from shardlab.problems.placements import REPLICATE, Layout, redistribute
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem


@dataclass(frozen=True, kw_only=True)
class OptionCost:
    """Cost of one operator option per layer and micro-batch; arrays are over ``b``."""

    compute_s: np.ndarray  # FLOP-bound time
    memory_s: np.ndarray  # HBM-bound time
    comm_s: np.ndarray  # communication inside the operator (MoE dispatch and combine)
    kernel_s: float
    weight_bytes: float  # resident per GPU
    kv_bytes_per_req: float  # resident KV cache per GPU per request (its whole context)
    kv_split_tp: bool  # the requests' KV is split over tp (seq_sharded attention)
    act_bytes: np.ndarray  # activation workspace per GPU
    source: str = "roofline"  # or "silicon": measured kernel times (compute_s holds them)
    draft_s: np.ndarray | float = 0.0  # the sampler's: speculative decoding's draft passes
    # a round's share of whole prompts in flight: that share of the option's time in a
    # prompt alone (:class:`shardlab.costmodel.tables.DegreeTables`)
    prompts_s: np.ndarray | float = 0.0

    @property
    def time_s(self) -> np.ndarray:
        return (
            np.maximum(self.compute_s, self.memory_s)
            + self.kernel_s
            + self.comm_s
            + self.draft_s
            + self.prompts_s
        )


class CostContext:
    """Shapes and rates shared by every option cost of one degree tuple."""

    def __init__(self, problem: Problem, degrees: Degrees, b: np.ndarray) -> None:
        self.problem = problem
        self.model = problem.model
        self.cluster = problem.cluster
        self.acc = problem.cluster.accelerator
        self.d = degrees
        self.b = b.astype(float)
        self.hbm_rate = self.acc.hbm_gbps * 1e9 * HBM_EFFICIENCY
        self.kv_context = kv_context(problem.workload)
        self.kernels: Kernels | None = None
        if problem.timing == "silicon" and silicon.covers(self.acc.key):
            # (an accelerator the database lacks is timed by the roofline throughout)
            self.kernels = silicon.kernels(self.acc.key, problem.engine)

    def collective(self, kind: str, group: Span, nbytes: np.ndarray) -> np.ndarray:
        """Seconds of one collective: measured inside a node where the database has the
        group size, else the alpha-beta model (uncalibrated: callers scale)."""
        if self.kernels is not None and group.nodes == 1 and group.size > 1:
            measured = self.kernels.collective(kind, group.size, nbytes)
            if measured is not None:
                return measured
        return collective_time(kind, group, nbytes, self.cluster)

    # -- rates -------------------------------------------------------------------

    def gemm_rate(self, family: str) -> float:
        dtype = self.problem.weight_dtype(family)
        peak = self.acc.peak_tflops(dtype)
        fmt = dtype if peak != self.acc.bf16_tflops else "bf16"
        return peak * 1e12 * GEMM_EFFICIENCY[fmt]

    def weight_bytes_per_value(self, family: str) -> float:
        return BYTES_PER_VALUE[self.problem.weight_dtype(family)]

    # -- how work divides ----------------------------------------------------------

    def ways(self, axes: tuple[str, ...]) -> int:
        return math.prod(self.d.axis_size(a) for a in axes)

    def tokens(
        self, per_req: float, opt: OptionSpec, *, whole_requests: bool = False
    ) -> np.ndarray:
        """Tokens (or requests, with ``per_req=1``) on the busiest GPU for this option."""
        if "dp" not in opt.token_axes:  # gathered over the dp axis
            return self.b * per_req * self.d.dp_attn
        if "tp" not in opt.token_axes or self.d.tp == 1:
            return self.b * per_req
        if whole_requests:
            return np.ceil(self.b / self.d.tp) * per_req
        return np.ceil(self.b * per_req / self.d.tp)

    def local_width(self, width: float, layout: Layout) -> float:
        """Feature width held per GPU under ``layout`` (split where it is Shard(hid))."""
        for axis, p in zip(("dp", "tp"), layout, strict=True):
            if p.kind == "S" and p.dim == "hid":
                width /= self.d.axis_size(axis)
        return width

    def roofline(
        self, flops: np.ndarray, nbytes: np.ndarray, rate: float
    ) -> tuple[np.ndarray, np.ndarray]:
        return flops / rate, nbytes / self.hbm_rate

    # -- redistribution --------------------------------------------------------------

    def redistribution_steps(
        self, src: Layout, dst: Layout, full_bytes: np.ndarray
    ) -> list[tuple[str, str, np.ndarray]]:
        """The collectives DTensor issues to turn ``src`` into ``dst``, in order.

        Each is ``(kind, mesh axis, per-rank message bytes)`` with the message as in
        :mod:`shardlab.costmodel.collectives`; ``full_bytes`` is the whole tensor of
        the stage (all dp ranks). As DTensor's ``redistribute`` does: shards of one
        tensor dimension over both axes nest tp inside dp, so changing the dp placement
        from or to the dimension tp shards first gathers tp and works on the
        tp-times larger buffer;
        reductions come first, then all-to-alls, then gathers, tp before dp.
        """
        local = np.array(full_bytes, dtype=float)
        for axis, p in zip(("dp", "tp"), src, strict=True):
            if p.kind == "S":
                local = local / self.d.axis_size(axis)
        steps: list[tuple[str, str, np.ndarray]] = []
        cur = list(src)
        # tp shards inside dp: a dp change touching the tensor dim tp shards undoes tp first
        nested = cur[1].kind == "S" and cur[1] in (cur[0], dst[0])
        if nested and cur[0] != dst[0] and self.d.tp > 1:
            local = local * self.d.tp
            steps.append(("all_gather", "tp", local))
            cur[1] = REPLICATE
        order = {"reduce_scatter": 0, "all_reduce": 1, "all_to_all": 2, "all_gather": 3}
        todo = []
        for i, (axis, a, c) in enumerate(zip(("dp", "tp"), cur, dst, strict=True)):
            kind = redistribute(a, c)
            if kind is not None and self.d.axis_size(axis) > 1:
                axis_rank = -i if kind == "all_gather" else i  # gathers: tp before dp
                todo.append((order[kind], axis_rank, axis, kind))
        for _, _, axis, kind in sorted(todo):
            n = self.d.axis_size(axis)
            if kind == "all_gather":
                local = local * n
                steps.append((kind, axis, local))
            else:
                steps.append((kind, axis, local))
                if kind == "reduce_scatter":
                    local = local / n
        return steps

    def redistribution_s(self, src: Layout, dst: Layout, full_bytes: np.ndarray) -> np.ndarray:
        """Time of :meth:`redistribution_steps`."""
        total = np.zeros_like(np.asarray(full_bytes, dtype=float))
        for kind, axis, message in self.redistribution_steps(src, dst, full_bytes):
            group = axis_span(axis, self.d, self.cluster)
            total = total + self.collective(kind, group, message)
        return total * self.communication_factor

    @property
    def communication_factor(self) -> float:
        cal = self.problem.calibration
        return 1.0 if cal is None else cal.communication
