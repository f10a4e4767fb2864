"""What each serving engine can launch: the capability model behind ``--space engine``,
the ``grid`` and ``recipe`` baselines and ``shardlab launch``.

For each engine, at the version pinned below, three things:

- which degree tuples it runs (:meth:`Capability.refusal` says why not, with the
  engine source file the rule comes from);
- which engine features it can switch on under a degree tuple (:class:`Feature`: the
  flag, YAML key or environment variable, and its source);
- the option every operator then gets. An engine has no per-operator freedom beyond
  its features, so a configuration (degrees + features) fixes every operator, and
  :class:`EngineConfig` lists them.

Options an engine has no equivalent for are simply never produced (``shardlab
engines`` prints the table): replicated attention projections under tensor
parallelism, head or token splits mixed within a layer, ``column_full``/``row_full``
FFNs outside SGLang's DP attention, token-sharded embedding, LM head or sampler, and
options chosen per layer. Line numbers cite the pinned source trees:
vLLM ``vllm-0.24.0`` wheel, SGLang ``sglang-0.5.14`` wheel, TensorRT-LLM ``1.3.0rc3``
(``tensorrt_llm/``; the newest complete source reachable here: 1.3.0rc20, whose
kernels the silicon tables measure, is not published as source on PyPI, and its
LLM-API keys are those of rc3 in AIConfigurator's rc14+ templates).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, get_args

from shardlab.errors import ShardlabError
from shardlab.problems.operators import HEAD_OPS, OpSpec, OptionSpec, layer_ops

if TYPE_CHECKING:
    from shardlab.problems.cluster import Cluster
    from shardlab.problems.model import Model
    from shardlab.problems.plan import Degrees

Engine = Literal["trtllm", "vllm", "sglang"]
ENGINES: tuple[str, ...] = get_args(Engine)


@dataclass(frozen=True)
class Feature:
    name: str  # short id, as configuration labels show it
    turns_on: str  # what the user sets: a flag, a YAML key or an environment variable
    source: str  # file:line at the pinned version
    doc: str


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """A degree tuple, the engine features it runs with, and each operator's option."""

    degrees: Degrees
    features: tuple[str, ...]
    options: tuple[tuple[str, str, str], ...]  # (layer kind or "head", operator, option)

    def option(self, kind: str, op: str) -> str:
        for k, o, name in self.options:
            if k == kind and o == op:
                return name
        raise KeyError((kind, op))


# Preference lists per operator: the first option that is valid under the degrees is
# taken; one that is invalid only because an axis it needs has size 1 gives way to the
# next (in the end to the canonical option, the same plan); one invalid for any other
# reason (a dimension that does not divide) makes the configuration unrunnable.
Wants = dict[str, tuple[str, ...]]

TENSOR_PARALLEL: Wants = {
    "residual": ("replicated",),
    "attn_norm": ("replicated",),
    "qkv_proj": ("column",),
    "attention": ("head_sharded",),
    "o_proj": ("row",),
    "ffn_norm": ("replicated",),
    "ffn_up": ("column",),
    "ffn_down": ("row",),
    "router": ("replicated",),
    "experts": ("allgather",),
    "shared_up": ("column",),
    "shared_down": ("row",),
    "embedding": ("vocab_sharded",),
    "final_norm": ("replicated",),
    "lm_head": ("column",),
    "sampler": ("replicated",),
}


def _axis_missing(opt: OptionSpec, d: Degrees) -> bool:
    sizes = {"tp": d.tp, "dp": d.dp_attn, "group": d.group}
    return any(sizes[r] == 1 for r in opt.requires)


def _resolve(op: OpSpec, wanted: tuple[str, ...], d: Degrees) -> str | None:
    from shardlab.problems.space import option_valid

    for name in wanted:
        opt = op.option(name)
        if option_valid(op, opt, d):
            return name
        if not _axis_missing(opt, d):
            return None
    return op.options[0].name


