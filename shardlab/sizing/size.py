"""``shardlab size``: the cheapest deployment that serves a rate under the SLOs.

**The space.** A deployment is, aggregated, any multiset of instances (each one copy
of the model on a power-of-two number of GPUs of one listed type: 1, 2, 4 ... within
a node, then 2, 4 ... whole nodes) behind one router that splits the rate over them in
proportion to their capacities (Mélange's mix of GPU types); disaggregated, a prefill
pool of identical instances and a decode pool of identical instances, each pool of any
listed type, the prefill instances handing each prompt's KV cache to the decode
instances over the network (the pools own separate nodes). Every instance runs the
plan that CP-SAT proves best for it (:mod:`shardlab.sizing.capacity`). Cost is
``sum GPUs x $/GPU-hour``, or the GPU count without prices; at most ``max_gpus`` GPUs.

**The proof** that no deployment in that space costs less rests on:

1. *Capacity adds over instances.* An instance's servable capacity is the most it
   serves over the concurrencies that all meet the SLOs (:mod:`shardlab.costmodel.rate`),
   so any share up to it settles at a concurrency that meets them; instances behind a
   router are independent, so ``k`` serve ``k`` times one and a mix the sum. The
   cheapest deployment is then a covering knapsack over instance kinds, solved exactly
   (:mod:`shardlab.sizing.cover`); one type's optimum is the cheapest multiset of its
   shapes (one shape times the instances the rate needs, unless a mix of shapes rounds
   better).
2. *Bounds prune shapes.* Any deployment holding an instance costs at least that
   instance: kinds are solved in order of one instance's cost and the search stops at
   the first that costs as much as the best deployment found. A disaggregated pair is
   bounded below by instance counts from CP-SAT optima (each at least any servable
   capacity): the decode instance over every layout and the prefill instance without
   the handoff (a handoff only adds to TTFT, so it only lowers prefill capacity,
   tested); other decode layouts (a smaller handoff) are solved only when that bound
   beats the best found.
3. *Infeasibility carries upward.* Capacities do not depend on the rate and a
   deployment covering a rate covers every lower one, so a rate that no deployment
   up to ``max_gpus`` serves refuses every higher rate of a curve unsolved.
4. *A compute ceiling.* No deployment of ``max_gpus`` GPUs serves more requests/s
   than they compute at their peak (:meth:`Sizer.rate_ceiling`); a rate above it is
   refused before any solve. Between the ceiling and what the GPUs really serve, the
   proof of "none" solves every shape (minutes for large models at 256 GPUs).

**A time limit** (``time_limit``, wall seconds from ``started``) ends the proof early:
each solve gets what is left, none starts after it, and an answer that needed a
capacity not proven (a solve stopped, or never started) is *partial*: the cheapest
deployment found so far (its instances do serve the rate: a stopped solve's capacity is
what its plan serves), not proven least-cost, naming the capacities left unproven.
Unproven capacities prove no infeasibility either: nothing is carried upward from them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from shardlab.costmodel import fit_rate
from shardlab.errors import ShardlabError
from shardlab.problems.cluster import Accelerator, Cluster
from shardlab.problems.disagg import SERVINGS
from shardlab.problems.limits import check_finite
from shardlab.problems.problem import Problem
from shardlab.problems.traffic import Traffic
from shardlab.sizing.capacity import Capacities, Capacity, instance_sizes, least_gpus
from shardlab.sizing.cover import Kind, cover
from shardlab.sizing.tail import check_tail, simulate_deployment

Mode = Literal["agg", "disagg"]
DEFAULT_MAX_GPUS = 256
# Costs within this relative distance are equal (prices are given to the cent).
_SAME = 1e-12
# Seconds of a time limit kept for what follows the last solve: a stopped CP-SAT solve
# ends within a second of its limit, then the answer is priced and printed and the
# process exits (measured: about 1.5 s in all with the interpreter's start before the
# command's clock starts, on a loaded machine).
_RESERVE_S = 3.0


@dataclass(frozen=True, kw_only=True)
class Pool:
    """``instances`` identical instances of one kind."""

    role: str  # agg, prefill, decode
    capacity: Capacity  # one instance's
    instances: int
    price: float | None  # $/GPU-hour
    gpus_per_node: int

    @property
    def gpu(self) -> str:
        return self.capacity.gpu

    @property
    def gpus(self) -> int:
        return self.instances * self.capacity.gpus

    @property
    def nodes(self) -> int:
        """Nodes it fills (instances within a node pack them, power-of-two sizes)."""
        return -(-self.gpus // self.gpus_per_node)

    @property
    def rate(self) -> float:
        return self.instances * self.capacity.rate

    @property
    def cost(self) -> float:
        return self.gpus * (self.price if self.price is not None else 1.0)

    def label(self) -> str:
        return f"{self.instances} x {self.capacity.gpus} {self.gpu}"

    def to_dict(self, problem: Problem, routed: float) -> dict[str, Any]:
        """As JSON; ``routed``: the requests/s the router sends this pool."""
        c = self.capacity
        plan = c.plan
        at_rate = None
        if self.role == "agg" and plan is not None and c.problem is not None:
            # where each instance settles at its share of the rate
            at_rate = fit_rate(c.problem, plan, routed / self.instances).to_dict()
        return {
            "role": self.role,
            "gpu": self.gpu,
            "instances": self.instances,
            "gpus_per_instance": c.gpus,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "capacity_rps": self.rate,
            "instance_capacity_rps": c.rate,
            "instance_cpsat_optimum_rps": c.bound,
            "routed_rps": routed,
            "at_rate": at_rate,
            "price_per_gpu_hour": self.price,
            "degrees": plan.degrees.short() if plan else None,
            "requests_per_rank": plan.requests_per_rank if plan else None,
            "ttft_ms": c.metrics.ttft_ms if c.metrics else None,
            "tpot_ms": c.metrics.tpot_ms if c.metrics else None,
            "plan": plan.to_dict(problem.model, cluster=f"{self.gpu}x{c.gpus}") if plan else None,
        }


@dataclass(frozen=True, kw_only=True)
class Deployment:
    mode: Mode
    pools: tuple[Pool, ...]

    @property
    def cost(self) -> float:
        return sum(p.cost for p in self.pools)

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def nodes(self) -> int:
        return sum(p.nodes for p in self.pools)

    @property
    def capacity(self) -> float:
        if self.mode == "agg":
            return sum(p.rate for p in self.pools)
        return min(p.rate for p in self.pools)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.gpu for p in self.pools))

    def key(self) -> tuple[float, int, float]:
        return (self.cost, self.gpus, -self.capacity)

    def label(self) -> str:
        if self.mode == "agg":
            return " + ".join(p.label() for p in self.pools)
        pre, dec = self.pools
        return f"prefill {pre.label()}; decode {dec.label()}"

    def routed(self, rate: float, pool: Pool) -> float:
        """Requests/s the router sends ``pool`` at ``rate``: aggregated, a share in
        proportion to capacity; disaggregated, every request passes both pools."""
        return rate * pool.rate / self.capacity if self.mode == "agg" else rate

    def to_dict(self, problem: Problem, priced: bool, rate: float) -> dict[str, Any]:
        return {
            "serving": self.mode,
            "label": self.label(),
            "cost_per_hour" if priced else "cost_gpus": self.cost,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "capacity_rps": self.capacity,
            "utilization": rate / self.capacity,
            "pools": [p.to_dict(problem, self.routed(rate, p)) for p in self.pools],
        }


def better(a: Deployment | None, b: Deployment | None) -> Deployment | None:
    """The cheaper (then fewer GPUs, then more capacity) of two deployments."""
    if a is None or b is None:
        return a or b
    if not math.isclose(a.cost, b.cost, rel_tol=_SAME):
        return a if a.cost < b.cost else b
    return a if a.key() <= b.key() else b


@dataclass(frozen=True, kw_only=True)
class Sizing:
    """The answer at one rate: the cheapest deployment over every listed type, and
    each type's own."""

    rate: float
    best: Deployment | None
    by_gpu: dict[str, Deployment | None]
    proof: tuple[str, ...]
    carried: bool = False  # unserved because a lower rate was (not solved)
    # capacities the proof asked for and the time limit left unproven: when any, the
    # answer is the cheapest found, not proven least-cost
    unproven: tuple[Capacity, ...] = ()
    # SLOs at a percentile: the whole deployment's simulated percentiles at the rate
    simulated: dict[str, float] | None = None

    @property
    def partial(self) -> bool:
        return bool(self.unproven)

    def left(self) -> str:
        """The unproven capacities by GPU type and role, e.g. ``a100 agg instances of 4
        (stopped), 8, 16 GPUs``: "stopped" a solve the limit ended, the others never
        started."""
        sizes: dict[tuple[str, str], dict[int, bool]] = {}
        for c in self.unproven:
            stopped = sizes.setdefault((c.gpu, c.role), {})
            stopped[c.gpus] = stopped.get(c.gpus, False) or c.status != "unsolved"
        return "; ".join(
            f"{gpu} {role} instances of "
            + ", ".join(f"{n}{' (stopped)' if stopped[n] else ''}" for n in sorted(stopped))
            + " GPUs"
            for (gpu, role), stopped in sizes.items()
        )


