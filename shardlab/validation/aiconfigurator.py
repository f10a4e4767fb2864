"""Agreement with AIConfigurator: its grid of agg estimates predicted point by point,
and its default problems with each tool scoring the other's pick."""

from __future__ import annotations

import csv
import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardlab.costmodel import degree_tables, evaluate, silicon
from shardlab.files import markdown_table
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from shardlab.problems.workload import Workload
from shardlab.validation.measurements import read_csv
from shardlab.validation.report import write_output

# -- agreement with another estimator's grid (AIConfigurator's agg estimates) -------------

# aiconfigurator's model ids of the catalog's models (tests/data/aiconfigurator_agg.csv)
REFERENCE_MODELS = {
    "Llama-3.1-8B": "llama-3.1-8b",
    "Llama-3.1-70B": "llama-3.1-70b",
    "Qwen3-32B": "qwen3-32b",
    "Qwen3-235B-A22B": "qwen3-235b-a22b",
    "Qwen3-235B-A22B-FP8": "qwen3-235b-a22b",
    "DeepSeek-V3": "deepseek-v3",
    "Mixtral-8x7B": "mixtral-8x7b",
}
REFERENCE_SYSTEMS = {v: k for k, v in silicon.SYSTEMS.items()}
REFERENCE_METRICS = ("tpot_ms", "ttft_ms", "tokens_s")


@dataclass(frozen=True, kw_only=True)
class Agreement:
    """One reference estimate and shardlab's prediction of the same point."""

    key: str  # model, system, engine, degrees, batch, lengths
    engine: str
    reference: dict[str, float]
    predicted: dict[str, float]


