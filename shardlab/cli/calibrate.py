"""Fitted corrections: ``shardlab calibrate`` (kernel-class factors, the engines' fixed
costs, and with ``--simulate`` the engines' costs through the simulator)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.table import Table

from shardlab.cli.app import Format, FormatOpt, app, command_line
from shardlab.cli.checks import FilterOpt, _filters
from shardlab.cli.render import emit_json, out, task_progress
from shardlab.errors import ShardlabError
from shardlab.files import check_output_file, write_text
from shardlab.problems.engines import ENGINES
from shardlab.solvers.choices import listed

CalibrateMeasurementsOpt = Annotated[
    str | None,
    typer.Option(
        help="Measurements to fit (CSV, or aiconfigurator-sample; default: the published ones)."
    ),
]
OutPathOpt = Annotated[
    str | None,
    typer.Option("--out", help="Calibration (or with --engines, engine costs) to write."),
]
HoldOutOpt = Annotated[
    str | None,
    typer.Option(
        help="Judge each row by a fit without its group: row (leave-one-out), family, gpu "
        "or engine; comma-separated (default: row; measured serving: family,gpu)."
    ),
]
EnginesOpt = Annotated[
    bool,
    typer.Option(
        "--engines",
        help="Fit only each engine's fixed costs (per request, per iteration), the file "
        "shardlab ships (shardlab/data/serving/engines.yaml).",
    ),
]
TieOpt = Annotated[
    str,
    typer.Option(
        help="Which kernel classes share a fitted factor: classes (each its own), shared "
        "(one for all four: an efficiency of the roofline, what rows of one model family "
        "can identify) or compute (one for GEMM, attention and MoE, one for communication)."
    ),
]
ReportPathOpt = Annotated[
    str | None, typer.Option("--report", help="Markdown of the fit's errors to write.")
]
SimulateFitOpt = Annotated[
    bool,
    typer.Option(
        "--simulate",
        help="With --engines: also fit each engine's costs per request and per iteration "
        "through the simulator (each measured closed loop replayed request by request), "
        "the ones the simulator adds; minutes on the measured serving sample.",
    ),
]


@app.command()
def calibrate(
    measurements: CalibrateMeasurementsOpt = None,
    out_path: OutPathOpt = None,
    timing: Annotated[str, typer.Option(help="The timing backend to correct.")] = "roofline",
    engine: Annotated[str, typer.Option(help=f"{listed(ENGINES)} (rows that say none).")] = (
        "trtllm"
    ),
    hold_out: HoldOutOpt = None,
    tie: TieOpt = "classes",
    engines: EnginesOpt = False,
    simulate: SimulateFitOpt = False,
    report_path: ReportPathOpt = None,
    gpu: FilterOpt = None,
    backend: FilterOpt = None,
    family: FilterOpt = None,
    mode: FilterOpt = None,
    protocol: FilterOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Fit per-kernel-class corrections (GEMM, attention, MoE, communication; --tie
    shares one between classes) and the engine's fixed costs per request and per
    iteration to measurements; report the
    error before, fitted, and on rows held out of the fit (by row, model family or
    GPU). Apply them with --calibration."""

    from shardlab.validation import load_measurements
    from shardlab.validation.calibrate import calibrate as fit_calibration
    from shardlab.validation.fit_report import write_fit_report

    if simulate and not engines:
        raise ShardlabError(
            "calibrate: --simulate fits the engines' costs through the simulator",
            fix="add --engines",
        )
    if engines and tie != "classes":
        raise ShardlabError(
            "calibrate: --engines fits no kernel factors, so none to tie", fix="drop --tie"
        )
    if out_path is not None:
        check_output_file(out_path, flag="--out", parents=True)
    if report_path is not None:
        check_output_file(report_path, flag="--report", parents=True)
    filters = _filters(gpu=gpu, backend=backend, family=family, mode=mode, protocol=protocol)
    measured = load_measurements(measurements, filters)
    groupings = [g for g in (hold_out or ("family,gpu" if measured.serving else "row")).split(",")]
    source = measurements or "the published measurements"
    described = source + "".join(f", {k} {','.join(v)}" for k, v in filters.items())
    with task_progress("calibrate", len(measured.rows), unit="rows priced") as progress:
        report = fit_calibration(
            measured.rows,
            timing,
            engine,
            described,
            hold_out=[g.strip() for g in groupings if g.strip()],
            factors=not engines,
            tie=tie,
            per_engine=engines,
            progress=lambda done, total: progress(done, f"{timing} timing"),
        )
    simulated = None
    if simulate:
        from shardlab.validation.simulated_costs import (
            fit_through_simulator,
            replay_without_costs,
        )

        with task_progress("simulate", unit="rows replayed") as progress:
            replayed = replay_without_costs(
                measured.rows,
                timing,
                progress=lambda done, total: progress(done, "closed loops", total=total),
            )
        simulated = fit_through_simulator(replayed)
    command = command_line(
        "shardlab calibrate",
        measurements=measurements,
        **{k: ",".join(v) for k, v in filters.items()},
        timing=timing,
        engine=engine if engine != "trtllm" else None,
        hold_out=hold_out,
        tie=tie if tie != "classes" else None,
        out=out_path,
        report=report_path,
        engines=engines,
        simulate=simulate,
    )
    summary = report.summary()
    if out_path is not None:
        write_text(out_path, _calibration_text(report, command, engines, simulated))
    if report_path is not None:
        text = write_fit_report(report, command, described)
        if simulated is not None:
            text += "\n" + "\n".join(_simulated_section(simulated)) + "\n"
        write_text(report_path, text)
    if fmt is Format.json:
        emit_json(
            {
                "calibration": asdict(report.calibration),
                "engines": {"request_ms": report.fitted.request_ms,
                            "iteration_ms": report.fitted.iteration_ms,
                            "simulated_request_ms":
                                None if simulated is None else simulated.request_ms,
                            "simulated_iteration_ms":
                                None if simulated is None else simulated.iteration_ms},
                "summary": summary,
                "held_out": {g: report.held_out_summary(g) for g in report.held_out_by},
            }
        )  # fmt: skip
        return
    _print_fit(report, summary, timing, engines, out_path)
    if simulated is not None:
        for e in sorted(simulated.request_ms):
            out.print(
                f"{e}: {simulated.request_ms[e]:.1f} ms per request, "
                f"{simulated.iteration_ms[e]:.2f} ms per iteration in the simulator"
            )
        for (e, metric), n in sorted(simulated.rows.items()):
            out.print(
                f"  {e} {metric}: {n} rows replayed; median error "
                f"{simulated.in_sample[(e, metric)]:.1%}, family held out "
                f"{simulated.family_held_out[(e, metric)]:.1%}"
            )


