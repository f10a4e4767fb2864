"""The engine capability model and ``--space engine``: every configuration is a plan of
the free space the engine can launch, every solver keeps to it, CP-SAT proves the
engine optimum and it never beats the free optimum."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from shardlab.cli import main
from shardlab.errors import ShardlabError
from shardlab.problems.engines import ENGINES, capability, option_coverage
from shardlab.problems.operators import layer_ops
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from shardlab.solvers import Budget
from shardlab.solvers.exhaustive import ExhaustiveSolver
from shardlab.solvers.registry import available_solvers, get_solver

# (model, cluster, workload): dense, few-expert MoE, wide MoE with dense layers
PROBLEMS = [
    ("llama-3.1-70b", "h100x8", "chat"),
    ("mixtral-8x7b", "h100x4", "chat"),
    ("qwen3-30b-a3b", "h100x8", "chat"),
    ("deepseek-v3", "h200x16", "chat"),
]
# Options no engine has a feature for (see shardlab.problems.engines).
NO_EQUIVALENT = {
    ("head", "embedding", "seq_sharded"),
    ("head", "lm_head", "seq_sharded"),
    ("head", "sampler", "seq_sharded"),
}


def engine_problem(model: str, cluster: str, workload: str, engine: str) -> Problem:
    return Problem.build(model, cluster, workload, engine=engine, space_kind="engine")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", PROBLEMS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_every_configuration_is_a_free_plan_the_engine_shards_as_it_says(
    engine: str, case: tuple[str, str, str]
) -> None:
    p = engine_problem(*case, engine)
    space, free = p.space, p.with_space("free").space
    assert space.configs is not None and len(space.configs) == space.num_degree_tuples
    labels = [space.label(i) for i in range(space.num_degree_tuples)]
    assert len(set(labels)) == len(labels)  # every configuration named apart
    for i, c in enumerate(space.configs):
        d = c.degrees
        plan = space.config_plan(i)
        free.encode(plan)  # a plan of the free space (raises otherwise)
        assert int(space.encode(plan)[0]) == i
        opts = {(k, op): name for k, op, name in c.options}
        assert not NO_EQUIVALENT & {(k, op, n) for (k, op), n in opts.items()}
        for kind in p.model.kinds:
            if d.tp > 1:  # every engine splits attention heads over its attention TP
                assert opts[(kind, "qkv_proj")] == "column"
                assert opts[(kind, "attention")] == "head_sharded"
                assert opts[(kind, "o_proj")] == "row"
        if not p.model.is_moe:
            assert d.dp_attn == 1  # data parallel of a dense model is replicas
        if engine == "vllm" and p.model.is_moe:
            assert d.ep in (1, d.group)
        if engine == "trtllm":
            assert d.tp == 1 or d.dp_attn == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_features_cite_the_engine_source(engine: str) -> None:
    cap = capability(engine)
    assert cap.version and cap.features
    for f in cap.features:
        assert f.turns_on and f.doc
        assert ":" in f.source  # file:line at the pinned version


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", PROBLEMS[:3], ids=lambda c: f"{c[0]}-{c[1]}")
def test_engine_optimum_is_proven_and_never_beats_the_free_optimum(
    engine: str, case: tuple[str, str, str]
) -> None:
    p = engine_problem(*case, engine)
    budget = Budget(max_evals=None, seconds=300)
    eng = get_solver("cpsat").solve(p, budget=budget)
    free = get_solver("cpsat").solve(p.with_space("free"), budget=budget)
    assert eng.status == "optimal" and free.status == "optimal"
    assert eng.objective <= free.objective * (1 + 1e-9)
    p.space.encode(eng.plan)  # launchable
    for method in ("grid", "recipe", "megatron"):
        r = get_solver(method).solve(p, budget=Budget(max_evals=None))
        p.space.encode(r.plan)
        assert r.objective <= eng.objective * (1 + 1e-9)


def test_engine_optimum_equals_exhaustive_enumeration() -> None:
    for engine in ENGINES:
        p = Problem.build("mixtral-8x7b", "h100x4", "chat", engine=engine, space_kind="engine")
        ex = ExhaustiveSolver().solve(p, budget=Budget(max_evals=None))
        cp = get_solver("cpsat").solve(p, budget=Budget(max_evals=None, seconds=300))
        assert ex.status == cp.status == "optimal"
        assert cp.objective == pytest.approx(ex.objective, rel=1e-6)


@pytest.mark.parametrize("method", available_solvers())
def test_every_solver_keeps_to_the_engine_space(method: str) -> None:
    p = engine_problem("mixtral-8x7b", "h100x4", "chat", "sglang")
    r = get_solver(method).solve(p, budget=Budget(max_evals=40, seconds=120), seed=1)
    assert r.plan is not None
    p.space.encode(r.plan)  # raises if the plan is outside the engine's space


def test_a_plan_the_engine_cannot_run_is_refused_naming_the_option() -> None:
    p = engine_problem("mixtral-8x7b", "h100x4", "chat", "vllm")
    free = p.with_space("free")
    with pytest.raises(ShardlabError, match=r"expert parallel over 2 of the 4"):
        p.space.degree_index(Degrees(tp=4, ep=2, etp=2))
    plan = free.space.megatron_plan(Degrees(tp=4, ep=4, etp=1))
    layer = list(plan.layer_options[0])
    names = [op.name for op in layer_ops(p.model, "moe")]
    layer[names.index("attention")] = "seq_sharded"
    bad = type(plan)(
        degrees=plan.degrees,
        stage_layers=plan.stage_layers,
        layer_options=(tuple(layer),) * len(plan.layer_options),
        head_options=plan.head_options,
    )
    free.space.encode(bad)  # fine in the free space
    with pytest.raises(ShardlabError, match=r"moe\.attention=seq_sharded.*no equivalent") as e:
        p.space.encode(bad)
    assert "\n" not in str(e.value)


def test_engine_space_takes_options_per_kind_only() -> None:
    with pytest.raises(ShardlabError, match="tie options per layer kind"):
        _ = Problem.build("llama-3.1-8b", "h100x2", tie="layer", space_kind="engine").space


def test_repair_and_sampling_stay_inside_the_engine_space() -> None:
    space = engine_problem("qwen3-30b-a3b", "h100x8", "chat", "sglang").space
    codes = space.sample(500, seed=3)
    assert space.is_valid(codes).all()
    noisy = codes.copy()
    noisy[:, 1:] = np.random.default_rng(0).integers(0, 4, size=noisy[:, 1:].shape)
    assert space.is_valid(space.repair(noisy)).all()


def test_solve_vs_free_reports_the_gain(capsys, monkeypatch) -> None:
    args = ["solve", "--model", "mixtral-8x7b", "--cluster", "h100x4", "--engine", "vllm"]
    args += ["--space", "engine", "--vs-free", "--format", "json"]
    monkeypatch.setattr(sys, "argv", ["shardlab", *args])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code in (0, None)
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "optimal" and data["free"]["status"] == "optimal"
    free_tps = data["free"]["throughput_tok_s"]
    assert data["free"]["ratio"] == pytest.approx(free_tps / data["metrics"]["throughput_tok_s"])
    assert data["free"]["ratio"] >= 1.0


def test_vs_free_needs_the_engine_space(capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["shardlab", "solve", "--vs-free"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_option_coverage_names_what_each_engine_has_no_equivalent_for() -> None:
    for engine in ENGINES:
        cov = option_coverage(engine)
        for op in ("qkv_proj", "attention", "o_proj", "embedding", "lm_head", "sampler"):
            assert cov[(op, "seq_sharded")] is None  # token splits no engine runs
        assert cov[("experts", "alltoall")]  # a feature (DeepEP / NVLink all-to-all)
        assert cov[("qkv_proj", "column")] == ()  # tensor parallel by default
    assert option_coverage("sglang")[("ffn_up", "column_full")] == ("dp-attention",)
    assert option_coverage("vllm")[("residual", "seq_sharded")] == ("sequence-parallel",)
    assert option_coverage("trtllm")[("residual", "seq_sharded")] is None


def test_fp8_blocks_are_never_split() -> None:
    """DeepSeek-V3's 128-row fp8 blocks: vLLM and SGLang refuse a split into part blocks
    (18,432 / 32 = 576 rows), so only SGLang's --moe-dense-tp-size 1 with DeepEP (the
    large-scale EP recipe) runs attention DP 32."""
    wide = Degrees(tp=1, dp_attn=32, ep=32, etp=1)
    sglang = engine_problem("deepseek-v3", "h100x32", "chat", "sglang").space
    labels = [sglang.label(i) for i, d in enumerate(sglang.degree_tuples) if d == wide]
    assert labels == [wide.short() + " +dp-attention+deepep+dense-tp1"]
    vllm = engine_problem("deepseek-v3", "h100x32", "chat", "vllm")
    with pytest.raises(ShardlabError, match="576-row slices of 128-row fp8 blocks"):
        vllm.space.degree_index(Degrees(tp=32, etp=32))
    trtllm = engine_problem("deepseek-v3", "h100x32", "chat", "trtllm").space
    assert trtllm.degree_index(Degrees(tp=1, dp_attn=32, ep=32, etp=1)) >= 0


def test_sglang_runs_dp_attention_only_where_its_model_code_gathers_tokens() -> None:
    mixtral = engine_problem("mixtral-8x7b", "h100x8", "chat", "sglang").space
    assert all(d.dp_attn == 1 for d in mixtral.degree_tuples)
    assert not any(c.features for c in mixtral.configs)
    qwen = engine_problem("qwen3-30b-a3b", "h100x8", "chat", "sglang").space
    assert any(d.dp_attn > 1 for d in qwen.degree_tuples)


def test_baselines_run_on_problems_with_options_per_layer() -> None:
    p = Problem.build("mixtral-8x7b", "h100x4", "chat", tie="layer", engine="vllm")
    for method in ("grid", "recipe"):
        r = get_solver(method).solve(p, budget=Budget(max_evals=None))
        assert r.status == "feasible"
        p.with_space("engine").space.encode(r.plan)  # the engine runs it
