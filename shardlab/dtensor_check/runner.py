"""Running checks: one process per rank over gloo (a plan's forward pass), or one
process on the fake process group (every edge's redistribution)."""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

from shardlab.dtensor_check.compare import (
    ATOL,
    RTOL,
    Call,
    CheckResult,
    PairResult,
    edge_layout_pairs,
    predicted_calls,
)
from shardlab.dtensor_check.edges import torch_placement
from shardlab.dtensor_check.recording import _kind_of, _Recorder, _Where
from shardlab.dtensor_check.styles import Styles, apply_plan
from shardlab.dtensor_check.tiny_configs import tiny_problem
from shardlab.dtensor_check.transformer import TinyTransformer
from shardlab.errors import ShardlabError
from shardlab.problems.model import Model
from shardlab.problems.operators import (
    TOKEN_IDS_LAYOUT,
)
from shardlab.problems.placements import MESH_AXES, Layout
from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem

# How worker processes start. Importing torch.distributed.tensor takes ~5 s of CPU, so
# "forkserver" (default) imports it once in a server that has run no torch kernel and
# forks every worker from there; "spawn" imports it in every worker; "fork" copies the
# caller (fastest, but unsafe if the caller has started OpenMP threads).
START_METHOD = os.environ.get("SHARDLAB_DTENSOR_START", "forkserver")


# -- DTensor's CPU all-to-all ---------------------------------------------------------------


def _shard_dim_alltoall_native(input, gather_dim, shard_dim, mesh, mesh_dim):
    """DTensor's ``Shard(a) -> Shard(b)`` as it runs on CUDA: one all-to-all."""
    from torch.distributed import _functional_collectives as funcol

    group = funcol._resolve_group((mesh, mesh_dim))
    return torch.ops._dtensor.shard_dim_alltoall(
        input, gather_dim, shard_dim, funcol._group_or_group_name(group)
    )


@contextlib.contextmanager
def _native_alltoall(enabled: bool) -> Iterator[None]:
    from torch.distributed.tensor import placement_types

    if not enabled or not hasattr(placement_types, "shard_dim_alltoall"):
        yield
        return
    old = placement_types.shard_dim_alltoall
    placement_types.shard_dim_alltoall = _shard_dim_alltoall_native
    try:
        yield
    finally:
        placement_types.shard_dim_alltoall = old


@dataclass(frozen=True, kw_only=True)
class _Case:
    name: str
    model: Model
    plan: Plan
    batch: int
    input_len: int
    styles: Styles
    cpu_alltoall_fallback: bool
    seed: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, cases: list[_Case], outdir: str) -> None:
    torch.set_num_threads(1)
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    logging.getLogger("torch.distributed.tensor._collective_utils").setLevel(logging.ERROR)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    results = []
    try:
        for case in cases:
            t0 = time.perf_counter()
            results.append(_run_case(rank, world, case))
            results[-1]["seconds"] = time.perf_counter() - t0
    finally:
        with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(results, f)
        dist.destroy_process_group()


_MESHES: dict[tuple[int, int], DeviceMesh] = {}


