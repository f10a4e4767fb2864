from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardlab import Degrees, Plan, Problem, ShardlabError
from shardlab.problems.degrees import option_valid
from shardlab.problems.model import LayerAttention
from shardlab.problems.operators import HEAD_OPS, layer_ops
from shardlab.problems.space import MAX_SHIFT

PROBLEMS = [
    ("llama-3.1-70b", "h100x8", "kind"),
    ("deepseek-v3", "h100x64", "kind"),
    ("deepseek-v3", "h100x64", "layer"),
    ("gpt-oss-120b", "h100x16", "layer"),
    ("qwen3-235b-a22b", "h200x16", "kind"),
]


@pytest.fixture(scope="module", params=PROBLEMS, ids=lambda p: "-".join(p))
def problem(request: pytest.FixtureRequest) -> Problem:
    model, cluster, tie = request.param
    return Problem.build(model, cluster, tie=tie)


def _degrees_by_brute_force(problem: Problem) -> set[Degrees]:
    """Every degree tuple of the rules as DESIGN.md states them, found by trying every
    product of the GPU count's divisors (independent of the space's own enumeration)."""
    m, n = problem.model, problem.cluster.num_gpus
    divisors = [k for k in range(1, n + 1) if n % k == 0]

    def splits(a: LayerAttention, tp: int) -> bool:
        if a.linear:
            assert m.linear is not None
            return m.linear.k_heads % tp == 0 and m.linear.v_heads % tp == 0
        kv = m.mla is not None or a.kv_heads % tp == 0 or tp % a.kv_heads == 0
        return a.heads % tp == 0 and kv

    max_pp = 1 if any(a.kv_shared for a in m.attention_layers) else m.num_layers
    out = set()
    for replicas, pp, tp, dp, ep, etp in itertools.product(divisors, repeat=6):
        if replicas * pp * tp * dp != n or ep * etp != tp * dp or pp > max_pp:
            continue
        if not all(splits(a, tp) for a in m.attentions):
            continue
        moe_ok = (
            m.moe.num_experts % ep == 0 and m.moe.expert_ffn_size % etp == 0
            if m.moe is not None
            else ep == 1
        )
        if moe_ok:
            out.add(Degrees(replicas=replicas, pp=pp, tp=tp, dp_attn=dp, ep=ep, etp=etp))
    return out


def test_the_space_holds_exactly_the_valid_degree_tuples(problem: Problem) -> None:
    """No tuple breaks a rule, and none that keeps them all is missing."""
    tuples = problem.space.degree_tuples
    assert len(set(tuples)) == len(tuples)
    assert set(tuples) == _degrees_by_brute_force(problem)


def test_known_tuples_present_and_invalid_ones_absent() -> None:
    ds = Problem.build("deepseek-v3", "h100x64").space
    tuples = set(ds.degree_tuples)
    # DeepSeek's own deployment style: attention DP 8 x TP 1 per node... over 64 GPUs, EP 64.
    assert Degrees(replicas=1, pp=1, tp=1, dp_attn=64, ep=64, etp=1) in tuples
    assert Degrees(replicas=8, pp=1, tp=8, dp_attn=1, ep=8, etp=1) in tuples
    assert Degrees(replicas=1, pp=8, tp=8, dp_attn=1, ep=1, etp=8) in tuples
    assert not any(d.tp == 3 or d.ep == 3 for d in tuples)
    llama = Problem.build("llama-3.1-70b", "h100x16").space
    assert all(d.tp <= 16 and d.ep == 1 for d in llama.degree_tuples)
    # tp = 16 keeps 64 heads divisible and is a multiple of the 8 KV heads.
    assert any(d.tp == 16 for d in llama.degree_tuples)
    mixtral = Problem.build("mixtral-8x7b", "h100x16").space
    assert not any(d.ep == 16 for d in mixtral.degree_tuples)  # only 8 experts
    with pytest.raises(ShardlabError, match="not valid"):
        ds.degree_index(Degrees(replicas=1, pp=64, tp=1, dp_attn=1, ep=1, etp=1))  # > 61 layers


def test_sample_is_valid_and_deterministic(problem: Problem) -> None:
    s = problem.space
    a = s.sample(500, seed=3)
    assert a.shape == (500, s.n_vars)
    assert s.is_valid(a).all()
    assert np.array_equal(a, s.sample(500, seed=3))
    assert not np.array_equal(a, s.sample(500, seed=4))


def test_encoding_round_trip(problem: Problem) -> None:
    s = problem.space
    for row in s.sample(200, seed=0):
        plan = s.decode(row)
        assert np.array_equal(s.encode(plan), row)
        again = Plan.from_json(plan.to_json(problem.model, cluster="x"), problem.model)
        assert again == plan


