"""Run several methods on several instances and seeds, and write the comparison.

Every (instance, method, seed, budget) run goes to a worker (a local process or a Ray
task, :mod:`shardlab.executors`) and, as it finishes, to ``results/<name>/runs.jsonl``
(:mod:`shardlab.journal`): a comparison stopped part-way (Ctrl-C, a kill) loses only
the runs in flight, and re-running the same command runs only the ones missing.
Every record carries its run's key, so a clone that has ``results.json`` (committed)
but not the journal (not committed) starts the journal from it and runs only what
``results.json`` lacks: a committed comparison is extended (more seeds, methods,
instances) without running it again.
Results are gathered into ``results/<name>/``: ``results.json`` (every run, with its
history and plan), ``results.csv`` (one row per run), ``summary.md`` (per instance and
method, means over seeds) and ``convergence.png`` (best-so-far quality against
evaluations, log x).

Quality of a plan is its objective relative to the best known on the instance (the
CP-SAT optimum when CP-SAT proved one, else the best any run found): ``obj / best``
for throughput objectives, ``best / obj`` for latency (objectives are negative).
The ``megatron`` baseline is always run, so every method has a ratio to it.

Several budgets (``budgets``): a method whose search does not depend on its budget
(``Solver.anytime``) runs once, at the largest, and its best at each smaller budget is
read off its history (the best after that many evaluations is what a run with that
budget would have returned); any other method (simulated annealing, whose schedule
spans the budget) runs once per budget. Exact methods and the baseline run once.
"""

from __future__ import annotations

import csv
import gc
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardlab.costmodel import forget_tables
from shardlab.errors import ShardlabError
from shardlab.executors import Executor, run_all
from shardlab.files import make_dir, replacing
from shardlab.journal import Journal, is_whole_run
from shardlab.problems.problem import Problem
from shardlab.problems.suite import Instance
from shardlab.solvers import Budget
from shardlab.solvers.registry import get_solver, solver_class

# The label of CP-SAT over the free space in a comparison of engine spaces.
FREE_OPTIMUM = "cpsat@free"
# The label of the disaggregated optimum (shardlab.solvers.disagg).
DISAGG_OPTIMUM = "cpsat/disagg"


@dataclass(frozen=True)
class Task:
    instance: Instance
    method: str  # the registered solver
    seed: int
    max_evals: int | None
    seconds: float | None
    options: tuple[tuple[str, object], ...] = ()  # method-specific solver options
    label: str = ""  # the name results carry (default: the method)
    timing: str | None = None  # the instance's kernel timing (None: the problem default)
    engine: str | None = None  # the serving engine (None: the problem default)
    space_kind: str = "free"  # the space searched: every sharding, or the engine's
    per_engine: bool = False  # several engines compared: name the instance with it
    serving: str = "agg"  # one pool of replicas, or prefill and decode pools

    @property
    def name(self) -> str:
        return self.label or self.method

    @property
    def instance_name(self) -> str:
        """The instance as results name it: with its engine when several are compared."""
        return self.instance.name + (f"/{self.engine}" if self.per_engine else "")


def task_key(task: Task) -> str:
    """What defines a run (a journal's key): a run with the same key is the same run."""
    # (keys of aggregated runs are those before disaggregated serving existed)
    serving = {"serving": task.serving} if task.serving != "agg" else {}
    return json.dumps(
        {
            **serving,
            "instance": task.instance_name,
            "label": task.name,
            "method": task.method,
            "options": [[k, str(v)] for k, v in task.options],
            "seed": task.seed,
            "max_evals": task.max_evals,
            "seconds": task.seconds,
            "timing": task.timing,
            "engine": task.engine,
            "space": task.space_kind,
        },
        sort_keys=True,
    )


def run_task(task: Task) -> dict[str, Any]:
    """One solve, as a JSON-ready dict (runs in a worker process). The cost model's
    tables are dropped after it, as a fresh process would start: a worker runs many
    runs, and the tables of every degree tuple of every instance piled up (a worker of
    the paper suite reached 14 GB and was killed)."""
    try:
        return _run(task)
    finally:
        forget_tables()
        gc.collect()