@dataclass(frozen=True, kw_only=True)
class SizingProgress:
    """Where a sizing is: reported after each capacity solve and at each rate."""

    rate: float  # the rate being sized
    rate_index: int  # 0-based, of ``rates``
    rates: int
    solves: int  # capacities solved so far, every rate
    last: Capacity | None  # the capacity just solved (None: a rate starts)


@dataclass
class Sizer:
    """Sizes one problem (model, engine, space, SLOs, lengths) over GPU types; the
    instance capacities are solved once and shared by every rate."""

    problem: Problem
    accelerators: dict[str, Accelerator]
    prices: dict[str, float] | None = None
    serving: str = "best"
    max_gpus: int = DEFAULT_MAX_GPUS
    seed: int = 0
    # wall seconds for the whole sizing from ``started`` (time.perf_counter(); None:
    # construction), all in; None: every capacity to its proof
    time_limit: float | None = None
    started: float | None = None
    progress: Callable[[SizingProgress], None] | None = None
    # SLOs at a percentile: the traffic instances are simulated under, rescaled to each
    # rate (None: Poisson arrivals of the workload's lengths; shardlab.sizing.tail)
    traffic: Traffic | None = None
    caps: Capacities = field(init=False)
    _at: tuple[float, int, int] = field(init=False, default=(0.0, 0, 1))

    def __post_init__(self) -> None:
        if self.serving not in SERVINGS:
            raise ShardlabError(
                f"serving {self.serving!r}: use one of {', '.join(SERVINGS)}",
                field="serving",
            )
        deadline = None
        if self.time_limit is not None:
            if not 0 < self.time_limit < math.inf:  # NaN too
                raise ShardlabError(
                    f"time limit {self.time_limit!r} s: give a positive number of seconds",
                    field="time_limit",
                )
            start = time.perf_counter() if self.started is None else self.started
            deadline = start + self.time_limit - min(_RESERVE_S, self.time_limit / 4)
        check_tail(self.problem, self.traffic)
        self.caps = Capacities(
            self.problem, self.accelerators, seed=self.seed, deadline=deadline, traffic=self.traffic
        )
        self.caps.on_solved = self._report

    @property
    def priced(self) -> bool:
        return self.prices is not None

    def _report(self, last: Capacity | None) -> None:
        if self.progress is not None:
            rate, i, n = self._at
            self.progress(
                SizingProgress(rate=rate, rate_index=i, rates=n, solves=self.caps.solves, last=last)
            )

    # -- kinds -----------------------------------------------------------------------

    def _price(self, gpu: str) -> float:
        return self.prices[gpu] if self.prices is not None else 1.0

    def shapes(self, gpu: str) -> tuple[int, ...]:
        acc = self.accelerators[gpu]
        least = least_gpus(self.problem, acc)
        return tuple(g for g in instance_sizes(acc, self.max_gpus) if g >= least)

    def _kinds(self, gpus: Iterable[str]) -> list[tuple[float, str, int]]:
        """(one instance's cost, GPU type, GPUs) in order of cost."""
        return sorted((n * self._price(g), g, n) for g in gpus for n in self.shapes(g))

    def _pool(self, role: str, c: Capacity, instances: int) -> Pool:
        return Pool(
            role=role,
            capacity=c,
            instances=instances,
            price=self.prices[c.gpu] if self.prices is not None else None,
            gpus_per_node=self.accelerators[c.gpu].gpus_per_node,
        )

    # -- aggregated ------------------------------------------------------------------

    def agg(self, rate: float, gpus: Sequence[str], bound: float = math.inf) -> Deployment | None:
        """The cheapest aggregated mix of ``gpus``' instances serving ``rate`` that
        costs less than ``bound`` (None: none)."""
        solved: list[Capacity] = []
        best: Deployment | None = None
        for unit, gpu, n in self._kinds(gpus):
            if unit >= bound * (1 - _SAME):
                break  # it and every kind after it cost the bound alone
            c = self.caps.served(self.caps.agg(gpu, n))
            if c.rate <= 0:
                continue
            solved.append(c)
            kinds = [Kind(cost=k.gpus * self._price(k.gpu), gpus=k.gpus, capacity=k.rate)
                     for k in solved]  # fmt: skip
            found = cover(kinds, rate, self.max_gpus)
            if found is None or found.cost >= bound * (1 - _SAME):
                continue
            pools = tuple(
                self._pool("agg", k, count)
                for k, count in zip(solved, found.counts, strict=True)
                if count
            )
            best = better(Deployment(mode="agg", pools=pools), best)
            bound = best.cost
        return best

    # -- disaggregated -----------------------------------------------------------------

    def disagg(
        self,
        rate: float,
        prefill_gpus: Sequence[str],
        decode_gpus: Sequence[str],
        bound: float = math.inf,
    ) -> Deployment | None:
        """The cheapest prefill pool of ``prefill_gpus`` and decode pool of
        ``decode_gpus`` serving ``rate`` that costs less than ``bound``."""
        pre_kinds = self._kinds(prefill_gpus)
        dec_kinds = self._kinds(decode_gpus)
        if not pre_kinds or not dec_kinds:
            return None
        least_pre = pre_kinds[0][0]
        best: Deployment | None = None
        for d_unit, dgpu, dn in dec_kinds:
            if d_unit + least_pre >= bound * (1 - _SAME):
                break
            dec = self.caps.decode(dgpu, dn)
            if dec.bound <= 0:
                continue
            # bounds from the CP-SAT optima (>= any servable capacity of any layout)
            y_least = math.ceil(rate / dec.bound * (1 - 1e-9))
            d_least = y_least * d_unit
            for p_unit, pgpu, pn in pre_kinds:
                if d_least + p_unit >= bound * (1 - _SAME):
                    break
                free = self.caps.prefill(pgpu, pn, None)
                if free.bound <= 0:
                    continue
                x_least = math.ceil(rate / free.bound * (1 - 1e-9))
                if (
                    d_least + x_least * p_unit >= bound * (1 - _SAME)
                    or x_least * pn + y_least * dn > self.max_gpus
                ):
                    continue
                for layout in self._layouts(dgpu, dn, dec):
                    found = self._pair(rate, (pgpu, pn), (dgpu, dn), layout, dec)
                    if found is not None and found.cost < bound * (1 - _SAME):
                        best = better(found, best)
                        bound = best.cost
                    if d_least + x_least * p_unit >= bound * (1 - _SAME):
                        break  # the pair's bound holds for every layout
        return best

    def _layouts(self, gpu: str, gpus: int, best: Capacity) -> list[tuple[int, int]]:
        """The decode instance's (pp, tp) layouts, its optimum's first."""
        first = best.layout
        assert first is not None
        return [first, *(lay for lay in self.caps.decode_layouts(gpu, gpus) if lay != first)]

    def _pair(
        self,
        rate: float,
        pre: tuple[str, int],
        dec: tuple[str, int],
        layout: tuple[int, int],
        dec_free: Capacity,
    ) -> Deployment | None:
        dcap = dec_free if layout == dec_free.layout else self.caps.decode(*dec, layout)
        dcap = self.caps.served(dcap)
        if dcap.rate <= 0:
            return None
        pcap = self.caps.served(self.caps.prefill(*pre, (dec[0], layout)))
        if pcap.rate <= 0:
            return None
        x = math.ceil(rate / pcap.rate * (1 - 1e-9))
        y = math.ceil(rate / dcap.rate * (1 - 1e-9))
        if x * pcap.gpus + y * dcap.gpus > self.max_gpus:
            return None
        return Deployment(
            mode="disagg", pools=(self._pool("prefill", pcap, x), self._pool("decode", dcap, y))
        )

    # -- one rate, a curve ---------------------------------------------------------------

    def _modes(self) -> tuple[Mode, ...]:
        return ("agg", "disagg") if self.serving == "best" else (self.serving,)  # type: ignore[return-value]

    def _best(self, rate: float, gpus: Sequence[str], bound: float = math.inf) -> Deployment | None:
        best: Deployment | None = None
        for mode in self._modes():
            limit = min(bound, best.cost if best is not None else math.inf)
            found = (
                self.agg(rate, gpus, limit)
                if mode == "agg"
                else self.disagg(rate, gpus, gpus, limit)
            )
            best = better(found, best)
        return best

    def size(self, rate: float, unserved: Mapping[str, bool] | None = None) -> Sizing:
        """The answer at ``rate`` (``unserved``: types a lower rate found no
        deployment of, skipped: infeasibility carries upward)."""
        check_finite(rate, what="rate (requests/s)", positive=True)
        self._at = (rate, *self._at[1:])  # what the progress reports (curve: which of them)
        gpus = list(self.accelerators)
        ceiling = self.rate_ceiling()
        if rate > ceiling:
            return Sizing(
                rate=rate,
                best=None,
                by_gpu=dict.fromkeys(gpus),
                proof=(f"above {ceiling:.4g}/s: more than the GPUs compute",),
            )
        solves, seconds = self.caps.solves, self.caps.seconds
        start = time.perf_counter()
        self.caps.unproven.clear()
        by_gpu: dict[str, Deployment | None] = {}
        for g in gpus:
            by_gpu[g] = None if unserved and unserved.get(g) else self._best(rate, [g])
        best: Deployment | None = None
        for d in by_gpu.values():
            best = better(d, best)
        if len(gpus) > 1:  # mixes: only what beats every one-type answer is searched
            best = better(self._best(rate, gpus, best.cost if best else math.inf), best)
        proof = (
            f"{self.caps.solves - solves} instance capacities solved by CP-SAT for this rate "
            f"({self.caps.seconds - seconds:.1f} s; {self.caps.solves} in all), "
            f"{time.perf_counter() - start:.1f} s",
        )
        unproven = tuple(self.caps.unproven.values())
        simulated = None
        if best is not None and self.caps.slos:
            pools = [(p.role, p.capacity.problem, p.capacity.plan, p.instances, p.capacity.rate)
                     for p in best.pools]  # fmt: skip
            at = (self.traffic, self.problem, rate, self.seed)
            simulated = simulate_deployment(pools, self.caps.slos, *at)  # type: ignore[arg-type]
        return Sizing(
            rate=rate, best=best, by_gpu=by_gpu, proof=proof, unproven=unproven,
            simulated=simulated,
        )  # fmt: skip

    def curve(self, rates: Sequence[float]) -> list[Sizing]:
        """Each rate's answer, lowest first; a type (or the mix) that serves no rate
        is not solved again at a higher one."""
        out: list[Sizing] = []
        unserved: dict[str, bool] = {}
        mix_unserved = False
        for i, rate in enumerate(sorted(rates)):
            self._at = (rate, i, len(rates))
            self._report(None)
            if mix_unserved:
                out.append(
                    Sizing(
                        rate=rate,
                        best=None,
                        by_gpu=dict.fromkeys(self.accelerators),
                        proof=("a lower rate is unserved: so is this one",),
                        carried=True,
                    )
                )
                continue
            s = self.size(rate, unserved)
            left = {c.gpu for c in s.unproven}  # a type searched in part proves no "none"
            for g, d in s.by_gpu.items():
                unserved[g] = unserved.get(g, False) or (d is None and g not in left)
            mix_unserved = s.best is None and not s.partial
            out.append(s)
        return out

    # -- refusals ------------------------------------------------------------------------

    def rate_ceiling(self) -> float:
        """Requests/s that no deployment of ``max_gpus`` GPUs exceeds by compute alone:
        each request multiplies every active weight once per token it processes
        (``input + output - 1``), 2 FLOPs each, and no GPU runs faster than its
        highest dense peak (the measured kernels stay below it). Rates above it are
        refused without solving anything."""
        w = self.problem.workload
        flops = 2.0 * self.problem.model.num_params().active_compute
        flops *= w.input_len + w.output_len - 1
        peak = max(
            max(a.bf16_tflops, a.fp8_tflops, a.fp4_tflops) for a in self.accelerators.values()
        )
        return self.max_gpus * peak * 1e12 / flops

    def why_unserved(self, rate: float) -> ShardlabError:
        """Why no deployment serves ``rate``: past what ``max_gpus`` GPUs compute, an
        SLO no instance meets, or a rate past what they serve."""
        if rate > (ceiling := self.rate_ceiling()):
            return ShardlabError(
                f"rate {rate:g} requests/s: {self.max_gpus} GPUs of "
                f"{', '.join(self.accelerators)} compute at most {ceiling:.4g} "
                f"requests/s of {self.problem.model.name} at their peak",
                field="rate",
                fix="give a lower rate or allow more GPUs (max_gpus)",
            )
        kinds = [
            c for g in self.accelerators for n in self.shapes(g) for c in self._role_caps(g, n)
        ]
        w = self.problem.workload
        slos = ", ".join(
            f"{name} <= {value:g} ms"
            for name, value in (("TTFT", w.ttft_ms), ("TPOT", w.tpot_ms))
            if value is not None
        )
        types = ", ".join(self.accelerators)

        def serves(role: str) -> bool:
            return any(c.rate > 0 for c in kinds if c.role == role)

        if not (serves("agg") or (serves("prefill") and serves("decode"))):
            return ShardlabError(
                f"no instance of {types} up to {self.max_gpus} GPUs meets the SLOs "
                f"({slos or 'none'}) for {self.problem.model.name} at "
                f"{w.input_len}/{w.output_len}",
                field="slo",
                fix="relax the TTFT/TPOT SLOs, or allow faster GPUs or more of them (max_gpus)",
            )
        agg = [(self.max_gpus // c.gpus) * c.rate for c in kinds if c.role == "agg"]
        most = (
            f" (aggregated instances of one kind serve at most {max(agg):.3g}/s there)"
            if agg and max(agg) > 0
            else ""
        )
        return ShardlabError(
            f"rate {rate:g} requests/s: no deployment of {types} up to {self.max_gpus} GPUs "
            f"serves it under the SLOs{most}",
            field="rate",
            fix="give a lower rate or allow more GPUs (max_gpus)",
        )

    def _role_caps(self, gpu: str, n: int) -> list[Capacity]:
        roles = []
        if self.serving in ("agg", "best"):
            roles.append(self.caps.agg(gpu, n))
        if self.serving in ("disagg", "best"):
            roles += [self.caps.decode(gpu, n), self.caps.prefill(gpu, n, None)]
        return roles


def sizing_cluster(accelerators: Mapping[str, Accelerator], max_gpus: int) -> Cluster:
    """A sizing problem's cluster before it is sized: ``max_gpus`` of the listed GPU
    with the most memory (the model must fit there for any deployment to)."""
    acc = max(accelerators.values(), key=lambda a: a.hbm_gb)
    node = acc.gpus_per_node
    n = max_gpus - max_gpus % node if max_gpus > node else max_gpus
    return Cluster(accelerator=acc, num_gpus=n, gpus_per_node=node)
