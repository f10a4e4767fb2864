"""Runs that write ``results/``: comparisons, speed benchmarks, policy training."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from shardlab.cli.app import Format, FormatOpt, app
from shardlab.cli.options import methods_help, problem_command
from shardlab.cli.render import (
    comparison_table,
    emit_json,
    err,
    out,
    task_progress,
    timing_label,
)
from shardlab.cli.traffic import simulated
from shardlab.compare.journal import JOURNAL, Journal
from shardlab.errors import ShardlabError
from shardlab.executors import check_executor
from shardlab.files import check_output_dir, check_output_file, folder_name, make_dir, write_text
from shardlab.problems.problem import Problem
from shardlab.problems.suite import SUITES
from shardlab.problems.traffic import Traffic
from shardlab.solvers.base import EXACT_SECONDS
from shardlab.solvers.choices import listed

SuiteOpt = Annotated[
    str, typer.Option(help=f"Instances to train on: {listed(SUITES)}, or an instance's name.")
]
EvalsOpt = Annotated[
    int, typer.Option("--evals", min=1, help="Evaluations per instance and round.")
]
ResumeOpt = Annotated[
    str | None, typer.Option(help="Continue from a checkpoint this command wrote.")
]


@app.command("train-policy")
def train_policy(
    suite: SuiteOpt = "train",
    out_file: Annotated[str, typer.Option("--out", help="Checkpoint to write.")] = "policy.pt",
    evals: EvalsOpt = 500,
    rounds: Annotated[int, typer.Option(min=1, help="Passes over the instances.")] = 1,
    seed: Annotated[int, typer.Option(min=0, help="Same seed, same policy.")] = 0,
    meta_lr: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Step of the meta weights towards each instance's adapted weights "
            "(Reptile; annealed to 0 over the run). 1: plain sequential fine-tuning.",
        ),
    ] = 0.25,
    resume: ResumeOpt = None,
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
    with task_progress("train-policy", rounds * len(instances), unit="instances") as report:

        def progress(p: TrainProgress) -> None:
            log.append(p)
            best = "-" if p.best is None else f"{p.best:,.1f}"
            line = f"round {p.round + 1} {p.instance}: {p.evals} evals, best {best}"
            err.print(f"  {line}, {p.seconds:.0f} s")
            report(p.position, line)

        path = train(
            instances,
            out=out_file,
            seed=seed,
            evals_per_instance=evals,
            rounds=rounds,
            meta_lr=meta_lr,
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


MethodsOpt = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated methods, each with options as METHOD:KEY=VALUE "
        f"(e.g. optuna:sampler=gp:encoding=class; the options: {methods_help()}; "
        "`shardlab solve --help` says what each means). Default: random,anneal,genetic."
    ),
]
CompareSuiteOpt = Annotated[
    str | None,
    typer.Option(
        help=f"{listed(SUITES)}, or instance names; comma-separated. sizing: the sizing "
        "suite (shardlab size over models, SLO levels and rates); melange: Mélange's "
        "experiment (each GPU type against the mix, on short, long and mixed lengths); "
        "catalog: the sizing curve of every GPU of the catalog, alone and together."
    ),
]
BudgetsOpt = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated evaluation budgets (e.g. 500,2000,5000), instead of "
        "--max-evals; methods whose search ignores the budget run once, at the largest."
    ),
]
PolicyOpt = Annotated[
    str | None,
    typer.Option(help="Also run rl from this pretrained policy (as method rl+policy)."),
]
ExecutorOpt = Annotated[
    str,
    typer.Option(
        help="Where runs run: local (--jobs worker processes) or ray (one task per run "
        "on the Ray cluster at --address; pip install -e '.[ray]')."
    ),
]
AddressOpt = Annotated[
    str | None,
    typer.Option(help="The Ray cluster's address (e.g. 10.0.0.1:6379), with --executor ray."),
]
FreshOpt = Annotated[
    bool,
    typer.Option(
        "--fresh",
        help="Run everything again: forget the finished runs in results/<name>/runs.jsonl "
        "and results.json (by default a re-run runs only the runs missing there).",
    ),
]
EnginesOpt = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated engines to run every instance on (default: --engine); "
        "results name instances INSTANCE/ENGINE."
    ),
]
VsFreeOpt = Annotated[
    bool,
    typer.Option(
        "--vs-free",
        help="With --space engine: also CP-SAT over the free space, the yardstick.",
    ),
]
ServingOpt = Annotated[
    str,
    typer.Option(
        help="agg: the methods plan one pool; disagg: CP-SAT's disaggregated optimum "
        "(cpsat/disagg) instead, megatron kept as the reference; best: both."
    ),
]
AiconfiguratorOpt = Annotated[
    str | None,
    typer.Option(
        help="With --serving best: AIConfigurator's agg-vs-disagg choices on the same "
        "problems (CSV of tests/data/make_aiconfigurator_disagg.py), beside the optima; "
        "with --suite sizing: its GPU counts (tests/data/make_aiconfigurator_sizing.py)."
    ),
]


@app.command()
@problem_command(traffic=True)
def compare(
    problem: Problem,
    traffic: Traffic | None,
    tries: int,
    methods: MethodsOpt = None,
    suite: CompareSuiteOpt = None,
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per method.")] = 3,
    max_evals: Annotated[int | None, typer.Option("--max-evals", min=1)] = 2000,
    budgets: BudgetsOpt = None,
    time_limit: Annotated[float | None, typer.Option("--time-limit", min=0.001)] = None,
    policy: PolicyOpt = None,
    jobs: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 2,
    executor: ExecutorOpt = "local",
    address: AddressOpt = None,
    fresh: FreshOpt = False,
    engines: EnginesOpt = None,
    vs_free: VsFreeOpt = False,
    serving: ServingOpt = "agg",
    aiconfigurator: AiconfiguratorOpt = None,
    name: Annotated[str | None, typer.Option(help="Results folder name.")] = None,
    results_dir: Annotated[str, typer.Option("--results-dir")] = "results",
    fmt: FormatOpt = Format.table,
) -> None:
    """Run methods on a suite (or the given problem) over seeds; write results/<name>/.
    ``--suite sizing``: size the sizing suite's problems (``shardlab size`` over models,
    SLO levels and rates) into results/sizing/, beside AIConfigurator's answers given
    with ``--aiconfigurator``; ``--suite melange``: Mélange's experiment, each GPU type
    alone against the mix on short, long and mixed lengths, into
    results/sizing/melange.md; ``--suite catalog``: every GPU of the catalog alone and
    all together, at example prices, into results/sizing/catalog.md."""
    from shardlab.compare import comparison, run_comparison, summarize, write_results

    if suite is not None and (problem.workload.tail or traffic is not None):
        raise ShardlabError(
            f"--slo-percentile and --traffic apply to the given problem; suite {suite!r} "
            "states its own problems and SLOs",
            field="slo_percentile",
            fix="drop --suite to compare the methods on this problem, or drop them",
        )
    traffic = simulated(problem, traffic)
    tables = {
        "sizing": _compare_sizing,
        "catalog": partial(_compare_curves, "catalog"),
        "melange": partial(_compare_curves, "melange"),
    }
    if suite in tables:
        tables[suite](
            Path(results_dir),
            aiconfigurator=aiconfigurator,
            methods=methods,
            budgets=budgets,
            policy=policy,
            engines=engines,
            vs_free=vs_free,
            name=name,
        )
        return

    spec = comparison(
        problem,
        methods=methods,
        suite=suite,
        name=name,
        budgets=budgets,
        policy=policy,
        engines=engines,
        vs_free=vs_free,
        serving=serving,
        aiconfigurator=aiconfigurator,
    )
    check_executor(executor)
    out_dir = check_output_dir(Path(results_dir) / folder_name(spec.label), flag="--results-dir")
    journal = _journal(out_dir, fresh)
    with task_progress("compare", unit="runs") as report:
        done: list[dict] = []
        before = [0]  # runs the journal had: the bar counts from there

        def on_done(r: dict) -> None:
            done.append(r)
            line = f"{r['instance']} {r['method']} seed {r['seed']}: {r['status']}"
            err.print(f"  [{len(done)}] {line}")
            report(before[0] + len(done), line)

        def on_resume(reused: int, total: int) -> None:
            before[0] = reused
            report(reused, "running", total=total)
            if reused:
                err.print(
                    f"{journal.path}: {reused} of {total} runs finished before, not run again"
                )

        results = run_comparison(
            spec.cases,
            spec.methods,
            seeds,
            max_evals=max_evals if spec.budgets is None else max(spec.budgets),
            seconds=time_limit,
            jobs=jobs,
            on_done=on_done,
            budgets=spec.budgets,
            variants=spec.variants,
            timing=problem.timing,
            engine=problem.engine,
            engines=spec.engines,
            space_kind=problem.space_kind,
            vs_free=vs_free,
            journal=journal,
            executor=executor,  # type: ignore[arg-type]
            address=address,
            on_resume=on_resume,
            serving=spec.serving,
            traffic=traffic,
            tries=tries,
        )
    rows = summarize(results)
    command = "shardlab compare " + " ".join(sys.argv[2:])
    anchor = list(spec.anchor) if spec.anchor is not None else None
    write_results(out_dir, spec.label, command, results, rows, timing_label(problem), anchor)
    if fmt is Format.json:
        emit_json({"name": spec.label, "summary": rows, "out_dir": str(out_dir)})
        return
    out.print(comparison_table(spec.label, seeds, rows))
    out.print(f"wrote {out_dir}/ (results.json, results.csv, summary.md, convergence.png)")


def _compare_sizing(results_dir: Path, aiconfigurator: str | None, **unused: object) -> None:
    from shardlab.sizing.suite import check_suite_options, run_suite

    check_suite_options(**unused)
    out_dir = check_output_dir(results_dir / "sizing", flag="--results-dir")
    anchor = None
    if aiconfigurator is not None:
        anchor = Path(aiconfigurator)
        if not anchor.is_file():
            raise ShardlabError(
                f"--aiconfigurator {aiconfigurator}: no such file",
                fix="give tests/data/aiconfigurator_sizing.csv",
            )
    command = "shardlab compare " + " ".join(sys.argv[2:])

    rows = _with_progress(
        "compare --suite sizing",
        "problems",
        lambda on_case: run_suite(out_dir, command, anchor, on_case),
        lambda row: f"{row['curve_solves']} solves, {row['curve_seconds']} s",
    )
    out.print(f"sized {len(rows)} (problem, rate) pairs; wrote {out_dir}/summary.md, results.json")


def _with_progress(
    what: str,
    unit: str,
    run: Callable[[Callable[[str, list[dict]], None]], list[dict]],
    said: Callable[[dict], str],
) -> list[dict]:
    """``run(on_case)``, each case it finishes on standard error and the progress bar
    (``said``: what a case's first row reports)."""
    with task_progress(what, unit=unit) as report:
        done: list[str] = []

        def on_case(name: str, rows: list[dict]) -> None:
            done.append(name)
            line = f"{name}: {said(rows[0])}"
            err.print(f"  {line}")
            report(len(done), line)

        return run(on_case)


def _compare_curves(suite: str, results_dir: Path, **unused: object) -> None:
    """``--suite melange`` or ``catalog``: sizing curves into results/sizing/<suite>.*"""
    from shardlab.sizing.catalog import run_catalog
    from shardlab.sizing.melange_report import run_melange
    from shardlab.sizing.suite import check_suite_options

    run, cells = {
        "melange": (run_melange, "(mix, SLO, rate)"),
        "catalog": (run_catalog, "(model, rate, GPU)"),
    }[suite]
    check_suite_options(**unused)
    out_dir = check_output_dir(results_dir / "sizing", flag="--results-dir")
    command = "shardlab compare " + " ".join(sys.argv[2:])
    rows = _with_progress(
        f"compare --suite {suite}",
        "curves",
        lambda on_case: run(out_dir, command, on_case),
        lambda row: f"{row['curve_seconds']} s",
    )
    out.print(f"sized {len(rows)} {cells} cells; wrote {out_dir}/{suite}.*")


def _journal(out_dir: Path, fresh: bool) -> Journal:
    """The comparison's journal: emptied with ``--fresh``; else started from the
    committed results.json when the journal itself is not there."""
    path = out_dir / JOURNAL
    if fresh:
        path.unlink(missing_ok=True)
    journal = Journal(path)
    if not fresh and (taken := journal.start_from(out_dir / "results.json")):
        err.print(f"{path}: started from {out_dir / 'results.json'} ({taken} runs)")
    return journal


WhatOpt = Annotated[
    str,
    typer.Argument(
        help="evaluator: plans and (plan, concurrency) points per second of the cost "
        "model; cpsat: time to the proven optimum from 64 to 2,048 GPUs; solves: the "
        "README's main job and the searches users start with, each in a fresh process; "
        "sizing: time to a proven `shardlab size`; simulate: the simulator on the Azure "
        "hour and a 10,000-request closed loop."
    ),
]
InstancesOpt = Annotated[
    str | None, typer.Option(help="Comma-separated suite instances (default: a fixed set).")
]
OutPathOpt = Annotated[
    str | None, typer.Option("--out", help="Markdown table to write (e.g. results/...).")
]
TimeLimitOpt = Annotated[
    float, typer.Option("--time-limit", min=1.0, help="cpsat: seconds per run.")
]
RepeatsOpt = Annotated[
    int,
    typer.Option(min=1, help="evaluator: best of this many repeats (more: less of other load)."),
]
BaselineOpt = Annotated[
    str | None,
    typer.Option(
        help="solves: also time each command on the code of this source tree (a "
        "checkout of another commit, e.g. `git worktree add /tmp/base REV`), side by side."
    ),
]


@app.command()
def bench(
    what: WhatOpt,
    instances: InstancesOpt = None,
    out_path: OutPathOpt = None,
    time_limit: TimeLimitOpt = EXACT_SECONDS,
    repeats: RepeatsOpt = 3,
    baseline: BaselineOpt = None,
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
    elif what == "sizing":
        if instances:
            raise ShardlabError("bench sizing runs a fixed set of problems; drop --instances")
        for run in b.SIZING_RUNS:
            rows.append(b.sizing_speed(run))
            r = rows[-1]
            err.print(f"  {r.model}, {r.gpus}, {r.slos}: {r.seconds:.1f} s")
        text = b.sizing_markdown(command, rows)
    elif what == "solves":
        if instances:
            raise ShardlabError("bench solves runs a fixed set of problems; drop --instances")
        if baseline is not None and not (Path(baseline) / "shardlab" / "__init__.py").is_file():
            raise ShardlabError(
                f"--baseline {baseline}: not a shardlab source tree (no shardlab/__init__.py)",
                field="baseline",
                fix="give a checkout of the commit to compare with (git worktree add DIR REV)",
            )
        for label, args in b.SOLVE_RUNS:
            wall, status, objective, solves = b.solve_speed(args)
            before: dict = {}
            if baseline is not None:
                bw, bs, bo, _ = b.solve_speed(args, code=str(Path(baseline).resolve()))
                before = {"base_seconds": bw, "base_status": bs, "base_objective": bo}
            rows.append(
                b.SolveSpeed(
                    label=label,
                    args=args,
                    seconds=wall,
                    status=status,
                    objective=objective,
                    solves=solves,
                    **before,
                )
            )
            was = f" (before: {before['base_seconds']:.1f} s)" if before else ""
            err.print(f"  {label}: {status} in {wall:.1f} s{was}")
        text = b.solves_markdown(command, rows, b.tree_label(baseline) if baseline else None)
    elif what == "simulate":
        if instances:
            raise ShardlabError("bench simulate runs a fixed set of runs; drop --instances")
        rows = b.simulate_speed(repeats)
        for r in rows:
            err.print(f"  {r.label}: {r.run_s:.3f} s")
        text = b.simulate_markdown(command, rows, repeats)
    else:
        raise ShardlabError(
            f"bench {what!r}: measure 'evaluator', 'cpsat', 'solves', 'sizing' or 'simulate'"
        )
    if out_path is not None:
        make_dir(Path(out_path).parent)  # checked creatable before the runs
        write_text(out_path, text)
    if fmt is Format.json:
        emit_json([_asdict(r) for r in rows])
        return
    out.print(text)
