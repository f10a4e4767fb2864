"""Every plan a solver may propose, and its integer encoding.

A plan is encoded as a vector of ``n_vars`` integers:

- variable 0 picks the degree tuple (an index into :attr:`SearchSpace.degree_tuples`);
- then one variable per (operator group, operator): the option index. Groups are the
  layer kinds (``tie="kind"``: every layer of a kind shares its options) or the layers
  themselves (``tie="layer"``), followed by the ``head`` group (embedding, final norm,
  LM head, sampler);
- then ``max_pp - 1`` cut variables: cut ``j`` moves the boundary after stage ``j``
  by ``value - MAX_SHIFT`` layers from the balanced partition.

Which values are valid depends only on the degree tuple (variable 0). The validity
table :meth:`SearchSpace.mask` is what Optuna, the genetic algorithm and the RL policy
sample from; an option that would shard an axis of size 1 is invalid because the
operator's first (canonical) option is the same plan.

Degree tuples use every GPU of the cluster (``replicas * pp * tp * dp_attn == N``),
with ``tp`` dividing the attention heads (and a multiple or divisor of the KV heads),
``pp`` at most the number of layers, and for MoE models ``ep * etp == tp * dp_attn``
with ``ep`` dividing the routed experts and ``etp`` the expert FFN width.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.problems.cluster import Cluster
from shardlab.problems.degrees import enumerate_degrees, option_valid
from shardlab.problems.engines.base import Capability, EngineConfig
from shardlab.problems.model import LayerKind, Model
from shardlab.problems.operators import HEAD_OPS, OpSpec, layer_ops
from shardlab.problems.plan import Degrees, Plan

Tie = Literal["kind", "layer"]
TIES: tuple[str, ...] = ("kind", "layer")
# free: every plan of the layout algebra; engine: what the problem's engine can launch
SpaceKind = Literal["free", "engine"]
SPACE_KINDS: tuple[str, ...] = ("free", "engine")
# The axes a degree choice is made of (RL decisions, Optuna's per-axis encoding); an
# engine space adds "features", the index of the engine features a configuration sets.
DEGREE_AXES: tuple[str, ...] = ("pp", "tp", "dp_attn", "ep")

# Megatron-style option of each operator (see SearchSpace.megatron_plan).
MEGATRON_OPTIONS: dict[str, str] = {
    "qkv_proj": "column",
    "attention": "head_sharded",
    "o_proj": "row",
    "ffn_up": "column",
    "ffn_down": "row",
    "shared_up": "column",
    "shared_down": "row",
    "embedding": "vocab_sharded",
    "lm_head": "column",
}

# How far (in layers) a pipeline boundary may move from the balanced partition.
MAX_SHIFT = 4

# Mask entries one chunk of sampling draws scores for (tens of MB).
SAMPLE_CHUNK = 1 << 22


@dataclass(frozen=True, kw_only=True)
class Variable:
    name: str
    cardinality: int
    role: Literal["degrees", "option", "cut"]
    group: str = ""  # option variables: "dense", "moe", "layer3", "head"
    group_kind: str = ""  # option variables: the group's layer kind, or "head"
    op: str = ""


@dataclass(frozen=True, kw_only=True)
class OpGroup:
    """Operators whose options one set of variables decides."""

    key: str  # "dense" | "moe" | "layer7" | "head"
    kind: LayerKind | Literal["head"]
    layers: tuple[int, ...]  # layers the group covers (empty for head)
    ops: tuple[OpSpec, ...]


def megatron_index(op: OpSpec, degrees: Degrees) -> int:
    """Index of the option Megatron-LM / vLLM gives ``op`` under ``degrees`` (the
    canonical 0 where it has none or it is not valid)."""
    name = MEGATRON_OPTIONS.get(op.name, "replicated")
    if op.name == "experts":
        name = "alltoall" if degrees.ep > 1 else "allgather"
    idx = op.option_names.index(name) if name in op.option_names else 0
    return idx if option_valid(op, op.options[idx], degrees) else 0


def balanced_boundaries(num_layers: int, pp: int) -> list[int]:
    """Layer index where each stage after the first starts, for equal stages."""
    return [round(j * num_layers / pp) for j in range(1, pp)]


def max_shift(num_layers: int, pp: int) -> int:
    """Largest boundary move that keeps every stage non-empty whatever the other moves."""
    if pp == 1:
        return 0
    return max(0, min(MAX_SHIFT, (num_layers // pp - 1) // 2))


class SearchSpace:
    """The degree tuples, operator options and pipeline partitions of one problem.

    With an engine ``capability`` the space holds only what that engine can launch:
    variable 0 then indexes the engine's configurations (a degree tuple and the engine
    features it is run with; several may share a degree tuple), and under each one
    every operator has the single option the engine gives it, so the masks alone
    restrict every solver. An engine chooses options per model, never per layer.
    """

    def __init__(
        self,
        model: Model,
        cluster: Cluster,
        *,
        tie: Tie = "kind",
        capability: Capability | None = None,
        pin: tuple[tuple[str, int], ...] = (),
        exclude: tuple[Degrees, ...] = (),
    ) -> None:
        if tie not in TIES:
            raise ShardlabError(f"tie {tie!r}: use 'kind' or 'layer'")
        self.model = model
        self.cluster = cluster
        self.tie: Tie = tie
        self.capability = capability
        free = enumerate_degrees(model, cluster)
        if not free:
            raise ShardlabError(
                f"cluster {cluster.name}: no way to split {model.name} ({model.num_heads} "
                f"heads, {model.num_kv_heads} KV heads) over {cluster.num_gpus} GPUs; use a "
                "GPU count whose factors divide the head counts (e.g. a power of two)"
            )
        self.pin = pin
        if pin:
            free = tuple(d for d in free if all(getattr(d, k) == v for k, v in pin))
            if not free:
                pinned = ", ".join(f"{k}={v}" for k, v in pin)
                raise ShardlabError(
                    f"cluster {cluster.name}: no degrees of {model.name} with {pinned}"
                )
        if exclude:
            free = tuple(d for d in free if d not in exclude)
            if not free:
                raise ShardlabError(
                    f"cluster {cluster.name}: every degree tuple of {model.name} was cut",
                    field="exclude",
                )
        self.configs: tuple[EngineConfig, ...] | None = None
        if capability is not None:
            if tie != "kind":
                raise ShardlabError(
                    f"an engine space: {capability.engine} chooses each operator's sharding "
                    "for the whole model, not per layer",
                    field="tie",
                    fix="tie options per layer kind (tie='kind')",
                )
            self.configs = capability.configs(model, cluster, free)
            self.degree_tuples: tuple[Degrees, ...] = tuple(c.degrees for c in self.configs)
            self.feature_sets = tuple(dict.fromkeys(c.features for c in self.configs))
        else:
            self.degree_tuples = free
            self.feature_sets = ((),)
        self.groups = self._groups()
        self.max_pp = max(d.pp for d in self.degree_tuples)
        variables = [Variable(name="degrees", cardinality=len(self.degree_tuples), role="degrees")]
        for g in self.groups:
            for op in g.ops:
                variables.append(
                    Variable(
                        name=f"{g.key}.{op.name}",
                        cardinality=len(op.options),
                        role="option",
                        group=g.key,
                        group_kind=g.kind,
                        op=op.name,
                    )
                )
        self.first_cut = len(variables)
        for j in range(self.max_pp - 1):
            variables.append(
                Variable(name=f"cut{j + 1}", cardinality=2 * MAX_SHIFT + 1, role="cut")
            )
        self.variables: tuple[Variable, ...] = tuple(variables)
        self.cardinalities = np.array([v.cardinality for v in variables], dtype=np.int64)
        self._masks = self._build_masks()
        self._var_offsets = np.arange(self.n_vars, dtype=np.int64) * self._masks.shape[2]

    # -- structure -----------------------------------------------------------------

    def _groups(self) -> tuple[OpGroup, ...]:
        m = self.model
        if self.tie == "kind":
            if any(a.kv_shared for a in m.attention_layers) and len(m.kinds) > 1:
                raise ShardlabError(
                    f"{m.name}: layers that share KV (num_kv_shared_layers) with layers of "
                    "another FFN kind are not modeled"
                )
            groups = [
                OpGroup(
                    key=kind,
                    kind=kind,
                    layers=tuple(i for i, k in enumerate(m.layer_kinds) if k == kind),
                    ops=layer_ops(m, kind),
                )
                for kind in m.kinds
            ]
        else:
            if any(a.kv_shared for a in m.attention_layers):
                raise ShardlabError(
                    f"{m.name}: layers that share KV (num_kv_shared_layers) must shard their "
                    "attention as the layer they read from",
                    field="tie",
                    fix="tie options per layer kind (tie='kind')",
                )
            groups = [
                OpGroup(key=f"layer{i}", kind=kind, layers=(i,), ops=layer_ops(m, kind))
                for i, kind in enumerate(m.layer_kinds)
            ]
        groups.append(OpGroup(key="head", kind="head", layers=(), ops=HEAD_OPS))
        return tuple(groups)

    @property
    def n_vars(self) -> int:
        return len(self.variables)

    @property
    def num_degree_tuples(self) -> int:
        return len(self.degree_tuples)

    def label(self, index: int) -> str:
        """The degree tuple at ``index`` and, in an engine space, the features it sets."""
        text = self.degree_tuples[index].short()
        if self.configs is not None and self.configs[index].features:
            text += " +" + "+".join(self.configs[index].features)
        return text

    def axis_value(self, index: int, axis: str) -> int:
        """Value of one of :data:`DEGREE_AXES` (or ``features``) at ``index``."""
        if axis == "features":
            features = self.configs[index].features if self.configs is not None else ()
            return self.feature_sets.index(features)
        return int(getattr(self.degree_tuples[index], axis))

    @property
    def axes(self) -> tuple[str, ...]:
        """The axes a choice of variable 0 is made of (ep only on MoE models)."""
        axes = DEGREE_AXES if self.model.is_moe else DEGREE_AXES[:3]
        return axes + (("features",) if len(self.feature_sets) > 1 else ())

    def degree_index(self, degrees: Degrees) -> int:
        """Index of ``degrees`` (in an engine space: its configuration with the
        engine's default features)."""
        if self.capability is not None:
            for i, d in enumerate(self.degree_tuples):
                if d == degrees:
                    return i
            why = self.capability.why_not(self.model, self.cluster, degrees)
            raise ShardlabError(
                f"degrees {degrees.short()}: {self.capability.label} cannot run them ({why})",
                field="degrees",
                fix="search the free space or choose other degrees",
            )
        try:
            return self.degree_tuples.index(degrees)
        except ValueError:
            raise ShardlabError(
                f"degrees {degrees.short()} are not valid for {self.model.name} on "
                f"{self.cluster.name} (GPU count, head, expert or layer divisibility)",
                field="degrees",
                fix="choose degrees from SearchSpace.degree_tuples",
            ) from None

    def option_slots(self) -> Iterator[tuple[int, OpGroup, OpSpec]]:
        """(variable index, group, operator) for every option variable."""
        v = 1
        for g in self.groups:
            for op in g.ops:
                yield v, g, op
                v += 1

    # -- validity --------------------------------------------------------------------

    def _build_masks(self) -> np.ndarray:
        width = int(self.cardinalities.max())
        masks = np.zeros((len(self.degree_tuples), self.n_vars, width), dtype=bool)
        masks[:, 0, : len(self.degree_tuples)] = True
        # Layers of one kind share their operators: decide each operator once per tuple.
        slots_of: dict[OpSpec, list[int]] = {}
        for v, _, op in self.option_slots():
            slots_of.setdefault(op, []).append(v)
        even_only = self.capability is not None and not self.capability.uneven_pp
        for d, degrees in enumerate(self.degree_tuples):
            for op, slots in slots_of.items():
                valid = [option_valid(op, opt, degrees) for opt in op.options]
                masks[d, slots, : len(valid)] = valid
            if self.configs is not None:
                for v, g, op in self.option_slots():
                    chosen = op.option_names.index(self.configs[d].option(g.kind, op.name))
                    assert masks[d, v, chosen], (self.configs[d], op.name)
                    masks[d, v] = False
                    masks[d, v, chosen] = True
            shift = 0 if even_only else max_shift(self.model.num_layers, degrees.pp)
            for j in range(self.max_pp - 1):
                v = self.first_cut + j
                if j < degrees.pp - 1:
                    masks[d, v, MAX_SHIFT - shift : MAX_SHIFT + shift + 1] = True
                else:
                    masks[d, v, MAX_SHIFT] = True
        masks.flags.writeable = False
        return masks

    def mask_table(self) -> np.ndarray:
        """``(num_degree_tuples, n_vars, max_cardinality)`` validity of every value."""
        return self._masks

    def mask(self, degree_index: int) -> np.ndarray:
        """``(n_vars, max_cardinality)`` booleans: the valid values under a degree tuple."""
        return self._masks[degree_index]

    def is_valid(self, codes: np.ndarray) -> np.ndarray:
        """Per row of ``codes`` (``(n, n_vars)`` ints): is it a valid encoded plan?"""
        codes = np.atleast_2d(np.asarray(codes))
        if codes.shape[1] != self.n_vars:
            return np.zeros(len(codes), dtype=bool)
        in_range = np.all((codes >= 0) & (codes < self.cardinalities), axis=1)
        out = np.zeros(len(codes), dtype=bool)
        rows = np.flatnonzero(in_range)
        if len(rows):
            sub = codes[rows]
            flat = self._masks.reshape(len(self.degree_tuples), -1)
            cols = sub + self._var_offsets[None, :]
            out[rows] = flat[sub[:, :1], cols].all(axis=1)
        return out

    def repair(self, codes: np.ndarray) -> np.ndarray:
        """Map every invalid value to the nearest valid one (options: the canonical one)."""
        codes = np.array(np.atleast_2d(codes), dtype=np.int64)
        codes[:, 0] = np.clip(codes[:, 0], 0, len(self.degree_tuples) - 1)
        codes[:, 1:] = np.clip(codes[:, 1:], 0, self.cardinalities[1:] - 1)
        m = self._masks[codes[:, 0]]
        ok = np.take_along_axis(m, codes[:, :, None], axis=2)[:, :, 0]
        bad_rows, bad_vars = np.nonzero(~ok)
        for r, v in zip(bad_rows, bad_vars, strict=True):
            valid = np.flatnonzero(m[r, v])
            if self.variables[v].role == "cut":
                codes[r, v] = valid[np.argmin(np.abs(valid - codes[r, v]))]
            else:  # the canonical option, or (an engine space) the one the engine runs
                codes[r, v] = valid[0]
        return codes

    # -- sampling, decoding, encoding ------------------------------------------------

    def sample(self, n: int, seed: int = 0) -> np.ndarray:
        """``(n, n_vars)`` valid encodings: degree tuple uniform, then each value uniform."""
        rng = np.random.default_rng(seed)
        degrees = rng.integers(0, len(self.degree_tuples), size=n)
        codes = np.empty((n, self.n_vars), dtype=np.int64)
        # in chunks of rows (the same random stream as one draw): a space with options
        # per layer has hundreds of variables
        per = max(1, SAMPLE_CHUNK // self._masks[0].size)
        for i in range(0, n, per):
            m = self._masks[degrees[i : i + per]]
            codes[i : i + per] = (rng.random(m.shape) * m).argmax(axis=2)
        codes[:, 0] = degrees
        return codes

    def stage_layers(self, pp: int, cuts: np.ndarray) -> tuple[int, ...]:
        """Layers per stage for ``pp`` stages and the cut values of one encoding."""
        return tuple(int(n) for n in self.stage_layers_batch(pp, np.asarray(cuts)[None])[0])

    def stage_layers_batch(self, pp: int, cuts: np.ndarray) -> np.ndarray:
        """``(n, pp)`` layers per stage for ``(n, >= pp - 1)`` cut values."""
        n = len(cuts)
        base = np.array(balanced_boundaries(self.model.num_layers, pp), dtype=np.int64)
        bounds = base[None, :] + cuts[:, : pp - 1] - MAX_SHIFT
        edges = np.concatenate(
            [np.zeros((n, 1), np.int64), bounds, np.full((n, 1), self.model.num_layers)], axis=1
        )
        return np.diff(edges, axis=1)

    def decode(self, row: np.ndarray) -> Plan:
        row = np.asarray(row, dtype=np.int64)
        if row.shape != (self.n_vars,) or not self.is_valid(row[None])[0]:
            raise ShardlabError(
                f"encoded plan is not valid for this space (expected {self.n_vars} values "
                "inside the validity mask); use SearchSpace.repair() first"
            )
        degrees = self.degree_tuples[int(row[0])]
        layer_opts: list[tuple[str, ...] | None] = [None] * self.model.num_layers
        head: tuple[str, ...] = ()
        v = 1
        for g in self.groups:
            opts = tuple(op.options[int(row[v + k])].name for k, op in enumerate(g.ops))
            v += len(g.ops)
            if g.kind == "head":
                head = opts
            for layer in g.layers:
                layer_opts[layer] = opts
        stages = self.stage_layers(degrees.pp, row[self.first_cut :])
        return Plan(
            degrees=degrees,
            stage_layers=stages,
            layer_options=tuple(o for o in layer_opts if o is not None),
            head_options=head,
        )

    def encode(self, plan: Plan) -> np.ndarray:
        """The encoding of ``plan``; raises if the plan is outside this space."""
        row = np.zeros(self.n_vars, dtype=np.int64)
        row[0] = self.degree_index(plan.degrees)
        if len(plan.layer_options) != self.model.num_layers:
            raise ShardlabError(
                f"plan lists {len(plan.layer_options)} layers, {self.model.name} has "
                f"{self.model.num_layers}"
            )
        for v, g, op in self.option_slots():
            k = [o.name for o in g.ops].index(op.name)
            if g.kind == "head":
                chosen = {plan.head_options[k]}
            else:
                chosen = {plan.layer_options[layer][k] for layer in g.layers}
            if len(chosen) != 1:
                raise ShardlabError(
                    f"plan chooses different options for {op.name} within {g.key}; "
                    "solve with tie='layer' to encode per-layer plans"
                )
            name = chosen.pop()
            row[v] = op.option_names.index(name)
        pp = plan.degrees.pp
        bounds = np.cumsum(plan.stage_layers)[:-1]
        shift = max_shift(self.model.num_layers, pp)
        for j, (b, base) in enumerate(
            zip(bounds, balanced_boundaries(self.model.num_layers, pp), strict=True)
        ):
            if abs(int(b) - base) > shift:
                raise ShardlabError(
                    f"pipeline partition {list(plan.stage_layers)} moves stage boundary {j + 1} "
                    f"by {int(b) - base} layers; this space allows at most {shift}"
                )
            row[self.first_cut + j] = int(b) - base + MAX_SHIFT
        row[self.first_cut + pp - 1 :] = MAX_SHIFT
        if self.configs is not None:
            return self._engine_row(plan, row)
        if not self.is_valid(row[None])[0]:
            bad = [
                self.variables[v].name
                for v in range(self.n_vars)
                if not self._masks[row[0], v, row[v]]
            ]
            raise ShardlabError(
                f"plan is not valid under degrees {plan.degrees.short()}: "
                + ", ".join(bad)
                + " shard an axis of size 1 or a dimension that does not divide"
            )
        return row

    def _engine_row(self, plan: Plan, row: np.ndarray) -> np.ndarray:
        """``row`` under the configuration of the engine that runs ``plan``'s options."""
        assert self.capability is not None and self.configs is not None
        candidates = [i for i, c in enumerate(self.configs) if c.degrees == plan.degrees]
        for i in candidates:
            row[0] = i
            if self.is_valid(row[None])[0]:
                return row
        # Name the first value no configuration of these degrees runs.
        engine = self.capability.label
        for v in range(1, self.n_vars):
            if not any(self._masks[i, v, row[v]] for i in candidates):
                var = self.variables[v]
                if var.role == "cut":
                    raise ShardlabError(
                        f"pipeline partition {list(plan.stage_layers)}: {engine} splits "
                        "layers into equal stages only",
                        field="plan.stage_layers",
                        fix="search the free space or use equal stages",
                    )
                runs = sorted({self.configs[i].option(var.group_kind, var.op) for i in candidates})
                ops = {op.name: op for _, _, op in self.option_slots()}
                raise ShardlabError(
                    f"{var.name}={ops[var.op].options[row[v]].name} under degrees "
                    f"{plan.degrees.short()}: {engine} has no equivalent (it runs "
                    f"{var.op} as {' or '.join(runs)})",
                    field="space",
                    fix="search the free space",
                )
        raise ShardlabError(
            f"plan under degrees {plan.degrees.short()}: {engine} runs no combination of its "
            "options (each is one of the engine's, but not together)",
            field="space",
            fix="search the free space",
        )

    def config_index(self, degrees: Degrees, features: tuple[str, ...]) -> int | None:
        """Index of the engine configuration with these degrees that sets the most of
        ``features`` and no other (a feature the model or degrees leave inert is not
        offered); None if the engine cannot run the degrees."""
        best, most = None, -1
        for i, c in enumerate(self.configs or ()):
            fits = c.degrees == degrees and set(c.features) <= set(features)
            if fits and len(c.features) > most:
                best, most = i, len(c.features)
        return best

    def config_plan(self, index: int) -> Plan:
        """The plan of engine configuration ``index``, with equal pipeline stages."""
        row = self._masks[index].argmax(axis=1)
        row[0] = index
        row[self.first_cut :] = MAX_SHIFT
        return self.decode(row)

    def megatron_plan(self, degrees: Degrees) -> Plan:
        """The plan Megatron-LM / vLLM would run under ``degrees``.

        Column-parallel QKV and FFN up, head-sharded attention, row-parallel output and
        FFN down, replicated norms and residual stream, vocabulary-parallel embedding
        and LM head; MoE experts dispatched with all-to-all when split over ``ep``,
        else computed on every token with partial sums (tensor-parallel experts); equal
        pipeline stages. Options that would shard an axis of size 1 fall back to the
        canonical option (the same plan). In an engine space: the plan the engine runs
        under ``degrees`` with its default features.
        """
        d = self.degree_index(degrees)
        row = np.zeros(self.n_vars, dtype=np.int64)
        row[0] = d
        mask = self._masks[d]
        if self.configs is not None:  # as the engine runs these degrees by default
            return self.config_plan(d)
        for v, _, op in self.option_slots():
            idx = megatron_index(op, degrees)
            row[v] = idx if mask[v, idx] else 0
        row[self.first_cut :] = MAX_SHIFT
        return self.decode(row)

    # -- size ----------------------------------------------------------------------

    def num_plans(self) -> int:
        """Exact number of distinct valid plans (a Python integer; may be astronomical)."""
        counts = self._masks.sum(axis=2)[:, 1:]
        return sum(math.prod(int(c) for c in row) for row in counts)

    def log10_size(self) -> float:
        """log10 of the number of distinct valid plans (degree tuples x options x cuts)."""
        counts = self._masks.sum(axis=2)[:, 1:]  # (degrees, vars)
        per_degree = np.log10(counts).sum(axis=1)
        top = per_degree.max()
        return float(top + np.log10(np.power(10.0, per_degree - top).sum()))