def _run(task: Task) -> dict[str, Any]:
    problem = task.instance.problem(task.timing, task.engine, task.space_kind)
    if task.serving == "disagg":
        return _run_disagg(task, problem)
    try:
        r = get_solver(task.method, **dict(task.options)).solve(
            problem,
            budget=Budget(max_evals=task.max_evals, seconds=task.seconds),
            seed=task.seed,
        )
    except Exception as exc:  # a failing run is recorded; the comparison goes on
        return _failed(task, exc)
    feasible = r.metrics is not None and r.status in ("optimal", "feasible")
    return {
        **_record(task),
        "status": r.status,
        "message": r.message,
        "objective": r.objective if feasible else None,
        "throughput_tok_s": r.metrics.throughput_tok_s if feasible and r.metrics else None,
        "n_evals": r.n_evals,
        "wall_s": r.wall_s,
        "history": [list(h) for h in r.history],
        "plan": r.to_dict(problem)["plan"],
        "facts": _jsonable(r.facts),
    }


def _run_disagg(task: Task, problem: Problem) -> dict[str, Any]:
    """One disaggregated solve, as :func:`run_task` records a run (its evaluations are
    the pools' CP-SAT solves)."""
    from shardlab.solvers.cpsat.disagg import solve_disagg

    try:
        r = solve_disagg(
            problem,
            task.method,
            budget=Budget(max_evals=None, seconds=task.seconds or 600.0),
            seed=task.seed,
        )
    except Exception as exc:  # a failing run is recorded; the comparison goes on
        return _failed(task, exc)
    m = r.metrics
    feasible = m is not None and r.status in ("optimal", "feasible")
    return {
        **_record(task),
        "history": [],
        "status": r.status,
        "message": r.message,
        "objective": m.objective if feasible and m else None,
        "throughput_tok_s": m.throughput_tok_s if feasible and m else None,
        "n_evals": int(r.facts.get("pool_solves", 0)),
        "wall_s": r.wall_s,
        "plan": r.to_dict(problem)["plan"],
        "facts": _jsonable({**r.facts, "label": r.plan.label() if r.plan else None}),
    }


def _record(task: Task) -> dict[str, Any]:
    """What every record of a run says of its task."""
    return {
        "task_max_evals": task.max_evals,
        "instance": task.instance_name,
        "engine": task.engine,
        "space": task.space_kind,
        "method": task.name,
        "solver": task.method,
        "seed": task.seed,
    }


def _failed(task: Task, exc: Exception) -> dict[str, Any]:
    """The record of a run that raised."""
    return {
        **_record(task),
        "status": "error",
        "message": f"{type(exc).__name__}: {exc}",
        "objective": None,
        "throughput_tok_s": None,
        "n_evals": 0,
        "wall_s": 0.0,
        "history": [],
        "plan": None,
        "facts": {},
    }


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def quality(objective: float | None, best: float) -> float:
    if objective is None or not math.isfinite(best) or best == 0:
        return 0.0
    return objective / best if best > 0 else best / objective


def _budgets_of(method: str, max_evals: int | None, budgets: Sequence[int] | None) -> list:
    """The evaluation budgets ``method`` is run with."""
    if not budgets:
        return [max_evals]
    cls = solver_class(method)
    if cls.exact or method == "megatron" or cls.anytime:
        return [max(budgets)]
    return sorted(budgets)


