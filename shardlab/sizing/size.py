"""``shardlab size``: the cheapest deployment that serves a rate under the SLOs.

**The space.** A deployment is, aggregated, any multiset of instances (each one copy
of the model on a power-of-two number of GPUs of one listed type: 1, 2, 4 ... within
a node, then 2, 4 ... whole nodes) behind one router that splits the rate over them in
proportion to their capacities (Mélange's mix of GPU types); disaggregated, a prefill
pool of identical instances and a decode pool of identical instances, each pool of any
listed type of one vendor, the prefill instances handing each prompt's KV cache to the decode
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
   refused before any solve.
5. *Instance ceilings.* No instance serves more than its largest CP-SAT subproblem
   bound (:meth:`~shardlab.sizing.capacity.Capacities.ceiling`, no solve). A rate that
   no deployment reaches even at those ceilings is refused before any solve
   (:mod:`shardlab.sizing.reach`), for each GPU type and serving mode as for all of
   them. When the ceilings do reach it, they prune what is solved: aggregated, the
   kinds left are not solved once the cheapest cover of the solved kinds' capacities
   and the others' ceilings cannot beat the best found; disaggregated, a pair of kinds
   is not solved when the instances its ceilings need already cost as much as the
   best found or exceed ``max_gpus``. Each pruning only skips solves that could not
   have changed the answer, so the answer is the one solving them would give.

**A time limit** (``time_limit``, wall seconds from ``started``) ends the proof early:
each solve gets what is left, none starts after it, and an answer that needed a
capacity not proven (a solve stopped, or never started) is *partial*: the cheapest
deployment found so far (its instances do serve the rate: a stopped solve's capacity is
what its plan serves), not proven least-cost, naming the capacities left unproven.
Unproven capacities prove no infeasibility either: nothing is carried upward from them.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from shardlab.errors import ShardlabError
from shardlab.problems.cluster import Accelerator, Cluster
from shardlab.problems.disagg import SERVINGS
from shardlab.problems.limits import check_finite
from shardlab.problems.problem import Problem
from shardlab.problems.traffic import Traffic
from shardlab.sizing.capacity import Capacities, Capacity, Key, instance_sizes, least_gpus
from shardlab.sizing.cover import Kind, cover
from shardlab.sizing.deployment import SAME as _SAME
from shardlab.sizing.deployment import Deployment, Mode, Pool, better
from shardlab.sizing.parallel import Parallel
from shardlab.sizing.reach import Reach, reach, why_unserved
from shardlab.sizing.tail import check_tail, simulate_deployment

DEFAULT_MAX_GPUS = 256
# Seconds of a time limit kept for what follows the last solve: a stopped CP-SAT solve
# ends within a second of its limit, then the answer is priced and printed and the
# process exits (measured: about 1.5 s in all with the interpreter's start before the
# command's clock starts, on a loaded machine).
_RESERVE_S = 3.0


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
    # prune and refuse by the instances' CP-SAT bounds before solving them (False: by
    # solves alone, the reference the tests hold the pruning to)
    bounds: bool = True
    # capacity searches at once, on ``executor`` (local processes or Ray at
    # ``address``): each GPU type's own search, and waves of instance bounds
    # (:mod:`shardlab.sizing.parallel`); the answer is one job's
    jobs: int = 1
    executor: str = "local"
    address: str | None = None
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
        parallel = Parallel(executor=self.executor, jobs=self.jobs, address=self.address)
        self.caps.parallel = parallel if parallel.side_by_side else None

    def ahead(self, keys: Iterable[Key]) -> None:
        """Start the next wave: the first ``jobs`` of ``keys`` not known yet, side by
        side (nothing without an executor)."""
        if self.caps.parallel is not None:
            todo = (k for k in keys if not self.caps.known(k))
            self.caps.prefetch(itertools.islice(todo, self.jobs))

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
        kinds = self._kinds(gpus)
        for j, (unit, gpu, n) in enumerate(kinds):
            if unit >= bound * (1 - _SAME):
                break  # it and every kind after it cost the bound alone
            if math.isfinite(bound) and not self._may_beat(rate, solved, kinds[j:], bound):
                break
            c = self.caps.served(self.caps.agg(gpu, n))
            if c.rate <= 0:
                continue
            solved.append(c)
            have = [Kind(cost=k.gpus * self._price(k.gpu), gpus=k.gpus, capacity=k.rate)
                    for k in solved]  # fmt: skip
            found = cover(have, rate, self.max_gpus)
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

    def _may_beat(
        self, rate: float, solved: list[Capacity], rest: list[tuple[float, str, int]], bound: float
    ) -> bool:
        """Whether a mix of the ``solved`` instances and the ``rest`` at their ceilings
        could serve ``rate`` for less than ``bound`` (False: solving the rest cannot
        improve on it: their capacities are at most their ceilings)."""
        if not self.bounds:
            return True
        kinds = [Kind(cost=c.gpus * self._price(c.gpu), gpus=c.gpus, capacity=c.rate)
                 for c in solved if c.rate > 0]  # fmt: skip
        open_ = [(u, g, n) for u, g, n in rest if u < bound * (1 - _SAME)]
        for i, (unit, gpu, n) in enumerate(open_):
            self.ahead(("ceiling", "agg", g, m) for _, g, m in open_[i:])
            ceiling = self.caps.ceiling("agg", gpu, n)
            if math.isinf(ceiling):
                return True  # not bounded in time: nothing to prune with
            if ceiling > 0:
                kinds.append(Kind(cost=unit, gpus=n, capacity=ceiling))
                found = cover(kinds, rate, self.max_gpus)
                if found is not None and found.cost < bound * (1 - _SAME):
                    return True  # more kinds would only make it cheaper: stop bounding
        return False

    def _open(
        self,
        role: str,
        kind: tuple[float, str, int],
        rate: float,
        bound: float,
        other: tuple[float, int],
    ) -> bool:
        """Whether a pool of ``kind`` (one instance's cost, GPU type, GPUs) may serve
        ``rate`` beside a pool costing at least ``other`` (cost, GPUs) for less than
        ``bound`` within ``max_gpus``, by its ceiling: no solve (without bounds: one
        instance each)."""
        unit, gpu, gpus = kind

        def fits(need: int) -> bool:
            return (
                other[0] + need * unit < bound * (1 - _SAME)
                and other[1] + need * gpus <= self.max_gpus
            )

        if not fits(1) or not self.bounds:  # one instance already too many, or no bounds
            return fits(1)
        ceiling = self.caps.ceiling(role, gpu, gpus)  # type: ignore[arg-type]
        if ceiling <= 0:
            return False
        return math.isinf(ceiling) or fits(math.ceil(rate / ceiling * (1 - 1e-9)))

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
        least_pre_gpus = min(n for _, _, n in pre_kinds)
        best: Deployment | None = None
        for d_unit, dgpu, dn in dec_kinds:
            if d_unit + least_pre >= bound * (1 - _SAME):
                break
            least = (least_pre, least_pre_gpus)  # the prefill pool's, at the least
            if not self._open("decode", (d_unit, dgpu, dn), rate, bound, least):
                continue
            dec = self.caps.decode(dgpu, dn)
            if dec.bound <= 0:
                continue
            # bounds from the CP-SAT optima (>= any servable capacity of any layout)
            y_least = math.ceil(rate / dec.bound * (1 - 1e-9))
            d_least = y_least * d_unit
            for p_unit, pgpu, pn in pre_kinds:
                if d_least + p_unit >= bound * (1 - _SAME):
                    break
                if self.accelerators[pgpu].vendor != self.accelerators[dgpu].vendor:
                    # no engine's P/D connector (NIXL, Mooncake) documents a CUDA
                    # build handing its KV cache to a ROCm build, or back
                    continue
                least = (d_least, y_least * dn)  # the decode pool's, at the least
                if not self._open("prefill", (p_unit, pgpu, pn), rate, bound, least):
                    continue
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

    def modes(self) -> tuple[Mode, ...]:
        return ("agg", "disagg") if self.serving == "best" else (self.serving,)  # type: ignore[return-value]

    def _alone(self, rate: float, gpus: list[str]) -> dict[str, Deployment | None]:
        """Each GPU type's own cheapest deployment: independent searches, side by side
        on the executor when there is one (:meth:`.parallel.Parallel.search`)."""
        if self.caps.parallel is not None and len(gpus) > 1:
            return self.caps.parallel.search(self, rate, gpus)
        return {g: self._best(rate, [g]) for g in gpus}

    def _best(self, rate: float, gpus: Sequence[str], bound: float = math.inf) -> Deployment | None:
        best: Deployment | None = None
        for mode in self.modes():
            if not self.reach(gpus, (mode,), rate).serves(rate):
                continue  # the bounds prove no deployment of the mode serves it
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
        try:
            return self._size(rate, unserved)
        finally:
            if self.caps.parallel is not None:
                self.caps.parallel.close()

    def _size(self, rate: float, unserved: Mapping[str, bool] | None) -> Sizing:
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
        bounded = self.reach(gpus, self.modes(), rate)
        if not bounded.serves(rate):
            return Sizing(
                rate=rate,
                best=None,
                by_gpu=dict.fromkeys(gpus),
                proof=(
                    f"at most {bounded.most:.4g}/s by CP-SAT's bounds on each of "
                    f"{bounded.shapes} instance shapes: no solve "
                    f"({time.perf_counter() - start:.1f} s)",
                ),
            )
        by_gpu: dict[str, Deployment | None] = dict.fromkeys(gpus)
        by_gpu |= self._alone(rate, [g for g in gpus if not (unserved and unserved.get(g))])
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
        """Why no deployment serves ``rate`` (:func:`shardlab.sizing.reach.why_unserved`)."""
        return why_unserved(self, rate)

    def reach(self, gpus: Sequence[str], modes: Sequence[str], enough: float) -> Reach:
        """What deployments of ``gpus`` in ``modes`` could serve by the instances'
        bounds, up to ``enough`` (without bounds: unlimited)."""
        if not self.bounds:
            return Reach(agg=math.inf, disagg=math.inf, per_gpu=math.inf)
        return reach(self, gpus, modes, enough)


def sizing_cluster(accelerators: Mapping[str, Accelerator], max_gpus: int) -> Cluster:
    """A sizing problem's cluster before it is sized: ``max_gpus`` of the listed GPU
    with the most memory (the model must fit there for any deployment to)."""
    acc = max(accelerators.values(), key=lambda a: a.hbm_gb)
    node = acc.gpus_per_node
    n = max_gpus - max_gpus % node if max_gpus > node else max_gpus
    return Cluster(accelerator=acc, num_gpus=n, gpus_per_node=node)
