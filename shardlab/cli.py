"""The ``shardlab`` command line.

Every command prints rich tables for people or, with ``--format json``, one JSON
object for machines. A mistake in the input prints one line and exits with status 2.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, get_args

import typer
from rich.table import Table

from shardlab.cli_options import plan_command, problem_command
from shardlab.costmodel import evaluate as cost_evaluate
from shardlab.costmodel import with_concurrency
from shardlab.errors import ShardlabError, interrupted
from shardlab.files import check_output_dir, check_output_file, folder_name, write_text
from shardlab.problems.catalog import CATALOG, load_model
from shardlab.problems.cluster import builtin_accelerators
from shardlab.problems.disagg import DisaggPlan, check_disagg, check_serving
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem, Timing
from shardlab.problems.workload import PRESETS
from shardlab.render import (
    emit_json,
    err,
    fact_text,
    out,
    plan_json,
    print_breakdown,
    print_disagg,
    print_front,
    print_metrics,
    print_plan,
    problem_json,
    problem_line,
    solve_progress,
    timing_label,
)

if TYPE_CHECKING:
    from shardlab.solvers import Budget, SolveResult

VS_FREE_NEEDS_ENGINE = "--vs-free compares the engine's space with the free one: add --space engine"

# When the command started (this module's import): --time-limit counts from here.
_STARTED = time.perf_counter()

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Find how to spread an LLM over a GPU cluster for inference.",
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from shardlab import __version__

        out.print(f"shardlab {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Find how to spread an LLM over a GPU cluster for inference."""


class Format(StrEnum):
    table = "table"
    json = "json"


FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="table or json.")]


# -- catalog commands ---------------------------------------------------------------


@app.command()
def models(fmt: FormatOpt = Format.table) -> None:
    """List the built-in models: parameters as their cards count them (total, and
    active per token with and without the input embedding) and their layer kinds."""
    rows = []
    for entry in CATALOG:
        m = load_model(entry.name)
        p = m.num_params()
        spans = Counter(a.short() for a in m.attention_layers)
        ffn = Counter(m.layer_kinds)
        softmax = "MLA" if m.mla else ("MHA" if m.num_kv_heads == m.num_heads else "GQA")
        if m.dsa is not None:
            softmax += "+DSA"
        if m.linear is not None:
            softmax += "+" + {"gated_deltanet": "GDN", "kda": "KDA"}[m.linear.kind]
        rows.append(
            {
                "name": entry.name,
                "hf_id": entry.hf_id,
                "layers": m.num_layers,
                "attention": softmax,
                "attention_layers": dict(spans),
                "ffn_layers": dict(ffn),
                "experts": f"{m.moe.num_experts} top-{m.moe.top_k}" if m.moe else "",
                "total_params": p.total,
                "active_params": p.active,
                "active_params_without_embedding": p.active_compute,
                "mtp_params": p.mtp,
                "weight_dtype": m.weight_dtype,
                "note": entry.note,
            }
        )
    if fmt is Format.json:
        emit_json(rows)
        return
    table = Table(title="Built-in models")
    cols = ("name", "layers", "attention", "experts", "params", "active", "w/o emb.", "dtype")
    for col in (*cols, "note"):
        right = col in ("layers", "params", "active", "w/o emb.")
        table.add_column(col, justify="right" if right else "left")
    for r in rows:
        kinds = " + ".join(f"{n} {k}" for k, n in r["attention_layers"].items())
        if len(r["ffn_layers"]) > 1:
            kinds += "; " + " + ".join(f"{n} {k}" for k, n in r["ffn_layers"].items())
        table.add_row(
            r["name"],
            str(r["layers"]),
            r["attention"]
            if len(r["attention_layers"]) == 1 and len(r["ffn_layers"]) == 1
            else f"{r['attention']}: {kinds}",
            r["experts"],
            f"{r['total_params'] / 1e9:,.1f}B",
            f"{r['active_params'] / 1e9:,.1f}B",
            f"{r['active_params_without_embedding'] / 1e9:,.1f}B",
            r["weight_dtype"],
            r["note"],
        )
    out.print(table)


@app.command()
def clusters(fmt: FormatOpt = Format.table) -> None:
    """List the built-in GPUs (write a cluster as GPUxCOUNT, e.g. h100x64)."""
    accs = builtin_accelerators()
    if fmt is Format.json:
        emit_json(
            [
                {"key": k, **{f: getattr(a, f) for f in a.__dataclass_fields__}}
                for k, a in accs.items()
            ]
        )
        return
    table = Table(title="Built-in GPUs (per GPU; bandwidths one way)")
    cols = (
        "key",
        "name",
        "BF16 TF/s",
        "FP8 TF/s",
        "FP4 TF/s",
        "HBM GB",
        "HBM GB/s",
        "NVLink GB/s",
        "net GB/s",
        "GPUs/node",
    )
    for col in cols:
        table.add_column(col, justify="left" if col in ("key", "name") else "right")
    for key, a in accs.items():
        table.add_row(
            key,
            a.name,
            f"{a.bf16_tflops:g}",
            f"{a.fp8_tflops:g}" if a.fp8_tflops else "-",
            f"{a.fp4_tflops:g}" if a.fp4_tflops else "-",
            f"{a.hbm_gb:g}",
            f"{a.hbm_gbps:g}",
            f"{a.nvlink_gbps:g}",
            f"{a.net_gbps:g}",
            str(a.gpus_per_node),
        )
    out.print(table)


@app.command()
def workloads(fmt: FormatOpt = Format.table) -> None:
    """List the workload presets."""
    if fmt is Format.json:
        emit_json([asdict(w) for w in PRESETS.values()])
        return
    table = Table(title="Workload presets")
    table.add_column("name")
    table.add_column("description")
    for w in PRESETS.values():
        table.add_row(w.name, w.describe())
    out.print(table)


@app.command()
@problem_command
def space(problem: Problem, fmt: FormatOpt = Format.table) -> None:
    """Size of the search space: degree tuples, variables, plans."""
    s = problem.space
    p = problem.model.num_params()
    other_tie = "layer" if problem.tie == "kind" else "kind"
    sizes: dict[str, float | None] = {problem.tie: s.log10_size(), other_tie: None}
    if s.configs is None:  # an engine chooses options per model only
        other = Problem.build(problem.model, problem.cluster, problem.workload, tie=other_tie)
        sizes[other_tie] = other.space.log10_size()
    data = {
        "model": problem.model.name,
        "cluster": problem.cluster.name,
        "space": problem.space_kind,
        "tie": problem.tie,
        "total_params": p.total,
        "active_params": p.active,
        "weight_gb": problem.weight_bytes() / 1e9,
        "num_degree_tuples": s.num_degree_tuples,
        "num_variables": s.n_vars,
        "log10_space_size": sizes[problem.tie],
        "log10_space_size_per_kind": sizes["kind"],
        "log10_space_size_per_layer": sizes["layer"],
        "degree_tuples": [asdict(d) for d in s.degree_tuples],
    }
    if s.configs is not None:
        data["engine"] = f"{problem.engine} {s.capability.version}"  # type: ignore[union-attr]
        data["features"] = [list(c.features) for c in s.configs]
    if fmt is Format.json:
        emit_json(data)
        return
    out.print(f"[bold]{problem.model.name}[/] on {problem.cluster.describe()}")
    out.print(
        f"  parameters: {p.total / 1e9:,.1f}B total, {p.active / 1e9:,.1f}B active per token; "
        f"weights {data['weight_gb']:,.0f} GB"
    )
    if s.configs is not None:
        out.print(
            f"  {data['engine']} configurations (degrees + engine features): "
            f"{s.num_degree_tuples} over {len(set(s.degree_tuples))} degree tuples",
            markup=False,
        )
    else:
        out.print(f"  degree tuples: {s.num_degree_tuples}")
    out.print(f"  variables ({problem.tie}): {s.n_vars}")
    out.print(f"  plans, options tied per layer kind: 10^{sizes['kind']:.1f}")
    if sizes["layer"] is not None:
        out.print(f"  plans, options chosen per layer:    10^{sizes['layer']:.1f}")


