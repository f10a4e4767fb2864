"""Command-line options shared by several commands: the problem, the plan and the
methods' own options.

``problem_command`` gives a command every option that defines a problem and calls it
with the built :class:`Problem`; ``plan_command`` adds ``--plan FILE`` or the degree
flags and calls it with the chosen :class:`Plan`; ``solver_options_command`` adds a flag
per option of the registered methods, generated from their ``Options`` dataclasses, and
calls it with the ``options`` given. One definition, every command.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from collections.abc import Callable
from typing import Annotated, Any, get_type_hints

import typer

from shardlab.cli.render import err
from shardlab.cli.traffic import PERCENTILE_OPTIONS, TRAFFIC_OPTIONS, traffic_of
from shardlab.errors import ShardlabError
from shardlab.problems.cluster import Cluster
from shardlab.problems.disagg import DISAGG_SCHEMA, DisaggPlan
from shardlab.problems.dtypes import KV_DTYPES
from shardlab.problems.engines import ENGINES
from shardlab.problems.plan import Degrees, Plan, read_plan_file
from shardlab.problems.problem import (
    DEFAULT_CLUSTER,
    DEFAULT_ENGINE,
    DEFAULT_MODEL,
    DEFAULT_TIMING,
    DEFAULT_WORKLOAD,
    Problem,
)
from shardlab.solvers.choices import choices, field_docs, hints, listed, text_type

PROBLEM_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    (
        "model",
        str,
        typer.Option(
            DEFAULT_MODEL, "--model", "-m", help="Catalog name, HuggingFace id or config.json path."
        ),
    ),
    (
        "cluster",
        str,
        typer.Option(
            DEFAULT_CLUSTER,
            "--cluster",
            "-c",
            help="GPUxCOUNT (e.g. h100x64) or a cluster YAML file.",
        ),
    ),
    (
        "workload",
        str,
        typer.Option(
            DEFAULT_WORKLOAD, "--workload", "-w", help="Workload preset (see `shardlab workloads`)."
        ),
    ),
    ("batch", int | None, typer.Option(None, help="Batch (static) or most requests in flight.")),
    (
        "rate",
        float | None,
        typer.Option(
            None,
            help="Offered load in requests/s instead of --batch: the plan of most requests/s "
            "under the SLOs, run at the concurrency the rate needs.",
        ),
    ),
    ("input_len", int | None, typer.Option(None, "--input-len", help="Prompt tokens.")),
    ("output_len", int | None, typer.Option(None, "--output-len", help="Generated tokens.")),
    ("phase", str | None, typer.Option(None, help="prefill, decode or request.")),
    ("schedule", str | None, typer.Option(None, help="static or inflight.")),
    ("ttft_ms", float | None, typer.Option(None, "--ttft-ms", help="SLO on time to first token.")),
    ("tpot_ms", float | None, typer.Option(None, "--tpot-ms", help="SLO on time per token.")),
    (
        "objective",
        str | None,
        typer.Option(None, help="throughput, throughput_per_gpu, latency, pareto or request_rate."),
    ),
    ("weight_dtype", str | None, typer.Option(None, "--weight-dtype", help="bf16, fp8 or fp4.")),
    ("kv_dtype", str | None, typer.Option(None, "--kv-dtype", help=f"{listed(KV_DTYPES)}.")),
    (
        "draft_tokens",
        int | None,
        typer.Option(None, "--draft-tokens", help="Speculative decoding: MTP drafts per step."),
    ),
    (
        "acceptance",
        float | None,
        typer.Option(None, "--acceptance", help="Probability a draft token is accepted."),
    ),
    (
        "prompts_per_client",
        int | None,
        typer.Option(
            None,
            "--prompts-per-client",
            help="In flight: requests each client of the closed loop sends (default 10).",
        ),
    ),
    (
        "clients",
        int | None,
        typer.Option(
            None, help="In flight: clients in all (default: as many as the plan runs at once)."
        ),
    ),
    (
        "prefix_reuse",
        float | None,
        typer.Option(
            None,
            "--prefix-reuse",
            help="Share of each prompt served from the engine's prefix cache, in [0, 1): "
            "its prefill computes the rest (default 0).",
        ),
    ),
    ("tie", str, typer.Option("kind", help="'kind': options per layer kind; 'layer': per layer.")),
    (
        "timing",
        str,
        typer.Option(
            DEFAULT_TIMING,
            help="Kernel times: roofline, or silicon (measured, aiconfigurator-core).",
        ),
    ),
    (
        "engine",
        str,
        typer.Option(DEFAULT_ENGINE, help=f"Serving engine: {listed(ENGINES)}."),
    ),
    (
        "space_kind",
        str,
        typer.Option(
            "free",
            "--space",
            help="free: every sharding; engine: only what --engine can launch.",
        ),
    ),
    (
        "calibration",
        str | None,
        typer.Option(
            None,
            help="Corrections from `shardlab calibrate` (YAML); on an AMD GPU they replace "
            "its shipped fit.",
        ),
    ),
    (
        "max_batch",
        int | None,
        typer.Option(None, "--max-batch", help="Engine's requests per DP rank (default: its own)."),
    ),
    (
        "max_tokens",
        int | None,
        typer.Option(None, "--max-tokens", help="Engine's tokens per iteration per DP rank."),
    ),
)

DEGREE_NAMES = ("tp", "pp", "dp_attn", "ep", "etp", "replicas")


def _extend(
    func: Callable[..., None],
    wrapper: Callable[..., None],
    drop: str | tuple[str, ...],
    extra: list[inspect.Parameter],
) -> None:
    """Give ``wrapper`` the signature of ``func`` minus ``drop`` plus ``extra``.

    Annotations are resolved here: typer reads them from the wrapper, whose module
    does not define the names the command's module uses.
    """
    hints = get_type_hints(func, include_extras=True)
    own = [
        p.replace(annotation=hints.get(p.name, p.annotation))
        for p in inspect.signature(func).parameters.values()
        if p.name not in ((drop,) if isinstance(drop, str) else drop)
    ]
    params = own + extra
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}


def problem_command(
    func: Callable[..., None] | None = None,
    *,
    without: tuple[str, ...] = (),
    cluster_from: Callable[[dict[str, Any]], Cluster] | None = None,
    traffic: bool = False,
    percentiles: bool = False,
) -> Any:
    """Give a command the problem options; it receives the built ``problem``.

    ``without``: options the command does not take (their defaults are used);
    ``cluster_from``: builds the cluster from the command's own options instead of
    ``--cluster`` (which it then drops); ``traffic``: the command also takes SLO
    percentiles and a traffic (:data:`TRAFFIC_OPTIONS`) and receives the ``traffic``
    they name (None: none named), the problem at its mean lengths and rate;
    ``percentiles``: the SLO percentiles alone (checked under the workload's own
    traffic).
    """
    if func is None:
        return functools.partial(
            problem_command,
            without=without,
            cluster_from=cluster_from,
            traffic=traffic,
            percentiles=percentiles,
        )
    if cluster_from is not None:
        without = (*without, "cluster")
    own = TRAFFIC_OPTIONS if traffic else PERCENTILE_OPTIONS if percentiles else ()
    taken = [opt for opt in PROBLEM_OPTIONS + own if opt[0] not in without]
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=typ)
        for name, typ, default in taken
    ]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> None:
        options = {name: kwargs.pop(name) for name, _, _ in taken}
        for name, _, default in PROBLEM_OPTIONS + own:
            if name in without:
                options[name] = default.default
        if cluster_from is not None:
            options["cluster"] = cluster_from(kwargs)
        chosen = None
        if traffic:
            chosen = traffic_of(options, takes_rate="rate" not in without)
            kwargs["traffic"] = chosen
            kwargs["tries"] = options.pop("tries")
        model, cluster = options.pop("model"), options.pop("cluster")
        workload, tie = options.pop("workload"), options.pop("tie")
        timing, engine = options.pop("timing"), options.pop("engine")
        problem = Problem.build(
            model=model,
            cluster=cluster,
            workload=workload,
            tie=tie,
            timing=timing,
            engine=engine,
            space_kind=options.pop("space_kind"),
            calibration=options.pop("calibration"),
            max_batch=options.pop("max_batch"),
            max_tokens=options.pop("max_tokens"),
            **options,
        )
        for notice in problem.model.notices:
            err.print(f"notice: {notice}", markup=False, soft_wrap=True)
        func(problem=problem, **kwargs)

    drop = ("problem", "traffic", "tries") if traffic else ("problem",)
    _extend(func, wrapper, drop, extra)
    return wrapper


def plan_command(func: Callable[..., None]) -> Callable[..., None]:
    """Give a problem command ``--plan FILE`` or degree flags; it receives the ``plan``."""
    extra = [
        inspect.Parameter(
            "plan_file",
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                str | None, typer.Option("--plan", help="A plan JSON file (shardlab solve --out).")
            ],
        ),
        *(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[
                    int | None,
                    typer.Option(
                        f"--{name.replace('_', '-')}",
                        min=1,
                        help=f"Degree {name} (Megatron-style operator sharding).",
                    ),
                ],
            )
            for name in DEGREE_NAMES
        ),
        inspect.Parameter(
            "requests_per_rank",
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[
                int | None,
                typer.Option(
                    "--requests-per-rank",
                    "--concurrency",
                    min=1,
                    help="In flight: requests per attention-DP rank (the engine's max batch "
                    "size); default: the plan's, else the best under the SLOs.",
                ),
            ],
        ),
    ]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> None:
        plan_file = kwargs.pop("plan_file")
        degrees = {name: kwargs.pop(name) for name in DEGREE_NAMES}
        plan = plan_from_options(kwargs["problem"], plan_file, degrees)
        requests_per_rank = kwargs.pop("requests_per_rank")
        if requests_per_rank is not None:
            if isinstance(plan, DisaggPlan):
                raise ShardlabError(
                    "--requests-per-rank sets one plan's; a disaggregated plan carries each "
                    "pool's 'requests_per_rank' in its JSON"
                )
            plan = dataclasses.replace(plan, requests_per_rank=requests_per_rank)
        func(plan=plan, **kwargs)

    _extend(func, wrapper, "plan", extra)
    return wrapper


def plan_from_options(
    problem: Problem, plan: str | None, degrees: dict[str, int | None]
) -> Plan | DisaggPlan:
    """A plan from a JSON file (an aggregated or a disaggregated one), or Megatron-style
    sharding under the given degrees."""
    if plan is not None:
        if any(v is not None for v in degrees.values()):
            raise ShardlabError("give either --plan or degree flags (--tp, --pp, ...), not both")
        data = read_plan_file(plan)
        if isinstance(data, dict) and data.get("schema") == DISAGG_SCHEMA:
            return DisaggPlan.from_dict(data, problem.model, where=plan, cluster=problem.cluster)
        loaded = Plan.from_dict(data, problem.model, where=plan, cluster=problem.cluster.name)
        problem.space.degree_index(loaded.degrees)  # the degrees must suit this cluster
        return loaded
    return problem.space.megatron_plan(resolve_degrees(problem, **degrees))


def resolve_degrees(
    problem: Problem,
    *,
    tp: int | None = None,
    pp: int | None = None,
    dp_attn: int | None = None,
    ep: int | None = None,
    etp: int | None = None,
    replicas: int | None = None,
) -> Degrees:
    """Fill unspecified degrees: tp = one node, pp = dp_attn = 1, replicas = the rest.

    On MoE models ``ep`` defaults to the whole group (``tp * dp_attn``, vLLM's expert
    parallel) and ``etp`` to what remains; on dense models the expert flags are
    accepted when consistent (``ep * etp == tp * dp_attn``) and ignored.
    """
    n = problem.cluster.num_gpus
    tp = tp or min(problem.cluster.host_size, n)
    pp = pp or 1
    dp_attn = dp_attn or 1
    group = tp * dp_attn
    if replicas is None:
        if n % (group * pp):
            raise ShardlabError(
                f"tp*dp_attn*pp = {group * pp} does not divide the {n} GPUs of "
                f"{problem.cluster.name}; choose degrees whose product divides it"
            )
        replicas = n // (group * pp)
    if problem.model.is_moe:
        if ep is None and etp is None:
            ep, etp = group, 1
        elif ep is None:
            ep = group // etp if etp and group % etp == 0 else 0
        elif etp is None:
            etp = group // ep if group % ep == 0 else 0
        if not ep or not etp or ep * etp != group:
            raise ShardlabError(
                f"--ep {ep} x --etp {etp} must equal tp*dp_attn = {group}: the MoE block "
                "regroups the same GPUs"
            )
    else:
        given_ep = ep if ep is not None else 1
        given_etp = etp if etp is not None else group // given_ep
        if given_ep * given_etp != group:
            raise ShardlabError(
                f"--ep {ep} x --etp {etp} must equal tp*dp_attn = {group}; on a dense model "
                "the expert flags are ignored when consistent"
            )
        ep, etp = 1, group
    degrees = Degrees(replicas=replicas, pp=pp, tp=tp, dp_attn=dp_attn, ep=ep, etp=etp)
    if degrees.num_gpus != n:
        raise ShardlabError(
            f"degrees {degrees.short()} use {degrees.num_gpus} GPUs; {problem.cluster.name} has {n}"
        )
    problem.space.degree_index(degrees)
    return degrees


def _first_lower(text: str) -> str:
    """``text`` as the rest of a sentence (``The sampler`` as ``the sampler``; an
    acronym kept)."""
    return text[:1].lower() + text[1:] if re.match(r"[A-Z][a-z]", text) else text


@functools.cache
def solver_flags() -> dict[str, Any]:
    """One flag per distinct option name of the registered methods, as the annotation
    typer reads: the type, and help from the field's docstring, the methods that take
    it and the values its ``Literal`` allows."""
    from shardlab.solvers.registry import available_solvers, options_class

    takers: dict[str, list[str]] = {}
    owner: dict[str, type] = {}
    for method in available_solvers():
        try:
            cls = options_class(method)
        except ImportError:  # a third-party method whose dependency is missing
            continue
        for f in dataclasses.fields(cls):
            first = owner.setdefault(f.name, cls)
            if text_type(hints(cls)[f.name]) is not text_type(hints(first)[f.name]):
                raise TypeError(f"option {f.name!r} has a different type in {method}")
            takers.setdefault(f.name, []).append(method)
    flags: dict[str, Any] = {}
    for name, methods in takers.items():
        cls = owner[name]
        kind, allowed = text_type(hints(cls)[name]), choices(hints(cls)[name])
        if kind is None:  # an object only a library caller can give
            continue
        default = next(f.default for f in dataclasses.fields(cls) if f.name == name)
        text = f"{', '.join(methods)}: {_first_lower(field_docs(cls).get(name, ''))}"
        if allowed:
            text += f" Values: {listed(allowed, default if isinstance(default, str) else None)}."
        option = typer.Option(f"--{name.replace('_', '-')}", help=text)
        flags[name] = Annotated[kind | None, option]
    return flags


def methods_help() -> str:
    """Each method with options and the options it takes (``cpsat: workers; ...``), as
    ``compare --methods METHOD:KEY=VALUE`` takes them."""
    from shardlab.solvers.registry import available_solvers, options_class

    taken = []
    for method in available_solvers():
        try:
            names = [f.name for f in dataclasses.fields(options_class(method))]
        except ImportError:  # a third-party method whose dependency is missing
            continue
        if names:
            taken.append(f"{method}: {', '.join(names)}")
    return "; ".join(taken)


def solver_options_command(func: Callable[..., None]) -> Callable[..., None]:
    """Give a command a flag per option of the registered methods (:func:`solver_flags`);
    it receives ``options``, the ones given (:func:`shardlab.solve` checks that the
    method takes them, and their values)."""
    flags = solver_flags()
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=typ)
        for name, typ in flags.items()
    ]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> None:
        given = {name: kwargs.pop(name) for name in flags}
        func(options={k: v for k, v in given.items() if v is not None}, **kwargs)

    _extend(func, wrapper, "options", extra)
    return wrapper
