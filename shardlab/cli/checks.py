"""The cost model against measurements: validation reports and fitted corrections."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, get_args

import typer
from rich.table import Table

from shardlab.cli.app import Format, FormatOpt, app, command_line
from shardlab.cli.render import (
    emit_json,
    out,
    task_progress,
    validation_table,
)
from shardlab.errors import ShardlabError
from shardlab.files import check_output_file
from shardlab.problems.problem import Timing
from shardlab.solvers.choices import listed

FilterOpt = Annotated[
    str | None, typer.Option(help="Measured serving only: keep these (comma-separated).")
]


def _filters(**given: str | None) -> dict[str, list[str]]:
    return {k: [x for x in v.split(",") if x.strip()] for k, v in given.items() if v}


MeasurementsOpt = Annotated[
    str | None,
    typer.Option(
        help="Your measurements (CSV in shardlab's columns or in the measured serving "
        "sample's), or aiconfigurator-sample (aiconfigurator-core's measured serving)."
    ),
]
EngineOpt = Annotated[
    str, typer.Option(help="Engine whose measured kernels price the silicon column.")
]
CalibrationOpt = Annotated[
    str | None, typer.Option(help="Also predict with these corrections (YAML).")
]
TimingOpt = Annotated[
    str | None,
    typer.Option(help=f"{listed(get_args(Timing))} (default: all; measured serving: silicon)."),
]
PeerOpt = Annotated[
    str | None,
    typer.Option(
        help="Measured serving: another estimator's predictions of the same rows (CSV of "
        "tests/data/make_aiconfigurator_sample.py), compared on the rows both price."
    ),
]
AiconfiguratorOpt = Annotated[
    str | None,
    typer.Option(help="Instead: agreement with this grid of AIConfigurator agg estimates."),
]


ReplayOpt = Annotated[
    bool,
    typer.Option(
        "--replay/--no-replay",
        help="Replay each row that states its load (clients, or rate and requests) in the "
        "simulator, and report each statistic (mean, median, pNN) beside the analytic mean.",
    ),
]
ReplayHoldOutOpt = Annotated[
    str | None,
    typer.Option(
        "--hold-out",
        help="With the replay: also replay each row under engine costs fitted on measured "
        "serving (aiconfigurator-sample) without its family or gpu; measured serving: also "
        "predict each row so; comma-separated.",
    ),
]


@app.command()
def validate(
    measurements: MeasurementsOpt = None,
    out_path: Annotated[str | None, typer.Option("--out", help="Markdown report to write.")] = None,
    engine: EngineOpt = "trtllm",
    calibration: CalibrationOpt = None,
    timing: TimingOpt = None,
    gpu: FilterOpt = None,
    backend: FilterOpt = None,
    family: FilterOpt = None,
    mode: FilterOpt = None,
    protocol: FilterOpt = None,
    peer: PeerOpt = None,
    aiconfigurator: AiconfiguratorOpt = None,
    replay: ReplayOpt = True,
    hold_out: ReplayHoldOutOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Predict every measurement and compare: the published ones, measured serving
    (aiconfigurator-sample) or yours; rows that state their load are also replayed in
    the simulator, each statistic apart; --out writes the report."""

    if out_path is not None:
        check_output_file(out_path, flag="--out", parents=True)
    if timing is not None and timing not in get_args(Timing):
        raise ShardlabError(f"--timing {timing!r} is not one of {', '.join(get_args(Timing))}")
    if aiconfigurator is not None:
        _agreement(aiconfigurator, out_path, fmt)
        return

    from shardlab.problems.calibration import Calibration
    from shardlab.validation import analytic, load_measurements, no_analytic_percentile, predict_all
    from shardlab.validation import write_report as write_validation

    filters = _filters(gpu=gpu, backend=backend, family=family, mode=mode, protocol=protocol)
    measured = load_measurements(measurements, filters)
    cal = Calibration.load(calibration) if calibration is not None else None
    command = command_line(
        "shardlab validate",
        measurements=measurements,
        out=out_path,
        engine=engine if engine != "trtllm" else None,
        calibration=calibration,
        timing=timing,
        **{k: ",".join(v) for k, v in filters.items()},
        peer=peer,
        no_replay=not replay,
        hold_out=hold_out,
    )
    groups = [g.strip() for g in (hold_out or "").split(",") if g.strip()]
    for g in groups:
        if g not in ("family", "gpu"):
            raise ShardlabError(
                f"--hold-out {g!r}: a replay holds out a family or a gpu", field="hold_out"
            )
    if measured.serving:
        _validate_serving(measured, timing or "silicon", cal, out_path, command, peer, fmt, groups)
        return
    if peer is not None:
        raise ShardlabError("--peer compares measured serving rows (the sample's columns)")
    if groups and not replay:
        raise ShardlabError("--hold-out judges the replay: drop --no-replay", field="hold_out")
    replayed = _replay(measured.rows, timing or "silicon", engine, cal, groups) if replay else {}
    rows, percentiles = analytic(measured.rows)
    runs = [(t, t, None) for t in ([timing] if timing else get_args(Timing))]
    if cal is not None:
        runs.append((f"{cal.timing}+calibration", cal.timing, cal))
    by_timing: dict[str, Any] = {}
    with task_progress("validate", len(rows) * len(runs), unit="rows") as report:
        for i, (name, t, c) in enumerate(runs):

            def progress(done: int, total: int, i: int = i, name: str = name) -> None:
                report(i * total + done, f"{name} timing")

            by_timing[name] = predict_all(t, engine, rows, c, progress=progress)
    source = measurements or "shardlab/data/validation/measured.csv"
    sections = _replay_sections(replayed, out_path)
    summaries = write_validation(
        by_timing,
        command,
        source,
        path=_path(out_path),
        percentiles=percentiles,
        sections=sections,
    )
    if fmt is Format.json:
        emit_json(
            {
                "summary": summaries,
                "replayed": {
                    name: [
                        {
                            "id": r.measurement.id,
                            "metric": r.measurement.metric,
                            "statistic": r.measurement.statistic,
                            "measured": r.measurement.value,
                            "simulated": r.simulated,
                            "analytic_mean": r.analytic_mean,
                            "note": r.note,
                        }
                        for r in rs
                    ]
                    for name, rs in replayed.items()
                },
                "rows": {
                    t: [{**_row_dict(r), "ratio": r.ratio} for r in rs]
                    for t, rs in by_timing.items()
                },
                # rows of a median or percentile: the analytic model predicts means only
                "no_analytic_percentile": [
                    {"id": m.id, "metric": m.metric, "statistic": m.statistic, "value": m.value}
                    for m in percentiles
                ],
                "refused": [asdict(x) for x in measured.refused],
            }
        )
        return
    if rows:
        out.print(validation_table(by_timing))
    if percentiles:
        out.print(no_analytic_percentile(percentiles))
    if replayed:
        from shardlab.validation.replay_report import statistic_table

        out.print("\n".join(statistic_table(replayed)), markup=False, soft_wrap=True)
    for t, summary in summaries.items():
        out.print(
            f"{t}: median |error| {summary['median_abs_error']:.1%}, within 25%: "
            f"{summary['within_25pct']}/{summary['rows']}, 1.5x or more: "
            f"{summary['beyond_1_5x']}, worst {summary['worst_id']} "
            f"({summary['worst_factor']:.2f}x)"
        )
    for x in measured.refused:
        out.print(f"refused {x.id or '?'} (line {x.line}): {x.reason}")
    _wrote(out_path)


