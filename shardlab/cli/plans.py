"""One plan: its metrics, where its time goes, and the engine's commands to run it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shardlab.cli.app import Format, FormatOpt, app
from shardlab.cli.options import plan_command, problem_command
from shardlab.cli.render import (
    emit_json,
    err,
    launch_script,
    out,
    plan_json,
    print_breakdown,
    print_disagg,
    print_launch,
    print_metrics,
    print_plan,
    problem_json,
    problem_line,
)
from shardlab.cli.traffic import simulated
from shardlab.costmodel import evaluate as cost_evaluate
from shardlab.costmodel import with_concurrency
from shardlab.errors import ShardlabError
from shardlab.files import check_output_dir, make_dir, write_text
from shardlab.problems.disagg import DisaggPlan
from shardlab.problems.dtypes import KV_DTYPES
from shardlab.problems.engines import ENGINES
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.problems.traffic import Traffic
from shardlab.solvers.choices import listed

if TYPE_CHECKING:
    from shardlab.launch.kube import PodOptions
    from shardlab.launch.servers import Launch


def _report(
    problem: Problem,
    plan: Plan | DisaggPlan,
    fmt: Format,
    *,
    top: int | None,
    traffic: Traffic | None = None,
) -> None:
    """A plan's metrics (and, with ``top``, its breakdown) as tables or JSON; with SLOs
    at a percentile, the analytic means without a verdict, and the simulator's."""
    asked = problem
    if problem.workload.tail:
        from shardlab.solvers.certify import check_traffic

        check_traffic(problem, traffic)
        # the means are the analytic model's; the SLOs are the simulator's to judge
        bare = problem.workload.on_the_mean(ttft_ms=None, tpot_ms=None)
        problem = dataclasses.replace(problem, workload=bare)
    if isinstance(plan, DisaggPlan):
        _report_disagg(problem, plan, fmt, top=top, asked=asked, traffic=traffic)
        return
    metrics = cost_evaluate(problem, plan, breakdown=top is not None)
    chosen = problem.workload.schedule == "inflight" and plan.requests_per_rank is None
    plan = with_concurrency(problem, plan, metrics)
    tail = _tail(asked, problem, plan, metrics, traffic)
    if fmt is Format.json:
        emit_json(
            {
                "problem": problem_json(asked),
                "plan": plan_json(problem, plan),
                "concurrency_chosen": chosen,
                **metrics.to_dict(breakdown=top is not None),
                **({"percentiles": tail} if tail is not None else {}),
            }
        )
        return
    out.print(problem_line(asked))
    print_plan(problem, plan)
    print_metrics(metrics)
    if chosen:
        out.print(
            f"  concurrency chosen: {metrics.requests_per_rank} requests per attention-DP "
            "rank, the best under the SLOs (give --requests-per-rank or the plan's "
            "'requests_per_rank' to fix it)"
        )
    _print_tail(tail)
    if top is not None:
        print_breakdown(metrics, top=top)


def _tail(
    asked: Problem, problem: Problem, plan: Any, metrics: Any, traffic: Traffic | None
) -> dict[str, Any] | None:
    """The plan under ``asked``'s percentile SLOs, simulated (None: SLOs on the mean)."""
    if not asked.workload.tail:
        return None
    from shardlab.solvers.certify import check, tail_slos

    attempt, described = check(asked, problem, plan, metrics, traffic, seed=0)
    return {
        "traffic": described,
        "slos": {k: {"limit_ms": v, "percentile": p} for k, (v, p) in tail_slos(asked).items()},
        "analytic_mean_ms": attempt.analytic_ms,
        "simulated_ms": attempt.simulated_ms,
        "floor_ms": attempt.floor_ms,
        "meets": attempt.passed,
    }


