"""Pricing plans: the cost model's entry points.

One plan (:func:`evaluate`, with its per-operator breakdown), encoded plans in bulk
(:func:`evaluate_batch`, :func:`evaluate_points`) and the plan helpers around them
all go through one implementation of the arithmetic,
:func:`shardlab.costmodel.arithmetic.assemble`; the definitions of what it computes
are in that module.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from shardlab.costmodel import stage_sums
from shardlab.costmodel.arithmetic import Assembled, assemble
from shardlab.costmodel.breakdown import breakdown_of
from shardlab.costmodel.constants import RUNTIME_RESERVE_GB
from shardlab.costmodel.engines import engine_limits, memory_shares
from shardlab.costmodel.metrics import VIOLATIONS, BatchMetrics, ConcurrencyPoints, Metrics
from shardlab.costmodel.stack import stack_of
from shardlab.costmodel.tables import degree_tables
from shardlab.costmodel.units import Units, forget_layouts, terms_of, units_of_codes, units_of_plan
from shardlab.errors import ShardlabError
from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem


def forget_tables() -> None:
    """Drop every table built so far (the next evaluation builds them, as a fresh
    process would): for measuring that cost."""
    degree_tables.cache_clear()
    stack_of.cache_clear()
    forget_layouts()


def prepare(problem: Problem, degrees: Degrees) -> None:
    """Build the cost tables of one degree tuple (kept for later calls): the slow part
    of pricing the first plan with these degrees, for callers that watch a clock."""
    stack = stack_of(problem)
    stack.ensure(stack.slots((degrees,)))


def evaluate_batch(
    problem: Problem,
    codes: np.ndarray,
    *,
    check: bool = True,
    requests_per_rank: np.ndarray | None = None,
) -> BatchMetrics:
    """Evaluate encoded plans (rows of ``problem.space``'s encoding), each at the
    concurrency it does best with, or at ``requests_per_rank`` requests per dp rank (one value
    per row, within the workload's offer; in flight only).

    ``check=False`` skips the validity check, for callers whose codes come from the
    space's own sampling and masks.
    """
    return _evaluate(
        problem, codes, check=check, requests_per_rank=requests_per_rank, points=False
    )[0]


def evaluate_points(
    problem: Problem, codes: np.ndarray, *, check: bool = True
) -> tuple[BatchMetrics, ConcurrencyPoints]:
    """:func:`evaluate_batch`, and every feasible point of the plans from the same pass:
    in flight one per concurrency each plan can run that no other concurrency of the
    same plan dominates (the trade-off a Pareto front is over); static, each plan's one
    point."""
    m, points = _evaluate(problem, codes, check=check, requests_per_rank=None, points=True)
    assert points is not None
    return m, points


def _evaluate(
    problem: Problem,
    codes: np.ndarray,
    *,
    check: bool,
    requests_per_rank: np.ndarray | None,
    points: bool,
) -> tuple[BatchMetrics, ConcurrencyPoints | None]:
    space = problem.space
    codes = np.atleast_2d(np.asarray(codes, dtype=np.int64))
    if check:
        valid = space.is_valid(codes)
        if not valid.all():
            bad = int(np.flatnonzero(~valid)[0])
            raise ValueError(f"row {bad} is not a valid encoding; use SearchSpace.repair()")
    units = units_of_codes(problem, codes)
    # plans per pass: keeps the per-plan arrays (terms, stage rows) to tens of MB
    terms = terms_of(problem, units.layout)
    per_stage = len(terms.unit_first) + len(terms.pair_a) + 9  # units, hops, ends, send
    per_pass = max(64, stage_sums.GATHER_CHUNK // (len(terms.unit) + space.max_pp * per_stage))
    parts: list[BatchMetrics] = []
    found: list[tuple[np.ndarray, ...]] = []
    point_fields = [f for f in ConcurrencyPoints.__dataclass_fields__ if f != "row"]
    for i in range(0, max(len(codes), 1), per_pass):
        rows = np.arange(i, min(i + per_pass, len(codes)))
        u = units.take(rows)
        fixed = (
            None if requests_per_rank is None else _requests(problem, u, requests_per_rank[rows])
        )
        a = assemble(problem, u, fixed)
        parts.append(a.metrics)
        if points:
            ok = a.curves["feasible"]
            found.append((rows[a.curves["plan"][ok]], *(a.curves[f][ok] for f in point_fields)))
    metrics = (
        parts[0]
        if len(parts) == 1
        else BatchMetrics(
            **{
                name: np.concatenate([getattr(part, name) for part in parts])
                for name in BatchMetrics.__dataclass_fields__
            }
        )
    )
    if not points:
        return metrics, None
    columns = map(np.concatenate, zip(*found, strict=True))
    return metrics, ConcurrencyPoints(
        **dict(zip(ConcurrencyPoints.__dataclass_fields__, columns, strict=True))
    )


def _requests(problem: Problem, u: Units, requests_per_rank: np.ndarray) -> np.ndarray:
    """Requests per dp rank given to plans, checked against what the workload offers."""
    requests_per_rank = np.asarray(requests_per_rank, dtype=np.int64)
    stack = u.stack
    stack.ensure(u.slot)
    offer = stack.scalar("max_requests_per_rank", u.slot).astype(np.int64)
    if problem.workload.schedule != "inflight":
        if (requests_per_rank != offer).any():
            i = int(np.flatnonzero(requests_per_rank != offer)[0])
            raise ShardlabError(
                f"plan concurrency {int(requests_per_rank[i])} per rank: the static schedule runs "
                f"its batch ({offer[i]} per attention-DP rank)",
                field="plan.requests_per_rank",
                fix="drop the plan's requests_per_rank, or serve the workload in flight "
                "(schedule 'inflight')",
            )
        return requests_per_rank
    bad = (requests_per_rank < 1) | (requests_per_rank > offer)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        d = stack.degrees[int(u.slot[i])]
        raise ShardlabError(
            f"plan concurrency {int(requests_per_rank[i])} per rank is more than this workload "
            f"offers an attention-DP rank under {d.short()} ({offer[i]}: the workload's "
            "batch over replicas and dp_attn, within the engine's max batch and max tokens)",
            field="plan.requests_per_rank",
            fix="raise the workload's batch or lower the plan's requests_per_rank",
        )
    return requests_per_rank


def assemble_plan(problem: Problem, plan: Plan) -> tuple[Units, Assembled]:
    """One plan through the batched arithmetic: at its ``concurrency`` when it has one,
    else at the concurrency it does best with."""
    units = units_of_plan(problem, plan)
    fixed = None
    if plan.requests_per_rank is not None:
        fixed = _requests(problem, units, np.array([plan.requests_per_rank]))
    return units, assemble(problem, units, fixed)


def with_concurrency(problem: Problem, plan: Plan, metrics: Metrics) -> Plan:
    """``plan`` with the concurrency ``metrics`` were evaluated at (in flight), so that
    its JSON says the engine's max batch size and re-evaluates to the same point."""
    if problem.workload.schedule != "inflight" or plan.requests_per_rank is not None:
        return plan
    return dataclasses.replace(plan, requests_per_rank=metrics.requests_per_rank)


def at_capacity(problem: Problem, plan: Plan) -> Plan:
    """``plan`` at the concurrency an engine left at its defaults runs it with: every
    offered request its KV cache holds (in flight; at least one). Measurements of
    "max-throughput" serving are taken there, not at the best concurrency."""
    if problem.workload.schedule != "inflight":
        return plan
    free = dataclasses.replace(plan, requests_per_rank=None)
    held = assemble(problem, units_of_plan(problem, free)).metrics.capacity_per_rank[0]
    return dataclasses.replace(plan, requests_per_rank=max(int(held), 1))


def evaluate(problem: Problem, plan: Plan, *, breakdown: bool = True) -> Metrics:
    """Evaluate one plan, with the per-operator breakdown (``breakdown=False``: without,
    three times faster): at its ``concurrency`` when it has one, else at the
    concurrency it does best with."""
    units, a = assemble_plan(problem, plan)
    bm = a.metrics
    violations = tuple(
        name
        for name, flag in zip(
            VIOLATIONS,
            (bm.memory_violation[0], bm.ttft_violation[0], bm.tpot_violation[0]),
            strict=True,
        )
        if flag
    )
    return Metrics(
        feasible=bool(bm.feasible[0]),
        violations=violations,
        objective=float(bm.objective[0]),
        ttft_ms=float(bm.ttft_ms[0]),
        tpot_ms=float(bm.tpot_ms[0]),
        latency_ms=float(bm.latency_ms[0]),
        throughput_tok_s=float(bm.throughput_tok_s[0]),
        throughput_tok_s_per_gpu=float(bm.throughput_tok_s_per_gpu[0]),
        memory_gb_per_gpu=float(bm.memory_gb_per_gpu[0]),
        hbm_gb=problem.cluster.accelerator.hbm_gb,
        num_gpus=int(bm.num_gpus[0]),
        requests_in_flight=int(bm.requests_in_flight[0]),
        requests_per_rank=int(bm.requests_per_rank[0]),
        capacity_per_rank=int(bm.capacity_per_rank[0]),
        weights_gb=float(bm.weights_gb[0]),
        kv_cache_gb=float(bm.kv_cache_gb[0]),
        activations_gb=float(bm.activations_gb[0]),
        memory_shares=memory_shares(
            engine_limits(problem, plan.degrees.tp, plan.degrees.pp, plan.degrees.dp_attn),
            weights=float(bm.weights_gb[0]),
            kv=float(bm.kv_cache_gb[0]),
            act=float(bm.activations_gb[0]),
            reserve=RUNTIME_RESERVE_GB,
            total=float(bm.memory_gb_per_gpu[0]),
        ),
        breakdown=breakdown_of(problem, plan, units, a) if breakdown else (),
    )
