"""Serving regimes: from step times to TTFT, TPOT, latency and throughput.

This module is the one definition the scalar and batched evaluators, calibration and
the CP-SAT objective all use (:func:`forms`; :func:`latencies` evaluates it in numpy,
:mod:`shardlab.solvers.cpsat` builds it from the model's variables).

Two times of a plan come from its per-step stage times ``t_s`` (``m`` micro-batches
per attention-DP rank):

- the **round** ``R = max(sum(t_s), m * max(t_s))`` of the step every request goes
  through once per output token (a steady-state round: the pipeline's fill overlaps
  the previous round's drain), plus the engine's fixed cost per iteration ``i``;
- the **prompt** ``S = sum(t_s) + (m - 1) * max(t_s)`` of a prefill: a static batch's
  (pipeline fill and drain), or in flight one prompt alone through every stage.

Every latency is then an affine form ``a * (R + i) + b * S + c`` whose coefficients
depend only on the workload, the engine and the requests per rank (:class:`Form`):
that is what keeps exact search exact, since a CP-SAT subproblem fixes the degrees
and the requests per rank.

By phase and schedule (see :mod:`shardlab.problems.workload`):

- static prefill: TTFT = the batch's prefill ``S + i``; throughput = batch * input /
  TTFT;
- static decode: TPOT = ``R + i``; throughput = batch / TPOT;
- static request: TTFT = ``S + i``, TPOT = ``R + i``, latency = TTFT + (output - 1) *
  TPOT, throughput = batch * output / latency;
- in flight, decode: TPOT = ``R + i``, throughput = requests in flight / TPOT;
- in flight, request: TPOT = the mixed round ``R + i`` (it carries, on average, the
  prompts of the requests that replace finished ones); TTFT from the closed loop
  below; throughput = requests in flight / TPOT;
- in flight, prefill (a prefill pool): rounds of the prompts in flight; TTFT from
  the closed loop, one cohort being one round; throughput = prompts in flight * input
  per round.

**The closed loop** (what serving benchmarks run; InferenceX: ``--max-concurrency
N --num-prompts 10N --request-rate inf``, mean TTFT and TPOT recorded). ``n`` clients
per attention-DP rank each send ``P = prompts_per_client`` requests one after the
other, all starting at once; the engine runs ``c`` of them (the plan's requests per
rank; the others wait for a slot). Per request:

- *the first wave*: the ``c`` first prompts arrive together and are prefilled in
  cohorts of ``k = clamp(budget // input, 1, c)`` prompts per iteration (the
  engine's token budget per iteration); cohort ``j`` sees its first token after ``j``
  cohorts, each taking ``k * S`` plus, when the engine decodes in the same iteration,
  the decoding of the cohorts before it (on average ``R / 2``): a mean of
  ``(M + 1) / 2 * (k * S + g * (R + i))`` over ``M = ceil(c / k)`` cohorts, ``g = 1/2``
  (``0`` for an engine that runs prefill batches of their own, SGLang);
- *the other waves*: random lengths spread the arrivals; a prompt waits for the
  iteration under way (half a round) and is prefilled in the next, which also
  decodes the running requests: ``S + 3/2 (R + i)`` (``S + 1/2 (R + i)`` when prefill
  runs alone);
- *waiting for a slot* (``n > c``): each of the ``n`` clients cycles once per
  ``(n / c)`` turns of the ``c`` slots, so a request first waits ``(n / c - 1)``
  cycles of a running one, ``steady TTFT + (output - 1) * TPOT``;
- TTFT = the engine's fixed cost per request ``r`` + (first wave + ``(P - 1)`` other
  waves) / ``P`` + the wait. TPOT's mean is the round's: the first wave concentrates
  the prompts' work, the round already spreads all of it.

A prefill pool of disaggregated serving (``problem.handoff``) adds the handoff of
each prompt's cache to the decode pool to its TTFT (:mod:`shardlab.costmodel.handoff`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

from shardlab.costmodel.engines import ServingCosts, serving_costs
from shardlab.costmodel.handoff import handoff_seconds
from shardlab.costmodel.steps import Step
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem


class DegreeArrays(NamedTuple):
    """The degrees the regimes read, one entry per plan: plans of many degree tuples
    are timed in one pass."""

    pp: np.ndarray
    replicas: np.ndarray
    dp_attn: np.ndarray
    tp: np.ndarray


@dataclass(frozen=True, kw_only=True)
class Form:
    """``round * (R + i) + prompt * S + const``: a latency as the regime defines it.

    Coefficients are numpy arrays (one per plan) in the evaluators and exact fractions
    in CP-SAT's subproblems; ``const`` is in the unit of the times (seconds or ns)."""

    round: Any
    prompt: Any
    const: Any

    def at(self, round_: Any, prompt: Any) -> Any:
        """The form's value at round ``R + i`` = ``round_`` and prompt ``S``."""
        return self.round * round_ + self.prompt * prompt + self.const