def _print_tail(tail: dict[str, Any] | None) -> None:
    if tail is None:
        return
    parts = []
    for k, slo in tail["slos"].items():
        name, p = k.removesuffix("_ms").upper(), f"p{slo['percentile']:g}"
        got = tail["simulated_ms"].get(k)
        seen = f"{got:,.1f}" if got is not None else f">= {tail['floor_ms'][k]:,.1f} (floor)"
        parts.append(f"{p} {name} {seen} ms (SLO {slo['limit_ms']:g})")
    verdict = "[bold]meets[/]" if tail["meets"] else "[bold]misses[/]"
    out.print(
        f"simulated under {tail['traffic']}: " + ", ".join(parts) + f": {verdict}",
        soft_wrap=True,
    )


def _report_disagg(
    problem: Problem,
    plan: DisaggPlan,
    fmt: Format,
    *,
    top: int | None,
    asked: Problem,
    traffic: Traffic | None,
) -> None:
    from shardlab.costmodel import evaluate_disagg, with_concurrencies

    metrics = evaluate_disagg(problem, plan, breakdown=top is not None)
    plan = with_concurrencies(problem, plan, metrics)
    tail = _tail(asked, problem, plan, metrics, traffic)
    if fmt is Format.json:
        emit_json(
            {
                "problem": problem_json(asked),
                "serving": "disagg",
                "plan": plan_json(problem, plan),
                **metrics.to_dict(breakdown=top is not None),
                **({"percentiles": tail} if tail is not None else {}),
            }
        )
        return
    out.print(problem_line(asked))
    print_disagg(problem, plan, metrics, top=top)
    _print_tail(tail)


@app.command()
@problem_command(traffic=True)
@plan_command
def evaluate(
    problem: Problem,
    plan: Plan,
    traffic: Traffic | None,
    tries: int,
    fmt: FormatOpt = Format.table,
) -> None:
    """Score one plan: throughput, latency, memory, feasibility (with SLOs at a
    percentile: the analytic means, and the percentiles the simulator gives)."""
    _report(problem, plan, fmt, top=None, traffic=simulated(problem, traffic))


@app.command()
@problem_command(traffic=True)
@plan_command
def explain(
    problem: Problem,
    plan: Plan,
    traffic: Traffic | None,
    tries: int,
    fmt: FormatOpt = Format.table,
    top: Annotated[int, typer.Option(help="Rows per table.")] = 15,
) -> None:
    """Where one plan's time and memory go, operator by operator, largest first (with
    SLOs at a percentile: and the percentiles the simulator gives)."""
    _report(problem, plan, fmt, top=top, traffic=simulated(problem, traffic))


ModelPathOpt = Annotated[
    str | None,
    typer.Option("--model-path", help="What the engine loads (default: the HF id)."),
]
ModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="Default: the plan's model.")]
ClusterOpt = Annotated[
    str | None, typer.Option("--cluster", "-c", help="Default: the plan's cluster.")
]
DraftTokensOpt = Annotated[
    int | None, typer.Option("--draft-tokens", min=1, help="MTP drafts per step.")
]
MaxTokensOpt = Annotated[
    int | None,
    typer.Option("--max-tokens", min=1, help="Tokens per iteration per DP rank."),
]
TrustRemoteCodeOpt = Annotated[
    bool, typer.Option("--trust-remote-code", help="Let the engine run the model's code.")
]
ConfigDirOpt = Annotated[
    str,
    typer.Option(
        "--config-dir",
        help="Where the engine reads its config files (TensorRT-LLM's options) on each node; "
        "the printed commands write them there, --out writes them (default: beside launch.sh).",
    ),
]