def _report(problem: Problem, plan: Plan | DisaggPlan, fmt: Format, *, top: int | None) -> None:
    """A plan's metrics (and, with ``top``, its breakdown) as tables or JSON."""
    if isinstance(plan, DisaggPlan):
        _report_disagg(problem, plan, fmt, top=top)
        return
    metrics = cost_evaluate(problem, plan, breakdown=top is not None)
    chosen = problem.workload.schedule == "inflight" and plan.concurrency is None
    plan = with_concurrency(problem, plan, metrics)
    if fmt is Format.json:
        emit_json(
            {
                "problem": problem_json(problem),
                "plan": plan_json(problem, plan),
                "concurrency_chosen": chosen,
                **metrics.to_dict(breakdown=top is not None),
            }
        )
        return
    out.print(problem_line(problem))
    print_plan(problem, plan)
    print_metrics(metrics)
    if chosen:
        out.print(
            f"  concurrency chosen: {metrics.requests_per_rank} requests per attention-DP "
            "rank, the best under the SLOs (give --concurrency or the plan's "
            "'concurrency' to fix it)"
        )
    if top is not None:
        print_breakdown(metrics, top=top)


def _report_disagg(problem: Problem, plan: DisaggPlan, fmt: Format, *, top: int | None) -> None:
    from shardlab.costmodel import evaluate_disagg, with_concurrencies

    metrics = evaluate_disagg(problem, plan, breakdown=top is not None)
    plan = with_concurrencies(problem, plan, metrics)
    if fmt is Format.json:
        emit_json(
            {
                "problem": problem_json(problem),
                "serving": "disagg",
                "plan": plan.to_dict(problem.model, cluster=problem.cluster.name),
                **metrics.to_dict(breakdown=top is not None),
            }
        )
        return
    out.print(problem_line(problem))
    print_disagg(problem, plan, metrics, top=top)


@app.command()
@problem_command
@plan_command
def evaluate(problem: Problem, plan: Plan, fmt: FormatOpt = Format.table) -> None:
    """Score one plan: throughput, latency, memory, feasibility."""
    _report(problem, plan, fmt, top=None)


@app.command()
@problem_command
@plan_command
def explain(
    problem: Problem,
    plan: Plan,
    fmt: FormatOpt = Format.table,
    top: Annotated[int, typer.Option(help="Rows per table.")] = 15,
) -> None:
    """Where one plan's time and memory go, operator by operator, largest first."""
    _report(problem, plan, fmt, top=top)


# -- solving -----------------------------------------------------------------------------


def _solver_options(method: str, **given: object) -> dict[str, object]:
    """Method-specific options the user gave, checked against what the method takes."""
    from shardlab.solvers.registry import accepted_options

    accepted = accepted_options(method)
    options = {k: v for k, v in given.items() if v is not None}
    for key in options:
        if key not in accepted:
            flag = "--" + key.replace("_", "-")
            raise ShardlabError(f"{flag} does not apply to method {method!r}")
    return options


@app.command()
@problem_command
def solve(
    problem: Problem,
    method: Annotated[str, typer.Option("--method", help="See `shardlab solvers`.")] = "cpsat",
    max_evals: Annotated[
        int | None, typer.Option("--max-evals", min=1, help="Most distinct plans to evaluate.")
    ] = None,
    time_limit: Annotated[
        float | None,
        typer.Option("--time-limit", min=0.001, help="Wall seconds for the command, all in."),
    ] = None,
    seed: Annotated[int, typer.Option(min=0, help="Same seed, same plan.")] = 0,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Search workers (cpsat; default: all cores).")
    ] = None,
    sampler: Annotated[
        str | None, typer.Option(help="optuna: tpe (default), gp, cmaes, random or nsga2.")
    ] = None,
    encoding: Annotated[
        str | None,
        typer.Option(
            help="optuna: shared (default; degrees per axis, options per operator) or class."
        ),
    ] = None,
    warm_start: Annotated[
        str | None,
        typer.Option(
            "--warm-start",
            help="optuna: megatron (default: first trials are Megatron plans) or none.",
        ),
    ] = None,
    history: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="optuna tpe: latest trials modelled besides the best (default 1000; 0: all).",
        ),
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(help="optuna: a storage URL (sqlite:///study.db, postgresql://...)."),
    ] = None,
    study: Annotated[str | None, typer.Option(help="optuna: the study name.")] = None,
    policy: Annotated[
        str | None,
        typer.Option(help="rl: start from this policy checkpoint (`shardlab train-policy`)."),
    ] = None,
    algorithm: Annotated[str | None, typer.Option(help="rl: ppo (default) or reinforce.")] = None,
    out_file: Annotated[
        str | None, typer.Option("--out", help="Write the best plan here (JSON).")
    ] = None,
    vs_free: Annotated[
        bool,
        typer.Option(
            "--vs-free",
            help="With --space engine: also solve the free space (CP-SAT) and report what "
            "per-operator sharding would add if the engine ran it.",
        ),
    ] = False,
    plot: Annotated[
        str, typer.Option(help="--objective pareto: write the front's figure here (PNG).")
    ] = "pareto.png",
    serving: Annotated[
        str,
        typer.Option(
            help="agg: one pool of replicas; disagg: a prefill and a decode pool (cpsat "
            "proves each, the pools' sizes enumerated); best: both, the better chosen."
        ),
    ] = "agg",
    fmt: FormatOpt = Format.table,
) -> None:
    """Search the best plan with one method; prints it and its ratio to megatron.

    With ``--objective pareto``: the front of throughput per GPU against TPOT (and TTFT
    for prefill-heavy workloads) over plans and concurrency (in flight every concurrency
    up to ``--batch``; static, powers of two up to it), as a table, a PNG (``--plot``)
    and, in JSON, a ``pareto`` list.
    """
    from shardlab.solvers import Budget
    from shardlab.solvers.registry import get_solver

    options = _solver_options(
        method,
        workers=workers,
        sampler=sampler,
        encoding=encoding,
        warm_start=warm_start,
        history=history,
        storage=storage,
        study=study,
        policy=policy,
        algorithm=algorithm,
    )
    solver = get_solver(method, **options)
    if vs_free and problem.space_kind != "engine":
        raise ShardlabError(VS_FREE_NEEDS_ENGINE)
    if out_file is not None:
        check_output_file(out_file, flag="--out")
    if problem.workload.objective == "pareto":
        check_output_file(plot, flag="--plot")
    if max_evals is None and time_limit is None:
        budget = Budget() if not solver.exact else Budget(max_evals=None, seconds=600.0)
    else:
        # The limit is the command's: its clock started with the command.
        budget = Budget(max_evals=max_evals, seconds=time_limit, started=_STARTED)
    if check_serving(serving) != "agg":
        _solve_serving(problem, serving, method, options, budget, seed, out_file, fmt)
        return
    if problem.workload.objective == "pareto":
        _solve_front(problem, method, options, budget, seed, plot, out_file, fmt)
        return
    with solve_progress(method, budget.max_evals, budget.seconds, budget.started) as callback:
        result = solver.solve(problem, budget=budget, seed=seed, callback=callback)
    if result.status in ("unknown", "infeasible"):  # no plan meets memory and the SLOs
        raise ShardlabError(f"{method}: {result.message}")
    baseline = get_solver("megatron").solve(problem, seed=seed)
    free = _free_optimum(problem, seed) if vs_free else None
    if out_file is not None and result.plan is not None:
        write_text(out_file, result.plan.to_json(problem.model, cluster=problem.cluster.name))
    ratio = None
    if result.metrics is not None and baseline.metrics is not None and baseline.metrics.feasible:
        from shardlab.compare import quality

        ratio = quality(result.metrics.objective, baseline.metrics.objective)
    if fmt is Format.json:
        data = result.to_dict(problem)
        data.pop("facts")
        emit_json(
            {
                "problem": problem_json(problem),
                **data,
                "facts": result.facts,
                "baseline": {
                    "method": "megatron",
                    "metrics": baseline.metrics.to_dict() if baseline.metrics else None,
                    "plan": baseline.to_dict(problem)["plan"],
                    "ratio": ratio,
                },
                **({"free": _free_json(problem, result, free)} if free is not None else {}),
            }
        )
    else:
        out.print(problem_line(problem))
        out.print(
            f"method {method}, seed {seed}: [bold]{result.status}[/] after {result.n_evals:,} "
            f"evaluations in {result.wall_s:.1f} s"
            + (f" ({result.message})" if result.message else "")
        )
        _print_facts(result.facts)
        if result.plan is not None and result.metrics is not None:
            print_plan(problem, result.plan)
            print_metrics(result.metrics)
            if ratio is not None:
                out.print(f"  ratio to the megatron plan: [bold]{ratio:.3f}[/]")
        if free is not None:
            gain = _free_json(problem, result, free)
            out.print(
                f"free space (every per-operator sharding): cpsat {free.status}, "
                f"{gain['throughput_tok_s'] or 0:,.0f} tok/s, plan {gain['degrees']}"
            )
            if gain["ratio"] is not None:
                out.print(
                    f"  free optimum over the {problem.engine} plan: [bold]{gain['ratio']:.3f}"
                    "[/] (what per-operator sharding would add if the engine ran it)"
                )
        if out_file is not None and result.plan is not None:
            out.print(f"wrote {out_file}")
    if result.status == "error":
        raise SystemExit(1)


