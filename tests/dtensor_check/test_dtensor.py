"""Plans executed under PyTorch DTensor issue the collectives the cost model predicts.

Each plan runs once on 2 or 4 CPU processes (gloo); the three checks per plan read the
same run: outputs equal the unsharded model's, collective counts by kind equal
``collectives_of``'s, and every predicted edge carries the predicted sequence of
``(kind, mesh axis, elements)``. See :mod:`shardlab.dtensor_check`.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import replace
from functools import cache

import pytest
import torch

from shardlab.costmodel.experts import dispatch_copies
from shardlab.dtensor_check import (
    COUNT_DTYPE,
    EXACT_RTOL,
    ROUTING_Z,
    CheckCase,
    CheckResult,
    TinyTransformer,
    check_redistributions,
    copies_moments,
    override_options,
    predicted_calls,
    routing_rtol,
    run_checks,
    tiny_problem,
    torch_styles_supported,
)
from shardlab.problems.plan import Degrees

SP_LAYER = {"residual": "seq_sharded", "attn_norm": "seq_sharded", "ffn_norm": "seq_sharded"}
SP_HEAD = {"final_norm": "seq_sharded"}
TOKEN_ATTENTION = {"qkv_proj": "seq_sharded", "attention": "seq_sharded", "o_proj": "seq_sharded"}
FULL_FFN = {"ffn_up": "column_full", "ffn_down": "row_full"}

# MoE problems run 32 tokens per request so that the routed dispatch sizes (compared in
# expectation) average over enough tokens.
MOE_LEN = 32


def _dense(cluster: str, **kw) -> Callable:
    return lambda: tiny_problem("dense", cluster, **kw)


def _moe(cluster: str) -> Callable:
    return lambda: tiny_problem("moe", cluster, input_len=MOE_LEN)


def _kind(kind: str, cluster: str) -> Callable:
    """Token mixers whose placements are new: Gemma 4's per-kind heads with K = V and
    KV shared across layers, gated DeltaNet and KDA states split by heads, MLA's latent
    and DSA's indexer whole on every rank while the heads split."""
    return lambda: tiny_problem(kind, cluster)  # type: ignore[arg-type]


NEW_KINDS = ("gemma4", "gdn", "kda", "dsa")


def _case(problem: Callable, degrees: Degrees, layers=None, head=None, **kw) -> Callable:
    only = kw.pop("only", None)

    def build(name: str) -> CheckCase:
        p = problem()
        plan = override_options(p, p.space.megatron_plan(degrees), layers, head, only=only)
        return CheckCase(problem=p, plan=plan, name=name, **kw)

    return build


TP2 = Degrees(tp=2, etp=2)
TP4 = Degrees(tp=4, etp=4)
DP2 = Degrees(dp_attn=2, etp=2)
MESH_2X2 = Degrees(tp=2, dp_attn=2, etp=4)