def _run_case(rank: int, world: int, case: _Case) -> dict[str, Any]:
    d = case.plan.degrees
    try:
        if d.group != world:
            raise ShardlabError(f"{case.name}: plan needs {d.group} ranks, {world} are running")
        shape = (d.dp_attn, d.tp)
        if shape not in _MESHES:  # one set of process groups per shape and process
            _MESHES[shape] = init_device_mesh("cpu", shape, mesh_dim_names=MESH_AXES)
        mesh = _MESHES[shape]
        axis_of_group = {dist.group.WORLD.group_name: "group"}
        for axis in MESH_AXES:
            axis_of_group[mesh.get_group(axis).group_name] = axis
        ref = TinyTransformer(case.model, groups=d.tp, seed=case.seed)
        g = torch.Generator().manual_seed(case.seed + 1)
        ids = torch.randint(0, case.model.vocab_size, (case.batch, case.input_len), generator=g)
        with torch.no_grad():
            want = ref(ids)
        net = apply_plan(copy.deepcopy(ref), case.plan, mesh, styles=case.styles)
        ids_mesh = mesh if case.styles == "mesh" else mesh["tp"]
        if case.styles == "mesh":
            placements = [torch_placement(p) for p in TOKEN_IDS_LAYOUT]
            dids = distribute_tensor(ids, ids_mesh, placements, src_data_rank=None)
        else:
            rows = case.batch // d.dp_attn
            dp_rank = dist.get_rank(mesh.get_group("dp"))
            mine = ids[dp_rank * rows : (dp_rank + 1) * rows]
            dids = DTensor.from_local(mine, ids_mesh, [Replicate()], run_check=False)
            want = want[dp_rank * rows : (dp_rank + 1) * rows]
        rec = _Recorder(axis_of_group)
        with torch.no_grad(), _native_alltoall(not case.cpu_alltoall_fallback), rec:
            out = net(dids)
        _Where.label = "compare"
        got = out.full_tensor()
        err = float((got - want).abs().max())
        match = bool(torch.allclose(got, want, atol=ATOL, rtol=RTOL))
        counts = Counter()
        for op, n in rec.get_comm_counts().items():
            counts[_kind_of(str(op))] += n
        return {
            "seen": rec.seen,
            "counts": dict(counts),
            "err": err,
            "match": match,
            "error": "",
        }
    except Exception as exc:  # reported per case; the other cases still run
        return {
            "seen": [],
            "counts": {},
            "err": math.inf,
            "match": False,
            "error": f"rank {rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}",
        }


@dataclass(frozen=True, kw_only=True)
class CheckCase:
    """One plan to run: the problem (model, batch, input length) and the plan."""

    problem: Problem
    plan: Plan
    name: str = ""
    styles: Styles = "mesh"
    cpu_alltoall_fallback: bool = False
    seed: int = 0


def _launch(fn: Any, args: tuple, nprocs: int) -> list[Any]:
    """Run ``fn(rank, *args, outdir)`` in ``nprocs`` processes; each pickles its result."""
    if START_METHOD == "forkserver":
        mp.set_forkserver_preload([__name__])
    with tempfile.TemporaryDirectory(prefix="shardlab-dtensor-") as outdir:
        mp.start_processes(fn, args=(*args, outdir), nprocs=nprocs, start_method=START_METHOD)
        out = []
        for r in range(nprocs):
            with open(os.path.join(outdir, f"rank{r}.pkl"), "rb") as f:
                out.append(pickle.load(f))
    return out


def run_checks(cases: Sequence[CheckCase], world_size: int) -> list[CheckResult]:
    """Run every case in one set of ``world_size`` processes (one process group)."""
    inner = []
    for i, c in enumerate(cases):
        w = c.problem.workload
        if w.phase != "prefill" or w.schedule != "static":
            raise ShardlabError(f"{c.name or i}: the check runs a static prefill workload")
        if w.batch % c.plan.degrees.group:
            raise ShardlabError(
                f"{c.name or i}: batch {w.batch} does not split evenly over "
                f"{c.plan.degrees.group} ranks"
            )
        c.problem.space.encode(c.plan)  # raises if the plan is outside the space
        inner.append(
            _Case(
                name=c.name or f"case{i}",
                model=c.problem.model,
                plan=c.plan,
                batch=w.batch,
                input_len=w.input_len,
                styles=c.styles,
                cpu_alltoall_fallback=c.cpu_alltoall_fallback,
                seed=c.seed,
            )
        )
    requests_per_rank = _launch(_worker, (world_size, _free_port(), inner), world_size)
    results = []
    for i, (c, case) in enumerate(zip(cases, inner, strict=True)):
        ranks = [requests_per_rank[r][i] for r in range(world_size)]
        results.append(_merge(case, c, ranks, world_size))
    return results


