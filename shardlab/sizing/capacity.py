"""The proven capacity of one instance: requests/s it serves under the SLOs.

An *instance* is one copy of the model on ``gpus`` GPUs of one type (``replicas = 1``;
a deployment of several is several instances behind a router). Its capacity is a
CP-SAT optimum over every plan and concurrency of that instance (a proof, or a proof
that no plan meets the SLOs there):

- aggregated: the most requests/s by Little's law (:mod:`shardlab.costmodel.rate`),
  the workload's objective ``request_rate``;
- a prefill instance of disaggregated serving: prompts/s under the TTFT SLO, its TTFT
  including the handoff of each prompt's cache to the decode pool's layout and GPU;
- a decode instance: requests/s under the TPOT SLO (``output_len - 1`` tokens each,
  :func:`shardlab.costmodel.disagg.instance_rate`).

Shapes are powers of two within a node, then powers of two of whole nodes. Solves are
kept by instance: a curve over rates re-uses every one.

Before any solve, an instance's capacity is bounded by the largest CP-SAT subproblem
bound of its problem (:meth:`Capacities.ceiling`): every plan of the instance lies in
one (degrees, requests per rank) subproblem and serves at most its bound, so the
optimum does, and the servable capacity is at most the optimum. A decode instance
pinned to a layout is a subset of the unpinned one, and a prefill handing off its
caches is slower than one without: the unpinned, handoff-free ceilings bound them all.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from shardlab.costmodel import (
    BatchMetrics,
    Metrics,
    forget_tables,
    instance_rate,
    little_rate,
    prefix_capacity,
)
from shardlab.errors import ShardlabError
from shardlab.problems.cluster import Accelerator, Cluster
from shardlab.problems.disagg import decode_problem, prefill_problem
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.problems.traffic import Traffic
from shardlab.sizing.tail import Probe, percentile_capacity, role_slos
from shardlab.solvers.base import Budget
from shardlab.solvers.certify import tail_slos
from shardlab.solvers.cpsat.bounds import ROUNDING, largest_bound

if TYPE_CHECKING:
    from shardlab.sizing.parallel import Parallel

Role = Literal["agg", "prefill", "decode"]
# what :meth:`Capacities.compute` computes: a capacity's key, or ("ceiling", role, ...)
Key = tuple[Any, ...]


class _OutOfTime(Exception):
    """The time limit ran out while an instance was being bounded."""


# Seconds under which a solve is not started before the deadline (it could prove nothing).
_LEAST_S = 0.05


@dataclass(frozen=True, kw_only=True)
class Capacity:
    """One instance's proven capacity (``rate`` 0: no plan meets the SLOs there)."""

    gpu: str  # accelerator key
    gpus: int  # per instance
    role: Role
    rate: float  # requests/s servable: every load up to it meets the SLOs
    bound: float  # requests/s of the CP-SAT optimum at its concurrency (>= rate)
    status: str  # optimal, infeasible, skipped (no problem: weights, layout), or the solve's
    # (feasible, unknown: stopped by the time limit; "unsolved": no time left to start)
    plan: Plan | None
    metrics: Metrics | None
    problem: Problem | None  # the instance's problem (None: skipped)
    why: str = ""
    seconds: float = 0.0
    # SLOs at a percentile: the mean-model capacity (``rate`` is the same until the
    # simulated capacity is searched, Capacities.served, with the rates probed)
    mean_rate: float | None = None
    probes: tuple[Probe, ...] = ()

    @property
    def proven(self) -> bool:
        return self.status in ("optimal", "infeasible", "skipped")

    @property
    def layout(self) -> tuple[int, int] | None:
        """(pp, tp) of the plan: what a prefill pool hands its caches off to."""
        return None if self.plan is None else (self.plan.degrees.pp, self.plan.degrees.tp)

    def label(self) -> str:
        return f"{self.gpus} x {self.gpu}"


def instance_sizes(acc: Accelerator, max_gpus: int) -> tuple[int, ...]:
    """GPUs an instance of ``acc`` may have, up to ``max_gpus``: powers of two dividing
    a host, powers of two of whole hosts inside an NVLink domain, then the domain and
    powers of two of whole domains (the sizes engines' parallel degrees, powers of two,
    fill; a rack's domain, 72 GPUs, is one instance of its own)."""
    host, domain = acc.gpus_per_node, acc.gpus_per_domain
    sizes = {1 << k for k in range(host.bit_length()) if host % (1 << k) == 0}
    g = host
    while g < domain:
        sizes.add(g)
        g *= 2
    g = domain
    while g <= max_gpus:
        sizes.add(g)
        g *= 2
    return tuple(sorted(s for s in sizes if s <= max_gpus))


