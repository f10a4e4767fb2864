"""Run several methods on several instances and seeds, and write the comparison.

Every (instance, method, seed, budget) run goes to a worker (a local process or a Ray
task, :mod:`shardlab.executors`) and, as it finishes, to ``results/<name>/runs.jsonl``
(:mod:`shardlab.compare.journal`): a comparison stopped part-way (Ctrl-C, a kill) loses only
the runs in flight, and re-running the same command runs only the ones missing.
Every record carries its run's key, so a clone that has ``results.json`` (committed)
but not the journal (not committed) starts the journal from it and runs only what
``results.json`` lacks: a committed comparison is extended (more seeds, methods,
instances) without running it again.
Results are gathered into ``results/<name>/``: ``results.json`` (every run, with its
history and plan), ``results.csv`` (one row per run), ``summary.md`` (per instance and
method, means over seeds) and ``convergence.png`` (best-so-far quality against
evaluations, log x).

Quality of a plan is its objective relative to the best known on the instance (the
CP-SAT optimum when CP-SAT proved one, else the best any run found): ``obj / best``
for throughput objectives, ``best / obj`` for latency (objectives are negative).
The ``megatron`` baseline is always run, so every method has a ratio to it.

Several budgets (``budgets``): a method whose search does not depend on its budget
(``Solver.anytime``) runs once, at the largest, and its best at each smaller budget is
read off its history (the best after that many evaluations is what a run with that
budget would have returned); any other method (simulated annealing, whose schedule
spans the budget) runs once per budget. Exact methods and the baseline run once.
"""

from shardlab.compare.report import read_anchor, summarize, write_results
from shardlab.compare.runs import DISAGG_OPTIMUM, FREE_OPTIMUM, Case, Task, run_task, task_key
from shardlab.compare.schedule import run_comparison
from shardlab.compare.spec import Comparison, comparison

__all__ = [
    "DISAGG_OPTIMUM",
    "FREE_OPTIMUM",
    "Case",
    "Comparison",
    "Task",
    "comparison",
    "read_anchor",
    "run_comparison",
    "run_task",
    "summarize",
    "task_key",
    "write_results",
]