def _merge(case: _Case, c: CheckCase, ranks: list[dict], world: int) -> CheckResult:
    errors = [r["error"] for r in ranks if r["error"]]
    seen = [r["seen"] for r in ranks]
    observed: list[Call] = []
    spread: list[tuple[float, float]] = []
    if not errors:
        shapes = {tuple((s.where, s.kind, s.axis) for s in rank_seen) for rank_seen in seen}
        if len(shapes) != 1:
            errors.append(
                "ranks issued different collective sequences: "
                + " | ".join(
                    ", ".join(f"{s.where} {s.kind}[{s.axis}]" for s in rank_seen)
                    for rank_seen in seen
                )
            )
        else:
            for calls in zip(*seen, strict=True):
                sizes = [s.elements for s in calls]
                first = calls[0]
                observed.append(
                    Call(
                        where=first.where,
                        kind=first.kind,
                        axis=first.axis,
                        elements=sum(sizes) / world,
                    )
                )
                spread.append((min(sizes), max(sizes)))
    return CheckResult(
        name=case.name,
        world_size=world,
        styles=case.styles,
        outputs_match=all(r["match"] for r in ranks),
        max_abs_error=max(r["err"] for r in ranks),
        observed=tuple(observed),
        observed_spread=tuple(spread),
        comm_counts=ranks[0]["counts"],
        predicted=predicted_calls(c.problem, c.plan),
        error="\n".join(errors[:1]),
        seconds=max(r.get("seconds", 0.0) for r in ranks),
    )


def run_check(
    problem: Problem,
    plan: Plan,
    world_size: int,
    *,
    styles: Styles = "mesh",
    cpu_alltoall_fallback: bool = False,
) -> CheckResult:
    """Run ``plan`` on ``world_size`` CPU processes and compare with the cost model."""
    case = CheckCase(
        problem=problem,
        plan=plan,
        name="plan",
        styles=styles,
        cpu_alltoall_fallback=cpu_alltoall_fallback,
    )
    return run_checks([case], world_size)[0]


def check_redistributions(
    dp: int, tp: int, *, model: Model | None = None, cpu_alltoall_fallback: bool = False
) -> list[PairResult]:
    """Redistribute a ``[batch, seq, features]`` DTensor between every layout pair a valid
    plan can put on an edge, on a ``(dp, tp)`` mesh, and compare with the cost model.

    Runs in one process on torch's fake process group (collectives are issued and
    recorded but move no data), so any mesh shape can be checked on one CPU.
    """
    from shardlab.costmodel import ACT_BYTES, CostContext

    model = model or tiny_problem("moe").model
    degrees = Degrees(dp_attn=dp, tp=tp, etp=dp * tp)
    pairs = edge_layout_pairs(model, degrees)
    observed = _launch(_pairs_worker, (dp, tp, list(pairs), cpu_alltoall_fallback), 1)[0]
    problem = Problem.build(model, f"h100x{dp * tp}", "prefill")
    ctx = CostContext(problem, degrees, np.array([1]))
    full, _ = _pair_shape(dp, tp)
    out = []
    for (src, dst), seen in zip(pairs, observed, strict=True):
        steps = ctx.redistribution_steps(src, dst, np.array([math.prod(full) * ACT_BYTES]))
        pred = tuple(
            Call(where="", kind=k, axis=a, elements=float(m[0]) / ACT_BYTES) for k, a, m in steps
        )
        obs = tuple(Call(where="", kind=s.kind, axis=s.axis, elements=s.elements) for s in seen)
        out.append(
            PairResult(src=src, dst=dst, edges=tuple(pairs[src, dst]), predicted=pred, observed=obs)
        )
    return out


def _pair_shape(dp: int, tp: int) -> tuple[tuple[int, int, int], int]:
    n = dp * tp
    return (2 * n, 2, 2 * n), n


def _pairs_worker(
    rank: int,
    dp: int,
    tp: int,
    pairs: list[tuple[Layout, Layout]],
    fallback: bool,
    outdir: str,
) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    logging.getLogger("torch.distributed.tensor._collective_utils").setLevel(logging.ERROR)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dp * tp)
    try:
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=MESH_AXES)
        axis_of_group = {mesh.get_group(a).group_name: a for a in MESH_AXES}
        shape, _ = _pair_shape(dp, tp)
        full = torch.zeros(shape)
        seen = []
        for src, dst in pairs:
            placements = [torch_placement(p) for p in src]
            as_data = [Replicate() if p.is_partial() else p for p in placements]
            local = distribute_tensor(full, mesh, as_data, src_data_rank=None).to_local()
            x = DTensor.from_local(
                local, mesh, placements, run_check=False, shape=full.shape, stride=full.stride()
            )
            rec = _Recorder(axis_of_group)
            with _native_alltoall(not fallback), rec:
                x.redistribute(mesh, [torch_placement(p) for p in dst])
            seen.append(rec.seen)
        with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(seen, f)
    finally:
        dist.destroy_process_group()