@dataclass(frozen=True, kw_only=True)
class Forms:
    """A regime: which steps give the round and the prompt, and its latencies."""

    round_step: int | None  # the step timed as a round (None: none)
    prompt_step: int | None  # the step timed as a prompt
    prompt_batches: bool  # the prompt runs the rank's micro-batches (a static batch)
    ttft: Form | None  # None: not a latency of the phase
    tpot: Form | None
    latency: Form
    rate: Form  # the time in which the regime serves its tokens (throughput's divisor)
    iteration: Any  # the engine's cost per iteration, in the unit of the times

    def time(self, objective: str) -> Form:
        """What exact search minimizes: the rate, or the latency (also for the most
        requests per second: ``N / latency`` with ``N`` fixed in a subproblem)."""
        return self.latency if objective in ("latency", "request_rate") else self.rate


def _zero(like: Any) -> Any:
    return 0 * like


def forms(
    problem: Problem,
    kinds: list[str],
    running: Any,
    clients: Any,
    budget: Any,
    handoff: Any,
    *,
    exact: bool,
    ns: bool = False,
    costs: ServingCosts | None = None,
) -> Forms:
    """The regime of ``problem`` whose steps are of ``kinds`` (see the module
    docstring). ``running``: requests per attention-DP rank the plan runs; ``clients``:
    the closed loop's clients per rank; ``budget``: the engine's tokens per iteration
    per rank; ``handoff``: a prefill pool's handoff time. ``exact``: every argument is
    a Python integer (times in ns) and coefficients are fractions (CP-SAT); else
    numpy arrays of plans, times in seconds (``ns``: in ns, for exact search's
    bounds). ``costs``: the engine's fixed costs (default: the problem's)."""
    w = problem.workload
    costs = serving_costs(problem) if costs is None else costs
    unit = 1 if exact or ns else 1e-9
    request, iteration = costs.request_ns * unit, costs.iteration_ns * unit
    zero = _zero(running)
    one = zero + 1
    o = w.output_len
    # forms are evaluated at the round with its iteration cost, R + i (basic_times)
    if kinds == ["prefill"] and w.schedule == "static":
        rate = Form(round=zero, prompt=one, const=iteration)
        ttft = Form(round=zero, prompt=one, const=iteration + handoff)
        return Forms(
            round_step=None,
            prompt_step=0,
            prompt_batches=True,
            ttft=ttft,
            tpot=None,
            latency=ttft,
            rate=rate,
            iteration=iteration,
        )
    if kinds == ["prefill", "decode"]:
        ttft = Form(round=zero, prompt=one, const=iteration)
        tpot = Form(round=one, prompt=zero, const=zero)
        latency = Form(round=one * (o - 1), prompt=one, const=iteration)
        return Forms(
            round_step=1,
            prompt_step=0,
            prompt_batches=True,
            ttft=ttft,
            tpot=tpot,
            latency=latency,
            rate=latency,
            iteration=iteration,
        )
    if kinds == ["decode"]:
        tpot = Form(round=one, prompt=zero, const=zero)
        return Forms(
            round_step=0,
            prompt_step=None,
            prompt_batches=False,
            ttft=None,
            tpot=tpot,
            latency=tpot,
            rate=tpot,
            iteration=iteration,
        )
    return _closed_loop(
        problem, kinds, running, clients, budget, handoff, costs, request, iteration, exact
    )


