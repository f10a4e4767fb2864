"""Run a plan under PyTorch DTensor and compare its collectives with the cost model's.

The cost model prices every redistribution between two operators as the collective
DTensor's ``redistribute`` would issue (:mod:`shardlab.problems.placements`). This module
checks that claim by execution, on CPU with the gloo backend:

1. :class:`TinyTransformer` is a scaled-down transformer in plain torch built from a
   :class:`~shardlab.problems.model.Model` (embedding, RMSNorm, GQA attention with
   Gemma 4's per-kind heads, K = V and shared KV, MLA with DSA's indexer, gated
   DeltaNet and KDA recurrences, SwiGLU FFN, MoE router + experts + shared expert, LM
   head; float32). Every operator of
   :mod:`shardlab.problems.operators` is one sub-module, so a plan's option maps onto it.
2. :func:`apply_plan` shards it with ``parallelize_module`` over a ``(dp, tp)``
   ``DeviceMesh``. Activations are ``[batch, seq, hidden]`` DTensors: ``S(tok)`` is
   ``Shard(0)`` (whole requests), ``S(hid)`` is ``Shard(-1)``, ``R`` is ``Replicate()``,
   ``P`` is ``Partial()``. Each operator receives its input in its option's ``inp``
   layout and produces its ``out`` layout; between a producer and a consumer the model
   calls ``DTensor.redistribute`` -- one call per edge of ``layer_edges``/``HEAD_EDGES``
   (and residual -> residual between layers), named like the cost model's trace.
   Two sets of styles exist:

   - ``styles="mesh"`` (default, any plan): :class:`OptionParallel`, a
     ``ParallelStyle`` that generalizes ``ColwiseParallel``/``RowwiseParallel``/
     ``SequenceParallel`` to the 2-D mesh (torch's own styles accept only a 1-D mesh).
     Weights become 2-D DTensors placed as the option says; linears, norms and the
     embedding run through DTensor's sharding propagation, which must produce the
     option's ``out`` layout without communicating (checked).
   - ``styles="torch"`` (plans whose operators all keep requests split over ``dp``,
     i.e. no ``column_full``/``row_full``/``allgather``): torch's own
     ``ColwiseParallel``/``RowwiseParallel``/``SequenceParallel``/
     ``PrepareModuleInputOutput`` on the 1-D ``mesh["tp"]``; each dp rank serves its own
     requests, as in torchtitan.

   Attention and the sampler compute on local shards (``PrepareModuleInputOutput``
   style). Expert routing cannot be written as a DTensor placement: the ``alltoall``
   option is an explicit DeepEP-style exchange with ``all_to_all_single`` (from
   ``torch.distributed``) over the ``ep = dp * tp`` ranks (``etp = 1``), three calls
   per MoE layer as the cost model prices them: the rows per destination rank
   (``counts``, int32), the hidden states with each row's routing ids and weights in
   extra columns (``dispatch``, one row per token and destination rank) and the
   weighted sums back (``combine``); ``allgather`` gathers every token on every rank
   (a DTensor redistribution) and returns ``Partial`` sums.
3. :func:`run_check` / :func:`run_checks` start one process per rank, run one
   static-prefill forward pass under ``CommDebugMode`` (extended to record each
   collective's size and the edge it belongs to), and compare with
   :func:`shardlab.costmodel.trace.collectives_of`: outputs against the unsharded
   model, collective counts by kind, and per edge the sequence of ``(kind, mesh axis,
   elements)``.
4. :func:`check_redistributions` redistributes a DTensor between every layout pair a
   valid plan can put on an edge, on torch's fake process group (one process, any
   mesh shape, no data moved), against ``CostContext.redistribution_steps``.

Units: the cost model counts bf16 activations (``ACT_BYTES = 2``) while the check runs
float32, so predicted elements are ``bytes / ACT_BYTES``; the logits edge is priced at
width ``2 * vocab`` (fp32 logits in bf16 units), so there it is ``bytes / (2 *
ACT_BYTES)``. The MoE count exchange is priced at ``COUNT_BYTES`` per count and runs
on int32 counts, so there it is ``bytes / COUNT_BYTES`` values. Observed elements: the
all-reduce tensor, the all-gather output, the reduce-scatter input, the all-to-all
input buffer -- the cost model's message conventions -- averaged over ranks; of the
MoE dispatch buffer only the hidden columns, not the routing columns the cost model
does not price. The dispatch and combine sizes depend on the routing: the cost model
prices their expectation under uniform routing, and they are compared within the
sampling noise of one forward pass (:func:`routing_rtol`).

DTensor on a CPU mesh replaces ``Shard(a) -> Shard(b)`` (an all-to-all on CUDA) by an
all-gather followed by a local chunk, because its code assumes gloo has no all-to-all.
gloo does have it, so by default the check routes that redistribution through
DTensor's own all-to-all op (``torch.ops._dtensor.shard_dim_alltoall``, what CUDA
runs); ``cpu_alltoall_fallback=True`` keeps the stock CPU behaviour.

Not modelled by the reference model (they change no collective): RoPE, biases, QK
norms, attention sinks, sliding windows, linear attention's short convolution,
pipeline stages (``pp = 1``).
Nothing in the solver or the CLI imports this package. Its modules, by role:
:mod:`~shardlab.dtensor_check.tiny_configs` (tiny configs and their problems),
:mod:`~shardlab.dtensor_check.transformer` (the reference model), built of
:mod:`~shardlab.dtensor_check.dense`, :mod:`~shardlab.dtensor_check.mixers` and
:mod:`~shardlab.dtensor_check.experts` (its modules),
:mod:`~shardlab.dtensor_check.recording` (what a forward pass records),
:mod:`~shardlab.dtensor_check.edges` (placements and the redistribution on each edge),
:mod:`~shardlab.dtensor_check.styles` (a plan's ``ParallelStyle`` per option),
:mod:`~shardlab.dtensor_check.compare` (the cost model's prediction and the
comparison) and :mod:`~shardlab.dtensor_check.runner` (processes and meshes).
"""

from shardlab.dtensor_check.compare import (
    ATOL,
    EXACT_RTOL,
    ROUTING_Z,
    RTOL,
    Call,
    CheckResult,
    PairResult,
    copies_moments,
    edge_layout_pairs,
    predicted_calls,
    routing_rtol,
)
from shardlab.dtensor_check.experts import COUNT_DTYPE
from shardlab.dtensor_check.runner import CheckCase, check_redistributions, run_check, run_checks
from shardlab.dtensor_check.styles import apply_plan, torch_styles_supported
from shardlab.dtensor_check.tiny_configs import override_options, tiny_config, tiny_problem
from shardlab.dtensor_check.transformer import MAX_PARAMS, TinyTransformer

__all__ = [
    "ATOL",
    "COUNT_DTYPE",
    "EXACT_RTOL",
    "MAX_PARAMS",
    "ROUTING_Z",
    "RTOL",
    "Call",
    "CheckCase",
    "CheckResult",
    "PairResult",
    "TinyTransformer",
    "apply_plan",
    "check_redistributions",
    "copies_moments",
    "edge_layout_pairs",
    "override_options",
    "predicted_calls",
    "routing_rtol",
    "run_check",
    "run_checks",
    "tiny_config",
    "tiny_problem",
    "torch_styles_supported",
]
