"""Plans under percentile SLOs: the analytic forms rank them, the simulator certifies.

The analytic model gives means; an SLO at a percentile of the requests (``p90 TTFT <=
2 s``, :meth:`Workload.percentile`) is a property of the distribution the request-level
simulator gives (:mod:`shardlab.simulate`). :func:`certify` joins the two by walking
the analytic ranking:

1. the *ranking problem* is the workload with each SLO on the analytic mean, at a
   limit: at first the SLO's own value; when no plan's mean meets that (or covers the
   offered rate under it), no limit at all (a plan's analytic mean is at its busiest
   concurrency, not at the traffic's load, so a percentile can hold where it does not);
2. the method finds its best plan under it (CP-SAT: the proven optimum);
3. the plan's deployment runs the traffic in the simulator. When every SLO's
   percentile is met, the plan is certified;
4. otherwise the plan is *cut*: each missed SLO's limit on the analytic mean is set
   below the plan's own analytic mean, in proportion to the miss
   (``limit = mean * slo / simulated``), so no plan whose analytic latency is the cut
   plan's or more ranks again; and the search runs again,

until a plan is certified, no plan meets the limits (nothing does: the claim says
which limits), or ``tries`` plans failed. The claim names both models: the best plan
under the analytic model, among those whose analytic means meet the final limits,
whose simulated percentiles meet the SLOs under this traffic, with the plans cut on
the way (:attr:`Certificate.claim`). It is not a proof that no plan cut by a
tightened limit would have met the percentiles.

**A floor that needs no simulation.** In the simulator each request's TTFT is at
least the engine's cost per request, one iteration's fixed cost and its prompt's
tokens at the fewest seconds per prompt token any iteration prices
(``request_s + i + rho * P_r``, :func:`least_per_prompt_token`: a prompt's chunks
each cost at least that, and waiting only adds; a prompt alone on an idle rank costs
more, ``S(P)``, but beside decodes the round prices it pro rata). Its TPOT is at
least one decode iteration of a single request at the traffic's shortest prompt
(``decode(1, min P)``, ``i`` in it: a decode iteration is no faster with more
requests or longer contexts, and a prefill-first engine's prefill iterations only
add). A percentile of a sample that is pointwise at
least another's is at least the other's percentile (the order statistics are, and the
interpolation between two of them is monotone), so the P-th percentile of TTFT is at
least the P-th percentile of the per-request floors. A plan whose floor misses an SLO
is cut without simulating (``tests/solvers/test_certify.py`` checks the floors
against the simulator's requests).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardlab.costmodel import DisaggMetrics, Metrics
from shardlab.errors import ShardlabError
from shardlab.problems.disagg import DisaggPlan
from shardlab.problems.limits import MAX_CONTEXT
from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem
from shardlab.problems.traffic import Arrivals, Lengths, Traffic, closed_loop, synthetic_traffic
from shardlab.solvers.solution import plan_label

# SLOs a percentile applies to, and the latency each names in the simulator.
TAIL_SLOS = ("ttft_ms", "tpot_ms", "itl_ms")
# The analytic mean each stands beside (the mean gap between tokens is the TPOT).
_ANALYTIC = {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms", "itl_ms": "tpot_ms"}
# Walks end after this many plans failed (each is a solve and a simulation).
TRIES = 8
# Requests of the synthetic traffic a rate's workload is certified under by default:
# the simulator's queues settle within a few hundred at the loads SLOs allow.
CERTIFY_REQUESTS = 2000
# A cut's limit sits this far below the cut plan's analytic mean (the search's tables
# round latencies: a limit equal to the mean could keep the plan).
_CUT_MARGIN = 1e-3


def statistic(p: float) -> str:
    """The simulator's name of percentile ``p`` (``p90``, ``p99.9``; 50: ``p50``)."""
    return f"p{p:g}"


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """One plan of the walk: its analytic means, its simulated percentiles (or the
    floors that cut it unsimulated), and whether it met every SLO."""

    label: str  # the plan's degrees (and pools)
    objective: float  # the analytic objective
    analytic_ms: dict[str, float]  # SLO -> the analytic mean
    simulated_ms: dict[str, float]  # SLO -> the simulated percentile (empty: floor-cut)
    floor_ms: dict[str, float]  # SLO -> the percentile of the per-request floors
    passed: bool
    limits_ms: dict[str, float]  # the ranking's limits on the analytic means it was found under
    # what its failure cut: "degrees" (its degree tuple, out of the space: the traffic's
    # load is the plan's whatever its concurrency) or "limits" (the limits on the means)
    cut: str = ""

    @property
    def by_floor(self) -> bool:
        return not self.simulated_ms

    def to_dict(self) -> dict[str, Any]:
        """As JSON: a limit that is none (no SLO on that mean) is null, not Infinity."""
        limits = {k: v if math.isfinite(v) else None for k, v in self.limits_ms.items()}
        return dataclasses.asdict(self) | {"limits_ms": limits, "cut_by_floor": self.by_floor}