KvDtypeOpt = Annotated[str | None, typer.Option("--kv-dtype", help=f"{listed(KV_DTYPES)}.")]
TargetOpt = Annotated[
    str,
    typer.Option(
        help="shell: each node's command (default); k8s: Deployments, LeaderWorkerSets and "
        "Services; llm-d: the llm-d-modelservice Helm values (vLLM); dynamo: a "
        "DynamoGraphDeployment."
    ),
]
DeployOutOpt = Annotated[
    str | None,
    typer.Option(
        "--out",
        help="Write into this directory: shell, launch.sh and the config files; k8s "
        "manifests.yaml; llm-d values.yaml; dynamo dynamo.yaml (default: print them).",
    ),
]
DeployNameOpt = Annotated[
    str | None, typer.Option("--name", help="Objects' name prefix (default: the model's name).")
]
NamespaceOpt = Annotated[str, typer.Option(help="Kubernetes namespace.")]
ImageOpt = Annotated[
    str | None,
    typer.Option(help="Container image (default: the engine's release image the rules are "
                 "read from, its ROCm build for the GPU family on AMD; Dynamo's runtime "
                 "image; llm-d's CUDA image)."),
]  # fmt: skip
ShmOpt = Annotated[str, typer.Option("--shm-size", help="/dev/shm of each pod (NCCL).")]
HfSecretOpt = Annotated[
    str | None,
    typer.Option("--hf-token-secret", help="A Secret with key HF_TOKEN the pods read."),
]
ModelVolumeOpt = Annotated[
    str | None,
    typer.Option(
        "--model-volume", help="A PersistentVolumeClaim holding the model (mounted at /models)."
    ),
]


@app.command()
def launch(
    plan_file: Annotated[str, typer.Option("--plan", help="A plan JSON (shardlab solve --out).")],
    engine: Annotated[
        str | None,
        typer.Option(help=f"{listed(ENGINES)} (default: the engine the plan was made for)."),
    ] = None,
    force_engine: Annotated[
        bool,
        typer.Option(
            "--force-engine",
            help="Launch on --engine even if the plan was made for another engine (its "
            "degrees, limits and memory were priced for that one).",
        ),
    ] = False,
    model_path: ModelPathOpt = None,
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    kv_dtype: Annotated[
        str | None, typer.Option("--kv-dtype", help=f"{listed(KV_DTYPES)}.")
    ] = None,
    draft_tokens: DraftTokensOpt = None,
    max_tokens: MaxTokensOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    config_dir: ConfigDirOpt = ".",
    target: TargetOpt = "shell",
    out_dir: DeployOutOpt = None,
    name: DeployNameOpt = None,
    namespace: NamespaceOpt = "default",
    image: ImageOpt = None,
    shm_size: ShmOpt = "16Gi",
    hf_token_secret: HfSecretOpt = None,
    model_volume: ModelVolumeOpt = None,
    fmt: FormatOpt = Format.table,
) -> None:
    """Print the engine's own launch commands for a plan, one per node of each replica,
    with the config files they read as here-documents (``--out``: a script and the
    files, written there); a plan the engine cannot run, or made for another engine, is
    refused. ``--target k8s|llm-d|dynamo`` writes the deployment files instead (to
    ``--out``, else standard output), every container command the shell target's."""
    from shardlab.launch import pods
    from shardlab.launch.kube import PodOptions
    from shardlab.launch.servers import build_disagg_launch, build_launch, build_pools_launch
    from shardlab.launch.sized import pool_launches
    from shardlab.launch.targets import TARGETS
    from shardlab.problems.catalog import hf_id_of
    from shardlab.problems.disagg import DISAGG_SCHEMA
    from shardlab.problems.plan import read_plan_file
    from shardlab.sizing.answer import SIZING_SCHEMA

    if target not in TARGETS:
        raise ShardlabError(
            f"--target {target!r}: not a target", field="target", fix=f"use {listed(TARGETS)}"
        )
    if out_dir is not None:
        check_output_dir(out_dir, flag="--out")
        if target == "shell" and config_dir == ".":  # the config files beside the script
            config_dir = out_dir
    check_output_dir(config_dir, flag="--config-dir")
    data = read_plan_file(plan_file)
    if not isinstance(data, dict):
        raise ShardlabError(f"{plan_file}: a plan must be a JSON object")
    engine, said = _engine_of(data, plan_file, engine, force=force_engine)
    opts = None
    if target != "shell":
        named = model or data.get("model") or plan_file
        opts = PodOptions(
            name=name or _k8s_name(str(named)),
            namespace=namespace,
            image=image,
            shm=shm_size,
            hf_token_secret=hf_token_secret,
            model_volume=model_volume,
        )
    overrides: dict[str, object] = {}
    if kv_dtype is not None:
        overrides["kv_dtype"] = kv_dtype
    if draft_tokens is not None:
        # the engine measures acceptance itself; launch prices nothing
        overrides.update(draft_tokens=draft_tokens, acceptance=0.0)
    if data.get("schema") == SIZING_SCHEMA:
        if cluster is not None:
            raise ShardlabError(
                f"{plan_file}: a sized deployment names each pool's GPUs; drop --cluster"
            )
        pools = pool_launches(
            data, where=plan_file, model=model, engine=engine, max_tokens=max_tokens,
            **overrides,
        )  # fmt: skip
        first = pools[0].problem
        path = model_path or hf_id_of(first.model) or first.model.name
        if opts is not None:
            groups = pods.sized_groups(pools, model_path=path, trust_remote_code=trust_remote_code)
            _emit_deployment(target, groups, opts, out_dir, fmt, said)
            return
        spec = build_pools_launch(
            pools, model_path=path, trust_remote_code=trust_remote_code, config_dir=config_dir
        )
        where = " + ".join(
            f"{p.instances} x {p.plan.degrees.num_gpus} {p.problem.cluster.accelerator.key}"
            + ("" if p.role == "agg" else f" ({p.role})")
            for p in pools
        )
        _emit_launch(first, engine, spec, fmt, where=where, out_dir=out_dir, said=said)
        return
    model = model or data.get("model") or ""
    cluster = cluster or data.get("cluster") or ""
    if not model or not cluster:
        raise ShardlabError(f"{plan_file}: names no model or cluster; give --model and --cluster")
    problem = Problem.build(model, cluster, engine=engine, max_tokens=max_tokens, **overrides)
    _check_gpu(data, plan_file, problem.cluster.accelerator.key)
    path = model_path or hf_id_of(problem.model) or problem.model.name
    if data.get("schema") == DISAGG_SCHEMA:
        dplan = DisaggPlan.from_dict(data, problem.model, where=plan_file, cluster=problem.cluster)
        if opts is not None:
            groups = pods.disagg_groups(
                problem, dplan, model_path=path, trust_remote_code=trust_remote_code
            )
            _emit_deployment(target, groups, opts, out_dir, fmt, said)
            return
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
        if opts is not None:
            groups = pods.plan_groups(
                problem, plan, model_path=path, trust_remote_code=trust_remote_code
            )
            _emit_deployment(target, groups, opts, out_dir, fmt, said)
            return
        spec = build_launch(
            problem,
            plan,
            model_path=path,
            trust_remote_code=trust_remote_code,
            config_dir=config_dir,
        )
    _emit_launch(problem, engine, spec, fmt, out_dir=out_dir, said=said)