CASES: dict[int, dict[str, Callable]] = {
    2: {
        "megatron-tp2": _case(_dense("h100x2"), TP2),
        "megatron-tp2-torch": _case(_dense("h100x2"), TP2, styles="torch"),
        "sp-tp2": _case(_dense("h100x2"), TP2, SP_LAYER, SP_HEAD),
        "sp-tp2-torch": _case(_dense("h100x2"), TP2, SP_LAYER, SP_HEAD, styles="torch"),
        "sp-sharded-sampler-tp2": _case(
            _dense("h100x2"), TP2, SP_LAYER, {**SP_HEAD, "sampler": "seq_sharded"}
        ),
        "token-attention-tp2": _case(_dense("h100x2"), TP2, TOKEN_ATTENTION),
        "token-attention-tp2-torch": _case(_dense("h100x2"), TP2, TOKEN_ATTENTION, styles="torch"),
        "replicated-small-ops-tp2": _case(
            _dense("h100x2"), TP2, None, {"embedding": "replicated", "lm_head": "replicated"}
        ),
        "replicated-everything-tp2": _case(
            _dense("h100x2"),
            TP2,
            {op: "replicated" for op in ("qkv_proj", "attention", "o_proj", "ffn_up", "ffn_down")},
            {"embedding": "replicated", "lm_head": "replicated"},
        ),
        "per-layer-sp-then-megatron-tp2": _case(
            _dense("h100x2", tie="layer"), TP2, SP_LAYER, None, only=[0]
        ),
        "full-ffn-dp2": _case(_dense("h100x2"), DP2, FULL_FFN),
        "moe-alltoall-tp2": _case(_moe("h100x2"), Degrees(tp=2, ep=2, etp=1)),
        "moe-allgather-ep2": _case(
            _moe("h100x2"), Degrees(tp=2, ep=2, etp=1), {"experts": "allgather"}
        ),
        "moe-allgather-etp2": _case(_moe("h100x2"), Degrees(tp=2, ep=1, etp=2)),
        "moe-sp-replicated-router-tp2": _case(
            _moe("h100x2"), Degrees(tp=2, ep=1, etp=2), {**SP_LAYER, "router": "replicated"}
        ),
        **{f"{k}-megatron-tp2": _case(_kind(k, "h100x2"), TP2) for k in NEW_KINDS},
        "dsa-megatron-tp2-torch": _case(_kind("dsa", "h100x2"), TP2, styles="torch"),
        **{f"{k}-sp-tp2": _case(_kind(k, "h100x2"), TP2, SP_LAYER, SP_HEAD) for k in NEW_KINDS},
        **{
            f"{k}-token-attention-tp2": _case(_kind(k, "h100x2"), TP2, TOKEN_ATTENTION)
            for k in NEW_KINDS
        },
    },
    4: {
        "megatron-tp4": _case(_dense("h100x4"), TP4),
        "sp-tp4": _case(_dense("h100x4"), TP4, SP_LAYER, SP_HEAD),
        "megatron-2x2": _case(_dense("h100x4"), MESH_2X2),
        "megatron-2x2-torch": _case(_dense("h100x4"), MESH_2X2, styles="torch"),
        "sp-2x2": _case(_dense("h100x4"), MESH_2X2, SP_LAYER, SP_HEAD),
        "full-ffn-2x2": _case(_dense("h100x4"), MESH_2X2, FULL_FFN),
        "sp-full-ffn-2x2": _case(_dense("h100x4"), MESH_2X2, {**SP_LAYER, **FULL_FFN}),
        "column-full-then-row-2x2": _case(
            _dense("h100x4"), MESH_2X2, {"ffn_up": "column_full", "ffn_down": "row"}
        ),
        "moe-sp-alltoall-2x2": _case(
            _moe("h100x4"),
            Degrees(tp=2, dp_attn=2, ep=4, etp=1),
            {**SP_LAYER, "router": "seq_sharded"},
        ),
        "moe-allgather-2x2": _case(
            _moe("h100x4"), Degrees(tp=2, dp_attn=2, ep=4, etp=1), {"experts": "allgather"}
        ),
        **{f"{k}-megatron-2x2": _case(_kind(k, "h100x4"), MESH_2X2) for k in NEW_KINDS},
        **{f"{k}-megatron-tp4": _case(_kind(k, "h100x4"), TP4) for k in ("gdn", "kda", "dsa")},
    },
}

# Not a cost-model check: the stock DTensor CPU path (see test_dtensor_cpu_fallback).
FALLBACK = "sp-sharded-sampler-tp2-cpu-fallback"

PARAMS = [pytest.param(w, name, id=name) for w, cases in CASES.items() for name in cases]


@cache
def _results(world: int) -> dict[str, CheckResult]:
    cases = [build(name) for name, build in CASES[world].items()]
    if world == 2:
        base = CASES[2]["sp-sharded-sampler-tp2"](FALLBACK)
        cases.append(replace(base, cpu_alltoall_fallback=True))
    return {r.name: r for r in run_checks(cases, world)}


# -- without processes -------------------------------------------------------------------


@pytest.mark.parametrize(("world", "name"), PARAMS)
def test_plan_is_in_the_space(world: int, name: str) -> None:
    case = CASES[world][name](name)
    case.problem.space.encode(case.plan)
    assert case.plan.degrees.group == world


@pytest.mark.parametrize("kind", ["dense", "moe", *NEW_KINDS])
def test_reference_model_does_not_depend_on_head_grouping(kind: str) -> None:
    p = tiny_problem(kind)  # type: ignore[arg-type]
    ids = torch.randint(0, p.model.vocab_size, (4, 8), generator=torch.Generator().manual_seed(1))
    groups = 2 if kind == "gemma4" else 4  # Gemma 4's global layers have 2 KV heads
    with torch.no_grad():
        one = TinyTransformer(p.model, groups=1, seed=3)(ids)
        four = TinyTransformer(p.model, groups=groups, seed=3)(ids)
    assert one.shape == (4, 1, p.model.vocab_size)
    torch.testing.assert_close(one, four, atol=1e-5, rtol=1e-5)