def least_gpus(problem: Problem, acc: Accelerator) -> int:
    """GPUs of ``acc`` the weights need at the least (HBM alone, nothing else)."""
    return max(1, math.ceil(problem.weight_bytes() / 1e9 / acc.hbm_gb))


def on(problem: Problem, acc: Accelerator, gpus: int) -> Problem:
    """``problem`` on one instance of ``gpus`` GPUs of ``acc`` (``replicas = 1``)."""
    cluster = Cluster(accelerator=acc, num_gpus=gpus, gpus_per_node=acc.gpus_per_node)
    return dataclasses.replace(problem, cluster=cluster, pin=(("replicas", 1),))


class Capacities:
    """Instance capacities of one sizing problem, each solved once.

    ``problem`` carries the model, engine, space and SLOs; its workload is the rate's
    (objective ``request_rate``); its cluster is replaced per instance.
    """

    def __init__(
        self,
        problem: Problem,
        accelerators: dict[str, Accelerator],
        seed: int = 0,
        deadline: float | None = None,
        traffic: Traffic | None = None,
    ):
        self.problem = problem
        # SLOs at a percentile: each instance's capacity is simulated (served) under
        # ``traffic`` (None: Poisson arrivals of the workload's lengths) at each rate
        self.slos = tail_slos(problem)
        self.traffic = traffic
        # the last instance the traffic's longest request did not fit (its message)
        self.too_long = ""
        self.accelerators = accelerators
        self.seed = seed
        # time.perf_counter() past which no solve starts and a running one stops (None:
        # every solve to its proof)
        self.deadline = deadline
        self.solves = 0
        self.seconds = 0.0
        # called with each capacity as it is solved (the CLI's progress display)
        self.on_solved: Callable[[Capacity], None] | None = None
        self._kept: dict[tuple, Capacity] = {}
        self._ceilings: dict[tuple[Role, str, int], float] = {}
        # where :meth:`prefetch` computes side by side (None: one at a time, here)
        self.parallel: Parallel | None = None
        # capacities asked for since the last clear that are not proven (the time limit
        # stopped or prevented their solve): what a partial answer names
        self.unproven: dict[tuple, Capacity] = {}
        w = problem.workload.on_the_mean()  # the analytic model's: every SLO on the mean
        # an instance's capacity: the most requests/s, no rate to fit
        self._agg_base = dataclasses.replace(
            problem, workload=dataclasses.replace(w, rate=None, objective="request_rate")
        )
        # the pools' problems derive from a throughput workload (one pool serves part of
        # each request: a rate of whole requests is not its objective)
        self._pool_base = dataclasses.replace(
            problem, workload=dataclasses.replace(w, rate=None, objective="throughput")
        )

    def agg(self, gpu: str, gpus: int) -> Capacity:
        return self._get(("agg", gpu, gpus))

    def decode(self, gpu: str, gpus: int, layout: tuple[int, int] | None = None) -> Capacity:
        return self._get(("decode", gpu, gpus, layout))

    def prefill(
        self, gpu: str, gpus: int, decode: tuple[str, tuple[int, int]] | None = None
    ) -> Capacity:
        """A prefill instance handing off to decode ranks ``(decode GPU, (pp, tp))``;
        None: no handoff (an upper bound on any)."""
        return self._get(("prefill", gpu, gpus, decode))

    # -- what is known, and computing it ---------------------------------------------------

    def known(self, key: Key) -> bool:
        return (key[1:] in self._ceilings) if key[0] == "ceiling" else key in self._kept

    def items(self) -> Iterator[tuple[Key, Capacity | float]]:
        """Every key known, with its value (ceilings' keys as ``("ceiling", ...)``)."""
        yield from self._kept.items()
        for key, ceiling in self._ceilings.items():
            yield ("ceiling", *key), ceiling

    def compute(self, key: Key) -> Capacity | float:
        """The value of ``key``, computed here and not kept: a capacity
        (``("agg", gpu, gpus)``, ``("decode", gpu, gpus, layout)``, ``("prefill", gpu,
        gpus, decode)``) or a ceiling (``("ceiling", role, gpu, gpus)``)."""
        what, *rest = key
        if what == "ceiling":
            return self._ceiling(*rest)
        acc = self.accelerators[rest[0]]
        if what == "agg":
            return self._solve("agg", acc, rest[1], lambda: self._build("agg", acc, rest[1]))
        if what == "decode":
            layout = rest[2]
            return self._solve(
                "decode", acc, rest[1], lambda: self._build("decode", acc, rest[1], layout)
            )
        decode = rest[2]
        return self._solve(
            "prefill", acc, rest[1], lambda: self._build("prefill", acc, rest[1], decode=decode)
        )

    def keep(self, key: Key, value: Capacity | float) -> None:
        """Keep what :meth:`compute` found for ``key`` (here or in a worker)."""
        if isinstance(value, Capacity):
            self._kept[key] = value
            if value.status not in ("skipped", "unsolved"):
                self.solves += 1
                self.seconds += value.seconds
                if self.on_solved is not None:
                    self.on_solved(value)
        else:
            self._ceilings[key[1:]] = value  # type: ignore[index]

    def prefetch(self, keys: Iterable[Key]) -> None:
        """Compute the ``keys`` not known yet side by side, on :attr:`parallel` (one
        key, or no executor: left to the search's own call)."""
        todo = [k for k in dict.fromkeys(keys) if not self.known(k)]
        if self.parallel is None or len(todo) < 2 or self.expired():
            return
        self.parallel.run(self, todo)

    def served(self, c: Capacity) -> Capacity:
        """``c`` under the percentile SLOs: its rate the simulated capacity
        (:func:`~shardlab.sizing.tail.percentile_capacity`), searched once, when a
        deployment first counts on it (bounds need only the mean model's); ``c`` as it
        is without percentile SLOs."""
        own = role_slos(self.slos, c.role)
        if c.mean_rate is None or c.probes or c.rate <= 0 or not own:
            return c
        assert c.plan is not None and c.problem is not None
        start = time.perf_counter()
        why = c.why
        try:
            rate, probes = percentile_capacity(
                c.problem,
                c.plan,
                c.rate,
                own,
                self.traffic,
                role=c.role,
                sized=self._agg_base,
                seed=self.seed,
            )
        except ShardlabError as exc:
            if exc.field != "traffic":
                raise
            # the traffic's longest request does not fit this instance: it serves none
            rate, probes, why = 0.0, (), exc.message
            self.too_long = exc.message
        found = dataclasses.replace(
            c,
            rate=rate,
            probes=probes,
            why=why,
            seconds=c.seconds + time.perf_counter() - start,
        )
        for key, kept in self._kept.items():
            if kept is c:
                self._kept[key] = found
                if key in self.unproven:
                    self.unproven[key] = found
        return found

    def expired(self) -> bool:
        """Whether the time limit has run out (no solve starts any more)."""
        return self.deadline is not None and time.perf_counter() >= self.deadline - _LEAST_S

    def gaps(self) -> list[Capacity]:
        """Instances whose servable capacity is below their CP-SAT optimum: an SLO
        fails at a load below the optimum's (the cost model's latencies dip there)."""
        return [
            c
            for c in self._kept.values()
            if (c.rate if c.mean_rate is None else c.mean_rate) < c.bound * (1 - 1e-6)
        ]

    def decode_layouts(self, gpu: str, gpus: int) -> tuple[tuple[int, int], ...]:
        """The (pp, tp) layouts a decode instance may take (what its prefill hands
        off to)."""
        acc = self.accelerators[gpu]
        space = decode_problem(on(self._pool_base, acc, gpus), gpus, 1).space
        return tuple(dict.fromkeys((d.pp, d.tp) for d in space.degree_tuples))

    # -- solves ---------------------------------------------------------------------------

    def ceiling(self, role: Role, gpu: str, gpus: int) -> float:
        """Requests/s no instance of ``gpus`` GPUs of ``gpu`` in ``role`` serves more
        than, in any decode layout or handoff, from bounds alone (no solve): the largest
        subproblem bound of its problem (0: no subproblem can hold a plan meeting the
        SLOs; inf: the time limit ran out before it was bounded)."""
        key = ("ceiling", role, gpu, gpus)
        if not self.known(key):
            self.keep(key, self.compute(key))
        return self._ceilings[key[1:]]  # type: ignore[index]

    def _ceiling(self, role: Role, gpu: str, gpus: int) -> float:
        acc = self.accelerators[gpu]
        if gpus < least_gpus(self.problem, acc):
            return 0.0
        if self.expired():
            return math.inf
        try:
            problem = self._build(role, acc, gpus)
            problem.space  # noqa: B018 -- no degrees (the model's shape)
        except ShardlabError:
            return 0.0

        def check() -> None:
            if self.expired():
                raise _OutOfTime

        # bounded in this process, not in forked ones (largest_bound's workers): a forked
        # bound builds the measured kernels' curves of its instance and takes them with it
        # when it exits, while a sizing's instances of one GPU type share them (every role
        # and shape). The degree tables of the instances bounded before are dropped (a few
        # MB each, thousands in a sizing), this one's kept for the solve that may follow:
        # DeepSeek-V3 over seven GPU types at 50 requests/s took 191 s forked (issue 52)
        forget_tables()
        try:
            top = largest_bound(problem, check)
        except _OutOfTime:
            return math.inf
        if not math.isfinite(top) or top <= 0:
            return 0.0
        # the plans CP-SAT prices may sit a table rounding above a bound (its cutoff)
        top *= 1 + ROUNDING
        return top if role == "agg" else float(instance_rate(self._pool_base, problem, top))

    # -- solves ---------------------------------------------------------------------------

    def _get(self, key: Key) -> Capacity:
        if not self.known(key):
            self.keep(key, self.compute(key))
        found = self._kept[key]
        if not found.proven:
            self.unproven[key] = found
        return found

    def _build(
        self,
        role: Role,
        acc: Accelerator,
        gpus: int,
        layout: tuple[int, int] | None = None,
        decode: tuple[str, tuple[int, int]] | None = None,
    ) -> Problem:
        """The problem of one instance: aggregated; a decode instance (``layout``: its
        pinned (pp, tp)); a prefill instance handing off to ``decode`` (None: no
        handoff, an upper bound on any)."""
        if role == "agg":
            return on(self._agg_base, acc, gpus)
        base = on(self._pool_base, acc, gpus)
        if role == "decode":
            return decode_problem(base, gpus, 1, layout=layout)
        if decode is None:  # no handoff: the pool problem's prefill alone
            pool = prefill_problem(base, gpus, 1, decode_pp=1, decode_tp=1, one_domain=False)
            return dataclasses.replace(pool, handoff=None)
        decode_gpu, (pp, tp) = decode
        other = self.accelerators[decode_gpu]
        return prefill_problem(
            base,
            gpus,
            1,
            decode_pp=pp,
            decode_tp=tp,
            one_domain=False,  # the pools own separate nodes
            decode_gpu=None if other == acc else other,
        )

    def _solve(self, role: Role, acc: Accelerator, gpus: int, build: object) -> Capacity:
        from shardlab.solvers.solve import solve

        def skipped(why: str) -> Capacity:
            return Capacity(
                gpu=acc.key,
                gpus=gpus,
                role=role,
                rate=0.0,
                bound=0.0,
                status="skipped",
                plan=None,
                metrics=None,
                problem=None,
                why=why,
            )

        if gpus < least_gpus(self.problem, acc):
            return skipped(f"the weights need {least_gpus(self.problem, acc)} or more")
        try:
            problem = build()  # type: ignore[operator]
            problem.space  # noqa: B018 -- no degrees (a pinned layout, the model's shape)
        except ShardlabError as exc:
            return skipped(exc.message)
        start = time.perf_counter()
        budget = Budget.exact()
        if self.deadline is not None:
            if self.expired():
                return dataclasses.replace(skipped("no time left"), status="unsolved")
            budget = Budget(max_evals=None, seconds=min(budget.seconds, self.deadline - start))
        s = solve(problem, "cpsat", budget=budget, seed=self.seed, baseline=False)
        seconds = time.perf_counter() - start
        m = s.agg.metrics if s.agg is not None else None
        feasible = m is not None and m.feasible
        rate = bound = 0.0
        plan = s.plan if feasible else None
        if feasible and m is not None and isinstance(plan, Plan):
            if role == "agg":
                bound, rate_of = m.objective, little_rate
            else:
                bound = float(instance_rate(self._pool_base, problem, m.throughput_tok_s))

                def rate_of(b: BatchMetrics) -> np.ndarray:
                    return instance_rate(self._pool_base, problem, b.throughput_tok_s)

            rate, _ = prefix_capacity(problem, plan, m.requests_per_rank, rate_of)
        # SLOs at a percentile: the mean-model capacity until a deployment counts on it
        # (served); a prefill instance with no handoff is a bound only
        tail = bool(self.slos) and (role != "prefill" or problem.handoff is not None)
        return Capacity(
            gpu=acc.key,
            gpus=gpus,
            role=role,
            rate=rate,
            bound=max(bound, rate),
            status=s.status,
            plan=plan,  # type: ignore[arg-type]
            metrics=m if feasible else None,
            problem=problem,
            why="" if feasible else s.message,
            seconds=seconds,
            mean_rate=rate if tail else None,
        )
