"""Serving regimes: from step times to TTFT, TPOT, latency and throughput.

This module is the one definition the scalar and batched evaluators, calibration and
the CP-SAT objective all use (:func:`forms`; :func:`latencies` evaluates it in numpy,
:mod:`shardlab.solvers.cpsat` builds it from the model's variables). It is written once
for exact fractions and for arrays of plans (:mod:`shardlab.costmodel.modes`).

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
- in flight, request: TPOT = the round ``R + i``, which carries the prompts of the
  requests that replace finished ones: ``b / output`` whole prompts per micro-batch
  of ``b`` (the tables add that share of a prompt alone to the decode step's times,
  :class:`shardlab.costmodel.tables.DegreeTables`); TTFT from the closed loop below;
  throughput = requests in flight / TPOT;
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
  engine's token budget per iteration; whole prompts, cached prefix or not); cohort
  ``j`` sees its first token after ``j`` cohorts, each taking ``k * S`` plus, when the
  engine decodes in the same iteration, the decoding of the cohorts before it (on
  average ``R / 2``): a mean of ``(M + 1) / 2 * (k * S + g * (R + i))`` over ``M =
  ceil(c / k)`` cohorts, ``g = 1/2`` (``0`` for an engine that runs prefill batches of
  their own, SGLang);
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from shardlab.costmodel.engines import ServingCosts, serving_costs
from shardlab.costmodel.handoff import handoff_seconds
from shardlab.costmodel.modes import ARRAYS, Arith, Number
from shardlab.costmodel.steps import Step
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem

Count = TypeVar("Count", int, np.ndarray)
"""Requests or clients per rank: one subproblem's, or an array of plans'."""

T = TypeVar("T")
"""A time: an array of plans, or a CP-SAT expression."""


class DegreeArrays(NamedTuple):
    """The degrees the regimes read, one entry per plan: plans of many degree tuples
    are timed in one pass."""

    pp: np.ndarray
    replicas: np.ndarray
    dp_attn: np.ndarray
    tp: np.ndarray


@dataclass(frozen=True, kw_only=True)
class Form(Generic[Number]):
    """``round * (R + i) + prompt * S + const``: a latency as the regime defines it.

    Coefficients are numpy arrays (one per plan) in the evaluators and exact fractions
    in CP-SAT's subproblems (:mod:`shardlab.costmodel.modes`); ``const`` is in the unit
    of the times (seconds or ns)."""

    round: Number
    prompt: Number
    const: Number

    # The constructors take 0 and 1 in the mode's numbers and shape (arrays of plans:
    # made once per regime, not once per form).

    @classmethod
    def rounds(cls, zero: Number, one: Number) -> Form[Number]:
        """One round: TPOT, and the time in which rounds serve their tokens."""
        return cls(round=one, prompt=zero, const=zero)

    @classmethod
    def prompt_time(cls, zero: Number, one: Number, const: Number) -> Form[Number]:
        """One prompt and ``const``: a static batch's prefill."""
        return cls(round=zero, prompt=one, const=const)

    def at(self, round_: T, prompt: T) -> T:
        """The form's value at round ``R + i`` = ``round_`` and prompt ``S``."""
        return self.round * round_ + self.prompt * prompt + self.const


@dataclass(frozen=True, kw_only=True)
class Forms(Generic[Number]):
    """A regime: which steps give the round and the prompt, and its latencies."""

    round_step: int | None  # the step timed as a round (None: none)
    prompt_step: int | None  # the step timed as a prompt
    prompt_batches: bool  # the prompt runs the rank's micro-batches (a static batch)
    ttft: Form[Number] | None  # None: not a latency of the phase
    tpot: Form[Number] | None
    latency: Form[Number]
    rate: Form[Number]  # the time in which the regime serves its tokens (throughput's divisor)
    iteration: Number  # the engine's cost per iteration, in the unit of the times

    @classmethod
    def static_batch(
        cls,
        *,
        ttft: Form[Number],
        tpot: Form[Number] | None,
        latency: Form[Number],
        rate: Form[Number],
        iteration: Number,
    ) -> Forms[Number]:
        """A static batch: step 0 its prompt through the rank's micro-batches, then
        (with a TPOT) step 1 its rounds."""
        return cls(
            round_step=None if tpot is None else 1,
            prompt_step=0,
            prompt_batches=True,
            ttft=ttft,
            tpot=tpot,
            latency=latency,
            rate=rate,
            iteration=iteration,
        )

    @classmethod
    def in_rounds(
        cls,
        *,
        ttft: Form[Number] | None,
        tpot: Form[Number] | None,
        latency: Form[Number],
        rate: Form[Number],
        iteration: Number,
        prompt_alone: bool = False,
    ) -> Forms[Number]:
        """Rounds of step 0 (decoding, or a prefill pool's prompts in flight) and, when
        ``prompt_alone``, step 1 a prompt alone."""
        return cls(
            round_step=0,
            prompt_step=1 if prompt_alone else None,
            prompt_batches=False,
            ttft=ttft,
            tpot=tpot,
            latency=latency,
            rate=rate,
            iteration=iteration,
        )

    def time(self, objective: str) -> Form[Number]:
        """What exact search minimizes: the rate, or the latency (also for the most
        requests per second: ``N / latency`` with ``N`` fixed in a subproblem)."""
        return self.latency if objective in ("latency", "request_rate") else self.rate