def against_reference(
    path: str | Path, timing: str, *, every: int = 1, engines: tuple[str, ...] | None = None
) -> list[Agreement]:
    """Predict the ok rows of an AIConfigurator ``agg`` grid (one in ``every``): the same
    model, GPUs, degrees, per-rank batch and lengths, in flight, megatron's options."""
    rows = [r for r in csv.DictReader(Path(path).read_text().splitlines()) if r["status"] == "ok"]
    out = []
    for r in rows[::every]:
        engine = r["backend"]
        if engines is not None and engine not in engines:
            continue
        tp, pp, dp = int(r["tp"]), int(r["pp"]), int(r["dp_attn"])
        ep = int(r["moe_ep"] or 1)
        etp = int(r["moe_tp"] or tp * dp // ep)
        degrees = Degrees(pp=pp, tp=tp, dp_attn=dp, ep=ep, etp=etp)
        quant = "bf16" if r["weight_quant"] == "bfloat16" else "fp8"
        kv = "bf16" if r["kv_quant"] == "bfloat16" else "fp8"
        b = int(r["batch_size"])  # per attention-DP rank and pipeline micro-batch
        workload = Workload(
            name="reference",
            phase="request",
            schedule="inflight",
            batch=b * dp * pp,
            input_len=int(r["isl"]),
            output_len=int(r["osl"]),
            weight_dtype=quant,
            kv_dtype=kv,
        )
        gpu = REFERENCE_SYSTEMS[r["system"]]
        problem = Problem.build(
            REFERENCE_MODELS[r["model"]],
            f"{gpu}x{degrees.num_gpus}",
            workload,
            timing=timing,
            engine=engine,
        )
        if degree_tables(problem, degrees).request_range.max_requests_per_rank < b * pp:
            continue  # the engine takes fewer per iteration (its token budget): not the point
        plan = dataclasses.replace(problem.space.megatron_plan(degrees), requests_per_rank=b * pp)
        m = evaluate(problem, plan)
        if "memory" in m.violations:
            continue  # the KV cache holds fewer: not the same point
        out.append(
            Agreement(
                key=f"{r['model']} {r['system']} {engine} {degrees.short()} b={b} "
                f"{r['isl']}/{r['osl']}",
                engine=engine,
                reference={k: float(r[k]) for k in REFERENCE_METRICS},
                predicted={
                    "tpot_ms": m.tpot_ms,
                    "ttft_ms": m.ttft_ms,
                    "tokens_s": m.throughput_tok_s,
                },
            )
        )
    return out


def agreement_summary(rows: list[Agreement]) -> dict[str, float]:
    """Median |predicted / reference - 1| per metric."""
    return {
        k: statistics.median(abs(a.predicted[k] / a.reference[k] - 1.0) for a in rows)
        for k in REFERENCE_METRICS
    }


def write_agreement(
    by_timing: dict[str, list[Agreement]], command: str, *, path: Path | None = None
) -> str:
    """Median errors per timing backend, overall and per engine, as markdown, written to
    ``path`` if given."""
    lines = [
        "# Agreement with AIConfigurator's agg estimates",
        "",
        f"Produced by `{command}`; do not edit by hand. The reference grid and the command "
        "that made it are in `tests/data/`. Each row: the same model, GPUs, degrees, "
        "per-rank batch and lengths, in flight. Median |shardlab / AIConfigurator - 1|:",
        "",
    ]
    body: list[list[object]] = []
    for timing, rows in by_timing.items():
        engines = sorted({a.engine for a in rows})
        for engine in ["all", *engines]:
            sub = rows if engine == "all" else [a for a in rows if a.engine == engine]
            s = agreement_summary(sub)
            shares = (f"{s[k]:.1%}" for k in ("tpot_ms", "ttft_ms", "tokens_s"))
            body.append([timing, engine, len(sub), *shares])
    head = ["timing", "engine", "points", "TPOT", "TTFT", "throughput"]
    lines += markdown_table(head, "llrrrr", body)
    lines += [
        "",
        "TTFT is defined differently: AIConfigurator multiplies the prefill iterations by a "
        "queueing factor (its backends' `_ttft_queuing_factor`: 2 to 4, vLLM's 1 + "
        "log2(b) / 8) and adds a dispatch cost per layer for vLLM; shardlab's TTFT is the "
        "closed loop's mean over a benchmark's requests (its first wave of 10 prompts per "
        "client prefilled cohort after cohort) plus each engine's fitted cost per request "
        "(`shardlab/costmodel/regimes.py`, `shardlab/data/serving/engines.yaml`).",
    ]
    return write_output(path, "\n".join(lines) + "\n")


# -- AIConfigurator's default problems, each tool scoring the other's pick --------------

SIDE_BY_SIDE_COLUMNS = frozenset({"problem", "its_tok_s_gpu", "its_tok_s_gpu_of_ours"})
SIDE_BY_SIDE_PROBLEMS = {  # shardlab's model and cluster of each problem
    "llama70b-h100x8": ("llama-3.1-70b", "h100x8"),
    "qwen235b-h200x16": ("qwen3-235b-a22b", "h200x16"),
    "deepseek-v3-h200x16": ("deepseek-v3", "h200x16"),
    "deepseek-v3-h100x64": ("deepseek-v3", "h100x64"),
}


def side_by_side(path: str | Path) -> list[dict[str, Any]]:
    """Each problem of ``path`` (``tests/data/make_aiconfigurator_default.py``): its
    pick and ours, each scored by both tools (per-GPU output tokens/s, the SLOs)."""
    from shardlab.problems.plan import Plan, read_plan_file

    path = Path(path)
    out = []
    for r in read_csv(path):
        model, cluster = SIDE_BY_SIDE_PROBLEMS[r["problem"]]
        problem = Problem.build(
            model,
            cluster,
            "chat",
            engine="trtllm",
            space_kind="engine",
            batch=8192,
            input_len=1024,
            output_len=256,
            ttft_ms=2000.0,
            tpot_ms=50.0,
        )
        ours_file = path.with_suffix("") / f"{r['problem']}.json"
        ours = Plan.from_dict(read_plan_file(ours_file), problem.model)
        mine = evaluate(problem, ours, breakdown=False)
        tp, pp, dp = (int(r[f"its_{k}"]) for k in ("tp", "pp", "dp"))
        ep, etp = int(r["its_moe_ep"]), int(r["its_moe_tp"])
        if problem.model.moe is None:
            ep, etp = 1, tp * dp
        replicas = problem.cluster.num_gpus // (tp * pp * dp)
        d = Degrees(replicas=replicas, pp=pp, tp=tp, dp_attn=dp, ep=ep, etp=etp)
        theirs_plan = dataclasses.replace(
            problem.space.megatron_plan(d), requests_per_rank=int(r["its_bs"]) * pp
        )
        theirs = evaluate(problem, theirs_plan, breakdown=False)
        out.append(
            {
                "problem": r["problem"],
                "ours": ours.degrees.short(),
                "ours_per_rank": ours.requests_per_rank,
                "ours_tok_s_gpu": mine.throughput_tok_s_per_gpu,
                "ours_by_it": float(r["its_tok_s_gpu_of_ours"]),
                "ours_it_slo": f"{float(r['its_ttft_ms_of_ours']):,.0f} / "
                f"{float(r['its_tpot_ms_of_ours']):.1f}",
                "theirs": d.short(),
                "theirs_per_rank": theirs_plan.requests_per_rank,
                "theirs_tok_s_gpu": float(r["its_tok_s_gpu"]),
                "theirs_by_us": theirs.throughput_tok_s_per_gpu,
                "theirs_by_us_slo": f"{theirs.ttft_ms:,.0f} / {theirs.tpot_ms:.1f}",
                "theirs_by_us_feasible": theirs.feasible,
            }
        )
    return out


def write_side_by_side(
    rows: list[dict[str, Any]], command: str, source: str, *, path: Path | None = None
) -> str:
    """Each problem's two picks, each scored by both tools, as markdown, written to
    ``path`` if given."""
    lines = [
        "# AIConfigurator's default problems: each tool scores the other's pick",
        "",
        f"Produced by `{command}` from `{source}` (its picks and its scores of ours, made by "
        "`tests/data/make_aiconfigurator_default.py`); do not edit by hand. Each problem: "
        "1,024 in / 256 out, TTFT <= 2 s, TPOT <= 50 ms, TensorRT-LLM; tokens/s are output "
        "tokens per GPU; TTFT / TPOT in ms.",
        "",
    ]
    head = ["problem", "shardlab's pick", "its tok/s/GPU by shardlab", "by AIConfigurator"]
    head += ["AIConfigurator's TTFT / TPOT of it", "AIConfigurator's pick"]
    head += ["its tok/s/GPU by AIConfigurator", "by shardlab", "shardlab's TTFT / TPOT of it"]
    head += ["AIConfigurator's score of shardlab's pick / its own"]
    head += ["shardlab's score of its pick / shardlab's"]
    body: list[list[object]] = []
    for r in rows:
        mark = "" if r["theirs_by_us_feasible"] else " (misses an SLO)"
        body.append(
            [
                r["problem"],
                f"{r['ours']} at {r['ours_per_rank']} per rank",
                f"{r['ours_tok_s_gpu']:,.1f}",
                f"{r['ours_by_it']:,.1f}",
                r["ours_it_slo"],
                f"{r['theirs']} at {r['theirs_per_rank']} per rank",
                f"{r['theirs_tok_s_gpu']:,.1f}",
                f"{r['theirs_by_us']:,.1f}",
                f"{r['theirs_by_us_slo']}{mark}",
                f"{r['ours_by_it'] / r['theirs_tok_s_gpu']:.2f}",
                f"{r['theirs_by_us'] / r['ours_tok_s_gpu']:.2f}",
            ]
        )
    lines += markdown_table(head, "llrrrlrrrrr", body)
    return write_output(path, "\n".join(lines) + "\n")