def _solve_serving(
    problem: Problem,
    serving: str,
    method: str,
    options: dict[str, object],
    budget: Budget,
    seed: int,
    out_file: str | None,
    fmt: Format,
) -> None:
    """``--serving disagg`` or ``best``: the disaggregated optimum (and the aggregated
    one, for ``best``), each with its plan and metrics."""
    from shardlab.solvers import Budget
    from shardlab.solvers.cpsat.disagg import solve_disagg

    check_disagg(problem)
    if method != "cpsat":
        raise ShardlabError(
            f"--serving {serving} is searched by cpsat (each pool proven, the pools' sizes "
            f"enumerated); {method} does not search it: use --method cpsat or --serving agg"
        )
    agg = None
    disagg_budget = budget
    if serving == "best":
        from shardlab.solvers.registry import get_solver

        # the aggregated search first, on half the time when there is a limit
        agg_budget = (
            budget
            if budget.seconds is None
            else Budget(max_evals=None, seconds=budget.seconds / 2, started=budget.started)
        )
        with solve_progress("cpsat (agg)", None, agg_budget.seconds, budget.started) as cb:
            agg = get_solver("cpsat", **options).solve(
                problem, budget=agg_budget, seed=seed, callback=cb
            )
    workers = options.get("workers")
    with solve_progress("cpsat (disagg)", None, budget.seconds, budget.started) as callback:
        result = solve_disagg(
            problem,
            budget=disagg_budget,
            seed=seed,
            callback=callback,
            workers=workers if isinstance(workers, int) else None,
        )
    unmet = [r for r in (result, agg) if r is not None and r.status in ("unknown", "infeasible")]
    if len(unmet) == (2 if agg is not None else 1):  # neither mode has a plan
        why = unmet[-1].message  # the aggregated search's, when there is one: it names the SLO
        raise ShardlabError(f"--serving {serving}: no plan in either mode; {why}")
    chosen = "disagg"
    if agg is not None and (result.metrics is None or agg.objective > result.objective):
        chosen = "agg"
    if out_file is not None:
        if chosen == "disagg" and result.plan is not None:
            text = json.dumps(
                result.plan.to_dict(problem.model, cluster=problem.cluster.name), indent=2
            )
            write_text(out_file, text)
        elif chosen == "agg" and agg is not None and agg.plan is not None:
            write_text(out_file, agg.plan.to_json(problem.model, cluster=problem.cluster.name))
    ratio = None
    if agg is not None and agg.metrics is not None and result.metrics is not None:
        ratio = result.metrics.objective / agg.metrics.objective
    if fmt is Format.json:
        data = {"problem": problem_json(problem), "disagg": result.to_dict(problem)}
        if agg is not None:
            data["agg"] = agg.to_dict(problem)
            data["chosen"] = chosen
            data["disagg_over_agg"] = ratio
        emit_json(data if agg is not None else {"problem": problem_json(problem), **data["disagg"]})
    else:
        out.print(problem_line(problem))
        if agg is not None:
            out.print(
                f"[bold]aggregated[/] cpsat: [bold]{agg.status}[/] in {agg.wall_s:.1f} s"
                + (f" ({agg.message})" if agg.message else "")
            )
            if agg.plan is not None and agg.metrics is not None:
                print_plan(problem, agg.plan)
                print_metrics(agg.metrics)
        out.print(
            f"[bold]disaggregated[/] cpsat: [bold]{result.status}[/] after "
            f"{result.facts.get('pool_solves', 0)} pool solves in {result.wall_s:.1f} s"
            + (f" ({result.message})" if result.message else "")
        )
        _print_facts(result.facts)
        if result.plan is not None and result.metrics is not None:
            print_disagg(problem, result.plan, result.metrics)
            _print_pairs(problem, result.pairs)
        if agg is not None:
            verdict = (
                f"disaggregated / aggregated: [bold]{ratio:.3f}[/]; {chosen} chosen"
                if ratio is not None
                else f"{chosen} chosen (the other has no feasible plan)"
            )
            out.print(verdict)
        if out_file is not None:
            out.print(f"wrote {out_file} (the {chosen} plan)")
    statuses = [result.status] + ([agg.status] if agg is not None else [])
    if "error" in statuses:
        raise SystemExit(1)


def _print_pairs(
    problem: Problem, pairs: tuple[tuple[int, int, int, int, float, float], ...]
) -> None:
    """Why this pair of pools: the pairs evaluated, best first, in tokens/s."""
    o = problem.workload.output_len
    table = Table(title="pairs of pools evaluated (the rest pruned by their bounds), tok/s")
    for col in ("prefill", "decode", "GPUs", "bound", "value"):
        table.add_column(col, justify="left" if col in ("prefill", "decode") else "right")
    for gp, x, gd, y, bound, value in sorted(pairs, key=lambda r: -r[5])[:8]:
        table.add_row(
            f"{x} x {gp} GPUs", f"{y} x {gd} GPUs", str(x * gp + y * gd),
            f"{bound * o:,.0f}", f"{value * o:,.0f}",
        )  # fmt: skip
    out.print(table)