def _replay(
    rows: list[Any], timing: str, engine: str, cal: Any, groups: list[str]
) -> dict[str, list[Any]]:
    """Each row that states its load replayed in the simulator: under the shipped engine
    costs (or the calibration given), then under fits without each row's group."""
    from shardlab.validation.held_out import held_out_costs
    from shardlab.validation.replay import replay, replayable
    from shardlab.validation.serving_sample import read_sample
    from shardlab.validation.simulated_costs import replay_without_costs

    todo = replayable(rows)
    if not todo:
        return {}
    sets: dict[str, list[Any]] = {}
    tables: dict = {}  # one plan's tables serve every set of engine costs
    steps = len(todo) * (1 + len(groups))
    with task_progress("replay", steps, unit="rows") as report:
        name = "calibration" if cal is not None else "shipped costs"
        sets[name] = replay(
            todo,
            timing,
            engine,
            calibration=(lambda m: cal) if cal is not None else None,
            progress=lambda done, total: report(done, name),
            tables=tables,
        )
        # the sample's closed loops without engine costs, for every grouping's fits of
        # the simulator's own
        engines = sorted({m.engine or engine for m in todo})
        sample = replay_without_costs(
            read_sample(mode=["agg"], protocol=["inferencex"], backend=engines).rows,
            timing,
            progress=lambda d, t: report(len(todo), f"the sample's loops {d}/{t}"),
            tables=tables,
        ) if groups else []  # fmt: skip
        for i, g in enumerate(groups, start=1):
            costs = held_out_costs(
                g,
                timing,
                progress=lambda d, t, g=g, i=i: report(i * len(todo), f"{g} fit {d}/{t}"),
                replayed=sample,
            )
            sets[f"{g} held out"] = replay(
                todo,
                timing,
                engine,
                calibration=costs,
                progress=lambda done, total, i=i, g=g: report(
                    i * len(todo) + done, f"{g} held out"
                ),
                tables=tables,
            )
    return sets