def test_prediction_is_in_float32_elements() -> None:
    p = tiny_problem("dense", batch=4, input_len=8)
    calls = predicted_calls(p, p.space.megatron_plan(TP2))
    tokens = 4 * 8 * p.model.hidden_size
    assert [(c.kind, c.elements) for c in calls] == [("all_reduce", tokens)] * 5 + [
        ("all_gather", 4 * p.model.vocab_size)  # one fp32 logit row per request
    ]


@pytest.mark.parametrize(("experts", "top_k", "ep"), [(8, 2, 2), (8, 2, 4), (8, 2, 8), (16, 4, 4)])
def test_copies_moments_by_enumeration(experts: int, top_k: int, ep: int) -> None:
    """Mean and variance of a token's distinct destination ranks over every top-k set."""
    local = experts // ep
    ranks = [
        len({e // local for e in chosen})
        for chosen in itertools.combinations(range(experts), top_k)
    ]
    mean, var = copies_moments(ep, top_k, experts)
    assert math.isclose(mean, statistics.fmean(ranks))
    assert math.isclose(mean, dispatch_copies(ep, top_k, experts))
    assert math.isclose(var, statistics.pvariance(ranks), abs_tol=1e-12)


MOE_ALLTOALL = {2: ["moe-alltoall-tp2"], 4: ["moe-sp-alltoall-2x2"]}


@pytest.mark.parametrize(("world", "name"), [(w, n) for w, ns in MOE_ALLTOALL.items() for n in ns])
def test_moe_alltoall_prediction_units(world: int, name: str) -> None:
    """Per MoE layer: counts as ep int32 values (exact), dispatch and combine in float32
    elements of the hidden rows, compared within the routing tolerance."""
    case = CASES[world][name](name)
    p, d = case.problem, case.plan.degrees
    moe = p.model.moe
    phases = ("experts counts", "experts dispatch", "experts combine")
    calls = [c for c in predicted_calls(p, case.plan) if c.where.endswith(phases)]
    assert [c.where.split(": ")[1] for c in calls] == [
        "experts counts",
        "experts dispatch",
        "experts combine",
    ]
    counts, dispatch, combine = calls
    assert COUNT_DTYPE.itemsize == 4
    assert (counts.kind, counts.axis, counts.elements, counts.rtol) == (
        "all_to_all",
        "ep",
        d.ep,
        EXACT_RTOL,
    )
    tokens = p.workload.batch * p.workload.input_len
    rows = tokens / d.group * dispatch_copies(d.ep, moe.top_k, moe.num_experts)
    for c in (dispatch, combine):
        assert math.isclose(c.elements, rows * p.model.hidden_size)
        assert c.rtol == routing_rtol(d.ep, moe.top_k, moe.num_experts, tokens)


def _copies_per_token(problem, ep: int, seed: int) -> float:
    """Mean distinct destination ranks per token in the reference model's MoE layer,
    for the ids ``run_checks`` feeds it with ``seed`` (what the sharded run routes)."""
    m = problem.model
    w = problem.workload
    net = TinyTransformer(m, seed=seed)
    logits = []
    for i, kind in enumerate(m.layer_kinds):
        if kind == "moe":
            net.layers[i].experts.register_forward_hook(lambda _m, a, _o: logits.append(a[1]))
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, m.vocab_size, (w.batch, w.input_len), generator=g)
    with torch.no_grad():
        net(ids)
    assert len(logits) == 1
    idx = logits[0].reshape(-1, m.moe.num_experts).topk(m.moe.top_k, -1).indices
    dest = idx // (m.moe.num_experts // ep)
    return float(sum((dest == r).any(1) for r in range(ep)).double().mean())


@pytest.mark.parametrize("ep", [2, 4])
def test_routing_tolerance_covers_the_tiny_configs(ep: int) -> None:
    """The tiny MoE model's routing over 100 seeds: centred on ``dispatch_copies`` (no
    bias for the tolerance to hide) and spread less than the tolerance allows."""
    p = _moe(f"h100x{ep}")()
    moe = p.model.moe
    tokens = p.workload.batch * p.workload.input_len
    rtol = routing_rtol(ep, moe.top_k, moe.num_experts, tokens)
    want = dispatch_copies(ep, moe.top_k, moe.num_experts)
    dev = [_copies_per_token(p, ep, seed) / want - 1 for seed in range(100)]
    assert abs(statistics.fmean(dev)) < rtol / math.sqrt(len(dev))  # 3 s.e. of the mean
    assert ROUTING_Z * statistics.stdev(dev) <= rtol
    assert max(map(abs, dev)) <= rtol


def test_torch_styles_cannot_gather_tokens_over_dp() -> None:
    p = tiny_problem("dense", "h100x2")
    plan = override_options(p, p.space.megatron_plan(DP2), FULL_FFN)
    assert not torch_styles_supported(plan, p.model)
    assert torch_styles_supported(p.space.megatron_plan(TP2), p.model)


# -- executed under DTensor --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("world", "name"), PARAMS)
def test_outputs_equal_unsharded_model(world: int, name: str) -> None:
    r = _results(world)[name]
    assert not r.error, r.error
    assert r.outputs_match, r.report()


@pytest.mark.slow
@pytest.mark.parametrize(("world", "name"), PARAMS)
def test_collective_counts_equal_prediction(world: int, name: str) -> None:
    r = _results(world)[name]
    assert not r.error, r.error
    assert r.comm_counts == r.observed_counts  # CommDebugMode and the recorder agree
    assert r.comm_counts == r.predicted_counts, r.report()


@pytest.mark.slow
@pytest.mark.parametrize(("world", "name"), PARAMS)
def test_elements_per_collective_equal_prediction(world: int, name: str) -> None:
    r = _results(world)[name]
    assert not r.error, r.error
    mismatches = r.edge_mismatches(unpredicted=False)
    assert not mismatches, "\n".join(mismatches)


@pytest.mark.slow
@pytest.mark.parametrize(("world", "name"), [(w, n) for w, ns in MOE_ALLTOALL.items() for n in ns])
def test_moe_alltoall_issues_counts_dispatch_combine(world: int, name: str) -> None:
    """Three all-to-alls per MoE layer over ep, in order; the counts are ep values."""
    r = _results(world)[name]
    assert not r.error, r.error
    p = CASES[world][name](name).problem
    ep = CASES[world][name](name).plan.degrees.ep
    for i, kind in enumerate(p.model.layer_kinds):
        mine = [
            c
            for c in r.observed
            if c.where.startswith(f"layer{i}: experts ") and "->" not in c.where
        ]
        if kind != "moe":
            assert not mine
            continue
        assert [(c.where, c.kind, c.axis) for c in mine] == [
            (f"layer{i}: experts {phase}", "all_to_all", "ep")
            for phase in ("counts", "dispatch", "combine")
        ]
        assert mine[0].elements == ep
        assert mine[1].elements == mine[2].elements  # routing columns not counted


@pytest.mark.slow
def test_dtensor_cpu_fallback() -> None:
    """Stock DTensor on a CPU mesh turns Shard(hid) -> Shard(tok) into an all-gather.

    The check patches that back to DTensor's all-to-all (what CUDA runs); this test
    documents the unpatched behaviour, so that the patch can go when torch drops it.
    """
    r = _results(2)[FALLBACK]
    assert not r.error, r.error
    assert r.outputs_match
    sampler = [c for c in r.observed if c.where == "lm_head -> sampler"]
    predicted = [c for c in r.predicted if c.where == "lm_head -> sampler"]
    assert [(c.kind, c.axis) for c in predicted] == [("all_to_all", "tp")]
    assert [(c.kind, c.axis) for c in sampler] == [("all_gather", "tp")]
    assert sampler[0].elements == 2 * predicted[0].elements  # tp x the all-to-all buffer


# -- every edge's layout pair, on simulated meshes ---------------------------------------


@pytest.mark.parametrize(("dp", "tp"), [(1, 4), (4, 1), (2, 2), (2, 4)])
def test_every_edge_redistribution_matches_dtensor(dp: int, tp: int) -> None:
    """All (producer out, consumer inp) pairs plans can put on an edge, on torch's fake
    process group: the cost model's steps against what DTensor's redistribute issues."""
    results = check_redistributions(dp, tp)
    assert results
    bad = [str(r) for r in results if not r.ok]
    assert not bad, f"{len(bad)} of {len(results)} layout pairs differ:\n" + "\n".join(bad)


def test_reference_dsa_attends_to_the_indexer_top_k_and_shares_it() -> None:
    p = tiny_problem("dsa")
    net = TinyTransformer(p.model, seed=3)
    ids = torch.randint(0, p.model.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        net(ids)
    first, second = (block.attention for block in net.layers)
    assert second.source is first and first.picked is not None
    keys = first.picked.sum(-1)  # [batch, query]: keys each query reads
    assert keys.max() == 4 and keys[:, :4].tolist() == [[1, 2, 3, 4]] * 2