def _print_facts(facts: dict[str, object]) -> None:
    """A solver's facts, a line each (its lists and tables are the JSON's)."""
    for key, value in facts.items():
        if not isinstance(value, list | dict):
            out.print(f"  {key}: {fact_text(key, value)}", markup=False)


def _free_optimum(problem: Problem, seed: int) -> SolveResult:
    """CP-SAT over the free space of ``problem`` (the yardstick of --vs-free)."""
    from shardlab.solvers import Budget
    from shardlab.solvers.registry import get_solver

    free = get_solver("cpsat").solve(
        problem.with_space("free"), budget=Budget(max_evals=None, seconds=600.0), seed=seed
    )
    if free.status == "unknown":
        raise ShardlabError(f"--vs-free: {free.message}")
    return free


def _free_json(problem: Problem, result: SolveResult, free: SolveResult) -> dict:
    from shardlab.compare import quality

    ratio = None
    if result.metrics is not None and free.metrics is not None and free.metrics.feasible:
        ratio = 1 / quality(result.metrics.objective, free.metrics.objective)
    return {
        "method": "cpsat",
        "space": "free",
        "status": free.status,
        "throughput_tok_s": free.metrics.throughput_tok_s if free.metrics else None,
        "degrees": free.plan.degrees.short() if free.plan else None,
        "plan": free.to_dict(problem)["plan"],
        "ratio": ratio,
    }


def _solve_front(
    problem: Problem,
    method: str,
    options: dict[str, object],
    budget: Budget,
    seed: int,
    plot: str,
    out_file: str | None,
    fmt: Format,
) -> None:
    from shardlab.plots import plot_front
    from shardlab.solvers.pareto import levels_of, solve_front

    levels = levels_of(problem)
    with solve_progress(method, None, None) as callback:
        result = solve_front(
            problem, method, budget=budget, seed=seed, options=options, callback=callback
        )
    best = result.best
    if out_file is not None and best is not None:  # the front's highest throughput per GPU
        write_text(out_file, best.plan.to_json(problem.model, cluster=problem.cluster.name))
    if result.front:
        plot_front(
            plot,
            problem,
            result.front,
            result.megatron,
            title=f"{problem.name}: {method}, batch {', '.join(map(str, levels))}",
        )
    if fmt is Format.json:
        emit_json({"problem": problem_json(problem), **result.to_dict(problem)})
    else:
        out.print(problem_line(problem))
        out.print(
            f"method {method}, seed {seed}: [bold]{result.status}[/] front of "
            f"{len(result.front)} points over batch {', '.join(map(str, levels))} after "
            f"{result.n_evals:,} evaluations in {result.wall_s:.1f} s"
            + (f" ({result.message})" if result.message else "")
        )
        print_front(problem, result.front, result.megatron)
        if result.front:
            out.print(f"wrote {plot}")
        if out_file is not None and best is not None:
            out.print(f"wrote {out_file} (the plan of batch {best.batch}, the front's highest)")
    if result.status == "error":
        raise SystemExit(1)


