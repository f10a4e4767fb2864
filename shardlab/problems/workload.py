"""What the cluster is asked to serve: phase, scheduling, sizes, SLOs, objective, precision.

Scheduling regimes (the cost model prices each as defined here):

- ``static``: the batch of ``batch`` requests is prefilled together, then decoded
  together to the end. TTFT is the prefill of the whole batch; TPOT is the mean decode
  step while the context grows from ``input_len`` to ``input_len + output_len``.
- ``inflight``: continuous batching. Up to ``batch`` requests are in flight (fewer if
  the KV cache cannot hold them); every step decodes one token for each running
  request and prefills the prompts of the requests that replace finished ones. The
  load is the closed loop serving benchmarks run (:mod:`shardlab.costmodel.regimes`):
  each client sends ``prompts_per_client`` requests one after the other, all clients
  starting together, and TTFT and TPOT are means over every request (InferenceX: 10
  prompts per client). The clients are the requests the plan runs, unless ``clients``
  says how many there are: the ones the plan cannot run at once wait for a slot.

Phase: ``prefill`` serves prompts only (throughput in input tokens/s), ``decode``
serves generation only (output tokens/s, prompts already cached), ``request`` serves
whole requests (output tokens/s, prefill included).

Speculative decoding (``draft_tokens`` > 0): every decode step drafts ``draft_tokens``
tokens per request with the model's multi-token-prediction layers, one pass each, and
verifies them in one forward pass of ``draft_tokens + 1`` tokens; each draft token is
accepted with probability ``acceptance`` (independently, as long as the ones before it
were), so a step advances a request by
``(1 - acceptance ** (draft_tokens + 1)) / (1 - acceptance)`` tokens on average.

Objective ``request_rate``: the most requests per second the cluster completes under
the SLOs, by Little's law on the closed loop: ``N`` requests in flight, each taking
the request latency ``L = TTFT + (output_len - 1) * TPOT``, complete ``N / L`` per
second (:mod:`shardlab.costmodel.rate`). It is what a deployment offered a request rate
has to cover; ``rate`` (requests/s, optional) is that offered rate, checked against
the plan after the search (the plan runs at the fewest requests in flight that cover
it).

Prefix reuse (``prefix_reuse`` F in [0, 1)): the share of each prompt an engine's
prefix cache already holds (multi-turn chat, agents, a shared system prompt). The
first ``floor(F * input_len)`` tokens of every prompt are not prefilled: the prompt's
compute, the engine's token budget per iteration and TTFT count the other tokens only,
while the KV cache, the decode context and a disaggregated handoff keep the whole
prompt (:func:`shardlab.costmodel.steps.prefill_tokens` is the one place the forms
read it). 0 prices every prompt whole, as before.

Objective ``pareto``: the trade-off between throughput per GPU (maximized; the scalar
objective every plan is ranked by) and the latencies of :attr:`Workload.latency_axes`
(minimized): TPOT for decode and request workloads, TTFT as well for prefill-heavy
requests, TTFT alone for prefill. Methods report the non-dominated plans they priced;
``optuna`` and ``cpsat`` search the front itself.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal, get_args

from shardlab.errors import ShardlabError
from shardlab.problems.datafile import load_records
from shardlab.problems.dtypes import KVDtype, WeightDtype, check_kv_dtype, check_weight_dtype
from shardlab.problems.limits import MAX_BATCH, MAX_CONTEXT, check_count, check_finite

Phase = Literal["prefill", "decode", "request"]
Schedule = Literal["static", "inflight"]
Objective = Literal["throughput", "throughput_per_gpu", "latency", "pareto", "request_rate"]

# Requests each client of the closed loop sends by default (InferenceX runs
# --num-prompts 10 * --max-concurrency).
PROMPTS_PER_CLIENT = 10

# Requests in flight a rate's workload offers: no bound of its own (the engine's max
# batch and the KV cache bound them).
RATE_IN_FLIGHT = MAX_BATCH

# A request workload is prefill-heavy (its TTFT is a second latency axis of the Pareto
# front) when its prompts hold at least this many times the tokens it generates.
PREFILL_HEAVY_RATIO = 8


def check_prefix_reuse(value: float, *, field: str, where: str = "workload") -> float:
    """A share of prompt tokens served from the prefix cache: a number in [0, 1) (1
    would leave a prompt nothing to compute, and an engine always computes its last
    token); refused otherwise, naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ShardlabError(
            f"{where}: prefix_reuse must be a number in [0, 1), got {value!r}",
            field=field,
            fix="give the share of prompt tokens the prefix cache serves, e.g. 0.5",
        )
    return float(value)