def run_comparison(
    instances: Sequence[Instance],
    methods: Sequence[str],
    seeds: int,
    *,
    max_evals: int | None,
    seconds: float | None,
    jobs: int,
    on_done: Callable[[dict[str, Any]], None] | None = None,
    budgets: Sequence[int] | None = None,
    variants: Sequence[tuple[str, str, dict[str, object]]] = (),
    timing: str | None = None,
    engine: str | None = None,
    engines: Sequence[str] = (),
    space_kind: str = "free",
    vs_free: bool = False,
    journal: Journal | None = None,
    executor: Executor = "local",
    address: str | None = None,
    on_resume: Callable[[int, int], None] | None = None,
    serving: str = "agg",
) -> list[dict[str, Any]]:
    """Every run as a dict; with ``budgets``, one record per run and budget (see the
    module docstring), each with its ``budget``. ``variants`` are extra methods run
    with options, as ``(label, method, options)`` (e.g. ``rl`` from a pretrained policy).
    Each instance is run on ``engine``, or on each of ``engines`` (results then name it
    ``instance/engine``), every method searching ``space_kind``; ``vs_free`` adds CP-SAT
    over the free space (``cpsat@free``), whose optimum the others are then a fraction of.

    Runs go to ``executor`` (:mod:`shardlab.executors`: ``jobs`` local processes, or
    the Ray cluster at ``address``). With a ``journal`` every run is put on disk as it
    finishes and runs already there are not run again; ``on_resume(reused, total)``
    hears how many. ``serving`` ``disagg`` runs CP-SAT's disaggregated optimum
    (``cpsat/disagg``) instead of ``methods`` (megatron's aggregated plan stays, the
    reference); ``best`` runs it beside them.
    """
    runs = [(m, m, {}, space_kind, "agg") for m in dict.fromkeys([*methods, "megatron"])]
    runs += [(label, m, opts, space_kind, "agg") for label, m, opts in variants]
    if vs_free and space_kind != "free":
        runs.append((FREE_OPTIMUM, "cpsat", {}, "free", "agg"))
    if serving == "disagg":
        runs = [r for r in runs if r[1] == "megatron"]
    if serving in ("disagg", "best"):
        runs.append((DISAGG_OPTIMUM, "cpsat", {}, space_kind, "disagg"))
    tasks = [
        Task(
            inst,
            m,
            s,
            b,
            seconds,
            tuple(sorted(opts.items())),
            label,
            timing,
            eng,
            space,
            bool(engines),
            mode,
        )
        for inst in instances
        for eng in (engines or [engine])
        for label, m, opts, space, mode in runs
        for b in _budgets_of(m, max_evals, budgets)
        for s in (range(seeds) if m != "megatron" else range(1))
    ]
    keys = [task_key(t) for t in tasks]
    finished: dict[int, dict[str, Any]] = {}
    if journal is not None:
        # a run that failed (an exception) is run again
        finished = {
            i: journal.runs[k]
            for i, k in enumerate(keys)
            if k in journal and journal.runs[k].get("status") != "error"
        }
    if on_resume is not None:
        on_resume(len(finished), len(tasks))

    def done(i: int, record: dict[str, Any]) -> None:
        if journal is not None:
            journal.add(keys[i], record)
        finished[i] = record
        if on_done:
            on_done(record)

    todo = [(i, t) for i, t in enumerate(tasks) if i not in finished]
    run_all(run_task, todo, executor=executor, jobs=jobs, address=address, done=done)
    # each carries its key, so that results.json can start a journal (Journal.start_from)
    results = [{**finished[i], "key": keys[i]} for i in range(len(tasks))]
    if not budgets:
        return results
    return [rec for r in results for rec in _at_budgets(r, budgets)]