@dataclass(frozen=True, kw_only=True)
class Certificate:
    """What the walk found: every plan it tried, in order (the certified one last when
    one was), the SLOs with their percentiles, and the traffic."""

    slos: dict[str, tuple[float, float]]  # SLO -> (limit ms, percentile)
    traffic: str  # the traffic's description
    attempts: tuple[Attempt, ...]
    tries: int
    seed: int
    stopped: str = ""  # why the walk ended without a plan (the search's message)

    @property
    def certified(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts and self.attempts[-1].passed else None

    @property
    def failed(self) -> tuple[Attempt, ...]:
        return tuple(a for a in self.attempts if not a.passed)

    def _slo_text(self) -> str:
        return " and ".join(
            f"simulated p{p:g} {k.removesuffix('_ms').upper()} <= {v:g} ms"
            for k, (v, p) in self.slos.items()
        )

    @property
    def claim(self) -> str:
        """The answer's exact wording (see the module's docstring)."""
        failed = self.failed
        floors = sum(a.by_floor for a in failed)
        tuples = sum(a.cut == "degrees" for a in failed)
        cut = (
            f"; {len(failed)} better plan{'s' if len(failed) != 1 else ''} failed"
            + (f" ({floors} by the floor, unsimulated)" if floors else "")
            + (f", {tuples} degree tuple{'s' if tuples != 1 else ''} cut" if tuples else "")
            if failed
            else ""
        )
        won = self.certified
        if won is not None:
            means = {_ANALYTIC[k]: v for k, v in won.limits_ms.items() if math.isfinite(v)}
            limits = (
                ", ".join(
                    f"mean {k.removesuffix('_ms').upper()} <= {v:,.4g} ms" for k, v in means.items()
                )
                or "no SLO on the mean"
            )
            rest = " and degrees not cut" if tuples else ""
            return (
                f"best under the analytic model among plans with {limits}{rest} whose "
                f"{self._slo_text()} under {self.traffic}{cut}"
            )
        if len(failed) >= self.tries:
            return (
                f"no plan certified: the best {self.tries} under the analytic model missed "
                f"{self._slo_text()} under {self.traffic}"
            )
        why = f" ({self.stopped})" if self.stopped else ""
        return (
            f"no plan has {self._slo_text()} under {self.traffic}: after {len(failed)} "
            f"cut{'s' if len(failed) != 1 else ''}, no plan meets the analytic limits{why}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "slos": {k: {"limit_ms": v, "percentile": p} for k, (v, p) in self.slos.items()},
            "traffic": self.traffic,
            "certified": self.certified is not None,
            "claim": self.claim,
            "tries": self.tries,
            "seed": self.seed,
            "stopped": self.stopped,
            "attempts": [a.to_dict() for a in self.attempts],
        }


def tail_slos(problem: Problem) -> dict[str, tuple[float, float]]:
    """SLO -> (limit, percentile) of every SLO the workload holds at a percentile."""
    w = problem.workload
    return {k: (float(getattr(w, k)), p) for k in TAIL_SLOS if (p := w.percentile(k)) is not None}


def check_traffic(problem: Problem, traffic: Traffic | None) -> None:
    """Refuse, in one line naming the part, a traffic given with no SLO at a percentile
    (only the simulator reads one), or a percentile SLO the simulator cannot check."""
    w = problem.workload
    if not w.tail:
        if traffic is not None:
            raise ShardlabError(
                f"traffic {traffic.source!r} is simulated to check SLOs at a percentile, and "
                "the workload holds none",
                field="traffic",
                fix="give the SLOs a percentile (slo_percentile), or set the workload's "
                "lengths and rate to the traffic's means",
            )
        return
    if w.draft_tokens:
        raise ShardlabError(
            f"a percentile SLO is checked by the simulator, which does not run speculative "
            f"decoding (draft_tokens {w.draft_tokens})",
            field="workload.draft_tokens",
            fix="set draft_tokens to 0, or put the SLOs on the mean",
        )
    if traffic is None:
        return
    m = problem.model
    limit = m.max_position_embeddings or MAX_CONTEXT
    longest = int((traffic.input_len + traffic.output_len).max())
    if longest > limit:
        raise ShardlabError(
            f"traffic {traffic.source!r}: a request of {longest:,} tokens is past {m.name}'s "
            f"context of {limit:,}",
            field="traffic",
            fix="drop the requests past the model's context from the trace",
        )


def poisson(problem: Problem, rate: float, seed: int) -> Traffic:
    """Poisson arrivals at ``rate`` of the workload's fixed lengths (the traffic a rate's
    workload states when none is given)."""
    w = problem.workload
    return synthetic_traffic(
        requests=CERTIFY_REQUESTS,
        lengths=Lengths(kind="fixed", input_len=w.input_len, output_len=w.output_len),
        arrivals=Arrivals(kind="poisson", rate=rate),
        seed=seed,
    )


def simulated_percentiles(sim: Any, slos: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each SLO's percentile (SLO -> (limit, percentile)) in a simulation, in ms."""
    return {k: sim.latency(k, statistic(p)) for k, (_, p) in slos.items()}


def default_traffic(problem: Problem, in_flight: int, seed: int) -> Traffic:
    """The traffic a workload states when none is given: Poisson arrivals at its rate,
    or its closed loop (its clients, or the ``in_flight`` requests the plan runs), at
    its fixed lengths."""
    w = problem.workload
    if w.rate is not None:
        return poisson(problem, w.rate, seed)
    return closed_loop(
        clients=w.clients or max(1, in_flight),
        prompts_per_client=w.prompts_per_client,
        lengths=Lengths(kind="fixed", input_len=w.input_len, output_len=w.output_len),
        seed=seed,
    )


def with_reuse(traffic: Traffic, problem: Problem) -> Traffic:
    """``traffic`` with the workload's prefix reuse (its share of each prompt from one
    shared prefix) when it states no prefixes of its own (a Mooncake trace's blocks
    stay theirs)."""
    reuse = problem.workload.prefix_reuse
    if reuse and traffic.prefix_blocks is None:
        return traffic.with_prefix_reuse(reuse)
    return traffic


def describe_traffic(traffic: Traffic, problem: Problem | None = None) -> str:
    """The traffic in a phrase; ``problem``: the workload's own (its rate as stated)."""
    if traffic.arrival == "closed":
        what = f"a closed loop of {traffic.clients:,} clients"
    else:
        rate = problem.workload.rate if problem is not None else traffic.rate
        what = f"{traffic.arrival} arrivals at {rate:,.4g} requests/s" if rate else traffic.arrival
    source = "the workload" if problem is not None else traffic.source
    return f"{source} ({traffic.requests:,} requests, {what})"


def deployment(problem: Problem, plan: Plan | DisaggPlan) -> Any:
    """The simulator's deployment of a solved plan."""
    from shardlab.simulate import Deployment

    if isinstance(plan, DisaggPlan):
        return Deployment.of_disagg(problem, plan)
    return Deployment.of_plan(problem, plan)


def floors(
    priced: Any, deployment: Any, traffic: Traffic, percentile: dict[str, float]
) -> dict[str, float]:
    """The P-th percentile of each request's floor, per SLO (see the module docstring)."""
    entry = next(pc for pc in priced if pc.pool.role == deployment.entry)
    back = next((pc for pc in priced if pc.pool.role == "decode"), entry)
    out: dict[str, float] = {}
    if "ttft_ms" in percentile:
        c = entry.costs
        per_token = least_per_prompt_token(c)
        ttft = c.request_s + c.iteration_s + per_token * traffic.input_len.astype(float)
        out["ttft_ms"] = 1e3 * float(np.percentile(ttft, percentile["ttft_ms"]))
    if "tpot_ms" in percentile or "itl_ms" in percentile:
        c = back.costs
        low = float(c.decode(1, float(traffic.input_len.min())))  # R + i: i is in it
        # every gap between two tokens is an iteration the request decodes in
        out |= {k: 1e3 * low for k in ("tpot_ms", "itl_ms") if k in percentile}
    return out


def least_per_prompt_token(c: Any) -> float:
    """The fewest seconds any iteration the simulator prices adds per prompt token: a
    chunk alone (``S(Q + P) - S(Q)``: a segment's slope of ``S``, linear between its
    nodes) or beside ``c`` decoding requests (the mixed round over the decode round at
    the same ratio, per prompt token; linear between ratio nodes, so least at a node or
    along the last segment). 0 when ``S`` dips somewhere (measured GEMMs have bumps in
    the token count): a chunk across the dip then costs less than nothing."""
    seg = np.diff(c.prompt_s) / np.diff(c.prompts)
    least = float(seg.min()) if seg.size else math.inf
    j = np.flatnonzero(c.ratios > 0)
    if j.size:
        cs = np.arange(1, c.mixed_s.shape[0])[:, None]
        decode = np.asarray(c.decode(cs, c.ratio_context[None, j]))
        prompt = c.mixed_s[1:, j] - decode
        least = min(least, float((prompt / (cs * c.ratios[None, j])).min()))
        if j.size > 1:  # past the last node: the last segment's slope per token
            a, b = j[-2], j[-1]
            slope = (prompt[:, -1] - prompt[:, -2]) / (cs[:, 0] * (c.ratios[b] - c.ratios[a]))
            least = min(least, float(slope.min()))
    return max(0.0, least)


def certify(
    problem: Problem,
    search: Callable[[Problem], Any],
    *,
    traffic: Traffic | None = None,
    tries: int = TRIES,
    seed: int = 0,
) -> tuple[Any, Certificate]:
    """Walk the ranking of ``search`` (a solve of a problem whose SLOs are on the mean,
    returning a :class:`~shardlab.solvers.solution.Solution`) until a plan's simulated
    percentiles meet ``problem``'s percentile SLOs under ``traffic`` (None: the
    workload's own, :func:`default_traffic`). Returns the last solution (the
    certified plan's, when one was) and the certificate."""
    slos = tail_slos(problem)
    if not slos:
        raise ShardlabError("certify: the workload holds no SLO at a percentile")
    check_traffic(problem, traffic)
    limits = {k: v for k, (v, _) in slos.items()}
    attempts: list[Attempt] = []
    described = stopped = ""
    solution = None
    cut: tuple[Degrees, ...] = ()
    while len(attempts) < tries:
        w = problem.workload.on_the_mean(**{k: _or_none(v) for k, v in limits.items()})
        try:
            ranking = dataclasses.replace(problem, workload=w, exclude=cut)
            ranking.space  # noqa: B018 -- every degree tuple cut: nothing left to rank
        except ShardlabError as exc:
            stopped = exc.message
            break
        plan = m = None
        try:
            solution = search(ranking)
            plan, m = solution.plan, solution.metrics
        except ShardlabError as exc:
            if exc.field != "rate":
                raise
            # the limits leave no plan whose analytic capacity covers the offered rate
            stopped = exc.message
        if plan is None or m is None or not m.feasible:
            if not stopped and solution is not None:
                stopped = solution.message or "no plan meets the analytic limits"
            if not attempts and any(math.isfinite(v) for v in limits.values()):
                # no plan's mean meets the SLOs: a percentile may still (the mean of a
                # plan at its busiest is not the latency at the traffic's load)
                limits = {k: math.inf for k in limits}
                stopped = ""
                continue
            break
        attempt, described = check(problem, ranking, plan, m, traffic, seed)
        missed = {
            k: attempt.simulated_ms.get(k, attempt.floor_ms[k])
            for k in slos
            if not attempt.simulated_ms.get(k, attempt.floor_ms[k]) <= slos[k][0]
        }
        # the load does not move with the plan's concurrency: a failed plan fails at
        # every concurrency of its degrees, which are cut; otherwise its latencies are
        by_degrees = isinstance(plan, Plan) and not (
            traffic is None and problem.workload.rate is None and problem.workload.clients is None
        )
        attempts.append(
            dataclasses.replace(
                attempt,
                limits_ms=dict(limits),
                cut="" if not missed else "degrees" if by_degrees else "limits",
            )
        )
        analytic = attempt.analytic_ms
        if not missed:
            break
        if by_degrees:
            assert isinstance(plan, Plan)
            cut = (*cut, plan.degrees)
            continue
        for k, got in missed.items():
            scaled = analytic[k] * slos[k][0] / got if math.isfinite(got) else 0.0
            limits[k] = min(limits[k], scaled * (1 - _CUT_MARGIN))
    if not described:
        described = "the workload" if traffic is None else describe_traffic(traffic)
    certificate = Certificate(
        slos=slos,
        traffic=described,
        attempts=tuple(attempts),
        tries=tries,
        seed=seed,
        stopped=stopped,
    )
    return solution, certificate


def check(
    problem: Problem,
    ranking: Problem,
    plan: Plan | DisaggPlan,
    metrics: Metrics | DisaggMetrics,
    traffic: Traffic | None,
    seed: int,
) -> tuple[Attempt, str]:
    """``plan`` (priced ``metrics`` on ``ranking``) under ``problem``'s percentile SLOs:
    its floors, and its simulated percentiles unless a floor already misses; and the
    traffic it ran, in a phrase."""
    from shardlab.simulate import price, simulate_priced

    slos = tail_slos(problem)
    percentile = {k: p for k, (_, p) in slos.items()}
    run = with_reuse(traffic or default_traffic(problem, _in_flight(plan, metrics), seed), problem)
    described = describe_traffic(run, problem if traffic is None else None)
    dep = deployment(ranking, plan)
    priced = price(dep, run, most=run.most_in_system)
    floor = floors(priced, dep, run, percentile)
    simulated: dict[str, float] = {}
    if all(floor[k] <= v for k, (v, _) in slos.items()):
        simulated = simulated_percentiles(simulate_priced(dep, priced, run, seed=seed), slos)
    passed = bool(simulated) and all(simulated[k] <= v for k, (v, _) in slos.items())
    attempt = Attempt(
        label=plan_label(plan),
        objective=float(metrics.objective),
        analytic_ms={k: float(getattr(metrics, _ANALYTIC[k])) for k in slos},
        simulated_ms=simulated,
        floor_ms=floor,
        passed=passed,
        limits_ms={k: getattr(ranking.workload, _ANALYTIC[k]) or math.inf for k in slos},
    )
    return attempt, described


def _or_none(limit: float) -> float | None:
    return limit if math.isfinite(limit) else None


def _in_flight(plan: Plan | DisaggPlan, m: Metrics | DisaggMetrics) -> int:
    """Requests the plan runs at once in the whole cluster (a closed loop's clients
    when the workload names none)."""
    if isinstance(m, DisaggMetrics) and isinstance(plan, DisaggPlan):
        return m.decode.requests_in_flight * plan.decode_instances
    assert isinstance(m, Metrics)
    return m.requests_in_flight