def _engine_of(data: dict, where: str, engine: str | None, *, force: bool) -> tuple[str, list[str]]:
    """The engine to launch a plan or sized deployment on, and what to say about it:
    the one it was made for, unless ``--engine`` names another and ``--force-engine``
    allows it (a file written before files recorded it takes ``--engine``)."""
    made = data.get("engine")
    if made is not None and made not in ENGINES:
        raise ShardlabError(f"{where}: engine {made!r} is not one of {listed(ENGINES)}")
    if engine is None:
        if made is None:
            raise ShardlabError(
                f"{where} does not record the engine it was made for (written before plan "
                "files did)",
                fix=f"give --engine ({listed(ENGINES)})",
            )
        return made, []
    if engine not in ENGINES:
        raise ShardlabError(f"--engine {engine!r}: not an engine", fix=f"use {listed(ENGINES)}")
    if made is None:
        return engine, [f"{where} does not record its engine: check it was solved for {engine}"]
    if made != engine and not force:
        raise ShardlabError(
            f"{where} was made for engine {made}, not {engine}: its degrees, per-rank limits "
            f"and memory were priced for {made}",
            fix=f"launch it with --engine {made}, solve again with --engine {engine}, or add "
            "--force-engine to launch it anyway",
        )
    if made != engine:
        return engine, [f"launched on {engine}, but {where} was made for {made} (--force-engine)"]
    return engine, []


