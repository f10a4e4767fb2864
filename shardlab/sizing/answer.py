"""A sizing's answer as JSON (``shardlab size --out``); :mod:`shardlab.launch.sized` reads a
deployment of it back as the pools ``shardlab launch`` starts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from shardlab.sizing.deployment import Deployment
from shardlab.sizing.size import Sizer, Sizing

SIZING_SCHEMA = "shardlab.sizing/1"


def sizing_json(sizer: Sizer, results: Sequence[Sizing]) -> dict[str, Any]:
    """The answer as JSON: every rate's deployment (pools with plans) and each type's
    own. ``shardlab launch --plan`` takes a file of one rate."""
    problem = sizer.problem

    def brief(d: Deployment | None) -> dict[str, Any] | None:
        if d is None:
            return None
        return {"serving": d.mode, "label": d.label(), "cost": d.cost, "gpus": d.gpus}

    slos = sizer.caps.slos

    def deployment(s: Sizing) -> dict[str, Any] | None:
        if s.best is None:
            return None
        data = s.best.to_dict(problem, sizer.priced, s.rate)
        if slos:  # the capacity each instance was searched under, and the rates probed
            for pool, out in zip(s.best.pools, data["pools"], strict=True):
                c = pool.capacity
                out["instance_mean_model_rps"] = c.mean_rate
                out["probes"] = [dataclasses.asdict(p) for p in c.probes]
        return data

    return {
        "schema": SIZING_SCHEMA,
        "model": problem.model.name,
        "engine": problem.engine,
        "workload": {
            "input_len": problem.workload.input_len,
            "output_len": problem.workload.output_len,
            "ttft_ms": problem.workload.ttft_ms,
            "tpot_ms": problem.workload.tpot_ms,
            "weight_dtype": problem.workload.weight_dtype,
            "kv_dtype": problem.workload.kv_dtype,
            "draft_tokens": problem.workload.draft_tokens,
            # SLO -> the percentile it holds at (none: every SLO on the mean)
            "slo_percentiles": {k: p for k, (_, p) in slos.items()},
        },
        "traffic": None if sizer.traffic is None else sizer.traffic.source,
        "space": problem.space_kind,
        "timing": problem.timing,
        "max_batch": problem.max_batch,
        "max_tokens": problem.max_tokens,
        "gpus": {
            g: {
                "accelerator": dataclasses.asdict(a),
                "price_per_gpu_hour": (sizer.prices or {}).get(g),
            }
            for g, a in sizer.accelerators.items()
        },
        "cost_unit": "$/hour" if sizer.priced else "GPUs",
        "serving": sizer.serving,
        "max_gpus": sizer.max_gpus,
        "time_limit_s": sizer.time_limit,
        # partial: the time limit left a capacity unproven at some rate (see its rate)
        "status": "partial" if any(s.partial for s in results) else "proven",
        "capacity_solves": sizer.caps.solves,
        "capacity_seconds": round(sizer.caps.seconds, 3),
        "capacity_gaps": [
            {
                "gpu": c.gpu,
                "gpus": c.gpus,
                "role": c.role,
                "servable_rps": c.rate,
                "cpsat_optimum_rps": c.bound,
            }
            for c in sizer.caps.gaps()
        ],
        "rates": [
            {
                "rate_rps": s.rate,
                "deployment": deployment(s),
                # percentile SLOs: the whole deployment simulated at the rate
                "simulated_ms": s.simulated,
                "by_gpu": {g: brief(d) for g, d in s.by_gpu.items()},
                "carried": s.carried,
                # proven: least-cost under the cost model; partial: the cheapest found
                # before the time limit, with the capacities left unproven
                "status": "partial" if s.partial else "proven",
                "unproven": [
                    {"gpu": c.gpu, "gpus": c.gpus, "role": c.role, "status": c.status}
                    for c in s.unproven
                ],
            }
            for s in results
        ],
    }
