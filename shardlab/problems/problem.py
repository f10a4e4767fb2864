"""A problem: one model on one cluster under one workload, and its search space."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, get_args

from shardlab.errors import ShardlabError
from shardlab.problems.cached_hash import CachedHash
from shardlab.problems.calibration import Calibration, chosen
from shardlab.problems.catalog import load_model
from shardlab.problems.cluster import Cluster, parse_cluster
from shardlab.problems.dtypes import BYTES_PER_VALUE
from shardlab.problems.engines import ENGINES, VENDOR_ENGINES, Engine, capability
from shardlab.problems.handoff import Handoff
from shardlab.problems.limits import MAX_CONTEXT
from shardlab.problems.model import Model
from shardlab.problems.plan import Degrees
from shardlab.problems.space import SearchSpace, SpaceKind, Tie
from shardlab.problems.workload import Workload, get_workload

DEFAULT_MODEL = "llama-3.1-70b"
DEFAULT_CLUSTER = "h100x8"
DEFAULT_WORKLOAD = "chat"

# How kernels are timed: measured tables (aiconfigurator-core; the roofline fills in
# what they lack, a whole user-defined accelerator included) or the roofline alone.
Timing = Literal["roofline", "silicon"]
DEFAULT_TIMING: Timing = "silicon"
DEFAULT_ENGINE: Engine = "trtllm"


@dataclass(frozen=True, kw_only=True)
class Problem(CachedHash):
    # @dataclass(frozen=True) would write its own __hash__ over the inherited one
    __hash__ = CachedHash.__hash__

    model: Model
    cluster: Cluster
    workload: Workload
    tie: Tie = "kind"
    timing: Timing = DEFAULT_TIMING
    # the serving engine: its kernels (with silicon timing, its measurements), its
    # memory budget and limits, and with space "engine" what it can launch
    engine: Engine = DEFAULT_ENGINE
    space_kind: SpaceKind = "free"
    # corrections fitted to measurements; none given: the accelerator's shipped ones
    # (AMD's, fitted to public runs: shardlab.problems.calibration.shipped_for)
    calibration: Calibration | None = None
    # the engine's requests and tokens per iteration per attention-DP rank (None: its
    # default, see shardlab.costmodel.engines)
    max_batch: int | None = None
    max_tokens: int | None = None
    # disaggregated serving (shardlab.problems.disagg): a prefill pool's TTFT includes
    # the handoff of each prompt's cache to the decode pool; ``pin`` keeps the degree
    # tuples with these values (one pool's layout)
    handoff: Handoff | None = None
    pin: tuple[tuple[str, int], ...] = ()
    # degree tuples left out of the space (a walk under percentile SLOs cuts the ones
    # whose best plan failed the simulation: shardlab.solvers.certify)
    exclude: tuple[Degrees, ...] = ()

    def __post_init__(self) -> None:
        cal = chosen(self.calibration, self.cluster.accelerator.key)
        if cal is not self.calibration:  # frozen: set once, before anything reads it
            object.__setattr__(self, "calibration", cal)
        for key in ("max_batch", "max_tokens"):
            value = getattr(self, key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ShardlabError(
                    f"{key} must be a positive integer, got {value!r}",
                    field=key,
                    fix="give a positive integer, or none for the engine's own limit",
                )
        for key, allowed in (
            ("timing", get_args(Timing)),
            ("engine", ENGINES),
            ("space_kind", get_args(SpaceKind)),
        ):
            if getattr(self, key) not in allowed:
                raise ShardlabError(
                    f"{key} {getattr(self, key)!r} is not one of {', '.join(allowed)}",
                    field=key,
                    fix=f"choose one of {', '.join(allowed)}",
                )
        acc = self.cluster.accelerator
        runs = VENDOR_ENGINES[acc.vendor]
        if self.engine not in runs:
            raise ShardlabError(
                f"engine {self.engine} does not run on {acc.name} ({acc.key}): "
                f"{acc.vendor.upper()} GPUs are served by {' or '.join(runs)}",
                field="engine",
                fix=f"choose engine {' or '.join(runs)}",
            )
        if self.workload.draft_tokens and not self.model.mtp_layers:
            raise ShardlabError(
                f"model {self.model.name}: draft_tokens drafts with multi-token-prediction "
                "layers and its config has none (num_nextn_predict_layers)",
                field="workload.draft_tokens",
                fix="set the workload's draft_tokens to 0, or choose a model with MTP layers",
            )
        for key, value in self.pin:
            if key not in Degrees.__dataclass_fields__ or not isinstance(value, int):
                raise ShardlabError(f"pin {key}={value!r}: pin a degree to an integer")
        self._check_context()
        need = self.weight_bytes() / 1e9
        have = self.cluster.total_hbm_gb
        if need > have:
            raise ShardlabError(
                f"model {self.model.name} needs {need:,.0f} GB for its weights "
                f"({self.weight_dtype('experts')} experts/FFN) but {self.cluster.name} has "
                f"{have:,.0f} GB of HBM in all",
                field="cluster",
                fix="use more GPUs, or weights in fp8 or fp4 (the workload's weight_dtype)",
            )

    def _check_context(self) -> None:
        w, m = self.workload, self.model
        tokens = w.input_len + w.output_len
        limit = m.max_position_embeddings or MAX_CONTEXT
        if tokens > limit:
            source = (
                f"model {m.name} takes at most {limit:,} (max_position_embeddings)"
                if m.max_position_embeddings
                else f"shardlab takes at most {limit:,}"
            )
            raise ShardlabError(
                f"workload {w.preset!r}: {w.input_len:,} prompt + {w.output_len:,} output tokens "
                f"= {tokens:,} per request, but {source}",
                field="workload",
                fix="shorten the workload's input_len or output_len",
            )

    @classmethod
    def build(
        cls,
        model: str | Path | Model = DEFAULT_MODEL,
        cluster: str | Cluster = DEFAULT_CLUSTER,
        workload: str | Workload = DEFAULT_WORKLOAD,
        *,
        tie: Tie = "kind",
        timing: Timing = DEFAULT_TIMING,
        engine: Engine = DEFAULT_ENGINE,
        space_kind: SpaceKind = "free",
        calibration: Calibration | str | Path | None = None,
        max_batch: int | None = None,
        max_tokens: int | None = None,
        **overrides: Any,
    ) -> Problem:
        """Build from catalog names or paths; ``overrides`` are :class:`Workload` fields."""
        m = model if isinstance(model, Model) else load_model(model)
        c = cluster if isinstance(cluster, Cluster) else parse_cluster(cluster)
        w = workload if isinstance(workload, Workload) else get_workload(workload)
        if calibration is not None and not isinstance(calibration, Calibration):
            calibration = Calibration.load(calibration)
        return cls(
            model=m,
            cluster=c,
            workload=w.with_overrides(**overrides),
            tie=tie,
            timing=timing,
            engine=engine,
            space_kind=space_kind,
            calibration=calibration,
            max_batch=max_batch,
            max_tokens=max_tokens,
        )

    @property
    def name(self) -> str:
        return f"{self.model.name} on {self.cluster.name}, {self.workload.name}"

    @cached_property
    def space(self) -> SearchSpace:
        engine = capability(self.engine) if self.space_kind == "engine" else None
        return SearchSpace(
            self.model,
            self.cluster,
            tie=self.tie,
            capability=engine,
            pin=self.pin,
            exclude=self.exclude,
        )

    def with_space(self, space_kind: SpaceKind) -> Problem:
        """The same problem searched over another space (free or the engine's; an engine
        chooses options per layer kind, so its space ties them so)."""
        tie: Tie = "kind" if space_kind == "engine" else self.tie
        return dataclasses.replace(self, space_kind=space_kind, tie=tie)

    # -- precision -----------------------------------------------------------------

    def weight_dtype(self, family: str) -> str:
        """Stored format of a weight family (attention, ffn, experts; others are bf16)."""
        if family not in ("attention", "ffn", "experts"):
            return "bf16"
        if self.workload.weight_dtype is not None:
            return self.workload.weight_dtype
        if family in self.model.quantized_families:
            return self.model.weight_dtype
        return "bf16"

    @property
    def kv_dtype(self) -> str:
        return self.workload.kv_dtype or "bf16"

    def weight_bytes(self) -> float:
        """All weights of one copy of the model, in bytes."""
        m = self.model
        b = BYTES_PER_VALUE
        attn = sum(m.qkv_params(a) + m.o_params(a) for a in m.attention_layers)
        total = attn * b[self.weight_dtype("attention")]
        total += m.norms_per_layer * m.norm_params() * m.num_layers * b["bf16"]
        dense = m.layers_of("dense")
        total += (m.ffn_up_params() + m.ffn_down_params()) * dense * b[self.weight_dtype("ffn")]
        if m.moe is not None:
            moe = m.layers_of("moe")
            experts = m.moe.num_experts * m.expert_params() * moe
            shared = (m.shared_up_params() + m.shared_down_params()) * moe
            total += experts * b[self.weight_dtype("experts")]
            total += shared * b[self.weight_dtype("ffn")]
            total += m.router_params() * moe * b["bf16"]
        embed = 0 if m.tie_word_embeddings else m.embedding_params()
        total += (embed + m.lm_head_params() + m.norm_params()) * b["bf16"]
        return total