class Capability(ABC):
    """One engine at one version: see the module docstring."""

    engine: ClassVar[str]
    version: ClassVar[str]
    # whether the engine takes uneven pipeline stages (and how: launch sets it)
    uneven_pp: ClassVar[bool]
    features: ClassVar[tuple[Feature, ...]]

    @property
    def label(self) -> str:
        return f"{self.engine} {self.version}"

    @abstractmethod
    def refusal(self, model: Model, cluster: Cluster, d: Degrees) -> str | None:
        """Why the engine cannot run ``d`` (None: it can)."""

    @abstractmethod
    def feature_sets(self, model: Model, cluster: Cluster, d: Degrees) -> list[tuple[str, ...]]:
        """The feature combinations it can run ``d`` with, its default first."""

    @abstractmethod
    def wants(self, model: Model, d: Degrees, features: tuple[str, ...], kind: str) -> Wants:
        """Preference lists of the operators of one layer kind (or "head")."""

    def config(self, model: Model, d: Degrees, features: tuple[str, ...]) -> EngineConfig | str:
        """The configuration, or why an operator cannot be sharded so."""
        options = []
        for kind in (*model.kinds, "head"):
            ops = HEAD_OPS if kind == "head" else layer_ops(model, kind)
            wants = self.wants(model, d, features, kind)
            for op in ops:
                name = _resolve(op, wants[op.name], d)
                if name is None:
                    return (
                        f"{op.name} would be {wants[op.name][0]}, whose "
                        f"{op.split_size:,}-wide dimension does not divide over the degrees"
                    )
                options.append((kind, op.name, name))
        why = self.check(model, d, {op: name for _, op, name in options})
        if why is not None:
            return why
        return EngineConfig(degrees=d, features=features, options=tuple(options))

    def check(self, model: Model, d: Degrees, options: dict[str, str]) -> str | None:
        """Why the engine refuses these resolved options (operator -> option), if it does."""
        return None

    def configs(
        self, model: Model, cluster: Cluster, free: tuple[Degrees, ...]
    ) -> tuple[EngineConfig, ...]:
        """Every configuration the engine can launch, over the free space's degrees."""
        out: list[EngineConfig] = []
        seen: set[tuple[Degrees, tuple[tuple[str, str, str], ...]]] = set()
        reasons: dict[str, int] = {}
        for d in free:
            why = self.refusal(model, cluster, d)
            if why is None:
                for features in self.feature_sets(model, cluster, d):
                    c = self.config(model, d, features)
                    if isinstance(c, str):
                        why = c
                    elif (d, c.options) not in seen:  # a feature can be inert here
                        seen.add((d, c.options))
                        out.append(c)
            if why is not None:
                reasons[why] = reasons.get(why, 0) + 1
        if not out:
            common = max(reasons, key=reasons.__getitem__) if reasons else "no degrees"
            raise ShardlabError(
                f"{self.label} can run no plan of {model.name} on {cluster.name} (e.g. "
                f"{common}); use --space free or another --engine"
            )
        return tuple(out)

    def why_not(self, model: Model, cluster: Cluster, d: Degrees) -> str:
        """Why no configuration of ``d`` exists (for error messages)."""
        why = self.refusal(model, cluster, d)
        if why is not None:
            return why
        for features in self.feature_sets(model, cluster, d):
            c = self.config(model, d, features)
            if isinstance(c, str):
                return c
        return "they are not a valid degree tuple of this problem"


# Models and a cluster whose engine configurations show every feature at work: a
# dense model, a MoE model with shared experts and dense layers (DeepSeek-V3), one
# with few experts; two nodes, so that multi-node rules apply.
COVERAGE_CASES: tuple[tuple[str, str], ...] = (
    ("llama-3.1-70b", "h100x16"),
    ("deepseek-v3", "h200x16"),
    ("mixtral-8x7b", "h100x16"),
)


def option_coverage(engine: str) -> dict[tuple[str, str], tuple[str, ...] | None]:
    """For every (operator, option): the fewest engine features under which ``engine``
    produces it on :data:`COVERAGE_CASES` with more than one GPU per stage (``()``:
    with its defaults), None if never (the option has no equivalent in the engine)."""
    from shardlab.problems.catalog import load_model
    from shardlab.problems.cluster import parse_cluster
    from shardlab.problems.space import enumerate_degrees

    cap = capability(engine)
    out: dict[tuple[str, str], tuple[str, ...] | None] = {}
    for model_name, cluster_name in COVERAGE_CASES:
        model, cluster = load_model(model_name), parse_cluster(cluster_name)
        for op in (*{o for k in model.kinds for o in layer_ops(model, k)}, *HEAD_OPS):
            for opt in op.options:
                out.setdefault((op.name, opt.name), None)
        for c in cap.configs(model, cluster, enumerate_degrees(model, cluster)):
            if c.degrees.group == 1:  # one GPU per stage: every option is the same plan
                continue
            for _, op_name, name in c.options:
                seen = out.get((op_name, name))
                if seen is None or len(c.features) < len(seen):
                    out[(op_name, name)] = c.features
    return out


def capability(engine: str) -> Capability:
    """The capability model of ``engine`` at its pinned version."""
    from shardlab.problems.engine_rules import CAPABILITIES

    try:
        return CAPABILITIES[engine]
    except KeyError:
        raise ShardlabError(f"--engine {engine!r} is not one of {', '.join(ENGINES)}") from None
