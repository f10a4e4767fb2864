"""The decision: parallelism degrees, one option per operator, the pipeline partition.

A plan is serialized as JSON with a versioned schema (``PLAN_SCHEMA``)::

    {"schema": "shardlab.plan/1", "model": "...", "cluster": "...",
     "engine": "vllm", "accelerator": "h100",
     "degrees": {"replicas": 1, "pp": 1, "tp": 8, "dp_attn": 1, "ep": 8, "etp": 1},
     "stage_layers": [61],
     "options": {"head": {"embedding": "vocab_sharded", ...},
                 "dense": {"qkv_proj": "column", ...}, "moe": {...}},
     "layers": [{"qkv_proj": "column", ...}, ...],
     "requests_per_rank": 96}

``engine`` and ``accelerator`` (optional; files written before they were recorded lack
them) name the serving engine and the GPU the plan was priced for: ``launch`` refuses
to start it on another engine unless told to. ``options`` holds one entry per layer
kind when every layer of a kind has the same options; otherwise ``layers`` lists every
layer's options and ``options`` holds only ``head``. ``requests_per_rank`` (in-flight
schedule; optional; ``concurrency`` in older files) is the requests each attention-DP
rank runs at once, the engine's max batch size; a plan without it is
evaluated at the concurrency it does best with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from shardlab.errors import ShardlabError
from shardlab.problems.model import Model
from shardlab.problems.operators import HEAD_OPS, layer_ops

PLAN_SCHEMA = "shardlab.plan/1"


@dataclass(frozen=True, kw_only=True, order=True)
class Degrees:
    """How many GPUs each parallel axis spans.

    ``replicas * pp * tp * dp_attn`` GPUs in all. The MoE block regroups a stage's
    ``tp * dp_attn`` GPUs as ``ep * etp``; on a dense model ``ep == 1`` and ``etp ==
    tp * dp_attn`` (the FFN sees the whole group).
    """

    replicas: int = 1
    pp: int = 1
    tp: int = 1
    dp_attn: int = 1
    ep: int = 1
    etp: int = 1

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ShardlabError(f"degrees {self.short()}: {f.name} must be an integer >= 1")
        if self.ep * self.etp != self.tp * self.dp_attn:
            raise ShardlabError(
                f"degrees {self.short()}: ep * etp ({self.ep} * {self.etp}) must equal "
                f"tp * dp_attn ({self.tp} * {self.dp_attn}): the MoE block regroups the "
                "same GPUs"
            )

    @property
    def group(self) -> int:
        """GPUs of one pipeline stage of one replica."""
        return self.tp * self.dp_attn

    @property
    def num_gpus(self) -> int:
        return self.replicas * self.pp * self.tp * self.dp_attn

    def short(self) -> str:
        return (
            f"replicas={self.replicas} pp={self.pp} tp={self.tp} dp_attn={self.dp_attn} "
            f"ep={self.ep} etp={self.etp}"
        )

    def axis_size(self, axis: str) -> int:
        return {"dp": self.dp_attn, "tp": self.tp}[axis]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One point of the search space.

    ``layer_options[i]`` lists layer ``i``'s option per operator, in the order of
    :func:`shardlab.problems.operators.layer_ops` for that layer's kind;
    ``head_options`` does the same for :data:`HEAD_OPS`.
    """

    degrees: Degrees
    stage_layers: tuple[int, ...]
    layer_options: tuple[tuple[str, ...], ...]
    head_options: tuple[str, ...]
    # requests per attention-DP rank in flight (the engine's max batch size); None:
    # the evaluator chooses the best
    requests_per_rank: int | None = None

    def __post_init__(self) -> None:
        c = self.requests_per_rank
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise ShardlabError(f"plan: requests_per_rank must be a positive integer, got {c!r}")
        if len(self.stage_layers) != self.degrees.pp:
            raise ShardlabError(
                f"plan: {len(self.stage_layers)} pipeline stages listed but pp={self.degrees.pp}"
            )
        if any(n < 1 for n in self.stage_layers):
            raise ShardlabError(f"plan: every pipeline stage needs a layer: {self.stage_layers}")

    @property
    def num_layers(self) -> int:
        return sum(self.stage_layers)

    def stage_of_layer(self) -> tuple[int, ...]:
        return tuple(s for s, n in enumerate(self.stage_layers) for _ in range(n))

    def option(self, model: Model, layer: int, op: str) -> str:
        names = [o.name for o in layer_ops(model, model.layer_kinds[layer])]
        return self.layer_options[layer][names.index(op)]

    def head_option(self, op: str) -> str:
        return self.head_options[[o.name for o in HEAD_OPS].index(op)]

    def is_tied(self, model: Model) -> bool:
        """Whether every layer of a kind has the same options."""
        first: dict[str, tuple[str, ...]] = {}
        for kind, opts in zip(model.layer_kinds, self.layer_options, strict=True):
            if first.setdefault(kind, opts) != opts:
                return False
        return True

    # -- JSON --------------------------------------------------------------------

    def to_dict(
        self, model: Model, *, cluster: str = "", engine: str = "", accelerator: str = ""
    ) -> dict[str, Any]:
        """The plan JSON (``engine``, ``accelerator``: what it was priced for, recorded
        when given)."""
        head = dict(zip((o.name for o in HEAD_OPS), self.head_options, strict=True))
        data: dict[str, Any] = {
            "schema": PLAN_SCHEMA,
            "model": model.name,
            "cluster": cluster,
            **made_for(engine=engine, accelerator=accelerator),
            "degrees": asdict(self.degrees),
            "stage_layers": list(self.stage_layers),
            "options": {"head": head},
        }
        per_layer = [
            dict(zip((o.name for o in layer_ops(model, kind)), opts, strict=True))
            for kind, opts in zip(model.layer_kinds, self.layer_options, strict=True)
        ]
        if self.is_tied(model):
            for kind, opts in zip(model.layer_kinds, per_layer, strict=True):
                data["options"].setdefault(kind, opts)
        else:
            data["layers"] = per_layer
        if self.requests_per_rank is not None:
            data["requests_per_rank"] = self.requests_per_rank
        return data

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        model: Model,
        *,
        where: str = "plan",
        cluster: str | None = None,
    ) -> Plan:
        """The plan ``data`` holds for ``model`` (and, if given, the cluster named
        ``cluster``: a plan's degrees are made for one cluster)."""
        _check_made_for(data, model, where, cluster)
        degrees = _read_degrees(data, where)
        stages = _read_stages(data, model, degrees, where)
        rows, head = _read_plan_options(data, model, where)
        return cls(
            degrees=degrees,
            stage_layers=stages,
            layer_options=rows,
            head_options=head,
            requests_per_rank=_read_requests_per_rank(data, where),
        )

    def to_json(self, model: Model, *, cluster: str = "") -> str:
        return json.dumps(self.to_dict(model, cluster=cluster), indent=2)

    @classmethod
    def from_json(cls, text: str, model: Model, *, where: str = "plan") -> Plan:
        return cls.from_dict(_parse(text, where), model, where=where)

    @classmethod
    def load(cls, path: str | Path, model: Model, *, cluster: str | None = None) -> Plan:
        return cls.from_dict(read_plan_file(path), model, where=str(path), cluster=cluster)


