"""``shardlab solve``: one method on one problem, through :func:`shardlab.solve`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from shardlab.cli.app import STARTED, Format, FormatOpt, app
from shardlab.cli.options import problem_command, solver_options_command
from shardlab.cli.render import (
    emit_json,
    out,
    print_disagg,
    print_facts,
    print_front,
    print_metrics,
    print_pairs,
    print_plan,
    problem_json,
    problem_line,
    solve_progress,
)
from shardlab.cli.traffic import simulated
from shardlab.errors import ShardlabError
from shardlab.files import check_output_file, write_text
from shardlab.problems.problem import Problem
from shardlab.problems.traffic import Traffic
from shardlab.solvers.registry import available_solvers

if TYPE_CHECKING:
    from shardlab.solvers import Budget, Result, Solution, SolveResult
    from shardlab.solvers.pareto import FrontResult

METHODS = ", ".join(available_solvers())


MaxEvalsOpt = Annotated[
    int | None, typer.Option("--max-evals", min=1, help="Most distinct plans to evaluate.")
]
TimeLimitOpt = Annotated[
    float | None,
    typer.Option("--time-limit", min=0.001, help="Wall seconds for the command, all in."),
]
OutFileOpt = Annotated[str | None, typer.Option("--out", help="Write the best plan here (JSON).")]
VsFreeOpt = Annotated[
    bool,
    typer.Option(
        "--vs-free",
        help="With --space engine: also solve the free space (CP-SAT) and report what "
        "per-operator sharding would add if the engine ran it.",
    ),
]
PlotOpt = Annotated[
    str | None, typer.Option(help="--objective pareto: write the front's figure here (PNG).")
]
ServingOpt = Annotated[
    str,
    typer.Option(
        help="agg: one pool of replicas; disagg: a prefill and a decode pool (cpsat "
        "proves each, the pools' sizes enumerated); best: both, the better chosen."
    ),
]


@app.command()
@problem_command(traffic=True)
@solver_options_command
def solve(
    problem: Problem,
    options: dict[str, object],
    traffic: Traffic | None,
    tries: int,
    method: Annotated[str, typer.Option("--method", help=f"One of: {METHODS}.")] = "cpsat",
    max_evals: MaxEvalsOpt = None,
    time_limit: TimeLimitOpt = None,
    seed: Annotated[int, typer.Option(min=0, help="Same seed, same plan.")] = 0,
    out_file: OutFileOpt = None,
    vs_free: VsFreeOpt = False,
    plot: PlotOpt = None,
    serving: ServingOpt = "agg",
    fmt: FormatOpt = Format.table,
) -> None:
    """Search the best plan with one method; prints it and its ratio to megatron.

    With ``--objective pareto``: the front of throughput per GPU against TPOT (and TTFT
    for prefill-heavy workloads) over plans and concurrency (in flight every concurrency
    up to ``--batch``; static, powers of two up to it), as a table, in JSON a
    ``pareto`` list, and with ``--plot`` a PNG.
    """
    from shardlab.solvers import SolveRequest, run

    if out_file is not None:
        check_output_file(out_file, flag="--out")
    if plot is not None:
        if problem.workload.objective != "pareto":
            raise ShardlabError("--plot draws the pareto front: add --objective pareto")
        check_output_file(plot, flag="--plot")
    budget = _budget(method, max_evals, time_limit)
    request = SolveRequest.of(
        problem,
        method,
        serving=serving,
        budget=budget,
        seed=seed,
        options=options,
        vs_free=vs_free,
        traffic=simulated(problem, traffic),
        tries=tries,
    )
    with solve_progress(method, budget.max_evals, budget.seconds, budget.started) as callback:
        solution = run(request, callback)
    if (error := solution.unmet_error()) is not None:
        raise error
    if out_file is not None and solution.plan is not None:
        write_text(out_file, solution.plan_json())
    if plot is not None and solution.front:
        _plot(solution, plot)
    if fmt is Format.json:
        emit_json({"problem": problem_json(problem), **solution.to_dict()})
    else:
        _print(solution, problem)
        if plot is not None and solution.front:
            out.print(f"wrote {plot}")
        if out_file is not None and solution.plan is not None:
            out.print(f"wrote {out_file}" + _which(solution))
    if solution.status == "error":
        raise SystemExit(1)


def _budget(method: str, max_evals: int | None, time_limit: float | None) -> Budget:
    """The method's default, or the limits given: the command's, its clock started with
    the command."""
    from shardlab.solvers import Budget, default_budget

    if max_evals is None and time_limit is None:
        return default_budget(method)
    return Budget(max_evals=max_evals, seconds=time_limit, started=STARTED)


def _which(solution: Solution) -> str:
    """Which plan ``--out`` holds, when the solve had several."""
    if solution.pareto is not None:
        best = solution.pareto.best
        return f" (the plan of batch {best.batch}, the front's highest)" if best else ""
    return f" (the {solution.chosen} plan)" if solution.serving != "agg" else ""


def _plot(solution: Solution, path: str) -> None:
    from shardlab.plots import plot_front
    from shardlab.solvers.pareto import levels_of

    problem, front = solution.problem, solution.pareto
    assert front is not None, "--plot is refused without the objective pareto"
    levels = ", ".join(map(str, levels_of(problem)))
    plot_front(
        path,
        problem,
        front.front,
        front.megatron,
        title=f"{problem.name}: {solution.method}, batch {levels}",
    )


def _print(solution: Solution, problem: Problem) -> None:
    """The solution as tables, for people (``problem``: as asked; a walk under
    percentile SLOs solves it with the SLOs on the mean)."""
    out.print(problem_line(problem))
    if solution.pareto is not None:
        _print_front(solution, solution.pareto)
        return
    if solution.agg is not None and solution.disagg is None:
        _print_agg(solution, solution.agg)
    else:
        _print_served(solution)
        _print_megatron(solution)
    _print_free(solution)
    _print_certificate(solution)


def _print_certificate(solution: Solution) -> None:
    cert = solution.certificate
    if cert is None:
        return
    out.print(f"[bold]certified[/]: {cert.claim}", soft_wrap=True)
    for i, a in enumerate(cert.attempts, 1):
        analytic = ", ".join(f"{_short(k)} {v:,.1f}" for k, v in a.analytic_ms.items())
        if a.by_floor:
            seen = "floor " + ", ".join(
                f"p{cert.slos[k][1]:g} {_short(k)} >= {v:,.1f}" for k, v in a.floor_ms.items()
            )
        else:
            seen = "simulated " + ", ".join(
                f"p{cert.slos[k][1]:g} {_short(k)} {v:,.1f}" for k, v in a.simulated_ms.items()
            )
        verdict = "[bold]meets[/]" if a.passed else f"misses (cut: {a.cut})"
        out.print(
            f"  {i}. {a.label}: analytic mean {analytic} ms; {seen} ms: {verdict}",
            soft_wrap=True,
        )


def _short(slo: str) -> str:
    return slo.removesuffix("_ms").upper()


def _status_line(label: str, r: Result, done: str) -> str:
    done = f" {done}" if done else ""
    return f"{label}: [bold]{r.status}[/]{done} in {r.wall_s:.1f} s" + (
        f" ({r.message})" if r.message else ""
    )


def _print_agg(solution: Solution, r: SolveResult) -> None:
    problem = solution.problem
    out.print(
        _status_line(
            f"method {solution.method}, seed {solution.seed}", r, f"after {r.n_evals:,} evaluations"
        )
    )
    print_facts(r.facts)
    if r.plan is not None and r.metrics is not None:
        print_plan(problem, r.plan)
        print_metrics(r.metrics)
        _print_megatron(solution)
    if solution.rate is not None:
        fit, m = solution.rate, solution.rate.metrics
        out.print(
            f"rate [bold]{fit.rate:g} requests/s[/]: capacity {fit.capacity:.3f}/s under the SLOs "
            f"(utilization {fit.utilization:.0%}); runs at {m.requests_per_rank} requests per "
            f"rank ({m.requests_in_flight} in flight): TTFT {m.ttft_ms:,.0f} ms, TPOT "
            f"{m.tpot_ms:.1f} ms, {fit.served:.3f} requests/s"
        )


def _print_megatron(solution: Solution) -> None:
    megatron = solution.megatron
    if megatron is None or megatron.ratio is None:
        return
    which = "" if solution.serving == "agg" else f" of the {solution.chosen} plan"
    out.print(f"  ratio{which} to the megatron plan: [bold]{megatron.ratio:.3f}[/]")


def _print_free(solution: Solution) -> None:
    from shardlab.solvers.solution import plan_label

    free = solution.free
    if free is None:
        return
    tok_s = free.metrics.throughput_tok_s if free.metrics else 0
    label = plan_label(free.plan) if free.plan else None
    mode = "" if solution.serving == "agg" else f", {solution.chosen} serving"
    partial = f" [bold]partial[/] ({free.message})" if free.partial else ""
    out.print(
        f"free space (every per-operator sharding{mode}): cpsat {free.status}, "
        f"{tok_s:,.0f} tok/s, plan {label}{partial}"
    )
    if free.ratio is not None:
        best = "best so far" if free.partial else "optimum"
        out.print(
            f"  free {best} over the {solution.problem.engine} plan: [bold]{free.ratio:.3f}"
            "[/] (what per-operator sharding would add if the engine ran it)"
        )


def _print_served(solution: Solution) -> None:
    problem, agg, disagg = solution.problem, solution.agg, solution.disagg
    assert disagg is not None, "a served solution holds the disaggregated result"
    if agg is not None:
        out.print(_status_line("[bold]aggregated[/] cpsat", agg, ""))
        if agg.plan is not None and agg.metrics is not None:
            print_plan(problem, agg.plan)
            print_metrics(agg.metrics)
    pools = f"after {disagg.n_evals} pool solves"
    out.print(_status_line("[bold]disaggregated[/] cpsat", disagg, pools))
    print_facts(disagg.facts)
    if disagg.plan is not None and disagg.metrics is not None:
        print_disagg(problem, disagg.plan, disagg.metrics)
        print_pairs(problem, disagg.pairs)
    if agg is not None:
        ratio = solution.disagg_over_agg
        out.print(
            f"disaggregated / aggregated: [bold]{ratio:.3f}[/]; {solution.chosen} chosen"
            if ratio is not None
            else f"{solution.chosen} chosen (the other has no feasible plan)"
        )


def _print_front(solution: Solution, r: FrontResult) -> None:
    from shardlab.solvers.pareto import levels_of

    levels = ", ".join(map(str, levels_of(solution.problem)))
    out.print(
        f"method {solution.method}, seed {solution.seed}: [bold]{r.status}[/] front of "
        f"{len(r.front)} points over batch {levels} after {r.n_evals:,} evaluations in "
        f"{r.wall_s:.1f} s" + (f" ({r.message})" if r.message else "")
    )
    print_front(solution.problem, r.front, r.megatron)