def _check_gpu(data: dict, where: str, gpu: str) -> None:
    """Refuse a plan made for one GPU launched on another, naming both: its degrees,
    memory and per-rank limits were priced on the GPU it records (``accelerator``; a
    file written before plan files recorded it: its cluster's name, ``h100x8``)."""
    made = data.get("accelerator")
    if not made:
        named = re.fullmatch(r"(.+)x\d+", str(data.get("cluster") or ""))
        made = named.group(1) if named else None
    if made and made != gpu:
        raise ShardlabError(
            f"{where} was made for {made} GPUs, not {gpu}: its degrees, memory and per-rank "
            f"limits were priced on {made}",
            field="cluster",
            fix=f"launch it on {made} GPUs, or solve again for {gpu}",
        )


def _k8s_name(source: str) -> str:
    """A Kubernetes name from a model's name or a plan file's."""
    stem = Path(source).stem if source.endswith(".json") else source.rsplit("/", 1)[-1]
    text = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:40].strip("-")
    return text if text[:1].isalpha() else f"m-{text}"[:40].strip("-")


def _emit_deployment(
    target: str, groups: list, opts: PodOptions, out_dir: str | None, fmt: Format, said: list[str]
) -> None:
    """The target's YAML: to ``out_dir`` (made only once everything is built) or to
    standard output; how to apply it and the servers' notes on standard error."""
    from shardlab.launch.engines import degree_mapping
    from shardlab.launch.kube import unpinned_note
    from shardlab.launch.targets import FILES, documents, dump, how_to_apply

    docs = documents(target, groups, opts)
    text = dump(docs)
    path = str(Path(out_dir) / FILES[target]) if out_dir is not None else None
    notes = [how_to_apply(target, path, opts, groups)]
    notes += [f"{g.name}: {degree_mapping(g.server)}" for g in groups]
    notes += [n for g in groups for n in g.notes] + unpinned_note(groups) + said
    if path is not None:
        make_dir(Path(path).parent)
        wrote = _wrote(path)
        write_text(path, text)
    if fmt is Format.json:
        emit_json({"target": target, "file": path, "documents": docs,
                   "notes": list(dict.fromkeys(notes))})  # fmt: skip
        return
    if path is None:
        out.print(text, markup=False, highlight=False, end="", soft_wrap=True)
    else:
        err.print(wrote, markup=False, highlight=False)
    for note in dict.fromkeys(notes):
        err.print(f"note: {note}", markup=False, highlight=False)


def _emit_launch(
    problem: Problem,
    engine: str,
    spec: Launch,
    fmt: Format,
    *,
    where: str | None = None,
    out_dir: str | None = None,
    said: list[str],
) -> None:
    """The commands printed (``said``: notes on the plan file itself); with
    ``out_dir``, also a script and the config files it reads written there (each
    named, a file replaced said so). Without it nothing is written: the printed
    commands write the config files on their nodes."""
    spec = dataclasses.replace(spec, notes=(*said, *spec.notes))
    if out_dir is not None:  # the commands as a script beside the config files
        make_dir(Path(out_dir))
        script = str(Path(out_dir) / "launch.sh")
        wrote = []
        for name, text in ((script, launch_script(problem, engine, spec, where=where)),
                           *spec.files):  # fmt: skip
            make_dir(Path(name).parent)
            wrote.append(_wrote(name))
            write_text(name, text)
        spec = dataclasses.replace(spec, notes=(*spec.notes, *wrote))
    if fmt is Format.json:
        emit_json(spec.to_dict())
        return
    print_launch(problem, engine, spec, where=where, inline=out_dir is None)


def _wrote(path: str) -> str:
    """What writing ``path`` does, said before it is written: a file there is replaced."""
    return f"{'replaced' if Path(path).exists() else 'wrote'} {path}"