def test_invalid_codes_are_detected_and_repaired(problem: Problem) -> None:
    s = problem.space
    codes = s.sample(100, seed=1)
    broken = codes.copy()
    broken[:, 1:] = s.cardinalities[1:] - 1  # last option / largest shift everywhere
    repaired = s.repair(broken)
    assert s.is_valid(repaired).all()
    assert s.is_valid(s.repair(codes)).all()
    assert np.array_equal(s.repair(codes), codes)
    out_of_range = codes[:1].copy()
    out_of_range[0, 0] = s.num_degree_tuples
    assert not s.is_valid(out_of_range)[0]
    with pytest.raises(ShardlabError):
        s.decode(out_of_range[0])


def test_per_layer_plan_needs_per_layer_space() -> None:
    per_layer = Problem.build("llama-3.1-8b", "h100x2", tie="layer").space
    tied = Problem.build("llama-3.1-8b", "h100x2", tie="kind").space
    rows = per_layer.sample(50, seed=2)
    plans = [per_layer.decode(r) for r in rows]
    untied = next(p for p in plans if not p.is_tied(per_layer.model))
    with pytest.raises(ShardlabError, match="tie='layer'"):
        tied.encode(untied)
    data = untied.to_dict(per_layer.model)
    assert "layers" in data and set(data["options"]) == {"head"}


def test_space_size_is_reported_in_log10() -> None:
    s = Problem.build("deepseek-v3", "h100x64", tie="layer").space
    assert s.log10_size() > 100  # per-layer choices: astronomically large
    small = Problem.build("llama-3.1-8b", "h100x1").space
    # One degree tuple, every option canonical: exactly one plan.
    assert small.num_degree_tuples == 1
    assert small.log10_size() == pytest.approx(0.0)


def test_plan_json_errors() -> None:
    p = Problem.build("llama-3.1-8b", "h100x2")
    plan = p.space.decode(p.space.sample(1, seed=0)[0])
    good = plan.to_dict(p.model)
    for mutate, needle in [
        (lambda d: d.update(schema="shardlab.plan/0"), "schema"),
        (lambda d: d.update(model="other"), "model"),
        (lambda d: d.update(stage_layers=[1]), "sum to"),
        (lambda d: d["degrees"].update(tp=4, etp=2), "ep \\* etp"),
        (lambda d: d["options"]["dense"].update(qkv_proj="diagonal"), "qkv_proj option"),
        (lambda d: d["options"].pop("dense"), "options.dense"),
    ]:
        import copy

        data = copy.deepcopy(good)
        mutate(data)
        with pytest.raises(ShardlabError, match=needle):
            Plan.from_dict(data, p.model)
    with pytest.raises(ShardlabError, match="not valid JSON"):
        Plan.from_json("{", p.model)


@st.composite
def encodings(draw: st.DrawFn, problem: Problem) -> np.ndarray:
    s = problem.space
    d = draw(st.integers(0, s.num_degree_tuples - 1))
    mask = s.mask(d)
    row = [d]
    for v in range(1, s.n_vars):
        row.append(draw(st.sampled_from(np.flatnonzero(mask[v]).tolist())))
    return np.array(row)


HYP_PROBLEMS = {
    "ds-layer": ("deepseek-v3", "h100x64", "layer"),
    "llama-kind": ("llama-3.1-405b", "h100x32", "kind"),
    "oss-kind": ("gpt-oss-120b", "b200x16", "kind"),
}


@pytest.fixture(scope="module", params=list(HYP_PROBLEMS))
def hyp_problem(request: pytest.FixtureRequest) -> Problem:
    model, cluster, tie = HYP_PROBLEMS[request.param]
    return Problem.build(model, cluster, tie=tie)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_valid_encodings_decode_to_valid_plans(
    hyp_problem: Problem, data: st.DataObject
) -> None:
    problem = hyp_problem
    s, m = problem.space, problem.model
    row = data.draw(encodings(problem))
    plan = s.decode(row)
    d = plan.degrees
    assert d in s.degree_tuples
    assert sum(plan.stage_layers) == m.num_layers
    for layer, opts in enumerate(plan.layer_options):
        ops = layer_ops(m, m.layer_kinds[layer])
        assert len(opts) == len(ops)
        for op, name in zip(ops, opts, strict=True):
            assert option_valid(op, op.option(name), d)
    for op, name in zip(HEAD_OPS, plan.head_options, strict=True):
        assert option_valid(op, op.option(name), d)
    base = m.num_layers / d.pp
    assert all(abs(n - base) <= 2 * MAX_SHIFT + 1 for n in plan.stage_layers)
    assert np.array_equal(s.encode(plan), row)