@app.command("train-policy")
def train_policy(
    suite: Annotated[
        str, typer.Option(help="Instances to train on: train, small, medium, all or a name.")
    ] = "train",
    out_file: Annotated[str, typer.Option("--out", help="Checkpoint to write.")] = "policy.pt",
    evals: Annotated[
        int, typer.Option("--evals", min=1, help="Evaluations per instance and round.")
    ] = 500,
    rounds: Annotated[int, typer.Option(min=1, help="Passes over the instances.")] = 1,
    seed: Annotated[int, typer.Option(min=0, help="Same seed, same policy.")] = 0,
    resume: Annotated[
        str | None, typer.Option(help="Continue from a checkpoint this command wrote.")
    ] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Pretrain the RL policy across a suite's instances; `solve --method rl --policy`
    starts from it. The checkpoint is rewritten (atomically) after every instance."""
    from shardlab.problems.suite import get_suite
    from shardlab.solvers.rl.train import TrainProgress
    from shardlab.solvers.rl.train import train_policy as train

    instances = get_suite(suite)
    check_output_file(out_file, flag="--out")
    log: list[TrainProgress] = []

    def progress(p: TrainProgress) -> None:
        log.append(p)
        best = "-" if p.best is None else f"{p.best:,.1f}"
        err.print(
            f"  round {p.round + 1} {p.instance}: {p.evals} evals, best {best}, {p.seconds:.0f} s"
        )

    path = train(
        instances,
        out=out_file,
        seed=seed,
        evals_per_instance=evals,
        rounds=rounds,
        resume=resume,
        progress=progress,
    )
    if fmt is Format.json:
        emit_json(
            {
                "out": str(path),
                "instances": [i.name for i in instances],
                "progress": [asdict(p) for p in log],
            }
        )
    else:
        out.print(f"trained on {len(instances)} instances x {rounds} round(s); wrote {path}")


@app.command()
def launch(
    plan_file: Annotated[str, typer.Option("--plan", help="A plan JSON (shardlab solve --out).")],
    engine: Annotated[str, typer.Option(help="trtllm, vllm or sglang.")],
    model_path: Annotated[
        str | None,
        typer.Option("--model-path", help="What the engine loads (default: the HF id)."),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Default: the plan's model.")
    ] = None,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="Default: the plan's cluster.")
    ] = None,
    kv_dtype: Annotated[str | None, typer.Option("--kv-dtype", help="bf16 or fp8.")] = None,
    draft_tokens: Annotated[
        int | None, typer.Option("--draft-tokens", min=1, help="MTP drafts per step.")
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option("--max-tokens", min=1, help="Tokens per iteration per DP rank."),
    ] = None,
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="Let the engine run the model's code.")
    ] = False,
    config_dir: Annotated[
        str, typer.Option("--config-dir", help="Where config files the engine takes go.")
    ] = ".",
    fmt: FormatOpt = Format.table,
) -> None:
    """Print the engine's own launch commands for a plan, one per node of each replica,
    and write the config files it takes; a plan the engine cannot run is refused."""
    from shardlab.launch import build_disagg_launch, build_launch
    from shardlab.problems.catalog import hf_id_of
    from shardlab.problems.disagg import DISAGG_SCHEMA
    from shardlab.problems.plan import read_plan_file

    check_output_dir(config_dir, flag="--config-dir")
    data = read_plan_file(plan_file)
    if not isinstance(data, dict):
        raise ShardlabError(f"{plan_file}: a plan must be a JSON object")
    model = model or data.get("model") or ""
    cluster = cluster or data.get("cluster") or ""
    if not model or not cluster:
        raise ShardlabError(f"{plan_file}: names no model or cluster; give --model and --cluster")
    overrides: dict[str, object] = {}
    if kv_dtype is not None:
        overrides["kv_dtype"] = kv_dtype
    if draft_tokens is not None:
        # the engine measures acceptance itself; launch prices nothing
        overrides.update(draft_tokens=draft_tokens, acceptance=0.0)
    problem = Problem.build(model, cluster, engine=engine, max_tokens=max_tokens, **overrides)
    path = model_path or hf_id_of(problem.model) or problem.model.name
    if data.get("schema") == DISAGG_SCHEMA:
        dplan = DisaggPlan.from_dict(data, problem.model, where=plan_file, cluster=problem.cluster)
        spec = build_disagg_launch(
            problem,
            dplan,
            model_path=path,
            trust_remote_code=trust_remote_code,
            config_dir=config_dir,
        )
    else:
        plan = Plan.from_dict(data, problem.model, where=plan_file)
        problem.space.degree_index(plan.degrees)  # the degrees must suit this cluster
        spec = build_launch(
            problem,
            plan,
            model_path=path,
            trust_remote_code=trust_remote_code,
            config_dir=config_dir,
        )
    for name, content in spec.files:
        write_text(name, content)
    if fmt is Format.json:
        emit_json(spec.to_dict())
        return
    out.print(
        f"{problem.model.name} on {problem.cluster.name} with {engine} {spec.version}"
        + (f" ({', '.join(spec.features)})" if spec.features else ""),
        markup=False,
    )
    for c in spec.commands:
        where = f"{c.role} instance" if c.role else "replica"
        where += f" {c.replica}, node {c.node}"
        if c.nodes > 1:
            where += f" (node rank {c.node_rank} of {c.nodes})"
        out.print(f"# {where}", markup=False)
        out.print(c.shell(), markup=False, soft_wrap=True)
    if spec.router:
        out.print("# the router", markup=False)
        out.print(spec.router_shell(), markup=False, soft_wrap=True)
    for name, _ in spec.files:
        out.print(f"wrote {name}", markup=False)
    for note in spec.notes:
        out.print(f"note: {note}", markup=False, soft_wrap=True)


@app.command()
def engines(fmt: FormatOpt = Format.table) -> None:
    """What each engine can launch: its pinned version and features, with sources."""
    from shardlab.problems.capability import ENGINES, capability, option_coverage

    rows = []
    for name in ENGINES:
        cap = capability(name)
        rows.append(
            {
                "engine": name,
                "version": cap.version,
                "uneven_pipeline_stages": cap.uneven_pp,
                "features": [
                    {"name": f.name, "turns_on": f.turns_on, "source": f.source, "doc": f.doc}
                    for f in cap.features
                ],
            }
        )
    coverage = {name: option_coverage(name) for name in ENGINES}
    pairs = list(dict.fromkeys(k for c in coverage.values() for k in c))
    for r in rows:
        r["options"] = [
            {"operator": op, "option": opt, "features": coverage[r["engine"]][(op, opt)]}
            for op, opt in pairs
        ]
    if fmt is Format.json:
        emit_json(rows)
        return
    table = Table(title="Engines (--space engine, shardlab launch)")
    for col in ("engine", "feature", "turned on by", "what it does", "source"):
        table.add_column(col, overflow="fold")
    for r in rows:
        for f in r["features"]:
            table.add_row(
                f"{r['engine']} {r['version']}", f["name"], f["turns_on"], f["doc"], f["source"]
            )
    out.print(table)
    options = Table(
        title="Operator options each engine runs (with the fewest features it takes; "
        "'-': no equivalent)"
    )
    for col in ("operator", "option", *ENGINES):
        options.add_column(col)
    for op, opt in pairs:
        cells = []
        for name in ENGINES:
            feats = coverage[name][(op, opt)]
            cells.append("-" if feats is None else "+".join(feats) or "default")
        options.add_row(op, opt, *cells)
    out.print(options)


@app.command()
def solvers(fmt: FormatOpt = Format.table) -> None:
    """List the registered methods."""
    from shardlab.solvers.registry import available_solvers, solver_class

    rows = []
    for name in available_solvers():
        try:
            cls = solver_class(name)
            rows.append(
                {
                    "name": name,
                    "exact": cls.exact,
                    "description": cls.description,
                    "available": True,
                }
            )
        except ImportError as exc:  # an optional dependency is missing
            rows.append({"name": name, "exact": False, "description": str(exc), "available": False})
    if fmt is Format.json:
        emit_json(rows)
        return
    table = Table(title="Methods")
    for col in ("name", "exact", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], "yes" if r["exact"] else "", r["description"])
    out.print(table)


@app.command()
@problem_command
def compare(
    problem: Problem,
    methods: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated methods, each with options as METHOD:KEY=VALUE "
            "(e.g. optuna:sampler=gp:encoding=class). [default: random,anneal,genetic]"
        ),
    ] = None,
    suite: Annotated[
        str | None,
        typer.Option(
            help="small, medium, large, train, heldout, all, instance names; comma-separated."
        ),
    ] = None,
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per method.")] = 3,
    max_evals: Annotated[int | None, typer.Option("--max-evals", min=1)] = 2000,
    budgets: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated evaluation budgets (e.g. 500,2000,5000), instead of "
            "--max-evals; methods whose search ignores the budget run once, at the largest."
        ),
    ] = None,
    time_limit: Annotated[float | None, typer.Option("--time-limit", min=0.001)] = None,
    policy: Annotated[
        str | None,
        typer.Option(help="Also run rl from this pretrained policy (as method rl+policy)."),
    ] = None,
    jobs: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 2,
    executor: Annotated[
        str,
        typer.Option(
            help="Where runs run: local (--jobs worker processes) or ray (one task per run "
            "on the Ray cluster at --address; pip install -e '.[ray]')."
        ),
    ] = "local",
    address: Annotated[
        str | None,
        typer.Option(help="The Ray cluster's address (e.g. 10.0.0.1:6379), with --executor ray."),
    ] = None,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Run everything again: forget the finished runs in results/<name>/runs.jsonl "
            "and results.json (by default a re-run runs only the runs missing there).",
        ),
    ] = False,
    engines: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated engines to run every instance on (default: --engine); "
            "results name instances INSTANCE/ENGINE."
        ),
    ] = None,
    vs_free: Annotated[
        bool,
        typer.Option(
            "--vs-free",
            help="With --space engine: also CP-SAT over the free space, the yardstick.",
        ),
    ] = False,
    serving: Annotated[
        str,
        typer.Option(
            help="agg: the methods plan one pool; disagg: CP-SAT's disaggregated optimum "
            "(cpsat/disagg) instead, megatron kept as the reference; best: both."
        ),
    ] = "agg",
    aiconfigurator: Annotated[
        str | None,
        typer.Option(
            help="With --serving best: AIConfigurator's agg-vs-disagg choices on the same "
            "problems (CSV of tests/data/make_aiconfigurator_disagg.py), beside the optima."
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Results folder name.")] = None,
    results_dir: Annotated[str, typer.Option("--results-dir")] = "results",
    fmt: FormatOpt = Format.table,
) -> None:
    """Run methods on a suite (or the given problem) over seeds; write results/<name>/."""
    from pathlib import Path

    from shardlab.compare import read_anchor, run_comparison, summarize, write_results
    from shardlab.problems.suite import Instance, get_suite
    from shardlab.solvers.registry import get_solver, parse_method

    anchor = None
    if aiconfigurator is not None:
        if serving != "best":
            raise ShardlabError(
                "--aiconfigurator sets AIConfigurator's agg-vs-disagg choice beside both "
                "optima: add --serving best"
            )
        anchor = read_anchor(aiconfigurator)
    if check_serving(serving) == "disagg":
        if methods not in (None, "cpsat"):
            raise ShardlabError(
                "--serving disagg runs CP-SAT's disaggregated optimum; drop --methods (or "
                "give --methods cpsat), or use --serving best to compare methods with it"
            )
        methods = ""
    elif methods is None:
        methods = "random,anneal,genetic"
    specs = [m.strip() for m in methods.split(",") if m.strip()]
    if not specs and policy is None and serving != "disagg":
        raise ShardlabError(
            f"--methods {methods!r}: name one or more methods (see `shardlab solvers`)"
        )
    parsed = {spec: parse_method(spec) for spec in specs}
    wanted = [spec for spec, (_, opts) in parsed.items() if not opts]
    variants = [(spec, name, opts) for spec, (name, opts) in parsed.items() if opts]
    if suite is not None:
        instances = get_suite(suite)
        label = name or suite
    else:
        w = problem.workload
        instances = (
            Instance(
                name=problem.name.replace(" ", "").replace(",", "-"),
                model=problem.model.source.removeprefix("catalog:"),
                cluster=problem.cluster.name,
                workload="chat",
                size="small",
                split="train",
                tie=problem.tie,
                overrides=tuple((k, v) for k, v in asdict(w).items() if k != "name"),
            ),
        )
        label = name or "custom"
    command = "shardlab compare " + " ".join(sys.argv[2:])
    done = []

    def on_done(r: dict) -> None:
        done.append(r)
        err.print(f"  [{len(done)}] {r['instance']} {r['method']} seed {r['seed']}: {r['status']}")

    levels = None
    if budgets is not None:
        try:
            levels = sorted({int(b) for b in budgets.split(",") if b.strip()})
        except ValueError:
            levels = []
        if not levels or levels[0] < 1:
            raise ShardlabError(f"--budgets {budgets!r}: give positive integers, e.g. 500,2000")
    if policy is not None:
        get_solver("rl", policy=policy)  # a bad checkpoint fails here, not in every run
    from shardlab.problems.capability import capability

    engine_list: list[str] = []
    if engines is not None:
        engine_list = [e.strip() for e in engines.split(",") if e.strip()]
        for e in engine_list:
            capability(e)  # an unknown engine fails here, not in every run
        if not engine_list:
            raise ShardlabError(f"--engines {engines!r}: name one or more of trtllm, vllm, sglang")
    if vs_free and problem.space_kind != "engine":
        raise ShardlabError(
            "--vs-free compares the engine space with the free one: add --space engine"
        )
    from shardlab.executors import EXECUTORS
    from shardlab.journal import JOURNAL, Journal

    if executor not in EXECUTORS:
        raise ShardlabError(f"--executor {executor!r}: use one of {', '.join(EXECUTORS)}")
    out_dir = check_output_dir(Path(results_dir) / folder_name(label), flag="--results-dir")
    journal_path = out_dir / JOURNAL
    if fresh:
        journal_path.unlink(missing_ok=True)
    journal = Journal(journal_path)
    if not fresh and (taken := journal.start_from(out_dir / "results.json")):
        err.print(f"{journal_path}: started from {out_dir / 'results.json'} ({taken} runs)")

    def on_resume(reused: int, total: int) -> None:
        if reused:
            err.print(f"{journal_path}: {reused} of {total} runs finished before, not run again")

    results = run_comparison(
        instances,
        wanted,
        seeds,
        max_evals=max_evals if levels is None else max(levels),
        seconds=time_limit,
        jobs=jobs,
        on_done=on_done,
        budgets=levels,
        variants=variants + ([("rl+policy", "rl", {"policy": policy})] if policy else []),
        timing=problem.timing,
        engine=problem.engine,
        engines=engine_list,
        space_kind=problem.space_kind,
        vs_free=vs_free,
        journal=journal,
        executor=executor,  # type: ignore[arg-type]
        address=address,
        on_resume=on_resume,
        serving=serving,
    )
    rows = summarize(results)
    write_results(out_dir, label, command, results, rows, timing_label(problem), anchor)
    if fmt is Format.json:
        emit_json({"name": label, "summary": rows, "out_dir": str(out_dir)})
        return
    table = Table(title=f"comparison {label} (means over {seeds} seeds)")
    for col in (
        "instance",
        "method",
        "throughput",
        "ratio to best",
        "ratio to megatron",
        "evals to 99%",
        "wall s",
    ):
        table.add_column(col, justify="left" if col in ("instance", "method") else "right")
    for r in rows:
        table.add_row(
            r["instance"] + ("*" if r["best_is_proven"] else ""),
            r["method"] + (f" @{r['budget']:,}" if r.get("budget") else ""),
            f"{r['throughput_tok_s']:,.0f}" if r["throughput_tok_s"] else "-",
            f"{r['ratio_to_best']:.3f}",
            f"{r['ratio_to_megatron']:.3f}" if r["ratio_to_megatron"] is not None else "-",
            f"{r['evals_to_99pct']:,}" if r["evals_to_99pct"] is not None else "-",
            f"{r['wall_s']:.1f}" if r["wall_s"] is not None else "-",
        )
    out.print(table)
    out.print(f"wrote {out_dir}/ (results.json, results.csv, summary.md, convergence.png)")


@app.command()
def bench(
    what: Annotated[
        str,
        typer.Argument(
            help="evaluator: plans per second of the cost model; cpsat: time to the "
            "proven optimum from 64 to 2,048 GPUs."
        ),
    ],
    instances: Annotated[
        str | None, typer.Option(help="Comma-separated suite instances (default: a fixed set).")
    ] = None,
    out_path: Annotated[
        str | None, typer.Option("--out", help="Markdown table to write (e.g. results/...).")
    ] = None,
    time_limit: Annotated[
        float, typer.Option("--time-limit", min=1.0, help="cpsat: seconds per run.")
    ] = 600.0,
    repeats: Annotated[
        int,
        typer.Option(
            min=1, help="evaluator: best of this many repeats (more: less of other load)."
        ),
    ] = 3,
    fmt: FormatOpt = Format.table,
) -> None:
    """Measure speed on this machine; --out writes the table with its command."""
    from dataclasses import asdict as _asdict

    from shardlab import bench as b

    command = "shardlab bench " + " ".join(sys.argv[2:])
    if out_path is not None:
        check_output_file(out_path, flag="--out", parents=True)
    rows: list = []
    if what == "evaluator":
        names = (
            [n.strip() for n in instances.split(",") if n.strip()]
            if instances
            else list(b.EVALUATOR_INSTANCES)
        )
        for name in names:
            rows.append(b.evaluator_speed(name, repeats=repeats))
            err.print(f"  {name}: {rows[-1].warm_plans_s:,.0f} plans/s warm")
        text = b.evaluator_markdown(command, rows, repeats)
    elif what == "cpsat":
        if instances:
            raise ShardlabError("bench cpsat runs a fixed set of problems; drop --instances")
        for model, cluster, tie, batch in b.EXACT_RUNS:
            rows.append(b.exact_speed(model, cluster, tie, batch, time_limit))
            r = rows[-1]
            err.print(f"  {model} {cluster} tie {tie}: {r.status} in {r.seconds:.1f} s")
        text = b.exact_markdown(command, rows, time_limit)
    else:
        raise ShardlabError(f"bench {what!r}: measure 'evaluator' or 'cpsat'")
    if out_path is not None:
        write_text(out_path, text)
    if fmt is Format.json:
        emit_json([_asdict(r) for r in rows])
        return
    out.print(text)


FilterOpt = Annotated[
    str | None, typer.Option(help="Measured serving only: keep these (comma-separated).")
]


def _filters(**given: str | None) -> dict[str, list[str]]:
    return {k: [x for x in v.split(",") if x.strip()] for k, v in given.items() if v}


@app.command()
def validate(
    measurements: Annotated[
        str | None,
        typer.Option(
            help="Your measurements (CSV in shardlab's columns or in the measured serving "
            "sample's), or aiconfigurator-sample (aiconfigurator-core's measured serving)."
        ),
    ] = None,
    out_path: Annotated[str | None, typer.Option("--out", help="Markdown report to write.")] = None,
    engine: Annotated[
        str, typer.Option(help="Engine whose measured kernels price the silicon column.")
    ] = "trtllm",
    calibration: Annotated[
        str | None, typer.Option(help="Also predict with these corrections (YAML).")
    ] = None,
    timing: Annotated[
        str | None,
        typer.Option(help="roofline or silicon (default: both; measured serving: silicon)."),
    ] = None,
    gpu: FilterOpt = None,
    backend: FilterOpt = None,
    family: FilterOpt = None,
    mode: FilterOpt = None,
    protocol: FilterOpt = None,
    peer: Annotated[
        str | None,
        typer.Option(
            help="Measured serving: another estimator's predictions of the same rows (CSV of "
            "tests/data/make_aiconfigurator_sample.py), compared on the rows both price."
        ),
    ] = None,
    aiconfigurator: Annotated[
        str | None,
        typer.Option(help="Instead: agreement with this grid of AIConfigurator agg estimates."),
    ] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Predict every measurement and compare: the published ones (written to
    results/validation.md), measured serving (aiconfigurator-sample) or yours."""
    from pathlib import Path

    if out_path is not None:
        check_output_file(out_path, flag="--out", parents=True)
    if timing is not None and timing not in get_args(Timing):
        raise ShardlabError(f"--timing {timing!r} is not one of {', '.join(get_args(Timing))}")
    if aiconfigurator is not None:
        _agreement(aiconfigurator, out_path or "aiconfigurator.md", fmt)
        return

    from shardlab.problems.calibration import Calibration
    from shardlab.validation import load_measurements, predict_all
    from shardlab.validation import write_report as write_validation

    filters = _filters(gpu=gpu, backend=backend, family=family, mode=mode, protocol=protocol)
    measured = load_measurements(measurements, filters)
    cal = Calibration.load(calibration) if calibration is not None else None
    command = "shardlab validate" + "".join(
        f" --{k} {v}"
        for k, v in (
            ("measurements", measurements),
            ("out", out_path),
            ("engine", engine if engine != "trtllm" else None),
            ("calibration", calibration),
            ("timing", timing),
            *((k, ",".join(v)) for k, v in filters.items()),
            ("peer", peer),
        )
        if v is not None
    )
    if measured.serving:
        md = out_path or "serving.md"
        _validate_serving(measured, timing or "silicon", cal, md, command, peer, fmt)
        return
    if peer is not None:
        raise ShardlabError("--peer compares measured serving rows (the sample's columns)")
    rows = measured.rows
    if out_path is None:
        out_path = "results/validation.md" if measurements is None else "validation.md"
    by_timing = {
        t: predict_all(t, engine, rows) for t in ([timing] if timing else get_args(Timing))
    }
    if cal is not None:
        by_timing[f"{cal.timing}+calibration"] = predict_all(cal.timing, engine, rows, cal)
    source = measurements or "shardlab/data/validation/measured.csv"
    summaries = write_validation(Path(out_path), by_timing, command, source)
    first = next(iter(by_timing))
    if fmt is Format.json:
        emit_json(
            {
                "summary": summaries,
                "rows": {
                    t: [{**_row_dict(r), "ratio": r.ratio} for r in rs]
                    for t, rs in by_timing.items()
                },
                "refused": [asdict(x) for x in measured.refused],
            }
        )
        return
    table = Table(title="cost model vs measurements")
    for col in ("id", "metric", "measured", *(f"{t} ratio" for t in by_timing), "note"):
        table.add_column(col, justify="left" if col in ("id", "metric", "note") else "right")
    for i, r in enumerate(by_timing[first]):
        ratios = [f"{by_timing[t][i].ratio:.2f}" for t in by_timing]
        note = "; ".join(dict.fromkeys(x for t in by_timing if (x := by_timing[t][i].note)))
        table.add_row(r.id, f"{r.metric} ({r.unit})", f"{r.measured:,.1f}", *ratios, note)
    out.print(table)
    for t, summary in summaries.items():
        out.print(
            f"{t}: median |error| {summary['median_abs_error']:.1%}, within 25%: "
            f"{summary['within_25pct']}/{summary['rows']}, 1.5x or more: "
            f"{summary['beyond_1_5x']}, worst {summary['worst_id']} "
            f"({summary['worst_factor']:.2f}x)"
        )
    for x in measured.refused:
        out.print(f"refused {x.id or '?'} (line {x.line}): {x.reason}")
    out.print(f"wrote {out_path}")


def _row_dict(r: Any) -> dict:
    return {k: v for k, v in asdict(r).items() if k != "measurement"}


def _validate_serving(
    measured: Any,
    timing: str,
    cal: Any,
    out_path: str,
    command: str,
    peer: str | None,
    fmt: Format,
) -> None:
    """Measured serving: predicted with one timing backend, reported by group."""
    from pathlib import Path

    from shardlab.serving_report import peer_section, write_serving_report
    from shardlab.validation import predict

    if peer is not None and not Path(peer).is_file():
        raise ShardlabError(f"--peer {peer!r}: no such file")
    md = Path(out_path)
    rows = [predict(m, timing, m.engine or "trtllm", cal) for m in measured.rows]
    sections = peer_section(rows, Path(peer)) if peer is not None else []
    summary = write_serving_report(
        md, md.with_suffix(".csv"), rows, measured, command, sections=sections
    )
    if fmt is Format.json:
        emit_json({"summary": summary, "refused": [asdict(x) for x in measured.refused]})
        return
    table = Table(title=f"measured serving vs {timing} predictions")
    for col in ("protocol / mode / metric", "rows", "median |error|", "median ratio", "off 1.5x+"):
        table.add_column(col, justify="left" if col.startswith("protocol") else "right")
    for key, s in summary.items():
        table.add_row(
            key,
            f"{s['rows']:,}",
            f"{s['median_abs_error']:.1%}",
            f"{s['median_ratio']:.2f}",
            f"{s['beyond_1_5x']:.0%}",
        )
    out.print(table)
    out.print(f"{len(measured.refused):,} rows refused (reasons in the report); wrote {md}")


def _agreement(grid: str, out_path: str, fmt: Format) -> None:
    from pathlib import Path

    from shardlab.validation import (
        SIDE_BY_SIDE_COLUMNS,
        against_reference,
        agreement_summary,
        read_csv,
        side_by_side,
        write_agreement,
        write_side_by_side,
    )

    if not Path(grid).is_file():
        raise ShardlabError(f"--aiconfigurator {grid!r}: no such file")
    head = read_csv(Path(grid))
    if head and set(head[0]) >= SIDE_BY_SIDE_COLUMNS:
        rows = side_by_side(grid)
        command = f"shardlab validate --aiconfigurator {grid} --out {out_path}"
        write_side_by_side(Path(out_path), rows, command, grid)
        if fmt is Format.json:
            emit_json(rows)
            return
        for r in rows:
            out.print(
                f"{r['problem']}: its score of ours / its own "
                f"{r['ours_by_it'] / r['theirs_tok_s_gpu']:.2f}; our score of its / ours "
                f"{r['theirs_by_us'] / r['ours_tok_s_gpu']:.2f}"
                + ("" if r["theirs_by_us_feasible"] else " (its pick misses an SLO here)")
            )
        out.print(f"wrote {out_path}")
        return
    by_timing = {t: against_reference(grid, t) for t in get_args(Timing)}
    write_agreement(
        Path(out_path), by_timing, f"shardlab validate --aiconfigurator {grid} --out {out_path}"
    )
    summaries = {t: agreement_summary(rows) for t, rows in by_timing.items()}
    if fmt is Format.json:
        emit_json({"summary": summaries})
        return
    for t, s in summaries.items():
        out.print(
            f"{t}: {len(by_timing[t])} points; median error TPOT {s['tpot_ms']:.1%}, TTFT "
            f"{s['ttft_ms']:.1%}, throughput {s['tokens_s']:.1%}"
        )
    out.print(f"wrote {out_path}")


@app.command()
def calibrate(
    measurements: Annotated[
        str | None,
        typer.Option(
            help="Measurements to fit (CSV, or aiconfigurator-sample; default: the published ones)."
        ),
    ] = None,
    out_path: Annotated[
        str, typer.Option("--out", help="Calibration (or with --engines, engine costs) to write.")
    ] = "cal.yaml",
    timing: Annotated[str, typer.Option(help="The timing backend to correct.")] = "roofline",
    engine: Annotated[str, typer.Option(help="trtllm, vllm or sglang (rows that say none).")] = (
        "trtllm"
    ),
    hold_out: Annotated[
        str | None,
        typer.Option(
            help="Judge each row by a fit without its group: row (leave-one-out), family, gpu "
            "or engine; comma-separated (default: row; measured serving: family,gpu)."
        ),
    ] = None,
    engines: Annotated[
        bool,
        typer.Option(
            "--engines",
            help="Fit only each engine's fixed costs (per request, per iteration), the file "
            "shardlab ships (shardlab/data/serving/engines.yaml).",
        ),
    ] = False,
    report_path: Annotated[
        str | None, typer.Option("--report", help="Markdown of the fit's errors to write.")
    ] = None,
    gpu: FilterOpt = None,
    backend: FilterOpt = None,
    family: FilterOpt = None,
    mode: FilterOpt = None,
    protocol: FilterOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Fit per-kernel-class corrections (GEMM, attention, MoE, communication) and the
    engine's fixed costs per request and per iteration to measurements; report the
    error before, fitted, and on rows held out of the fit (by row, model family or
    GPU). Apply them with --calibration."""
    from pathlib import Path

    from shardlab.calibrate import calibrate as fit_calibration
    from shardlab.calibrate import write_fit_report
    from shardlab.costmodel import serving_constants_yaml
    from shardlab.validation import load_measurements

    check_output_file(out_path, flag="--out", parents=True)
    if report_path is not None:
        check_output_file(report_path, flag="--report", parents=True)
    filters = _filters(gpu=gpu, backend=backend, family=family, mode=mode, protocol=protocol)
    measured = load_measurements(measurements, filters)
    groupings = [g for g in (hold_out or ("family,gpu" if measured.serving else "row")).split(",")]
    source = measurements or "the published measurements"
    described = source + "".join(f", {k} {','.join(v)}" for k, v in filters.items())
    report = fit_calibration(
        measured.rows,
        timing,
        engine,
        described,
        hold_out=[g.strip() for g in groupings if g.strip()],
        factors=not engines,
        per_engine=engines,
    )
    command = (
        "shardlab calibrate"
        + "".join(
            f" --{k} {v}"
            for k, v in (
                ("measurements", measurements),
                *((k, ",".join(v)) for k, v in filters.items()),
                ("timing", timing),
                ("hold-out", hold_out),
                ("out", out_path),
                ("report", report_path),
            )
            if v is not None
        )
        + (" --engines" if engines else "")
    )
    summary = report.summary()
    if engines:
        fitted = report.fitted
        header = [
            "Each serving engine's fixed costs (shardlab.costmodel.engines), fitted by",
            f"  {command}",
            "do not edit by hand. " + report.calibration.fitted_on,
        ]
        write_text(out_path, serving_constants_yaml(fitted.request_ms, fitted.iteration_ms, header))
    else:
        write_text(out_path, report.calibration.to_yaml())
    if report_path is not None:
        write_fit_report(Path(report_path), report, command, described)
    if fmt is Format.json:
        emit_json(
            {
                "calibration": asdict(report.calibration),
                "engines": {"request_ms": report.fitted.request_ms,
                            "iteration_ms": report.fitted.iteration_ms},
                "summary": summary,
                "held_out": {g: report.held_out_summary(g) for g in report.held_out_by},
            }
        )  # fmt: skip
        return
    c, f = report.calibration, report.fitted
    if not engines:
        out.print(
            f"factors: gemm {c.gemm:.3f}, attention {c.attention:.3f}, moe {c.moe:.3f}, "
            f"communication {c.communication:.3f}"
        )
    for e in sorted(f.request_ms):
        out.print(
            f"{e}: {f.request_ms[e]:.3f} ms per request, {f.iteration_ms[e]:.3f} ms per iteration"
        )
    if len(report.before) <= 60:
        table = Table(title=f"{summary['rows']} rows, {timing} timing: predicted / measured")
        for col in ("id", "before", "fitted", "held out"):
            table.add_column(col, justify="left" if col == "id" else "right")
        for lin, b, a, h in zip(
            report.rows.rows, report.before, report.after, report.held_out, strict=True
        ):
            table.add_row(lin.measurement.id, f"{1 + b:.2f}", f"{1 + a:.2f}", f"{1 + h:.2f}")
        out.print(table)
    out.print(
        f"median |error|: {summary['median_before']:.1%} before, {summary['median_after']:.1%} "
        f"fitted, {summary['median_cross_validated']:.1%} {report.held_out_name} (worst "
        f"{summary['worst_before']:.2f}x, {summary['worst_after']:.2f}x, "
        f"{summary['worst_cross_validated']:.2f}x); wrote {out_path}"
    )


def _usage_error(exc: typer.TyperException) -> str:
    """A command-line error (bad flag, bad value, missing option) as one line."""
    fmt = getattr(exc, "format_message", None)
    text = " ".join((fmt() if fmt is not None else str(exc)).split())
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else "shardlab"
    return f"{text} (see '{path} --help')"


def main(argv: list[str] | None = None) -> None:
    """The console script: a mistake in the input prints one line and exits with 2."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        code = app(args=args or ["--help"], prog_name="shardlab", standalone_mode=False)
    except typer.Abort:
        err.print("interrupted")
        raise SystemExit(130) from None
    except typer.TyperException as exc:
        err.print(f"error: {_usage_error(exc)}", markup=False, soft_wrap=True)
        raise SystemExit(2) from None
    except ShardlabError as exc:
        err.print(f"error: {' '.join(str(exc).splitlines())}", markup=False, soft_wrap=True)
        raise SystemExit(2) from None
    except (KeyboardInterrupt, ImportError) as exc:
        if not interrupted(exc):
            raise
        err.print("interrupted")
        raise SystemExit(130) from None
    except BrokenPipeError:  # the reader left (`shardlab models | head`)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until the exit
        raise SystemExit(1) from None
    if code == 130:  # typer's own stop on a Ctrl-C while it parsed or called the command
        err.print("interrupted")
    raise SystemExit(code or 0)  # as click's standalone mode ends, success included


if __name__ == "__main__":
    main()