def _replay_sections(replayed: dict[str, list[Any]], out_path: str | None) -> list[str]:
    """The replay's part of the report (and its rows as CSV beside it)."""
    if not replayed:
        return []
    from shardlab.validation.replay_report import (
        goals,
        group_table,
        refusals,
        rows_csv,
        statistic_table,
    )
    from shardlab.validation.report import write_output

    first = next(iter(replayed.values()))
    lines = [
        "## Replayed in the simulator, each statistic apart",
        "",
        f"{len(first):,} rows state their load and were replayed request by request "
        "(`shardlab.simulate`), each under the deployment it measured; beside each "
        "statistic, the analytic model's mean of the same metric (the only number it "
        "has). Costs: the engine costs shardlab ships, and fits of them on measured "
        "serving that did not see the row's group (*... held out*).",
        "",
        *statistic_table(replayed),
    ]
    for name, rs in replayed.items():
        if name.endswith("held out"):
            lines += ["", f"### The issue's goals, {name}", "", *goals(rs)]
    lines += ["", "### By GPU, engine and serving mode (first costs)", ""]
    lines += group_table(
        first,
        lambda r: (r.measurement.gpu, r.engine,
                   "disagg" if r.measurement.disagg is not None else "agg"),
        ["gpu", "engine", "mode"],
    )  # fmt: skip
    missing = refusals(first)
    if missing:
        lines += ["", "Not simulated:", "", *missing]
    if out_path is not None:
        csv_path = Path(out_path).with_suffix(".replay.csv")
        write_output(csv_path, rows_csv([r for rs in replayed.values() for r in rs]))
        lines += ["", f"Every replayed row, each set of costs: `{csv_path.name}`."]
    return lines


def _path(out_path: str | None) -> Path | None:
    return Path(out_path) if out_path is not None else None


def _wrote(out_path: str | None) -> None:
    out.print(f"wrote {out_path}" if out_path is not None else "--out FILE writes the report")


def _row_dict(r: Any) -> dict:
    return {k: v for k, v in asdict(r).items() if k != "measurement"}


def _validate_serving(
    measured: Any,
    timing: str,
    cal: Any,
    out_path: str | None,
    command: str,
    peer: str | None,
    fmt: Format,
    groups: list[str],
) -> None:
    """Measured serving: predicted with one timing backend, reported by group; with
    ``groups``, each row also under engine costs fitted without its group."""
    from pathlib import Path

    from shardlab.validation import predict
    from shardlab.validation.held_out import held_out_costs
    from shardlab.validation.report import write_output
    from shardlab.validation.serving_report import (
        held_out_csv,
        held_out_section,
        peer_section,
        write_serving_report,
    )

    if peer is not None and not Path(peer).is_file():
        raise ShardlabError(f"--peer {peer!r}: no such file")
    if groups and cal is not None:
        raise ShardlabError(
            "--hold-out fits the engine costs itself: drop --calibration", field="hold_out"
        )
    rows: list[Any] = []
    with task_progress("validate", len(measured.rows), unit="rows") as report:
        for m in measured.rows:
            rows.append(predict(m, timing, m.engine or "trtllm", cal))
            report(len(rows), f"{timing} timing")
    held: dict[str, list[Any]] = {}
    for g in groups:
        with task_progress(f"{g} held out", unit="rows") as report:
            costs = held_out_costs(
                g,
                timing,
                progress=lambda d, t, g=g: report(d, f"{g} fit: rows priced", total=t),
                through_simulator=False,
            )
            held[g] = [predict(m, timing, m.engine or "trtllm", costs(m)) for m in measured.rows]
    sections = peer_section(rows, Path(peer)) if peer is not None else []
    sections += held_out_section(rows, held) if held else []
    md = _path(out_path)
    if held and md is not None:
        write_output(md.with_suffix(".held-out.csv"), held_out_csv(rows, held))
    summary = write_serving_report(
        rows,
        measured,
        command,
        md_path=md,
        csv_path=md.with_suffix(".csv") if md is not None else None,
        sections=sections,
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
    out.print(f"{len(measured.refused):,} rows refused (reasons in the report)")
    _wrote(out_path)


def _agreement(grid: str, out_path: str | None, fmt: Format) -> None:
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
        command = command_line("shardlab validate", aiconfigurator=grid, out=out_path)
        write_side_by_side(rows, command, grid, path=_path(out_path))
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
        _wrote(out_path)
        return
    by_timing = {t: against_reference(grid, t) for t in get_args(Timing)}
    command = command_line("shardlab validate", aiconfigurator=grid, out=out_path)
    write_agreement(by_timing, command, path=_path(out_path))
    summaries = {t: agreement_summary(rows) for t, rows in by_timing.items()}
    if fmt is Format.json:
        emit_json({"summary": summaries})
        return
    for t, s in summaries.items():
        out.print(
            f"{t}: {len(by_timing[t])} points; median error TPOT {s['tpot_ms']:.1%}, TTFT "
            f"{s['ttft_ms']:.1%}, throughput {s['tokens_s']:.1%}"
        )
    _wrote(out_path)
