"""``shardlab simulate``: one deployment under one traffic, request by request."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from shardlab.cli.app import Format, FormatOpt, app
from shardlab.cli.plans import ClusterOpt, ModelOpt
from shardlab.cli.render import emit_json, out
from shardlab.cli.traffic import (
    ArrivalOpt,
    ClientsOpt,
    CvOpt,
    InputLenOpt,
    OutputLenOpt,
    PromptsPerClientOpt,
    RangeRatioOpt,
    RateOpt,
    RequestsOpt,
    SeedOpt,
    TraceFormatOpt,
    TrafficFileOpt,
    build_traffic,
)
from shardlab.errors import ShardlabError
from shardlab.files import check_output_file, write_text
from shardlab.problems.engines import ENGINES
from shardlab.problems.problem import Problem
from shardlab.problems.traffic import Traffic
from shardlab.solvers.choices import listed


def deployment_of_file(
    path: str,
    traffic: Traffic,
    *,
    model: str | None,
    cluster: str | None,
    engine: str | None,
    workload: str,
) -> Any:
    """The deployment a plan file (``solve --out``), a disaggregated plan or a sized
    deployment (``size --out``) describes, its problems' workload at the traffic's
    mean lengths (the iteration tables are centred there)."""
    from shardlab.launch.sized import pool_launches
    from shardlab.problems.disagg import DISAGG_SCHEMA, DisaggPlan
    from shardlab.problems.plan import Plan, read_plan_file
    from shardlab.simulate import Deployment, Pool
    from shardlab.sizing.answer import SIZING_SCHEMA

    data = read_plan_file(path)
    if not isinstance(data, dict):
        raise ShardlabError(f"{path}: a plan must be a JSON object")
    engine = engine or data.get("engine")
    if engine is None:
        raise ShardlabError(f"{path}: names no engine; give the engine", field="engine")
    lengths = {
        "input_len": max(1, round(float(traffic.input_len.mean()))),
        "output_len": max(2, round(float(traffic.output_len.mean()))),
    }
    if data.get("schema") == SIZING_SCHEMA:
        pools = pool_launches(data, where=path, model=model, engine=engine)
        return Deployment(
            pools=tuple(
                Pool(
                    role=p.role,  # type: ignore[arg-type]
                    problem=_at(p.problem, lengths),
                    plan=p.plan,
                    instances=p.instances,
                )
                for p in pools
            )
        )
    model = model or data.get("model")
    cluster = cluster or data.get("cluster")
    if not model or not cluster:
        raise ShardlabError(f"{path}: names no model or cluster; give the model and cluster")
    problem = Problem.build(model, cluster, workload, engine=engine)  # type: ignore[arg-type]
    problem = _at(problem, lengths)
    if data.get("schema") == DISAGG_SCHEMA:
        dplan = DisaggPlan.from_dict(data, problem.model, where=path, cluster=problem.cluster)
        return Deployment.of_disagg(problem, dplan)
    plan = Plan.from_dict(data, problem.model, where=path)
    problem.space.degree_index(plan.degrees)  # the degrees must suit this cluster
    return Deployment.of_plan(problem, plan)


def _at(problem: Problem, lengths: dict[str, int]) -> Problem:
    w = dataclasses.replace(problem.workload, **lengths)
    return dataclasses.replace(problem, workload=w)


@app.command()
def simulate(
    plan_file: Annotated[
        str,
        typer.Option(
            "--plan",
            help="A plan JSON (solve --out), a disaggregated plan, or a sized deployment "
            "(size --out).",
        ),
    ],
    traffic_file: TrafficFileOpt = None,
    trace_format: TraceFormatOpt = None,
    rate: RateOpt = None,
    arrival: ArrivalOpt = None,
    cv: CvOpt = 1.0,
    requests: RequestsOpt = None,
    input_len: InputLenOpt = 1024,
    output_len: OutputLenOpt = 128,
    range_ratio: RangeRatioOpt = 1.0,
    clients: ClientsOpt = None,
    prompts_per_client: PromptsPerClientOpt = None,
    seed: SeedOpt = 0,
    prefix_reuse: Annotated[
        float | None,
        typer.Option(
            "--prefix-reuse",
            help="Each prompt opens with this share of one prefix all requests share, in "
            "[0, 1), found in each rank's prefix cache; replaces a Mooncake trace's own "
            "hash ids (0: no prefix caching). Default: a trace's hash ids, else none.",
        ),
    ] = None,
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    engine: Annotated[
        str | None,
        typer.Option(help=f"{listed(ENGINES)} (default: the engine the plan was made for)."),
    ] = None,
    workload: Annotated[
        str,
        typer.Option(help="Workload preset for dtypes (its lengths: the traffic's means)."),
    ] = "chat",
    router: Annotated[
        str,
        typer.Option(
            help="least (outstanding requests), round-robin, or prefix (the fewest tokens "
            "to prefill past each rank's prefix cache plus tokens held and waiting)."
        ),
    ] = "least",
    slo_ttft_ms: Annotated[
        float | None, typer.Option("--slo-ttft-ms", help="SLO on each request's TTFT.")
    ] = None,
    slo_tpot_ms: Annotated[
        float | None, typer.Option("--slo-tpot-ms", help="SLO on each request's TPOT.")
    ] = None,
    statistics: Annotated[
        str,
        typer.Option(help="Statistics to report, comma-separated: mean, median, pNN."),
    ] = "mean,median,p90,p99,p99.9",
    out_file: Annotated[
        str | None, typer.Option("--out", help="Write one CSV row per request here.")
    ] = None,
    plot: Annotated[
        str | None,
        typer.Option(help="Draw the latency CDFs and the requests in the system (PNG)."),
    ] = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Run a traffic through a deployment, request by request and iteration by
    iteration, each engine's scheduler stepping through iterations the cost model
    prices: TTFT, TPOT, inter-token and end-to-end latency as distributions, throughput,
    goodput and SLO attainment; with prompts' prefixes (a Mooncake trace's hash ids, or
    --prefix-reuse), each rank's prefix cache and its hit rate. Same seed, same result."""
    from shardlab.plots import plot_simulation
    from shardlab.simulate import ROUTERS, Slo, price, simulate_priced
    from shardlab.simulate.requests import check_statistic

    if router not in ROUTERS:
        raise ShardlabError(f"router {router!r} is not one of {', '.join(ROUTERS)}", field="router")
    stats = tuple(check_statistic(s.strip()) for s in statistics.split(",") if s.strip())
    slo = Slo(ttft_ms=slo_ttft_ms, tpot_ms=slo_tpot_ms)
    for path, flag in ((out_file, "--out"), (plot, "--plot")):
        if path is not None:
            check_output_file(path, flag=flag)
    chosen = build_traffic(
        traffic_file=traffic_file,
        trace_format=trace_format,
        rate=rate,
        arrival=arrival,
        cv=cv,
        requests=requests,
        input_len=input_len,
        output_len=output_len,
        range_ratio=range_ratio,
        clients=clients,
        prompts_per_client=prompts_per_client,
        seed=seed,
    )
    if prefix_reuse is not None:
        chosen = chosen.with_prefix_reuse(prefix_reuse)
    deployment = deployment_of_file(
        plan_file, chosen, model=model, cluster=cluster, engine=engine, workload=workload
    )
    priced = price(deployment, chosen, most=chosen.most_in_system)
    sim = simulate_priced(deployment, priced, chosen, router=router, seed=seed)  # type: ignore[arg-type]
    summary = sim.summary(slo, stats)
    if out_file is not None:
        write_text(out_file, sim.to_csv())
    if plot is not None:
        first = deployment.pools[0]
        plot_simulation(
            plot,
            sim,
            f"{first.problem.model.name} on {_pools(deployment)}, {first.problem.engine}; "
            f"{Path(chosen.source).name}: {chosen.requests:,} requests",
        )
    if fmt is Format.json:
        emit_json({"summary": summary.to_dict(), "wall_s": sim.wall_s, "slo": slo.given})
        return
    _print(deployment, chosen, summary, sim.wall_s, slo)
    for path in (out_file, plot):
        if path is not None:
            out.print(f"wrote {path}", markup=False)