def _closed_loop(
    problem: Problem,
    kinds: list[str],
    running: Any,
    clients: Any,
    budget: Any,
    handoff: Any,
    costs: ServingCosts,
    request: Any,
    iteration: Any,
    exact: bool,
) -> Forms:
    """The in-flight regimes with prompts: the closed loop (see the module docstring)."""
    w = problem.workload

    def ratio(a: Any, b: Any) -> Any:
        return Fraction(a, b) if exact else np.asarray(a, dtype=float) / b

    def number(x: Fraction) -> Any:
        return x if exact else float(x)

    zero = _zero(running)
    one = zero + 1
    o = w.output_len
    p = w.prompts_per_client
    alone = costs.prefill_first
    # a new prompt's wait in rounds: half the round under way, and the round that
    # decodes beside its prefill unless prefill runs alone
    steady_round = number(Fraction(1, 2) if alone else Fraction(3, 2))
    wave_round = number(Fraction(0) if alone else Fraction(1, 2))
    if exact:
        run = min(running, clients)
        waiting = max(clients - run, 0)
    else:
        run = np.minimum(running, clients)
        waiting = np.maximum(clients - run, 0)
    queue = ratio(waiting, run)  # cycles a request waits for a slot
    later = ratio(p - 1, p)
    if kinds == ["prefill"]:
        # a prefill pool: each round prefills the prompts it runs, the first wave's in
        # rounds one after the other; a later prompt waits for the round under way,
        # then its own (a prompt holds no slot once prefilled: no wait for one)
        waves = -(-clients // run)
        a_round = ratio(waves + 1, 2 * p) + later * number(Fraction(3, 2))
        ttft = Form(round=a_round, prompt=zero, const=request + handoff)
        rate = Form(round=one, prompt=zero, const=zero)
        return Forms(
            round_step=0,
            prompt_step=None,
            prompt_batches=False,
            ttft=ttft,
            tpot=None,
            latency=ttft,
            rate=rate,
            iteration=iteration,
        )
    # mixed rounds and a prompt alone
    if exact:
        cohort = max(1, min(budget // w.input_len, run))
    else:
        cohort = np.clip(budget // w.input_len, 1, run)
    waves = -(-run // cohort)
    first = ratio(waves + 1, 2 * p)  # the mean of cohorts 1..waves, one in p requests
    a_prompt = first * cohort + later + queue
    a_round = first * wave_round + later * steady_round + queue * (steady_round + o - 1)
    tpot = Form(round=one, prompt=zero, const=zero)
    return Forms(
        round_step=0,
        prompt_step=1,
        prompt_batches=False,
        ttft=Form(round=a_round, prompt=a_prompt, const=request),
        tpot=tpot,
        latency=Form(round=a_round + (o - 1), prompt=a_prompt, const=request),
        rate=tpot,
        iteration=iteration,
    )


def basic_times(
    f: Forms,
    m: Any,
    sums: list[Any],
    maxes: list[Any],
    maximum: Callable[[Any, Any], Any],
) -> tuple[Any, Any]:
    """(round with its iteration's cost ``R + i``, prompt ``S``): what the forms are
    evaluated at, from per-step stage sums and maxima; ``maximum`` is ``np.maximum``
    for arrays and a fresh bounded variable for CP-SAT expressions (0 where the regime
    has no such step)."""
    rnd: Any = 0
    prompt: Any = 0
    if f.round_step is not None:
        rnd = maximum(sums[f.round_step], m * maxes[f.round_step]) + f.iteration
    if f.prompt_step is not None:
        j = f.prompt_step
        prompt = sums[j] + (m - 1) * maxes[j] if f.prompt_batches else sums[j]
    return rnd, prompt


@dataclass(frozen=True, kw_only=True)
class Latencies:
    """A regime's times and rates, one entry per (plan, concurrency) priced."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    latency_s: np.ndarray
    throughput: np.ndarray  # tokens/s of the whole cluster
    requests_in_flight: np.ndarray  # in the whole cluster


@dataclass(frozen=True, kw_only=True)
class Judgement:
    objective: np.ndarray  # higher is better
    ttft_violation: np.ndarray
    tpot_violation: np.ndarray
    feasible: np.ndarray


def in_flight_requests(
    problem: Problem,
    degrees: Degrees | DegreeArrays,
    per_replica: int | np.ndarray,
    requests_per_rank: np.ndarray | int,
) -> np.ndarray:
    """Requests the whole cluster serves at once: the offered batch, or what the
    replicas hold when each dp rank holds ``requests_per_rank`` (the in-flight KV cap)."""
    d = degrees
    held = d.replicas * np.minimum(per_replica, np.asarray(requests_per_rank) * d.dp_attn)
    return np.minimum(problem.workload.batch, held).astype(float)


def clients_per_rank(problem: Problem, degrees: Degrees | DegreeArrays, running: Any) -> Any:
    """The closed loop's clients on one attention-DP rank: the workload's clients
    spread over the replicas and ranks, or the requests the plan runs."""
    clients = problem.workload.clients
    if clients is None:
        return running
    return -(-clients // (degrees.replicas * degrees.dp_attn))


def tokens(
    problem: Problem, degrees: Degrees | DegreeArrays, per_replica: Any, requests_per_rank: Any
) -> Any:
    """The tokens a regime serves in its rate's time (throughput = tokens / rate)."""
    w = problem.workload
    inflight = w.schedule == "inflight"
    served = in_flight_requests(problem, degrees, per_replica, requests_per_rank)
    if not inflight:
        served = np.full_like(served, float(w.batch))
    if w.phase == "prefill":
        return served * w.input_len
    if w.phase == "request" and not inflight:
        return served * w.output_len
    return served


def latencies(
    problem: Problem,
    degrees: Degrees | DegreeArrays,
    steps: tuple[Step, ...],
    per_replica: int | np.ndarray,
    requests_per_rank: np.ndarray,
    sums: list[np.ndarray],
    maxes: list[np.ndarray],
    budget: np.ndarray,
) -> Latencies:
    """TTFT, TPOT, latency, throughput from per-step stage-time sums and maxima (in
    seconds), for plans at ``requests_per_rank`` requests per rank under an engine budget of
    ``budget`` tokens per iteration per rank."""
    w = problem.workload
    d = degrees
    requests_per_rank = np.asarray(requests_per_rank)
    m = np.minimum(d.pp, requests_per_rank)
    handoff = np.broadcast_to(handoff_seconds(problem, d.pp, d.tp), requests_per_rank.shape)
    f = forms(
        problem,
        [s.kind for s in steps],
        requests_per_rank,
        clients_per_rank(problem, d, requests_per_rank),
        np.asarray(budget),
        handoff,
        exact=False,
    )
    rnd, prompt = basic_times(f, m, sums, maxes, np.maximum)
    latency = f.latency.at(rnd, prompt)
    zeros = np.zeros(np.shape(latency))
    ttft = zeros if f.ttft is None else f.ttft.at(rnd, prompt)
    tpot = zeros if f.tpot is None else f.tpot.at(rnd, prompt)
    throughput = tokens(problem, d, per_replica, requests_per_rank) / f.rate.at(rnd, prompt)
    inflight = w.schedule == "inflight"
    in_flight = in_flight_requests(problem, d, per_replica, requests_per_rank)
    concurrency = in_flight if inflight else np.full_like(in_flight, float(w.batch))
    shape = np.shape(throughput)
    return Latencies(
        ttft_s=np.broadcast_to(ttft, shape),
        tpot_s=np.broadcast_to(tpot, shape),
        latency_s=np.broadcast_to(latency, shape),
        throughput=throughput,
        requests_in_flight=np.broadcast_to(concurrency, shape),
    )


def judge(problem: Problem, t: Latencies, memory_ok: np.ndarray) -> Judgement:
    """Objective (higher is better) and SLO violations."""
    w = problem.workload
    ttft_bad = np.zeros(np.shape(memory_ok), dtype=bool)
    tpot_bad = np.zeros(np.shape(memory_ok), dtype=bool)
    if w.ttft_ms is not None and w.phase != "decode":
        ttft_bad = t.ttft_s * 1e3 > w.ttft_ms
    if w.tpot_ms is not None and w.phase != "prefill":
        tpot_bad = t.tpot_s * 1e3 > w.tpot_ms
    if w.objective == "latency":
        objective = -t.latency_s * 1e3
    elif w.objective == "request_rate":  # Little's law on the closed loop
        with np.errstate(divide="ignore"):
            objective = t.requests_in_flight / t.latency_s
    elif w.per_gpu:
        objective = t.throughput / problem.cluster.num_gpus
    else:
        objective = t.throughput
    return Judgement(
        objective=objective,
        ttft_violation=ttft_bad,
        tpot_violation=tpot_bad,
        feasible=memory_ok & ~ttft_bad & ~tpot_bad,
    )
