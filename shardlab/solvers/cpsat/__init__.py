"""CP-SAT exact search: the plan the cost model rates best, with a proof.

Decomposition. A plan's degree tuple ``d`` and the requests each attention-data-
parallel rank holds, ``C`` (the static batch; in flight, the plan's concurrency, a
decision between one and what the rank is offered) fix every table of the cost model
(:mod:`shardlab.costmodel.decompose`). The search therefore splits into subproblems
``(d, C)`` enumerated outside CP-SAT: inside one, the objective is linear in Boolean
choices, whereas ``C`` enters every table non-linearly and ``d`` changes which
options exist. Degree Booleans inside one model were not built: ``C`` would still be
enumerated, and the model would be the union of the subproblems' models without the
bounds that separate them.

Subproblems are visited in decreasing order of an upper bound on their objective
(each layer kind and the model's ends at their best joint choice of options, found
exactly by min-sum elimination over the operators' graph (:mod:`.minsum`) for every
``C`` of a degree tuple at once, ignoring memory and the pipeline's balance)
and skipped once the bound cannot beat the incumbent. Bounds also discard the
``(d, C)`` no plan can have: ``C`` requests fit for no plan, or even the time bound
misses an SLO. When a subproblem proves infeasible, a bisection over ``C`` with
*floor* models (every time at its least over ``C`` requests or more, a relaxation of
all of them; :class:`.solves.Feasibility`) finds the requests from which the degree
tuple holds no plan, and every subproblem from there on is skipped: an SLO that binds costs
a logarithmic number of proofs per degree tuple, not one per concurrency. The Megatron
rule's plan is priced first (the incumbent however early the clock runs out); each
solve is warm-started from the last plan found with its degrees when that plan meets
memory and the SLOs at its requests. The clock is read between chunks of the bounds,
between the constraint families of each model, and after every solve.

Modules: :mod:`.forms` (the regime's forms in a subproblem), :mod:`.bounds` (the
subproblems and their bounds), :mod:`.subproblem_model` (the CP-SAT model of one),
:mod:`.solves` (the solves of one run and the floor models' bisection), :mod:`.search`
(the scalar search loop), :mod:`.fronts` (the Pareto fronts), :mod:`.solver` (the
registered solver); :mod:`.chain` and :mod:`.minsum` (the layers' shortest paths and
min-sum elimination) and :mod:`.disagg` (the disaggregated search, pools solved here).

Status: ``optimal`` only when every subproblem was solved to CP-SAT's proof or
discarded by a bound; otherwise ``feasible`` with the bound and the relative gap (both None when the
clock ran out before every subproblem had a bound: :mod:`.search`).
"""

from __future__ import annotations

from shardlab.solvers.cpsat.bounds import ROUNDING, Subproblem, subproblems, valid_options
from shardlab.solvers.cpsat.forms import chain_weights, objective_of, time_function
from shardlab.solvers.cpsat.fronts import SWEEP_SLACK, SWEEP_STEP
from shardlab.solvers.cpsat.solver import CpSatSolver
from shardlab.solvers.cpsat.subproblem_model import SubproblemModel, SubSolution

__all__ = [
    "ROUNDING",
    "SWEEP_SLACK",
    "SWEEP_STEP",
    "CpSatSolver",
    "SubSolution",
    "Subproblem",
    "SubproblemModel",
    "chain_weights",
    "objective_of",
    "subproblems",
    "time_function",
    "valid_options",
]