def _pools(deployment: Any) -> str:
    """Each pool: instances x GPUs of a type (role), and its plan's degrees."""
    return " + ".join(
        f"{p.instances} x {p.plan.degrees.num_gpus} {p.problem.cluster.accelerator.key}"
        + ("" if p.role == "agg" else f" {p.role}")
        + f" ({_degrees(p.plan.degrees)})"
        for p in deployment.pools
    )


def _degrees(d: Any) -> str:
    """The degrees above 1 (tp always)."""
    parts = [f"{k} {v}" for k, v in (("replicas", d.replicas), ("pp", d.pp), ("tp", d.tp),
             ("dp_attn", d.dp_attn), ("ep", d.ep)) if v > 1 or k == "tp"]  # fmt: skip
    return ", ".join(parts)


def _print(deployment: Any, traffic: Traffic, s: Any, wall_s: float, slo: Any) -> None:
    out.print(
        f"{traffic.source}: {s.requests:,} requests on {_pools(deployment)} "
        f"on {deployment.pools[0].problem.engine}, simulated in {wall_s:.2f} s",
        markup=False,
        soft_wrap=True,
    )
    table = Table()
    table.add_column("ms")
    stats = list(next(iter(s.latencies.values())))
    for name in stats:
        table.add_column(name, justify="right")
    for metric, values in s.latencies.items():
        table.add_row(metric.removesuffix("_ms"), *(f"{values[k]:,.1f}" for k in stats))
    out.print(table)
    line = (
        f"throughput {s.output_tok_s:,.0f} output tok/s ({s.total_tok_s:,.0f} with prompts), "
        f"{s.request_rate:,.2f} requests/s over {s.span_s:,.0f} s; "
        f"{s.mean_in_flight:,.1f} in flight on average; {s.preemptions:,} preemptions"
    )
    out.print(line, markup=False, soft_wrap=True)
    if s.goodput is not None:
        met = ", ".join(f"{k} {v:.1%}" for k, v in s.attainment.items())
        out.print(f"goodput {s.goodput:,.2f} requests/s; SLO met: {met}", markup=False)
    if s.prefix_hit_rate is not None:
        out.print(
            f"prefix cache: {s.prefix_hit_rate:.1%} of prompt tokens found "
            f"(blocks of {traffic.block_tokens} tokens)",
            markup=False,
        )