def forms(
    problem: Problem,
    kinds: list[str],
    running: Number,
    clients: Number,
    budget: Number,
    handoff: Number,
    *,
    arith: Arith[Number],
    costs: ServingCosts | None = None,
) -> Forms[Number]:
    """The regime of ``problem`` whose steps are of ``kinds`` (see the module
    docstring). ``running``: requests per attention-DP rank the plan runs; ``clients``:
    the closed loop's clients per rank; ``budget``: the engine's tokens per iteration
    per rank; ``handoff``: a prefill pool's handoff time. ``arith``: the numbers of all
    of them and of the coefficients, and the unit of the times
    (:mod:`shardlab.costmodel.modes`: fractions in ns for CP-SAT, arrays of plans in
    seconds for the evaluators). ``costs``: the engine's fixed costs (default: the problem's)."""
    w = problem.workload
    costs = serving_costs(problem) if costs is None else costs
    request = costs.request_ns * arith.per_ns
    iteration = costs.iteration_ns * arith.per_ns
    zero = arith.zeros(running)
    one = zero + 1
    o = w.output_len
    # forms are evaluated at the round with its iteration cost, R + i (basic_times)
    if kinds == ["prefill"] and w.schedule == "static":
        ttft = Form.prompt_time(zero, one, iteration + handoff)
        return Forms.static_batch(
            ttft=ttft,
            tpot=None,
            latency=ttft,
            rate=Form.prompt_time(zero, one, iteration),
            iteration=iteration,
        )
    if kinds == ["prefill", "decode"]:
        latency = Form(round=one * (o - 1), prompt=one, const=iteration)
        return Forms.static_batch(
            ttft=Form.prompt_time(zero, one, iteration),
            tpot=Form.rounds(zero, one),
            latency=latency,
            rate=latency,
            iteration=iteration,
        )
    if kinds == ["decode"]:
        tpot = Form.rounds(zero, one)
        return Forms.in_rounds(ttft=None, tpot=tpot, latency=tpot, rate=tpot, iteration=iteration)
    return _closed_loop(
        problem,
        kinds,
        zero,
        one,
        running,
        clients,
        budget,
        handoff,
        costs,
        request,
        iteration,
        arith,
    )


def _closed_loop(
    problem: Problem,
    kinds: list[str],
    zero: Number,
    one: Number,
    running: Number,
    clients: Number,
    budget: Number,
    handoff: Number,
    costs: ServingCosts,
    request: Number,
    iteration: Number,
    arith: Arith[Number],
) -> Forms[Number]:
    """The in-flight regimes with prompts: the closed loop (see the module docstring)."""
    w = problem.workload
    o = w.output_len
    p = w.prompts_per_client
    alone = costs.prefill_first
    # a new prompt's wait in rounds: half the round under way, and the round that
    # decodes beside its prefill unless prefill runs alone
    steady_round = arith.number(Fraction(1, 2) if alone else Fraction(3, 2))
    wave_round = arith.number(Fraction(0) if alone else Fraction(1, 2))
    run = arith.minimum(running, clients)
    waiting = arith.maximum(clients - run, 0)
    queue = arith.ratio(waiting, run)  # cycles a request waits for a slot
    later = arith.ratio(p - 1, p)
    if kinds == ["prefill"]:
        # a prefill pool: each round prefills the prompts it runs, the first wave's in
        # rounds one after the other; a later prompt waits for the round under way,
        # then its own (a prompt holds no slot once prefilled: no wait for one)
        waves = -(-clients // run)
        a_round = arith.ratio(waves + 1, 2 * p) + later * arith.number(Fraction(3, 2))
        ttft = Form(round=a_round, prompt=zero, const=request + handoff)
        return Forms.in_rounds(
            ttft=ttft, tpot=None, latency=ttft, rate=Form.rounds(zero, one), iteration=iteration
        )
    # mixed rounds and a prompt alone
    # whole prompts, even past a cached prefix: the engine's budget would take more of
    # the shorter prompts, but a cohort is priced as that many prompts alone (k * S,
    # each reading the weights), which an engine runs as one pass, and counting the
    # computed tokens here made TTFT rise with prefix reuse on some plans
    cohort = arith.clip(budget // w.input_len, 1, run)
    waves = -(-run // cohort)
    first = arith.ratio(waves + 1, 2 * p)  # the mean of cohorts 1..waves, one in p requests
    a_prompt = first * cohort + later + queue
    a_round = first * wave_round + later * steady_round + queue * (steady_round + o - 1)
    tpot = Form.rounds(zero, one)
    return Forms.in_rounds(
        ttft=Form(round=a_round, prompt=a_prompt, const=request),
        tpot=tpot,
        latency=Form(round=a_round + (o - 1), prompt=a_prompt, const=request),
        rate=tpot,
        iteration=iteration,
        prompt_alone=True,
    )


def basic_times(
    f: Forms[Number],
    m: int | np.ndarray,
    sums: Sequence[T],
    maxes: Sequence[T],
    maximum: Callable[[T, T], T],
) -> tuple[T | int, T | int]:
    """(round with its iteration's cost ``R + i``, prompt ``S``): what the forms are
    evaluated at, from per-step stage sums and maxima; ``maximum`` is ``np.maximum``
    for arrays and a fresh bounded variable for CP-SAT expressions (0 where the regime
    has no such step)."""
    rnd: T | int = 0
    prompt: T | int = 0
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


def clients_per_rank(
    problem: Problem, degrees: Degrees | DegreeArrays, running: Count
) -> Count | int:
    """The closed loop's clients on one attention-DP rank: the workload's clients
    spread over the replicas and ranks, or the requests the plan runs."""
    clients = problem.workload.clients
    if clients is None:
        return running
    return -(-clients // (degrees.replicas * degrees.dp_attn))


def tokens(
    problem: Problem,
    degrees: Degrees | DegreeArrays,
    per_replica: int | np.ndarray,
    requests_per_rank: int | np.ndarray,
) -> np.ndarray:
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
        arith=ARRAYS,
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