def _simulated_section(fit: Any) -> list[str]:
    return [
        "## The engine costs through the simulator",
        "",
        "Each aggregated TTFT and TPOT row's closed loop replayed request by request "
        "(`shardlab.validation.simulated_costs`) with no engine costs and with 1 ms per "
        "iteration; the per-iteration cost is the one that minimizes the median |TPOT "
        "error|, the per-request cost then the median |TTFT error|. The simulator adds "
        "them; the forms keep the ones above, which also stand for the queueing and "
        "prefill stalls they lack.",
        "",
        *fit.lines(),
    ]


def _calibration_text(report: Any, command: str, engines: bool, simulated: Any = None) -> str:
    """The fit as the file ``--calibration`` reads, or (``--engines``) as the engine
    constants shardlab ships."""
    from shardlab.costmodel import serving_constants_yaml

    if not engines:
        return report.calibration.to_yaml()
    header = [
        "Each serving engine's fixed costs (shardlab.costmodel.engines), fitted by",
        f"  {command}",
        "do not edit by hand. " + report.calibration.fitted_on,
    ]
    return serving_constants_yaml(
        report.fitted.request_ms,
        report.fitted.iteration_ms,
        header,
        None if simulated is None else simulated.request_ms,
        None if simulated is None else simulated.iteration_ms,
    )


def _print_fit(
    report: Any, summary: dict, timing: str, engines: bool, out_path: str | None
) -> None:
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
        f"{summary['worst_cross_validated']:.2f}x)"
        + (f"; wrote {out_path}" if out_path is not None else "; --out FILE saves the fit")
    )