@dataclass(frozen=True, kw_only=True)
class Workload:
    name: str = "custom"
    phase: Phase = "request"
    schedule: Schedule = "inflight"
    batch: int = 256  # static: batch size; inflight: most requests in flight
    input_len: int = 1024
    output_len: int = 256
    ttft_ms: float | None = None  # SLO on time to first token; None: no SLO
    tpot_ms: float | None = None  # SLO on time per output token; None: no SLO
    objective: Objective = "throughput"
    weight_dtype: WeightDtype | None = None  # None: what the model's config declares
    kv_dtype: KVDtype | None = None  # None: bf16
    draft_tokens: int = 0  # speculative decoding: MTP draft tokens per step (0: off)
    acceptance: float | None = None  # probability that one draft token is accepted
    # the closed loop of in-flight serving: requests each client sends in turn, and the
    # clients in the whole cluster (None: as many as the plan runs at once)
    prompts_per_client: int = PROMPTS_PER_CLIENT
    clients: int | None = None
    # the offered load as a rate (requests/s) instead of requests in flight: the search
    # maximizes requests/s (objective request_rate) and the plan must cover this rate
    rate: float | None = None
    # the SLOs at a percentile of the requests instead of the mean (None: the mean);
    # ttft_percentile and tpot_percentile override slo_percentile for one SLO
    slo_percentile: float | None = None
    ttft_percentile: float | None = None
    tpot_percentile: float | None = None
    # SLO on the gap between two tokens of a request (Vidur's TBT), over every token:
    # a percentile only (the analytic model's mean gap is its TPOT)
    itl_ms: float | None = None
    itl_percentile: float | None = None
    # the share of each prompt served from the engine's prefix cache (0: none)
    prefix_reuse: float = 0.0

    def __post_init__(self) -> None:
        where = f"workload {self.preset!r}"
        for key, allowed in (
            ("phase", Phase),
            ("schedule", Schedule),
            ("objective", Objective),
        ):
            if getattr(self, key) not in get_args(allowed):
                raise ShardlabError(
                    f"{where}: {key} {getattr(self, key)!r} is not one of "
                    + ", ".join(get_args(allowed)),
                    field=f"workload.{key}",
                )
        counts = [("batch", MAX_BATCH), ("prompts_per_client", MAX_BATCH)]
        counts += [("input_len", MAX_CONTEXT), ("output_len", MAX_CONTEXT)]
        if self.clients is not None:
            counts.append(("clients", MAX_BATCH))
        for key, limit in counts:
            check_count(getattr(self, key), limit, what=f"{where}: {key}", field=f"workload.{key}")
        for key in ("ttft_ms", "tpot_ms", "itl_ms"):
            value = getattr(self, key)
            if value is not None:
                check_finite(value, what=f"{where}: {key}", positive=True, field=f"workload.{key}")
        self._check_speculation(where)
        self._check_rate(where)
        self._check_percentiles(where)
        check_prefix_reuse(self.prefix_reuse, field="workload.prefix_reuse", where=where)
        if self.weight_dtype is not None:
            check_weight_dtype(self.weight_dtype, where=where)
        if self.kv_dtype is not None:
            check_kv_dtype(self.kv_dtype, where=where)

    def _check_speculation(self, where: str) -> None:
        k, a = self.draft_tokens, self.acceptance
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ShardlabError(
                f"{where}: draft_tokens must be an integer >= 0, got {k!r}",
                field="workload.draft_tokens",
            )
        if a is not None and (
            isinstance(a, bool) or not isinstance(a, int | float) or not 0 <= a <= 1
        ):  # NaN is not in [0, 1] either
            raise ShardlabError(
                f"{where}: acceptance must be a number in [0, 1], got {a!r}",
                field="workload.acceptance",
            )
        if k and a is None:
            raise ShardlabError(
                f"{where}: draft_tokens {k} needs acceptance (the probability that a draft "
                "token is accepted)",
                field="workload.acceptance",
                fix="set the workload's acceptance, e.g. 0.7",
            )
        if k and self.phase == "prefill":
            raise ShardlabError(
                f"{where}: draft_tokens applies to decoding; phase 'prefill' decodes nothing"
            )

    def _check_rate(self, where: str) -> None:
        if self.rate is not None:
            check_finite(self.rate, what=f"{where}: rate", positive=True, field="workload.rate")
        wants_rate = self.rate is not None or self.objective == "request_rate"
        if wants_rate and self.phase != "request":
            raise ShardlabError(
                f"{where}: a request rate counts whole requests; phase {self.phase!r} "
                "serves part of one",
                field="workload.phase",
                fix="use phase 'request' with a rate or the objective request_rate",
            )
        if self.rate is not None and self.objective != "request_rate":
            raise ShardlabError(
                f"{where}: rate {self.rate:g} requests/s is met by the plan of most requests/s "
                f"under the SLOs, not by objective {self.objective!r}",
                field="workload.objective",
                fix="drop the objective (a rate implies request_rate), or drop the rate",
            )

    def _check_percentiles(self, where: str) -> None:
        for key in ("slo_percentile", "ttft_percentile", "tpot_percentile", "itl_percentile"):
            p = getattr(self, key)
            if p is None:
                continue
            if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p < 100:
                raise ShardlabError(
                    f"{where}: {key} must be a percentile in (0, 100), got {p!r}",
                    field=f"workload.{key}",
                    fix="give e.g. 90 or 99 (50: the median)",
                )
            slo = key.replace("_percentile", "_ms")
            if key != "slo_percentile" and getattr(self, slo) is None:
                raise ShardlabError(
                    f"{where}: {key} {p:g} applies to an SLO {slo} that is not given",
                    field=f"workload.{key}",
                    fix=f"give the SLO {slo}, or drop {key}",
                )
        if self.itl_ms is not None and self.percentile("itl_ms") is None:
            raise ShardlabError(
                f"{where}: itl_ms {self.itl_ms:g} is a gap between tokens at a percentile; on "
                "the mean it is the TPOT",
                field="workload.itl_ms",
                fix="give itl_percentile (or slo_percentile), or use tpot_ms on the mean",
            )
        if not self.tail:
            if self.slo_percentile is not None:
                raise ShardlabError(
                    f"{where}: slo_percentile {self.slo_percentile:g} applies to SLOs, and "
                    "none is given",
                    field="workload.slo_percentile",
                    fix="give ttft_ms or tpot_ms, or drop slo_percentile",
                )
            return
        if self.phase != "request" or self.schedule != "inflight":
            raise ShardlabError(
                f"{where}: a percentile SLO is checked by simulating whole requests served "
                f"in flight; phase {self.phase!r}, schedule {self.schedule!r} is not",
                field="workload.slo_percentile",
                fix="use phase 'request' and schedule 'inflight', or SLOs on the mean",
            )
        if self.objective in ("pareto", "latency"):
            raise ShardlabError(
                f"{where}: a percentile SLO is met by walking the ranking of objective "
                f"throughput or request_rate, not {self.objective!r}",
                field="workload.objective",
                fix="drop the objective, or put the SLOs on the mean",
            )

    def percentile(self, slo: str) -> float | None:
        """The percentile ``slo`` (``ttft_ms``, ``tpot_ms`` or ``itl_ms``) holds at
        (None: the mean, or no such SLO)."""
        if getattr(self, slo) is None:
            return None
        own = getattr(self, slo.replace("_ms", "_percentile"))
        return own if own is not None else self.slo_percentile

    @property
    def tail(self) -> bool:
        """Whether any SLO holds at a percentile (checked by the simulator, not the
        analytic model's means)."""
        return any(self.percentile(s) is not None for s in ("ttft_ms", "tpot_ms", "itl_ms"))

    def on_the_mean(self, **limits: float | None) -> Workload:
        """This workload with every SLO on the mean, at ``limits`` where given (the
        problem the analytic model ranks plans of). An ITL limit bounds the mean TPOT
        (the analytic model's mean gap between tokens)."""
        given = {k: v for k, v in limits.items() if getattr(self, k) is not None}
        itl = given.pop("itl_ms", self.itl_ms if "itl_ms" not in limits else None)
        if itl is not None:
            tpot = given.get("tpot_ms", self.tpot_ms)
            given["tpot_ms"] = itl if tpot is None else min(tpot, itl)
        return replace(
            self,
            slo_percentile=None,
            ttft_percentile=None,
            tpot_percentile=None,
            itl_percentile=None,
            itl_ms=None,
            **given,
        )

    @property
    def accepted_per_step(self) -> float:
        """Tokens a decode step advances a request by (1 without speculation)."""
        k, a = self.draft_tokens, self.acceptance or 0.0
        if not k:
            return 1.0
        if a == 1:
            return float(k + 1)
        return (1.0 - a ** (k + 1)) / (1.0 - a)

    def with_overrides(self, **overrides: Any) -> Workload:
        known = {f.name for f in fields(self)}
        unknown = sorted(k for k in overrides if k not in known)
        if unknown:
            raise ShardlabError(
                f"workload: unknown field(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        given = {k: v for k, v in overrides.items() if v is not None}
        if "rate" in given:
            rate = given.pop("rate")
            if "batch" in given:
                raise ShardlabError(
                    f"workload: rate {rate!r} and batch {given['batch']!r} both set the load",
                    field="rate",
                    fix="give a rate (requests/s) or a batch (requests in flight), not both",
                )
            if given.get("objective", "request_rate") != "request_rate":
                raise ShardlabError(
                    f"workload: a rate is met by the plan of most requests/s under the SLOs, "
                    f"not by objective {given['objective']!r}",
                    field="objective",
                    fix="give no objective with a rate",
                )
            given.pop("objective", None)
            return self.with_overrides(**given).at_rate(rate)
        if not given:
            return self
        return replace(self, name=self.name if self.name == "custom" else f"{self.name}*", **given)

    def at_rate(self, rate: float) -> Workload:
        """This workload offered ``rate`` requests/s: the search maximizes requests/s
        under the SLOs, and requests in flight are bounded by the engine and the KV
        cache alone (the rate implies how many run)."""
        check_finite(rate, what=f"workload {self.preset!r}: rate", positive=True, field="rate")
        name = self.name if self.name == "custom" or self.name.endswith("*") else f"{self.name}*"
        return replace(
            self, name=name, rate=float(rate), objective="request_rate", batch=RATE_IN_FLIGHT
        )

    @property
    def preset(self) -> str:
        """The preset's name as the user gave it (``name`` marks one with overrides
        ``chat*`` for the outputs; errors name the input as written)."""
        return self.name.removesuffix("*")

    @property
    def per_gpu(self) -> bool:
        """Plans are ranked by throughput per GPU (also the scalar of a Pareto search)."""
        return self.objective in ("throughput_per_gpu", "pareto")

    @property
    def latency_axes(self) -> tuple[str, ...]:
        """The latencies (metric names, minimized) a Pareto front trades against
        throughput per GPU: TTFT for prefill, TPOT for decode, TPOT and (for requests
        whose prompt is ``PREFILL_HEAVY_RATIO`` times the output or more) TTFT."""
        if self.phase == "prefill":
            return ("ttft_ms",)
        if self.phase == "request" and self.input_len >= PREFILL_HEAVY_RATIO * self.output_len:
            return ("tpot_ms", "ttft_ms")
        return ("tpot_ms",)

    def slos(self) -> list[str]:
        """The SLOs given, as people read them (``p90 TTFT <= 2000 ms``)."""
        slo = []
        for key in ("ttft_ms", "tpot_ms", "itl_ms"):
            value, p = getattr(self, key), self.percentile(key)
            if value is not None:
                at = "" if p is None else f"p{p:g} "
                slo.append(f"{at}{key.removesuffix('_ms').upper()} <= {value:g} ms")
        return slo

    def describe(self) -> str:
        slo = self.slos()
        if self.objective == "latency":
            goal = "minimize latency"
        elif self.objective == "request_rate":
            goal = "maximize requests/s"
        elif self.objective == "pareto":
            axes = " and ".join(a.removesuffix("_ms").upper() for a in self.latency_axes)
            goal = f"Pareto front of throughput per GPU vs {axes}"
        else:
            goal = f"maximize {self.objective}"
        load = f"{self.rate:g} requests/s" if self.rate is not None else f"batch {self.batch}"
        parts = [
            self.phase,
            self.schedule,
            load,
            f"{self.input_len} in / {self.output_len} out",
            *slo,
            *(
                [f"MTP drafts {self.draft_tokens} at acceptance {self.acceptance:g}"]
                if self.draft_tokens
                else []
            ),
            *([f"{self.clients} clients"] if self.clients is not None else []),
            *([f"prefix reuse {self.prefix_reuse:.0%}"] if self.prefix_reuse else []),
            *(
                [f"{self.prompts_per_client} prompts per client"]
                if self.prompts_per_client != PROMPTS_PER_CLIENT
                else []
            ),
            goal,
        ]
        return ", ".join(parts)


# The presets, in data/workloads.yaml.
PRESETS: dict[str, Workload] = load_records("workloads.yaml", Workload)


def get_workload(name: str) -> Workload:
    try:
        return PRESETS[name]
    except KeyError:
        raise ShardlabError(
            f"workload {name!r}: unknown preset; presets: {', '.join(PRESETS)}"
        ) from None
