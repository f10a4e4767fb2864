"""What each serving engine can launch: the vocabulary of the capability model behind
an engine search space, the ``grid`` and ``recipe`` baselines and ``shardlab launch``.

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

One module per engine holds its rules (:mod:`.trtllm`, :mod:`.vllm`, :mod:`.sglang`);
:mod:`shardlab.problems.engines` registers them.

Vocabulary: the engine's "TP size" is
shardlab's group (``tp * dp_attn``) where the engine runs attention data parallel
inside it (SGLang, TensorRT-LLM), and shardlab's ``tp`` where data parallel ranks
are counted apart (vLLM). Replicas are separate servers in every engine (``shardlab
launch`` prints one per replica).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from shardlab.errors import ShardlabError
from shardlab.problems.cluster import Cluster
from shardlab.problems.degrees import option_valid
from shardlab.problems.model import Model
from shardlab.problems.operators import HEAD_OPS, OpSpec, OptionSpec, layer_ops
from shardlab.problems.plan import Degrees


@dataclass(frozen=True, kw_only=True)
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
                f"{self.label} can run no plan of {model.name} on {cluster.name} (e.g. {common})",
                field="engine",
                fix="search the free space or choose another engine",
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


# DeepSeek-V3's architecture in every engine (Kimi-K2 and DeepSeek-V3.2 included).
DEEPSEEK = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2"})


def block_split(model: Model, d: Degrees, options: dict[str, str]) -> str | None:
    """Why a block-quantized checkpoint cannot be split so (None: it can).

    vLLM and SGLang refuse a slice of an fp8 weight that is not whole scale blocks
    (vLLM model_executor/layers/quantization/fp8.py:560-573, utils/fp8_utils.py
    validate_fp8_block_shape; SGLang srt/layers/quantization/fp8_utils.py:1788-1812,
    srt/model_executor/model_runner.py:1129-1143)."""
    block = model.weight_block
    if not block:
        return None
    sizes = {"ffn_up": model.ffn_size, "ffn_down": model.ffn_size}
    if model.moe is not None:
        sizes.update(shared_up=model.moe.shared_ffn_size, shared_down=model.moe.shared_ffn_size)
    ways = {"column": d.tp, "row": d.tp, "column_full": d.group, "row_full": d.group}
    for op, size in sizes.items():
        option = options.get(op, "replicated")
        n = ways.get(option, 1)
        if size and n > 1 and size % n == 0 and (size // n) % block:
            return f"{op} {option} leaves {size // n}-row slices of {block}-row fp8 blocks"
    if model.moe is not None and d.etp > 1 and (model.moe.expert_ffn_size // d.etp) % block:
        return (
            f"expert TP {d.etp} leaves {model.moe.expert_ffn_size // d.etp}-row slices of "
            f"{block}-row fp8 blocks"
        )
    return None