def _at_budgets(run: dict[str, Any], budgets: Sequence[int]) -> list[dict[str, Any]]:
    """The records of one run at the budgets it stands for."""
    cls = solver_class(run["solver"])
    if cls.exact or run["solver"] == "megatron":
        return [{**run, "budget": None}]
    if not cls.anytime:
        return [{**run, "budget": run["task_max_evals"]}]
    out = []
    for b in sorted(budgets):
        if b >= run["n_evals"]:
            out.append({**run, "budget": b})
            continue
        seen = [h for h in run["history"] if h[0] <= b]
        out.append(
            {
                **run,
                "budget": b,
                "objective": seen[-1][2] if seen else None,
                "throughput_tok_s": None,  # the history keeps objectives only
                "n_evals": b,
                "wall_s": None,  # not timed at this budget
                "history": seen,
                "plan": None,
            }
        )
    return out


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (instance, method): means over seeds and the ratios."""
    best: dict[str, float] = {}
    proven: dict[str, float] = {}
    for r in results:
        if r["objective"] is None:
            continue
        best[r["instance"]] = max(best.get(r["instance"], -math.inf), r["objective"])
        if r["method"] in ("cpsat", FREE_OPTIMUM, DISAGG_OPTIMUM) and r["status"] == "optimal":
            proven[r["instance"]] = max(proven.get(r["instance"], -math.inf), r["objective"])
    best.update(proven)
    megatron = {r["instance"]: r["objective"] for r in results if r["method"] == "megatron"}
    rows = []
    keys = dict.fromkeys((r["instance"], r["method"], r.get("budget")) for r in results)
    for inst, method, budget in keys:
        runs = [
            r
            for r in results
            if r["instance"] == inst and r["method"] == method and r.get("budget") == budget
        ]
        b = best.get(inst, math.nan)
        qualities = [quality(r["objective"], b) for r in runs]
        reach = [_evals_to(r, b, 0.99) for r in runs]
        throughputs = [r["throughput_tok_s"] for r in runs if r["throughput_tok_s"] is not None]
        walls = [r["wall_s"] for r in runs if r["wall_s"] is not None]
        mega = megatron.get(inst)
        rows.append(
            {
                "instance": inst,
                "method": method,
                "budget": budget,
                "runs": len(runs),
                "feasible_runs": sum(r["objective"] is not None for r in runs),
                "throughput_tok_s": statistics.mean(throughputs)
                if len(throughputs) == len(runs)
                else None,
                "ratio_to_best": statistics.mean(qualities),
                "min_ratio_to_best": min(qualities),
                "ratio_to_megatron": statistics.mean(quality(r["objective"], mega) for r in runs)
                if mega is not None
                else None,
                "evals_to_99pct": statistics.median(reach) if None not in reach else None,
                "wall_s": statistics.mean(walls) if len(walls) == len(runs) else None,
                "best_known": b,
                "best_is_proven": inst in proven,
            }
        )
    return rows


def _evals_to(run: dict[str, Any], best: float, level: float) -> int | None:
    for evals, _, value in run["history"]:
        if quality(value, best) >= level:
            return int(evals)
    return None


def write_results(
    out_dir: Path,
    name: str,
    command: str,
    results: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    timing: str = "",
    anchor: list[dict[str, str]] | None = None,
) -> None:
    """Write the four files atomically (each to a temporary name, then renamed);
    ``timing`` says how the cost model timed the kernels; ``anchor``: AIConfigurator's
    agg-versus-disagg choices, beside a comparison of serving modes."""
    make_dir(out_dir)

    def atomic(path: Path, write: Callable[[Path], None]) -> None:
        with replacing(path) as tmp:
            write(tmp)

    atomic(
        out_dir / "results.json",
        lambda p: p.write_text(
            json.dumps(
                {"name": name, "command": command, "runs": results, "summary": rows}, indent=2
            )
        ),
    )

    def write_csv(p: Path) -> None:
        fields = [
            "instance",
            "method",
            "seed",
            "status",
            "objective",
            "throughput_tok_s",
            "n_evals",
            "wall_s",
            "message",
        ]
        with p.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
            w.writeheader()
            w.writerows(results)

    atomic(out_dir / "results.csv", write_csv)
    atomic(
        out_dir / "summary.md",
        lambda p: p.write_text(summary_markdown(name, command, rows, timing, results, anchor)),
    )
    atomic(out_dir / "convergence.png", lambda p: plot_convergence(p, results, rows))


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def summary_markdown(
    name: str,
    command: str,
    rows: list[dict[str, Any]],
    timing: str = "",
    results: list[dict[str, Any]] | None = None,
    anchor: list[dict[str, str]] | None = None,
) -> str:
    lines = [
        f"# Comparison `{name}`",
        "",
        f"Produced by `{command}`; numbers are written by the code, never by hand."
        + (f" Kernels: {timing}." if timing else ""),
        "",
        "Ratio to best: objective over the best known plan of the instance (the CP-SAT",
        "optimum where proven, marked *), mean over seeds. Evals to 99%: median number of",
        "distinct plans evaluated before reaching 99% of the best known.",
        "",
        "| instance | method | throughput tok/s | ratio to best | worst seed | ratio to megatron "
        "| evals to 99% | wall s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    budgets = sorted({r["budget"] for r in rows if r.get("budget") is not None})
    if budgets:
        lines[-2] = lines[-2].replace("| method |", "| method | budget |")
        lines[-1] = lines[-1].replace("|---|---|", "|---|---|---:|", 1)
    for r in rows:
        star = "*" if r["best_is_proven"] else ""
        method = r["method"]
        if budgets:
            method += f" | {_fmt(r.get('budget'), ',')}"
        lines.append(
            f"| {r['instance']}{star} | {method} | {_fmt(r['throughput_tok_s'], ',.0f')} | "
            f"{_fmt(r['ratio_to_best'], '.3f')} | {_fmt(r['min_ratio_to_best'], '.3f')} | "
            f"{_fmt(r['ratio_to_megatron'], '.3f')} | {_fmt(r['evals_to_99pct'], ',')} | "
            f"{_fmt(r['wall_s'], '.1f')} |"
        )
    if budgets:
        lines += ["", *budget_table(rows, budgets)]
    if any(r["method"] == FREE_OPTIMUM for r in rows):
        lines += [
            "",
            "## Against the free optimum",
            "",
            "Each entry as a fraction of CP-SAT's optimum over the free space (every",
            "per-operator sharding) under the same engine's kernels and memory budget.",
            "",
            *engine_table(rows),
        ]
    if results is not None and any(r["method"] == DISAGG_OPTIMUM for r in results):
        lines += ["", *serving_table(results, anchor)]
    return "\n".join(lines) + "\n"


def serving_table(
    results: list[dict[str, Any]], anchor: list[dict[str, str]] | None = None
) -> list[str]:
    """Per instance, CP-SAT's aggregated and disaggregated optima side by side (tokens/s
    per GPU of the cluster, the plans), and AIConfigurator's choice on the same problem
    when ``anchor`` holds it (rows of tests/data/aiconfigurator_disagg.csv)."""
    from shardlab.problems.suite import get_instance

    by = {(r["instance"], r["method"]): r for r in results if r.get("budget") is None}
    aic = {row["instance"]: row for row in anchor or ()}
    lines = [
        "## Aggregated or disaggregated",
        "",
        "CP-SAT's optimum of each mode under the same SLOs, tokens/s per GPU of the",
        "cluster (output tokens). Aggregated: one pool of replicas; disaggregated: x",
        "prefill instances and y decode instances (`xP(GPUs) + yD(GPUs)`), the KV handoff",
        "priced." + (" AIConfigurator: its `cli default` on the same problem." if aic else ""),
        "",
    ]
    head = "| instance | agg tok/s/GPU | agg plan | disagg tok/s/GPU | disagg plan | disagg / agg |"
    rule = "|---|---:|---|---:|---|---:|"
    if aic:
        head += " AIConfigurator agg | disagg | its xPyD | it chose |"
        rule += "---:|---:|---|---|"
    lines += [head, rule]
    for inst in dict.fromkeys(r["instance"] for r in results):
        agg, dis = by.get((inst, "cpsat")), by.get((inst, DISAGG_OPTIMUM))
        if agg is None or dis is None:
            continue
        gpus = get_instance(inst.split("/")[0]).problem().cluster.num_gpus
        a = agg["throughput_tok_s"] / gpus if agg["throughput_tok_s"] else None
        d = dis["throughput_tok_s"] / gpus if dis["throughput_tok_s"] else None
        plan = agg.get("plan") or {}
        degrees = plan.get("degrees") or {}
        agg_plan = " ".join(f"{k} {v}" for k, v in degrees.items() if v != 1) or "-"
        line = (
            f"| {inst} | {_fmt(a, ',.1f')} | {agg_plan} | {_fmt(d, ',.1f')} | "
            f"{(dis.get('facts') or {}).get('label') or '-'} | "
            f"{_fmt(d / a if a and d else None, '.3f')} |"
        )
        row = aic.get(inst)
        if aic:
            if row is None:
                line += " - | - | - | - |"
            else:
                line += (
                    f" {_fmt(_float(row['agg_tok_s_gpu']), ',.1f')} | "
                    f"{_fmt(_float(row['disagg_tok_s_gpu']), ',.1f')} | "
                    f"{row['disagg_config'] or '-'} | {row['chosen']} |"
                )
        lines.append(line)
    return lines


def _float(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def engine_table(rows: list[dict[str, Any]]) -> list[str]:
    """Per instance and engine, every method as a fraction of the free optimum (CP-SAT
    over the free space): the engine optimum (CP-SAT over the engine's space), the
    baselines; and the geometric mean of free over engine optimum."""
    by = {(r["instance"], r["method"]): r for r in rows if r.get("budget") is None}
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != FREE_OPTIMUM]
    insts = list(dict.fromkeys(r["instance"] for r in rows))
    head = ["instance", "engine", "free optimum tok/s"] + [
        "engine optimum" if m == "cpsat" else m for m in methods
    ]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    gains = []
    for inst in insts:
        free = by.get((inst, FREE_OPTIMUM))
        if free is None:
            continue
        name, _, engine = inst.rpartition("/")
        cells = [name or inst, engine or "-", _fmt(free["throughput_tok_s"], ",.0f")]
        cells += [
            _fmt(by[(inst, m)]["ratio_to_best"], ".3f") if (inst, m) in by else "-" for m in methods
        ]
        lines.append("| " + " | ".join(cells) + " |")
        eng = by.get((inst, "cpsat"))
        if eng and eng["ratio_to_best"] > 0 and free["best_is_proven"]:
            gains.append(1 / eng["ratio_to_best"])
    if gains:
        geo = math.exp(sum(math.log(g) for g in gains) / len(gains))
        lines += [
            "",
            f"Free optimum over engine optimum: geometric mean {geo:.3f} over {len(gains)} "
            f"instance-engine pairs (min {min(gains):.3f}, max {max(gains):.3f}).",
        ]
    return lines


def budget_table(rows: list[dict[str, Any]], budgets: list[int]) -> list[str]:
    """Ratio to best (mean over seeds; worst seed in brackets) per instance, method and
    budget, one column per method and budget; the exact method and the baseline once."""
    methods = list(dict.fromkeys(r["method"] for r in rows if r.get("budget") is not None))
    fixed = list(dict.fromkeys(r["method"] for r in rows if r.get("budget") is None))
    cols = [(m, b) for m in methods for b in budgets]
    head = ["instance", *fixed, *(f"{m} @{b:,}" for m, b in cols)]
    lines = [
        "Ratio to best by budget: mean over seeds (worst seed).",
        "",
        "| " + " | ".join(head) + " |",
        "|---|" + "---:|" * (len(head) - 1),
    ]
    by = {(r["instance"], r["method"], r.get("budget")): r for r in rows}
    for inst in dict.fromkeys(r["instance"] for r in rows):
        cells = []
        for key in [(inst, m, None) for m in fixed] + [(inst, m, b) for m, b in cols]:
            r = by.get(key)
            cells.append(
                "-"
                if r is None
                else f"{_fmt(r['ratio_to_best'], '.3f')} ({_fmt(r['min_ratio_to_best'], '.3f')})"
            )
        lines.append(f"| {inst} | " + " | ".join(cells) + " |")
    return lines


def plot_convergence(path: Path, results: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = {r["instance"]: r["best_known"] for r in rows}
    results = [r for r in results if is_whole_run(r)]  # one curve per run
    instances = list(dict.fromkeys(r["instance"] for r in results))
    methods = list(dict.fromkeys(r["method"] for r in results))
    cols = min(3, len(instances))
    nrows = math.ceil(len(instances) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.4 * nrows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, inst in zip(axes.flat, instances, strict=False):
        runs_here = [r for r in results if r["instance"] == inst]
        # Every run is drawn to the panel's last evaluation, so a method that stopped
        # early (CP-SAT, the one-plan Megatron baseline) shows where it ended.
        right = max([2, *(r["n_evals"] for r in runs_here)])
        for mi, method in enumerate(methods):
            # one legend entry per method: its runs (seeds, and budgets of methods run
            # once per budget) share its colour
            labelled = False
            for run in (r for r in runs_here if r["method"] == method):
                pts = [(e, quality(v, best[inst])) for e, _, v in run["history"]]
                if not pts:
                    continue
                ax.step(
                    [p[0] for p in pts] + [right],
                    [p[1] for p in pts] + [pts[-1][1]],
                    where="post",
                    color=colors[mi % len(colors)],
                    alpha=0.8,
                    linestyle="--" if method == "megatron" else "-",
                    label=None if labelled else method,
                )
                labelled = True
        ax.set_xscale("log")
        ax.set_title(inst, fontsize=9)
        ax.set_xlabel("evaluations")
        ax.set_ylabel("best / best known")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(instances) :]:
        ax.axis("off")
    entries: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    fig.tight_layout()
    # below the panels, and the figure grown to hold it (not drawn over the axes' labels)
    legend = fig.legend(
        list(entries.values()),
        list(entries),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(len(entries), 6),
    )
    fig.savefig(path, format="png", dpi=90, bbox_inches="tight", bbox_extra_artists=(legend,))
    plt.close(fig)


ANCHOR_FIELDS = ("instance", "chosen", "agg_tok_s_gpu", "disagg_tok_s_gpu", "disagg_config")


def read_anchor(path: str) -> list[dict[str, str]]:
    """AIConfigurator's agg-versus-disagg choices (tests/data/aiconfigurator_disagg.csv)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ShardlabError(f"--aiconfigurator {path}: cannot read it ({exc})") from None
    rows = list(csv.DictReader(text.splitlines()))
    missing = [f for f in ANCHOR_FIELDS if rows and f not in rows[0]]
    if not rows or missing:
        raise ShardlabError(
            f"--aiconfigurator {path}: not a CSV of tests/data/make_aiconfigurator_disagg.py "
            f"(missing {', '.join(missing) or 'rows'})"
        )
    return rows
