"""Metrics of a disaggregated plan: one instance of each pool priced on its own
problem (:mod:`shardlab.problems.disagg`), then matched.

- A prefill instance serves ``prefill throughput / input_len`` requests per second;
  its TTFT is a round of prompts in flight plus the handoff of the prompt's cache to
  the decode plan's ranks (:mod:`shardlab.costmodel.handoff`).
- A decode instance serves ``decode throughput / (output_len - 1)`` requests per
  second (the first output token comes from the prefill); its TPOT is its round.
- A pool of ``x`` instances serves ``x`` times as many.
- Together they serve ``min`` of the two rates (the slower pool sets the pace):
  ``output_len`` tokens per request; per GPU over the whole cluster's GPUs (the ones
  neither pool uses count too).
- Feasible: each pool fits its memory, TTFT (handoff included) meets the TTFT SLO and
  TPOT the TPOT SLO.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from shardlab.costmodel.handoff import handoff_seconds
from shardlab.costmodel.metrics import Metrics
from shardlab.costmodel.pricing import evaluate, with_concurrency
from shardlab.problems.disagg import (
    DisaggPlan,
    check_disagg,
    decode_problem,
    in_one_domain,
    prefill_problem,
)
from shardlab.problems.problem import Problem


@dataclass(frozen=True, kw_only=True)
class DisaggMetrics:
    feasible: bool
    violations: tuple[str, ...]  # "prefill.memory", "prefill.ttft_slo", "decode.tpot_slo"...
    objective: float
    throughput_tok_s: float  # output tokens per second
    throughput_tok_s_per_gpu: float  # over the cluster's GPUs
    request_rate: float  # requests per second both pools serve
    prefill_rate: float  # what the prefill pool alone could take
    decode_rate: float
    bottleneck: str  # "prefill" or "decode": the pool that sets the pace
    ttft_ms: float  # a round of prompts plus the handoff
    handoff_ms: float
    tpot_ms: float
    num_gpus: int  # the cluster's
    gpus_used: int  # both pools'
    prefill: Metrics  # one instance of each pool on its own problem, with its breakdown
    decode: Metrics

    def to_dict(self, *, breakdown: bool = False) -> dict:
        data = {
            k: getattr(self, k)
            for k in self.__dataclass_fields__
            if k not in ("prefill", "decode", "violations")
        }
        data["violations"] = list(self.violations)
        data["prefill"] = self.prefill.to_dict(breakdown=breakdown)
        data["decode"] = self.decode.to_dict(breakdown=breakdown)
        return data


def pool_problems(problem: Problem, plan: DisaggPlan) -> tuple[Problem, Problem]:
    """The problems one instance of each of ``plan``'s pools is priced on: the prefill
    instance hands off to the decode plan's ranks."""
    d = plan.decode.degrees
    prefill = prefill_problem(
        problem,
        plan.gpus("prefill"),
        plan.prefill_instances,
        decode_pp=d.pp,
        decode_tp=d.tp,
        one_domain=in_one_domain(problem.cluster, plan.num_gpus),
    )
    return prefill, decode_problem(problem, plan.gpus("decode"), plan.decode_instances)


def combine(
    problem: Problem, plan: DisaggPlan, pm: Metrics, dm: Metrics, handoff_s: float
) -> DisaggMetrics:
    """The matched metrics of two pools' metrics."""
    w = problem.workload
    prefill_rate = plan.prefill_instances * pm.throughput_tok_s / w.input_len
    decode_rate = plan.decode_instances * dm.throughput_tok_s / (w.output_len - 1)
    rate = min(prefill_rate, decode_rate)
    throughput = rate * w.output_len
    gpus = problem.cluster.num_gpus
    violations = tuple(f"prefill.{v}" for v in pm.violations) + tuple(
        f"decode.{v}" for v in dm.violations
    )
    objective = throughput / gpus if w.per_gpu else throughput
    return DisaggMetrics(
        feasible=pm.feasible and dm.feasible,
        violations=violations,
        objective=objective,
        throughput_tok_s=throughput,
        throughput_tok_s_per_gpu=throughput / gpus,
        request_rate=rate,
        prefill_rate=prefill_rate,
        decode_rate=decode_rate,
        bottleneck="prefill" if prefill_rate <= decode_rate else "decode",
        ttft_ms=pm.ttft_ms,
        handoff_ms=handoff_s * 1e3,
        tpot_ms=dm.tpot_ms,
        num_gpus=gpus,
        gpus_used=plan.num_gpus,
        prefill=pm,
        decode=dm,
    )


def evaluate_disagg(problem: Problem, plan: DisaggPlan, *, breakdown: bool = True) -> DisaggMetrics:
    """Price ``plan``: each pool at its plan's concurrency, or the one it does best with
    (``breakdown``: each pool's per-operator breakdown too)."""
    check_disagg(problem)
    pp_problem, dp_problem = pool_problems(problem, plan)
    for pool, pool_plan in ((pp_problem, plan.prefill), (dp_problem, plan.decode)):
        pool.space.degree_index(pool_plan.degrees)  # each instance's degrees must suit it
    pm = evaluate(pp_problem, plan.prefill, breakdown=breakdown)
    dm = evaluate(dp_problem, plan.decode, breakdown=breakdown)
    d = plan.prefill.degrees
    handoff = float(handoff_seconds(pp_problem, d.pp, d.tp))
    return combine(problem, plan, pm, dm, handoff)


def with_concurrencies(problem: Problem, plan: DisaggPlan, m: DisaggMetrics) -> DisaggPlan:
    """``plan`` with each pool's concurrency fixed at what ``m`` was priced at."""
    pp_problem, dp_problem = pool_problems(problem, plan)
    return dataclasses.replace(
        plan,
        prefill=with_concurrency(pp_problem, plan.prefill, m.prefill),
        decode=with_concurrency(dp_problem, plan.decode, m.decode),
    )


def instance_rate(problem: Problem, pool: Problem, throughput: np.ndarray | float) -> np.ndarray:
    """Requests per second of one instance of a pool from its throughput (tokens/s)."""
    w = problem.workload
    per_request = w.input_len if pool.workload.phase == "prefill" else w.output_len - 1
    return np.asarray(throughput, dtype=float) / per_request
