"""The one counting, caching evaluator every solver goes through.

"Evaluations" means distinct plans priced by the cost model, the same for every
method: a plan seen before is answered from the cache and not counted. The evaluator
enforces the budget (raising :class:`BudgetExhausted`), keeps the best feasible plan,
the history of improvements, and the least infeasible plan for error messages.

Fitness (what metaheuristics compare): the workload's objective for feasible plans;
for infeasible ones ``-1e18 * (1 + excess)``, below every feasible plan and graded by
how far the plan misses (memory over HBM, TTFT and TPOT over their SLOs, relative).
When the workload's objective is ``pareto`` it also keeps the front of the feasible
plans it priced (:class:`~shardlab.solvers.front.Front`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from shardlab.costmodel import BatchMetrics, evaluate_batch, evaluate_points, prepare
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem
from shardlab.solvers.front import Front

INFEASIBLE = -1e18


# A search that asks this many times in a row without proposing a new plan is stopped:
# it can no longer spend its budget (a converged population in a small space).
STALL_LIMIT = 2000


class BudgetExhausted(Exception):
    """Raised inside a search when the evaluation or time budget is spent, when every
    plan of the space has been evaluated, or when the search stalls."""


# Seconds between two progress reports of a phase that prices no plans (an exact
# solver's enumeration, a study's set-up): often enough for a live display.
TICK_S = 0.25


class HistoryPoint(NamedTuple):
    evals: int
    seconds: float
    best: float


@dataclass(frozen=True, kw_only=True)
class Progress:
    evals: int
    max_evals: int | None
    seconds: float
    best: float | None
    phase: str = "search"


def excess(problem: Problem, m: BatchMetrics) -> np.ndarray:
    """How far each plan misses its constraints (0 when feasible), summed relative."""
    w = problem.workload
    hbm = problem.cluster.accelerator.hbm_gb
    out = np.where(m.memory_violation, np.maximum(m.memory_gb_per_gpu / hbm - 1.0, 1e-3), 0.0)
    if w.ttft_ms is not None:
        out = out + np.where(m.ttft_violation, m.ttft_ms / w.ttft_ms - 1.0, 0.0)
    if w.tpot_ms is not None:
        out = out + np.where(m.tpot_violation, m.tpot_ms / w.tpot_ms - 1.0, 0.0)
    return out


def fitness(problem: Problem, m: BatchMetrics) -> np.ndarray:
    return np.where(m.feasible, m.objective, INFEASIBLE * (1.0 + excess(problem, m)))


class Evaluator:
    def __init__(
        self,
        problem: Problem,
        max_evals: int | None,
        seconds: float | None,
        callback: Callable[[Progress], None] | None,
        start: float,
    ) -> None:
        self.problem = problem
        self.space = problem.space
        self.max_evals = max_evals
        self.seconds = seconds
        self.callback = callback
        self.start = start
        self.cache: dict[bytes, float] = {}
        self.n_evals = 0
        self.best_code: np.ndarray | None = None
        self.best_objective = float("-inf")
        self.best_requests_per_rank: int | None = None  # what the best was priced at
        self.history: list[HistoryPoint] = []
        self._least_code: np.ndarray | None = None
        self._least_fitness = float("-inf")
        self._violation_counts = {"memory": 0, "ttft_slo": 0, "tpot_slo": 0}
        self._closest: dict[str, float] = {}
        self.space_size = self.space.num_plans()
        self.stalls = 0  # consecutive calls that proposed nothing new
        self.stalled = False
        self.front = Front(problem) if problem.workload.objective == "pareto" else None
        self.phase = "search"  # what the run is doing (progress; where the clock ran out)
        self.ran_out_in: str | None = None  # the phase the time budget ran out in
        self._reported = -math.inf
        self._prepared: set[int] = set()

    @property
    def space_exhausted(self) -> bool:
        """Every plan of the space has been evaluated: the best is the optimum."""
        return self.n_evals >= self.space_size

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    @property
    def remaining(self) -> int | None:
        return None if self.max_evals is None else self.max_evals - self.n_evals

    def out_of_time(self) -> bool:
        if self.seconds is not None and self.elapsed >= self.seconds:
            self.ran_out_in = self.ran_out_in or self.phase
            return True
        return False

    def left(self) -> float | None:
        """Seconds left of the time budget (None: no time limit)."""
        return None if self.seconds is None else max(self.seconds - self.elapsed, 0.0)

    def enter(self, phase: str) -> None:
        """Name the phase the run is in, for the progress display and for the message
        when the clock runs out there; stops the run if the time is already spent."""
        self.phase = phase
        self._reported = -math.inf
        self.check_time()

    def check_time(self) -> None:
        """Stop the run (:class:`BudgetExhausted`) once the time budget is spent.

        Phases that price no plans call this between chunks of their work; it also
        keeps the progress display moving there.
        """
        if self.out_of_time():
            raise BudgetExhausted
        if self.callback is not None and self.elapsed - self._reported >= TICK_S:
            self._report()

    def check_budget(self) -> None:
        if self.out_of_time() or (self.remaining is not None and self.remaining <= 0):
            raise BudgetExhausted
        if self.space_exhausted or self.stalled:
            raise BudgetExhausted

    def _report(self) -> None:
        if self.callback is None:
            return
        self._reported = self.elapsed
        best = None if self.best_code is None else self.best_objective
        self.callback(
            Progress(
                evals=self.n_evals,
                max_evals=self.max_evals,
                seconds=self._reported,
                best=best,
                phase=self.phase,
            )
        )

    def evaluate(self, codes: np.ndarray) -> np.ndarray:
        """Fitness of each row; new rows count against the budget.

        When the budget runs out part-way, the rows that fit are evaluated and
        recorded, then :class:`BudgetExhausted` is raised.
        """
        self.check_budget()
        codes = np.atleast_2d(np.asarray(codes, dtype=np.int64))
        keys = [row.tobytes() for row in codes]
        new: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            if k not in self.cache and k not in new:
                new[k] = i
        exhausted = False
        todo = list(new.values())
        if self.remaining is not None and len(todo) > self.remaining:
            todo, exhausted = todo[: self.remaining], True
        if self.seconds is not None:
            ready = self._prepare(codes[todo])
            exhausted = exhausted or not ready.all()
            todo = [i for i, ok in zip(todo, ready, strict=True) if ok]
        if todo:
            self._price(codes[todo], [keys[i] for i in todo])
            self.stalls = 0
        else:
            self.stalls += 1
            self.stalled = self.stalls >= STALL_LIMIT
        if exhausted or self.out_of_time() or self.space_exhausted:
            raise BudgetExhausted
        return np.array([self.cache[k] for k in keys])

    def _prepare(self, codes: np.ndarray) -> np.ndarray:
        """Build the cost tables of the rows' degree tuples while the time lasts; which
        rows can be priced. A batch of new degree tuples is the slow part of pricing
        (each builds its tables once), so the clock is read between them."""
        ready = np.ones(len(codes), dtype=bool)
        for di in dict.fromkeys(codes[:, 0].tolist()):
            if di in self._prepared:
                continue
            if self.out_of_time():
                ready &= np.isin(codes[:, 0], list(self._prepared))
                break
            prepare(self.problem, self.space.degree_tuples[di])
            self._prepared.add(di)
        return ready

    def _price(self, codes: np.ndarray, keys: list[bytes]) -> None:
        if self.front is not None:
            m, points = evaluate_points(self.problem, codes)
            self.front.add(codes, points)
        else:
            m = evaluate_batch(self.problem, codes)
        fit = fitness(self.problem, m)
        for k, f in zip(keys, fit, strict=True):
            self.cache[k] = float(f)
        self.n_evals += len(keys)
        for name, flags in (
            ("memory", m.memory_violation),
            ("ttft_slo", m.ttft_violation),
            ("tpot_slo", m.tpot_violation),
        ):
            self._violation_counts[name] += int(flags.sum())
        for name, values in (
            ("memory_gb", m.memory_gb_per_gpu),
            ("ttft_ms", m.ttft_ms),
            ("tpot_ms", m.tpot_ms),
        ):
            low = float(values.min())
            self._closest[name] = min(self._closest.get(name, low), low)
        # History per plan, in the order priced: the best after any number of
        # evaluations is then exact, even inside a batch.
        first = self.n_evals - len(keys)
        obj = np.where(m.feasible, m.objective, -np.inf)
        before = np.concatenate([[self.best_objective], np.maximum.accumulate(obj)[:-1]])
        now = self.elapsed
        for j in np.flatnonzero(obj > np.maximum(before, self.best_objective)):
            self.best_objective = float(obj[j])
            self.best_code = codes[j].copy()
            self.best_requests_per_rank = int(m.requests_per_rank[j])
            self.history.append(HistoryPoint(first + int(j) + 1, now, self.best_objective))
        i = int(np.argmax(fit))
        if not m.feasible[i] and fit[i] > self._least_fitness:
            self._least_fitness = float(fit[i])
            self._least_code = codes[i].copy()
        self._report()

    def metrics(self, codes: np.ndarray) -> BatchMetrics:
        """Full metrics of rows; rows not seen before are counted like :meth:`evaluate`."""
        codes = np.atleast_2d(np.asarray(codes, dtype=np.int64))
        self.evaluate(codes)
        return evaluate_batch(self.problem, codes)

    def evaluate_plan(self, plan: Plan) -> float:
        return float(self.evaluate(self.space.encode(plan)[None])[0])

    def best_plan(self) -> Plan | None:
        """The best feasible plan, carrying the requests per rank it was priced at when
        the schedule lets the plan choose them."""
        if self.best_code is None:
            return None
        plan = self.space.decode(self.best_code)
        if self.problem.workload.schedule == "inflight" and plan.requests_per_rank is None:
            plan = dataclasses.replace(plan, requests_per_rank=self.best_requests_per_rank)
        return plan

    def least_infeasible_plan(self) -> Plan | None:
        return None if self._least_code is None else self.space.decode(self._least_code)

    def infeasibility_message(self, *, proven: bool) -> str:
        w = self.problem.workload
        if self.n_evals == 0:
            return "no plan was evaluated; raise the budget"
        scope = (
            f"no plan in the space (proven; {self.n_evals} priced for this message)"
            if proven
            else f"none of the {self.n_evals} plans tried"
        )
        hints = []
        if self._violation_counts["memory"] == self.n_evals:
            hints.append(
                f"fits in memory (smallest footprint {self._closest['memory_gb']:.1f} GB per GPU "
                f"> {self.problem.cluster.accelerator.hbm_gb:g} GB): use more GPUs, "
                "fp8 weights (weight_dtype) or a shorter context"
            )
        if w.tpot_ms is not None and self._violation_counts["tpot_slo"] == self.n_evals:
            hints.append(
                f"meets TPOT <= {w.tpot_ms:g} ms "
                f"(fastest priced {self._closest['tpot_ms']:.2f} ms): "
                "relax the TPOT SLO (tpot_ms) or lower the batch"
            )
        if w.ttft_ms is not None and self._violation_counts["ttft_slo"] == self.n_evals:
            hints.append(
                f"meets TTFT <= {w.ttft_ms:g} ms "
                f"(fastest priced {self._closest['ttft_ms']:.1f} ms): "
                "relax the TTFT SLO (ttft_ms) or shorten the prompt"
            )
        if not hints:
            hints.append("meets memory and the SLOs together; relax an SLO or add GPUs")
        return f"{scope} " + "; and ".join(hints)