def made_for(*, engine: str = "", accelerator: str = "") -> dict[str, str]:
    """The keys a plan file records of what it was priced for (those given)."""
    return {k: v for k, v in (("engine", engine), ("accelerator", accelerator)) if v}


def _parse(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ShardlabError(
            f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except (ValueError, RecursionError) as exc:  # an integer of 4,300 digits, deep nesting
        raise ShardlabError(f"{where}: not a plan JSON ({str(exc)[:80]})") from None


def read_plan_file(path: str | Path) -> Any:
    """The parsed JSON of a plan file (its ``model`` and ``cluster`` name what it is for)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ShardlabError(f"{path}: cannot read the plan ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ShardlabError(
            f"{path}: not a plan JSON", field="plan", fix="give a plan file that solve wrote"
        ) from None
    return _parse(text, str(path))


def _read_options(entry: Any, ops: tuple, where: str) -> tuple[str, ...]:
    if not isinstance(entry, Mapping):
        raise ShardlabError(f"{where} must map operator names to option names")
    names = [op.name for op in ops]
    unknown = sorted(set(entry) - set(names))
    if unknown:
        raise ShardlabError(f"{where}: unknown operator(s) {', '.join(unknown)}")
    out = []
    for op in ops:
        if op.name not in entry:
            raise ShardlabError(f"{where}: missing operator {op.name!r}")
        if entry[op.name] not in op.option_names:
            raise ShardlabError(
                f"{where}: {op.name} option {entry[op.name]!r} is not one of "
                + ", ".join(op.option_names)
            )
        out.append(entry[op.name])
    return tuple(out)


def _check_made_for(data: Any, model: Model, where: str, cluster: str | None) -> None:
    """Refuse a plan that is no plan JSON, or one made for another model or cluster."""
    if not isinstance(data, Mapping):
        raise ShardlabError(f"{where}: a plan must be a JSON object")
    schema = data.get("schema")
    if schema != PLAN_SCHEMA:
        raise ShardlabError(
            f"{where}: schema {schema!r} is not {PLAN_SCHEMA!r}; re-export the plan with "
            "this version of shardlab"
        )
    if data.get("model") not in (None, "", model.name):
        raise ShardlabError(
            f"{where}: the plan is for model {data.get('model')!r}, not {model.name!r}"
        )
    planned_for = data.get("cluster")
    if cluster is not None and planned_for not in (None, "", cluster):
        raise ShardlabError(
            f"{where}: the plan is for cluster {planned_for!r}, not {cluster!r}",
            field="cluster",
            fix=f"solve again for {cluster} or evaluate the plan on {planned_for}",
        )


def _read_degrees(data: Mapping[str, Any], where: str) -> Degrees:
    raw_degrees = data.get("degrees")
    if not isinstance(raw_degrees, Mapping):
        raise ShardlabError(f"{where}: missing key 'degrees'")
    unknown = sorted(set(raw_degrees) - {f.name for f in fields(Degrees)})
    if unknown:
        raise ShardlabError(f"{where}: unknown degree(s) {', '.join(unknown)}")
    return Degrees(**raw_degrees)


def _read_stages(
    data: Mapping[str, Any], model: Model, degrees: Degrees, where: str
) -> tuple[int, ...]:
    stages = data.get("stage_layers")
    if not isinstance(stages, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in stages
    ):
        raise ShardlabError(f"{where}: key 'stage_layers' must be a list of integers >= 1")
    if sum(stages) != model.num_layers:
        raise ShardlabError(
            f"{where}: stage_layers {stages} sum to {sum(stages)}, the model has "
            f"{model.num_layers} layers"
        )
    if len(stages) != degrees.pp:
        raise ShardlabError(
            f"{where}: key 'stage_layers' lists {len(stages)} stages, degree pp is {degrees.pp}"
        )
    return tuple(stages)


def _read_plan_options(
    data: Mapping[str, Any], model: Model, where: str
) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """Every layer's options and the head's, from ``options`` (per kind) or ``layers``."""
    options = data.get("options")
    if not isinstance(options, Mapping) or "head" not in options:
        raise ShardlabError(f"{where}: missing key 'options.head'")
    layers = data.get("layers")
    known = {"head"} if layers is not None else {"head", *model.kinds}
    unknown = sorted(str(k) for k in set(options) - known)
    if unknown:
        raise ShardlabError(
            f"{where}: options for {', '.join(unknown)}, which model {model.name} does "
            f"not have (its layer kinds: {', '.join(model.kinds)}"
            + ("; with 'layers', options hold only 'head'" if layers is not None else "")
            + ")"
        )
    head = _read_options(options["head"], HEAD_OPS, f"{where}: options.head")
    if layers is not None:
        if not isinstance(layers, list) or len(layers) != model.num_layers:
            raise ShardlabError(
                f"{where}: key 'layers' must list {model.num_layers} layers' options"
            )
        rows = tuple(
            _read_options(entry, layer_ops(model, kind), f"{where}: layers[{i}]")
            for i, (kind, entry) in enumerate(zip(model.layer_kinds, layers, strict=True))
        )
        return rows, head
    per_kind = {}
    for kind in model.kinds:
        if kind not in options:
            raise ShardlabError(f"{where}: missing key 'options.{kind}'")
        per_kind[kind] = _read_options(
            options[kind], layer_ops(model, kind), f"{where}: options.{kind}"
        )
    return tuple(per_kind[kind] for kind in model.layer_kinds), head


def _read_requests_per_rank(data: Mapping[str, Any], where: str) -> int | None:
    """The plan's requests per attention-DP rank; ``concurrency`` is the key's name in
    plan files written before the name said what it counts."""
    key = "requests_per_rank" if "requests_per_rank" in data else "concurrency"
    value = data.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ShardlabError(
            f"{where}: key {key!r} must be a positive integer (requests per "
            f"attention-DP rank), got {value!r}"
        )
    return value
