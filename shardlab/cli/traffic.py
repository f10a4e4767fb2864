"""``shardlab traffic``: what a trace or a synthetic traffic holds, in a few numbers."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.table import Table

from shardlab.cli.app import Format, FormatOpt, app
from shardlab.cli.render import emit_json, out
from shardlab.errors import ShardlabError
from shardlab.problems.problem import Problem
from shardlab.problems.traces import TRACE_FORMATS, read_trace
from shardlab.problems.traffic import (
    Arrivals,
    Lengths,
    Traffic,
    TrafficSummary,
    closed_loop,
    summarize,
    synthetic_traffic,
)
from shardlab.problems.workload import get_workload
from shardlab.solvers.certify import CERTIFY_REQUESTS, TRIES
from shardlab.solvers.choices import listed

# How many refused rows the table lists (the JSON lists them all).
SHOWN_REFUSALS = 10
SYNTHETIC_REQUESTS = 1000
BENCHMARK_PROMPTS = 10  # prompts per client of InferenceX's closed loop

# The options that name a traffic, shared by every command that takes one.
TrafficFileOpt = Annotated[
    str | None,
    typer.Option(
        "--traffic",
        help=f"A trace file ({listed(TRACE_FORMATS)}; .gz is read as it is). "
        "Without it: a synthetic traffic from the options below.",
    ),
]
TraceFormatOpt = Annotated[
    str | None,
    typer.Option(
        "--trace-format",
        help=f"The trace's format, {listed(TRACE_FORMATS)} (default: from its name and header).",
    ),
]
RateOpt = Annotated[
    float | None,
    typer.Option(
        help="Requests/s: a trace's timestamps rescaled to this mean rate (its "
        "burstiness kept), or the rate of synthetic arrivals."
    ),
]
ArrivalOpt = Annotated[
    str | None,
    typer.Option(
        help="poisson or gamma (default: a trace's own timestamps; poisson without a "
        "trace). --clients makes a closed loop instead."
    ),
]
CvOpt = Annotated[
    float,
    typer.Option(help="Gamma arrivals: the coefficient of variation of the gaps (1: Poisson)."),
]
RequestsOpt = Annotated[
    int | None, typer.Option(help="Synthetic: the number of requests. [default: 1000]")
]
InputLenOpt = Annotated[int, typer.Option("--input-len", help="Synthetic: prompt tokens.")]
OutputLenOpt = Annotated[int, typer.Option("--output-len", help="Synthetic: generated tokens.")]
RangeRatioOpt = Annotated[
    float,
    typer.Option(
        "--range-ratio",
        help="Synthetic: lengths uniform in [r x nominal, nominal] (the benchmarks' random "
        "range ratio, e.g. 0.8; 1: fixed).",
    ),
]
ClientsOpt = Annotated[
    int | None,
    typer.Option(help="A closed loop: requests in flight (the benchmark's concurrency)."),
]
PromptsPerClientOpt = Annotated[
    int | None,
    typer.Option("--prompts-per-client", help="A closed loop: requests per client. [default: 10]"),
]
SeedOpt = Annotated[int, typer.Option(min=0, help="Seed of the synthetic draws.")]


@app.command()
def traffic(
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
    fmt: FormatOpt = Format.table,
) -> None:
    """Summarise a traffic: requests, span, mean rate, burstiness (CV of the gaps between
    arrivals) and percentiles of the input and output lengths, with the trace rows
    that could not be read."""
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
    summary = summarize(chosen)
    if fmt is Format.json:
        emit_json(asdict(summary))
        return
    _print(summary)


def build_traffic(
    *,
    traffic_file: str | None,
    trace_format: str | None,
    rate: float | None,
    arrival: str | None,
    cv: float,
    requests: int | None,
    input_len: int,
    output_len: int,
    range_ratio: float,
    clients: int | None,
    prompts_per_client: int | None,
    seed: int,
) -> Traffic:
    """The traffic the traffic options name (see ``shardlab traffic``): a trace, as it is
    or under other arrivals or rate; a closed loop; or synthetic arrivals."""
    lengths = Lengths(
        kind="uniform" if range_ratio != 1 else "fixed",
        input_len=input_len,
        output_len=output_len,
        range_ratio=range_ratio,
    )
    if not cv > 0:  # refused even where unused: a CV <= 0 is a mistake either way
        raise ShardlabError(
            f"the coefficient of variation of the gaps must be a positive number, got {cv!r}",
            field="cv",
        )
    if arrival not in (None, "poisson", "gamma"):
        raise ShardlabError(f"arrival {arrival!r} is not one of poisson, gamma", field="arrival")
    chosen: Traffic
    if clients is None and prompts_per_client is not None:
        raise ShardlabError(
            "prompts per client make a closed loop: give its clients", field="clients"
        )
    if traffic_file is not None and prompts_per_client is not None:
        raise ShardlabError(
            "a trace run as a closed loop sends its own requests", field="prompts_per_client"
        )
    if requests is not None and (clients is not None or traffic_file is not None):
        raise ShardlabError(
            "a closed loop has clients x prompts per client requests, a trace its own",
            field="requests",
        )
    if clients is not None:
        if arrival is not None or rate is not None:
            raise ShardlabError(
                "a closed loop has no arrivals or rate: give either clients or an arrival",
                field="clients",
            )
        if traffic_file is not None:
            trace = read_trace(traffic_file, trace_format)
            chosen = trace.with_arrivals(Arrivals(kind="closed", clients=clients))
        else:
            chosen = closed_loop(
                clients=clients,
                prompts_per_client=(
                    BENCHMARK_PROMPTS if prompts_per_client is None else prompts_per_client
                ),
                lengths=lengths,
                seed=seed,
            )
    elif traffic_file is not None:
        chosen = read_trace(traffic_file, trace_format)
        if arrival is not None:
            kind = "gamma" if arrival == "gamma" else "poisson"
            chosen = chosen.with_arrivals(
                Arrivals(kind=kind, rate=rate or chosen.rate, cv=cv), seed=seed
            )
        elif rate is not None:
            chosen = chosen.at_rate(rate)
    else:
        if rate is None:
            raise ShardlabError(
                "a synthetic traffic needs a rate (requests/s), or a closed loop's clients",
                field="rate",
            )
        kind = "gamma" if arrival == "gamma" else "poisson"
        chosen = synthetic_traffic(
            requests=SYNTHETIC_REQUESTS if requests is None else requests,
            lengths=lengths,
            arrivals=Arrivals(kind=kind, rate=rate, cv=cv),
            seed=seed,
        )
    return chosen


def _print(s: TrafficSummary) -> None:
    head = f"{s.source}: {s.requests:,} requests"
    if s.arrival == "closed":
        head += f", a closed loop of {s.clients:,} clients"
    elif s.span_s is not None:
        rate = "-" if s.rate is None else f"{s.rate:,.2f}/s"
        cv = "-" if s.gap_cv is None else f"{s.gap_cv:.2f}"
        head += f" ({s.arrival}) over {s.span_s:,.0f} s, mean rate {rate}, CV of gaps {cv}"
    out.print(head, markup=False, soft_wrap=True)
    table = Table()
    for col in ("tokens", "p50", "p90", "p99", "max", "mean"):
        table.add_column(col, justify="left" if col == "tokens" else "right")
    for name, values in (("input", s.input_len), ("output", s.output_len)):
        table.add_row(name, *(f"{v:,}" for v in values.values()))
    out.print(table)
    if s.refused:
        out.print(f"{len(s.refused):,} rows refused:", markup=False)
        for r in s.refused[:SHOWN_REFUSALS]:
            out.print(f"  {r.reason}", markup=False, soft_wrap=True)
        if len(s.refused) > SHOWN_REFUSALS:
            out.print(f"  ... and {len(s.refused) - SHOWN_REFUSALS:,} more", markup=False)


# SLOs at a percentile and the traffic that checks them: the options of the commands
# that take a traffic (problem_command(traffic=True)).
TRAFFIC_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    (
        "slo_percentile",
        float | None,
        typer.Option(
            None,
            "--slo-percentile",
            help="Hold every SLO at this percentile of the requests (e.g. 90, 99), checked "
            "by simulating the traffic; default: on the mean.",
        ),
    ),
    (
        "ttft_percentile",
        float | None,
        typer.Option(None, "--ttft-percentile", help="The TTFT SLO's own percentile."),
    ),
    (
        "tpot_percentile",
        float | None,
        typer.Option(None, "--tpot-percentile", help="The TPOT SLO's own percentile."),
    ),
    (
        "itl_ms",
        float | None,
        typer.Option(
            None,
            "--itl-ms",
            help="SLO on every gap between two tokens (Vidur's TBT), at a percentile only.",
        ),
    ),
    (
        "itl_percentile",
        float | None,
        typer.Option(None, "--itl-percentile", help="The ITL SLO's own percentile."),
    ),
    (
        "traffic_file",
        str | None,
        typer.Option(
            None,
            "--traffic",
            help=f"A trace file ({listed(TRACE_FORMATS)}): its mean lengths and rate are "
            "the workload's, and percentile SLOs are simulated under it.",
        ),
    ),
    (
        "trace_format",
        str | None,
        typer.Option(None, "--trace-format", help=f"The trace's format, {listed(TRACE_FORMATS)}."),
    ),
    (
        "arrival",
        str | None,
        typer.Option(
            None, help="poisson or gamma arrivals at --rate (default: a trace's own, or poisson)."
        ),
    ),
    ("cv", float, typer.Option(1.0, help="Gamma arrivals: the CV of the gaps (1: Poisson).")),
    (
        "range_ratio",
        float,
        typer.Option(
            1.0,
            "--range-ratio",
            help="Synthetic lengths uniform in [r x nominal, nominal] (e.g. 0.8; 1: fixed).",
        ),
    ),
    (
        "requests",
        int | None,
        typer.Option(None, help=f"Synthetic traffic: requests. [default: {CERTIFY_REQUESTS}]"),
    ),
    (
        "tries",
        int,
        typer.Option(
            TRIES, min=1, help="Percentile SLOs: plans the simulator may reject before giving up."
        ),
    ),
)

PERCENTILE_OPTIONS = TRAFFIC_OPTIONS[:5]


def traffic_of(options: dict[str, Any], *, takes_rate: bool = True) -> Traffic | None:
    """The traffic the options name, its own options taken out of ``options`` and the
    workload's set from it: a trace's mean lengths and (open arrivals, when the
    command takes a rate) its rate. None when they name none (a percentile SLO is then
    checked under the workload's own traffic)."""
    file, fmt = options.pop("traffic_file"), options.pop("trace_format")
    arrival, cv = options.pop("arrival"), options.pop("cv")
    range_ratio, requests = options.pop("range_ratio"), options.pop("requests")
    synthetic = arrival is not None or cv != 1.0 or range_ratio != 1.0 or requests is not None
    if file is None and not synthetic:
        return None
    if file is not None:
        for key in ("input_len", "output_len"):
            if options.get(key) is not None:
                flag = "--" + key.replace("_", "-")
                raise ShardlabError(
                    f"{flag} {options[key]}: a trace has its own lengths",
                    field=key,
                    fix=f"drop {flag}, or drop --traffic for a synthetic traffic",
                )
    elif takes_rate and options.get("rate") is None and options.get("clients") is None:
        raise ShardlabError(
            "a synthetic traffic needs a rate (requests/s), or a closed loop's clients",
            field="rate",
            fix="give --rate (or --clients), or a trace with --traffic",
        )
    w = get_workload(options["workload"])
    # a command sizing for rates of its own takes the traffic's shape (arrivals at 1/s,
    # rescaled to each rate) when it has no trace
    shape_rate = None if file is not None or takes_rate else 1.0
    made = build_traffic(
        traffic_file=file,
        trace_format=fmt,
        rate=options.get("rate") or shape_rate,
        arrival=arrival,
        cv=cv,
        requests=requests or (None if file else CERTIFY_REQUESTS),
        input_len=options.get("input_len") or w.input_len,
        output_len=options.get("output_len") or w.output_len,
        range_ratio=range_ratio,
        clients=options.get("clients"),
        prompts_per_client=options.get("prompts_per_client"),
        seed=0,
    )
    # the analytic model prices the traffic's mean request
    options["input_len"] = max(1, round(float(made.input_len.mean())))
    options["output_len"] = max(2, round(float(made.output_len.mean())))
    if file is not None and made.arrival != "closed" and takes_rate:
        options["rate"] = made.rate
    return made


def simulated(problem: Problem, traffic: Traffic | None) -> Traffic | None:
    """The traffic a command simulates: the one named, under SLOs at a percentile; on
    the mean none (the traffic gave the workload its mean request and rate, nothing
    more)."""
    return traffic if problem.workload.tail else None
