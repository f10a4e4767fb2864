"""``shardlab size``: the cheapest deployment serving a request rate, over GPU types."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shardlab.cli.app import STARTED, Format, FormatOpt, app
from shardlab.cli.options import problem_command
from shardlab.cli.render import emit_json, out, problem_json, task_progress
from shardlab.cli.traffic import simulated
from shardlab.errors import ShardlabError
from shardlab.files import check_output_file, write_text
from shardlab.problems.cluster import Cluster, parse_accelerators
from shardlab.problems.limits import MAX_GPUS
from shardlab.problems.problem import Problem
from shardlab.problems.traffic import Traffic

if TYPE_CHECKING:
    from shardlab.sizing.size import Sizer, Sizing, SizingProgress

DEFAULT_GPUS = "h100,h200,b200"


def _cluster(options: dict[str, Any]) -> Cluster:
    from shardlab.sizing.size import sizing_cluster

    return sizing_cluster(parse_accelerators(options["gpus"]), options["max_gpus"])


# Options that describe one plan's load or cluster: a sizing sets them itself.
_NOT_TAKEN = (
    "batch", "rate", "objective", "phase", "schedule", "clients", "prompts_per_client", "tries",
)  # fmt: skip


@app.command()
@problem_command(without=_NOT_TAKEN, cluster_from=_cluster, traffic=True)
def size(
    problem: Problem,
    traffic: Traffic | None,
    tries: int,
    rate: Annotated[
        float | None, typer.Option(help="Requests/s to serve (or --rates for a curve).")
    ] = None,
    rates: Annotated[
        str | None,
        typer.Option(
            help="A curve: rates as 5,10,20,40 or a range START:STOP:STEP (xF for a factor, "
            "e.g. 5:80:x2)."
        ),
    ] = None,
    gpus: Annotated[
        str,
        typer.Option(
            "--gpus", help="GPU types to choose from: built-in names or cluster YAML files."
        ),
    ] = DEFAULT_GPUS,
    price: Annotated[
        str | None,
        typer.Option(
            help="$/GPU-hour of every listed GPU, e.g. h100=2.99,h200=3.79 (none: fewest GPUs)."
        ),
    ] = None,
    serving: Annotated[
        str,
        typer.Option(
            help="agg: instances behind a router, types mixed; disagg: a prefill and a decode "
            "pool, each of any type; best: both."
        ),
    ] = "best",
    max_gpus: Annotated[
        int,
        typer.Option("--max-gpus", min=1, max=MAX_GPUS, help="Most GPUs a deployment may use."),
    ] = 256,
    seed: Annotated[int, typer.Option(min=0, help="CP-SAT's seed.")] = 0,
    jobs: Annotated[
        int,
        typer.Option(
            min=1,
            help="Capacity searches at once: each GPU type's own search, and the instance "
            "bounds, in this many worker processes (or Ray tasks). Same answer as one.",
        ),
    ] = 1,
    executor: Annotated[
        str,
        typer.Option(
            help="Where the searches run: local (--jobs worker processes) or ray (tasks "
            "on the Ray cluster at --address; pip install -e '.[ray]')."
        ),
    ] = "local",
    address: Annotated[
        str | None,
        typer.Option(help="The Ray cluster's address (e.g. 10.0.0.1:6379), with --executor ray."),
    ] = None,
    buckets: Annotated[
        int | None,
        typer.Option(
            min=2,
            help="Also size Mélange's move: the traffic's requests split into this many "
            "prompt-length buckets, each served by instances of its own (needs --traffic or "
            "--range-ratio, and one rate).",
        ),
    ] = None,
    time_limit: Annotated[
        float | None,
        typer.Option(
            "--time-limit",
            min=0.001,
            help="Wall seconds for the whole command, all in. When they run out: the "
            "cheapest deployment found so far, marked partial (not proven least-cost), with "
            "the instance capacities left unproven. [default: until proven]",
        ),
    ] = None,
    out_file: Annotated[
        str | None,
        typer.Option("--out", help="Write the answer (JSON; `shardlab launch --plan` takes it)."),
    ] = None,
    plot: Annotated[
        str | None, typer.Option(help="--rates: write the cost per rate per GPU type here (PNG).")
    ] = None,
    per_dollar: Annotated[
        bool,
        typer.Option(
            "--per-dollar",
            help="Vidur-Search's question instead: every aggregated instance of each GPU type "
            "and size, ranked by requests/s at the SLOs per $/hour (needs --price; no rate).",
        ),
    ] = False,
    fmt: FormatOpt = Format.table,
) -> None:
    """The cheapest deployment (least $/hour, or fewest GPUs without prices) serving a
    rate under the SLOs: GPU type, instances, nodes and plan of each pool, proven
    optimal under the cost model over every listed type, count up to --max-gpus and
    serving mode. With --time-limit, the cheapest found when it runs out, marked
    partial with what is left unproven."""
    from shardlab.sizing.answer import sizing_json
    from shardlab.sizing.inputs import parse_prices, parse_rates
    from shardlab.sizing.size import Sizer

    if per_dollar:
        _per_dollar(problem, traffic, gpus, price, serving, max_gpus, seed, jobs, executor,
                    address, (rate, rates, buckets, time_limit, plot), out_file, fmt)  # fmt: skip
        return
    if rate is None and rates is None and traffic is not None and traffic.rate is not None:
        rate = traffic.rate  # a trace replayed at its own rate
    if (rate is None) == (rates is None):
        raise ShardlabError("give --rate R (requests/s) or --rates for a curve", field="rate")
    values = parse_rates(rates) if rates is not None else parse_rates(str(rate), name="rate")
    if plot is not None:
        if rates is None:
            raise ShardlabError("--plot draws a curve: give --rates")
        check_output_file(plot, flag="--plot")
    if buckets is not None and (traffic is None or len(values) > 1):
        raise ShardlabError(
            "--buckets splits a traffic's requests by prompt length at one rate",
            field="buckets",
            fix="give --traffic (or synthetic lengths with --range-ratio) and one --rate",
        )
    if out_file is not None:
        check_output_file(out_file, flag="--out")
    accs = parse_accelerators(gpus)
    prices = parse_prices(price, list(accs))
    problem = dataclasses.replace(problem, workload=problem.workload.at_rate(values[0]))
    with task_progress(
        "size", unit="capacities solved", seconds=time_limit, started=STARTED
    ) as report:

        def progress(p: SizingProgress) -> None:
            c = p.last
            what = "starting" if c is None else f"{c.label()} {c.role}: {c.rate:.3g}/s {c.status}"
            report(p.solves, f"rate {p.rate:g}/s ({p.rate_index + 1} of {p.rates}), {what}")

        sizer = Sizer(
            problem,
            accs,
            prices=prices,
            serving=serving,
            max_gpus=max_gpus,
            seed=seed,
            jobs=jobs,
            executor=executor,
            address=address,
            time_limit=time_limit,
            started=STARTED,
            progress=progress,
            traffic=simulated(problem, traffic),
        )
        results = sizer.curve(values)
    if all(s.best is None for s in results):
        partial = [s for s in results if s.partial]
        if partial:
            raise ShardlabError(
                f"no deployment found within the time limit of {time_limit:g} s; left "
                f"unproven: {partial[0].left()}",
                field="time_limit",
                fix="allow more time, fewer GPU types, or a smaller --max-gpus",
            )
        if sizer.caps.too_long:
            raise ShardlabError(
                f"no instance of {gpus} up to {max_gpus} GPUs served the traffic under the "
                f"percentile SLOs; the last refused: {sizer.caps.too_long}",
                field="traffic",
                fix="drop the longest requests from the trace, or allow larger instances",
            )
        raise sizer.why_unserved(values[0])
    data = sizing_json(sizer, results)
    by_bucket = without_reuse = None

    def again(p: Problem, shaped: Traffic | None) -> Sizer:
        return Sizer(
            p, accs, prices=prices, serving=serving, max_gpus=max_gpus, seed=seed, jobs=jobs,
            executor=executor, address=address, traffic=shaped,
        )  # fmt: skip

    if buckets is not None and traffic is not None:
        from shardlab.sizing.buckets import size_by_bucket

        by_bucket = size_by_bucket(problem, traffic, values[0], buckets, again)
        data["by_bucket"] = _bucket_json(sizer, by_bucket)
    if problem.workload.prefix_reuse and len(values) == 1:
        bare = dataclasses.replace(problem.workload, prefix_reuse=0.0)
        alone = again(dataclasses.replace(problem, workload=bare), sizer.traffic).size(values[0])
        without_reuse = alone.best
        data["without_prefix_reuse"] = None if alone.best is None else {
            "label": alone.best.label(), "cost": alone.best.cost, "gpus": alone.best.gpus,
            "capacity_rps": alone.best.capacity,
        }  # fmt: skip
    if out_file is not None:
        write_text(out_file, _dumps(data))
    if plot is not None:
        from shardlab.plots import plot_sizing

        plot_sizing(plot, sizer, results)
    if fmt is Format.json:
        emit_json({"problem": problem_json(problem), **data})
        return
    _print(sizer, results)
    if by_bucket is not None:
        _print_buckets(sizer, by_bucket)
    if problem.workload.prefix_reuse and len(values) == 1:
        reuse = f"{problem.workload.prefix_reuse:.0%} of each prompt cached"
        out.print(
            f"without prefix reuse ({reuse} above): "
            + (
                f"{without_reuse.label()}, {_money(sizer, without_reuse.cost)}"
                if without_reuse is not None
                else "none up to --max-gpus"
            )
        )
    for path in (plot, out_file):
        if path is not None:
            out.print(f"wrote {path}")


def _bucket_json(sizer: Sizer, b: Any) -> dict[str, Any]:
    return {
        "buckets": [
            {
                "prompt_tokens": [k.low, k.high],
                "share": k.share,
                "input_len": k.input_len,
                "output_len": k.output_len,
                "rate_rps": s.rate,
                "deployment": None if s.best is None else s.best.label(),
                "cost": None if s.best is None else s.best.cost,
                "simulated_ms": s.simulated,
            }
            for k, s in zip(b.buckets, b.answers, strict=True)
        ],
        "bucketed_cost": b.cost if b.cost < float("inf") else None,
        "together_cost": None if b.together.best is None else b.together.best.cost,
        "bucketed": b.bucketed,
    }


def _print_buckets(sizer: Sizer, b: Any) -> None:
    from rich.table import Table

    table = Table(title="by prompt length (each bucket's own instances)")
    for col in ("bucket", "share", "mean in/out", "requests/s", "deployment", "cost"):
        table.add_column(col)
    for k, s in zip(b.buckets, b.answers, strict=True):
        table.add_row(
            k.label(),
            f"{k.share:.0%}",
            f"{k.input_len}/{k.output_len}",
            f"{s.rate:.3g}",
            s.best.label() if s.best else "none",
            _money(sizer, s.best.cost) if s.best else "-",
        )
    out.print(table)
    together = b.together.best
    verdict = "cheaper: route by length" if b.bucketed else "not cheaper: serve together"
    out.print(
        f"by length: {_money(sizer, b.cost) if b.cost < float('inf') else 'none'} against "
        f"{_money(sizer, together.cost) if together else 'none'} together ({verdict}; "
        "shardlab.sizing.buckets states the claim)"
    )


def _dumps(data: dict[str, Any]) -> str:
    import json

    return json.dumps(data, indent=2) + "\n"


def _money(sizer: Sizer, cost: float) -> str:
    return f"${cost:,.2f}/h" if sizer.priced else f"{cost:g} GPUs"


def _print(sizer: Sizer, results: list[Sizing]) -> None:
    from rich.table import Table

    problem = sizer.problem
    w = problem.workload
    out.print(
        f"[bold]{problem.model.name}[/]: {w.input_len} in / {w.output_len} out"
        + "".join(f", {slo}" for slo in w.slos())
        + f"; {problem.engine}"
        + (" (plans it can launch)" if problem.space_kind == "engine" else "")
        + f", {problem.timing} timing"
    )
    prices = sizer.prices or {}
    gpus = ", ".join(
        g + (f" ${prices[g]:g}/GPU-h" if g in prices else "") for g in sizer.accelerators
    )
    out.print(f"GPUs {gpus}; serving {sizer.serving}; up to {sizer.max_gpus} GPUs")
    if sizer.caps.slos:
        source = "Poisson arrivals" if sizer.traffic is None else sizer.traffic.source
        out.print(
            f"percentile SLOs: each instance's capacity is the largest rate, up to its "
            f"mean-model capacity, at which its simulated percentiles meet them (a prefill "
            f"pool's TTFT, a decode pool's TPOT) under {source} rescaled to that rate "
            "(shardlab.sizing.tail)",
            soft_wrap=True,
        )
    if len(results) == 1:
        _print_one(sizer, results[0])
    else:
        table = Table(title="cost per rate" if sizer.priced else "GPUs per rate")
        table.add_column("requests/s", justify="right")
        for g in sizer.accelerators:
            table.add_column(f"{g} only", justify="right")
        table.add_column("cheapest", justify="right")
        table.add_column("deployment")
        table.add_column("status")
        for s in results:
            cells = [_cell(sizer, s.by_gpu.get(g)) for g in sizer.accelerators]
            best = s.best
            table.add_row(
                f"{s.rate:g}",
                *cells,
                _cell(sizer, best),
                _none(s) if best is None else best.label(),
                "partial" if s.partial else "proven",
            )
        out.print(table)
    partial = [s for s in results if s.partial]
    if not partial:
        out.print(
            f"proof: {sizer.caps.solves} instance capacities proven by CP-SAT "
            f"({sizer.caps.seconds:.1f} s); the rest pruned by bounds (shardlab.sizing.size)"
        )
    for s in partial:
        out.print(
            f"[bold]partial[/] at {s.rate:g} requests/s: the time limit "
            f"({sizer.time_limit:g} s) ran out first; "
            + ("the cheapest found, " if s.best else "none found, ")
            + f"not proven least-cost. Left unproven: {s.left()}"
        )
    for c in sizer.caps.gaps():
        out.print(
            f"note: {c.label()} ({c.role}) serves {c.rate:.3f}/s, below its CP-SAT optimum "
            f"{c.bound:.3f}/s: an SLO fails at a lower load there (the cost model's latency "
            "dips); its servable capacity is used"
        )


def _cell(sizer: Sizer, d: Any) -> str:
    if d is None:
        return "-"
    return f"{_money(sizer, d.cost)} {d.mode}"


def _print_one(sizer: Sizer, s: Sizing) -> None:
    from rich.table import Table

    best = s.best
    if best is None:
        out.print(f"rate [bold]{s.rate:g} requests/s[/]: {_none(s)}")
        return
    out.print(
        ("[bold]partial[/] (not proven least-cost) " if s.partial else "")
        + f"rate [bold]{s.rate:g} requests/s[/]: [bold]{best.label()}[/] ({best.mode}), "
        + (f"${best.cost:,.2f}/h, " if sizer.priced else "")
        + f"{best.gpus} GPUs on {best.nodes} node(s), "
        f"capacity {best.capacity:.3f}/s"
    )
    table = Table(title="pools")
    tail = bool(sizer.caps.slos)
    for col in ("pool", "GPU", "instances", "GPUs each", "nodes", "plan", "per rank", "TTFT ms",
                "TPOT ms", "requests/s", *(["mean-model requests/s"] if tail else [])):  # fmt: skip
        table.add_column(col)
    for p in best.pools:
        c = p.capacity
        mean = [f"{p.instances * (c.mean_rate or 0):.3f}"] if tail else []
        table.add_row(
            p.role,
            p.gpu,
            str(p.instances),
            str(c.gpus),
            str(p.nodes),
            c.plan.degrees.short() if c.plan else "-",
            str(c.plan.requests_per_rank) if c.plan else "-",
            f"{c.metrics.ttft_ms:,.0f}" if c.metrics and p.role != "decode" else "-",
            f"{c.metrics.tpot_ms:.1f}" if c.metrics and p.role != "prefill" else "-",
            f"{p.rate:.3f}",
            *mean,
        )
    out.print(table)
    if s.simulated is not None:
        slos = sizer.caps.slos
        seen = ", ".join(
            f"p{slos[k][1]:g} {k.removesuffix('_ms').upper()} {v:,.1f} ms (SLO {slos[k][0]:g})"
            for k, v in s.simulated.items()
        )
        met = all(v <= slos[k][0] for k, v in s.simulated.items())
        out.print(
            f"simulated whole at {s.rate:g} requests/s: {seen}: "
            + ("[bold]meets[/]" if met else "[bold]misses[/] (instances pooled behind one router)"),
            soft_wrap=True,
        )
    table = Table(title="each GPU type alone")
    for col in ("GPU", "cost" if sizer.priced else "GPUs", "deployment"):
        table.add_column(col)
    left = {c.gpu for c in s.unproven}
    for g, d in s.by_gpu.items():
        none = "none found in time" if g in left else "none up to --max-gpus"
        table.add_row(g, _cell(sizer, d), d.label() if d else none)
    out.print(table)


def _none(s: Sizing) -> str:
    return "none found in time" if s.partial else "none up to --max-gpus"


def _per_dollar(
    problem: Problem,
    traffic: Traffic | None,
    gpus: str,
    price: str | None,
    serving: str,
    max_gpus: int,
    seed: int,
    jobs: int,
    executor: str,
    address: str | None,
    not_taken: tuple[object, ...],
    out_file: str | None,
    fmt: Format,
) -> None:
    """``size --per-dollar``: :func:`shardlab.sizing.per_dollar.per_dollar`, printed."""
    from shardlab.sizing.inputs import parse_prices
    from shardlab.sizing.per_dollar import per_dollar
    from shardlab.sizing.size import Sizer

    if any(v is not None for v in not_taken):
        raise ShardlabError(
            "--per-dollar ranks instances by their own capacity: it takes no --rate, "
            "--rates, --buckets, --time-limit or --plot",
            field="per_dollar",
        )
    if serving == "disagg":
        raise ShardlabError(
            "--per-dollar ranks aggregated instances (Vidur-Search's replicas)",
            field="serving",
            fix="drop --serving disagg",
        )
    accs = parse_accelerators(gpus)
    prices = parse_prices(price, list(accs))
    if prices is None:
        raise ShardlabError(
            "--per-dollar needs each GPU type's price", field="price",
            fix="give --price, e.g. a100=2.21,h100=4.25",
        )  # fmt: skip
    if out_file is not None:
        check_output_file(out_file, flag="--out")
    w = problem.workload
    # an instance's capacity does not depend on the rate; the workload needs one
    held = traffic.rate if traffic is not None and traffic.rate is not None else 1.0
    problem = dataclasses.replace(problem, workload=w.at_rate(held))
    sizer = Sizer(
        problem, accs, prices=prices, serving="agg", max_gpus=max_gpus, seed=seed, jobs=jobs,
        executor=executor, address=address, traffic=traffic if w.tail else None,
    )  # fmt: skip
    ranked = per_dollar(sizer)
    data = _per_dollar_json(sizer, ranked)
    if out_file is not None:
        write_text(out_file, _dumps(data))
    if fmt is Format.json:
        emit_json({"problem": problem_json(problem), **data})
        return
    _print_per_dollar(sizer, ranked)
    if out_file is not None:
        out.print(f"wrote {out_file}")


def _per_dollar_json(sizer: Sizer, ranked: Any) -> dict[str, Any]:
    best = ranked.best
    return {
        "model": sizer.problem.model.name,
        "engine": sizer.problem.engine,
        "traffic": None if sizer.traffic is None else sizer.traffic.source,
        "slos": {k: {"ms": v, "percentile": p} for k, (v, p) in sizer.caps.slos.items()},
        "prices": sizer.prices,
        "instances": [
            {
                "gpu": v.gpu,
                "gpus": v.gpus,
                "plan": v.plan.degrees.short() if v.plan else None,
                "requests_per_rank": v.plan.requests_per_rank if v.plan else None,
                "status": v.status,
                "mean_model_rps": v.mean_rate,
                "rps": v.rate,
                "cost_per_hour": v.cost,
                "rps_per_dollar": v.per_dollar,
                "solve_s": v.solve_s,
                "simulate_s": v.simulate_s,
                "probes": [dataclasses.asdict(p) for p in v.probes],
            }
            for v in ranked.instances
        ],
        "best": None if best is None else {"gpu": best.gpu, "gpus": best.gpus},
        "seconds": ranked.seconds,
    }


def _print_per_dollar(sizer: Sizer, ranked: Any) -> None:
    from rich.table import Table

    p = sizer.problem
    w = p.workload
    slos = ", ".join(
        f"p{pct:g} {k.removesuffix('_ms').upper()} <= {v:g} ms"
        for k, (v, pct) in sizer.caps.slos.items()
    )
    source = "Poisson arrivals" if sizer.traffic is None else sizer.traffic.source
    out.print(
        f"[bold]{p.model.name}[/]: {w.input_len} in / {w.output_len} out (mean), "
        f"{slos or 'SLOs on the mean'}; {p.engine}"
        + (" (plans it can launch)" if p.space_kind == "engine" else "")
        + f", {p.timing} timing; under {source}",
        soft_wrap=True,
    )
    table = Table(title="requests/s per dollar, one instance (its replicas scale both)")
    for col in ("GPU", "GPUs", "plan", "per rank", "mean-model req/s", "req/s at SLOs",
                "$/h", "req/s per $/h", "solve s", "simulate s"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("GPU", "plan") else "right")
    best = ranked.best
    for v in ranked.instances:
        mark = " *" if v is best else ""
        table.add_row(
            v.gpu + mark,
            str(v.gpus),
            v.plan.degrees.short() if v.plan else v.status,
            str(v.plan.requests_per_rank) if v.plan else "-",
            f"{v.mean_rate:.3f}",
            f"{v.rate:.3f}",
            f"{v.cost:.2f}",
            f"{v.per_dollar:.4f}",
            f"{v.solve_s:.1f}",
            f"{v.simulate_s:.1f}",
        )
    out.print(table)
    if best is None:
        out.print("no instance serves under the SLOs")
    else:
        out.print(
            f"best: {best.gpus} x {best.gpu} ({best.plan.degrees.short() if best.plan else ''}), "
            f"{best.rate:.3f} requests/s at ${best.cost:.2f}/h = {best.per_dollar:.4f} "
            "requests/s per $/h (shardlab.sizing.per_dollar states the claim)",
            soft_wrap=True,
        )
    out.print(
        f"{len(ranked.instances)} instances in {ranked.seconds:.1f} s: CP-SAT "
        f"{sum(v.solve_s for v in ranked.instances):.1f} s, capacity searches "
        f"{sum(v.simulate_s for v in ranked.instances):.1f} s"
    )
