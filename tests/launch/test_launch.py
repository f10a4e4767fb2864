"""``shardlab launch``: the engines' own commands, whose degrees are the plan's, for one
node and several, with every flag one the pinned engine defines."""

from __future__ import annotations

import json
import os
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from shardlab.errors import ShardlabError
from shardlab.launch.servers import Launch, build_launch
from shardlab.problems.engines import ENGINES
from shardlab.problems.plan import Degrees, Plan
from shardlab.problems.problem import Problem
from tests.conftest import run_cli

# (model, cluster, degrees, engine features wanted): one GPU per replica, several
# replicas on a node, attention DP, pipeline stages, whole multi-node replicas
CASES = [
    ("llama-3.1-8b", "h100x8", Degrees(replicas=4, tp=2, etp=2), ()),
    ("llama-3.1-70b", "h100x16", Degrees(replicas=1, pp=2, tp=8, etp=8), ()),
    ("mixtral-8x7b", "h100x8", Degrees(replicas=1, tp=1, dp_attn=8, ep=8, etp=1), ("deepep",)),
    ("deepseek-v3", "h100x32", Degrees(replicas=2, tp=1, dp_attn=16, ep=16, etp=1), ("deepep",)),
    ("deepseek-v3", "h100x32", Degrees(replicas=1, pp=2, tp=16, ep=16, etp=1), ()),
    ("qwen3-235b-a22b", "h200x16", Degrees(replicas=1, tp=16, ep=16, etp=1), ()),
]


def engine_flags(engine: str) -> dict:
    text = (
        resources.files("shardlab.problems") / "data" / "engines" / f"{engine}.json"
    ).read_text()
    return json.loads(text)


def runnable_plan(
    engine: str, model: str, cluster: str, d: Degrees, feats: tuple
) -> tuple[Problem, Plan] | None:
    """A case's problem and plan on ``engine`` (None: the engine does not run it)."""
    problem = Problem.build(model, cluster, "chat", engine=engine, space_kind="engine")
    space = problem.space
    i = space.config_index(d, (*feats, "expert-parallel", "dp-attention", "attention-dp"))
    if i is None:
        return None
    plan = space.config_plan(i)
    return problem, Plan(**{**plan.__dict__, "requests_per_rank": 16})


def case_plan(engine: str, model: str, cluster: str, d: Degrees, feats: tuple) -> tuple:
    found = runnable_plan(engine, model, cluster, d, feats)
    if found is None:
        pytest.skip(f"{engine} does not run {d.short()}")
    return found


def values(argv: tuple[str, ...], flag: str, default: str | None = None) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else default


def check_degrees(engine: str, launch: Launch, problem: Problem, plan: Plan) -> None:
    d = plan.degrees
    nodes = max(1, d.pp * d.group // problem.cluster.host_size)
    per_replica = 1 if engine == "trtllm" else nodes
    assert len(launch.commands) == d.replicas * per_replica
    for c in launch.commands:
        a = c.argv
        assert c.nodes == nodes
        if engine == "vllm":
            assert values(a, "--tensor-parallel-size") == str(d.tp)
            assert values(a, "--pipeline-parallel-size", "1") == str(d.pp)
            assert values(a, "--data-parallel-size", "1") == str(d.dp_attn)
            assert ("--enable-expert-parallel" in a) == (problem.model.is_moe and d.ep > 1)
            if nodes > 1 and d.dp_attn > 1 and d.tp * d.pp <= problem.cluster.host_size:
                local = int(values(a, "--data-parallel-size-local"))
                assert local * nodes == d.dp_attn
                assert values(a, "--data-parallel-start-rank", "0") == str(c.node_rank * local)
            elif nodes > 1:
                assert values(a, "--nnodes") == str(nodes)
                assert values(a, "--node-rank") == str(c.node_rank)
        elif engine == "sglang":
            assert values(a, "--tp-size") == str(d.group)
            assert values(a, "--pp-size", "1") == str(d.pp)
            assert values(a, "--dp-size", "1") == str(d.dp_attn)
            assert values(a, "--ep-size", "1") == str(d.ep)
            assert ("--enable-dp-attention" in a) == (d.dp_attn > 1)
            if nodes > 1:
                assert values(a, "--nnodes") == str(nodes)
                assert values(a, "--node-rank") == str(c.node_rank)
                assert values(a, "--dist-init-addr").startswith(f"${{NODE{c.node - c.node_rank}")
        else:
            assert values(a, "--tp_size") == str(d.group)
            assert values(a, "--pp_size") == str(d.pp)
            if problem.model.is_moe:
                assert values(a, "--ep_size") == str(d.ep)
            if nodes > 1:
                assert a[0] == "mpirun" and values(a, "-n") == str(d.group * d.pp)
                assert values(a, "-H").count(",") == nodes - 1
                forwarded = {a[i + 1] for i, x in enumerate(a) if x == "-x"}
                assert forwarded == {name for name, _ in c.env}  # to the remote ranks too
            ((_, yaml),) = launch.files
            assert f"enable_attention_dp: {json.dumps(d.dp_attn > 1)}" in yaml
            if problem.model.is_moe:
                assert f"moe_tensor_parallel_size: {d.etp}" in yaml
            if d.pp > 1:
                assert f"pp_partition: {json.dumps(list(plan.stage_layers))}" in yaml


def check_flags(engine: str, launch: Launch) -> None:
    known = engine_flags(engine)
    flags = set(known["flags"])
    for c in launch.commands:
        for i, arg in enumerate(c.argv):
            if arg.startswith("--") and not (c.argv[0] == "mpirun" and i < 5):
                assert arg in flags, f"{engine} {known['version']} has no flag {arg}"
                if arg in known["choices"]:
                    assert c.argv[i + 1] in known["choices"][arg]
    keys = {k.replace("(MTP)", "") for k in known["config_keys"]}
    for _, content in launch.files:
        parent = ""
        for line in content.splitlines():
            key = line.split(":")[0]
            if line.startswith("  "):
                assert f"{parent}.{key.strip()}" in keys
            else:
                parent = key
                assert key in keys


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2].short()}")
def test_launch_commands_carry_the_plan_degrees(engine: str, case: tuple) -> None:
    problem, plan = case_plan(engine, *case)
    launch = build_launch(problem, plan, model_path="org/model")
    check_degrees(engine, launch, problem, plan)
    check_flags(engine, launch)


def test_every_case_runs_on_some_engine_and_some_span_nodes() -> None:
    multi = 0
    for case in CASES:
        ran = 0
        for engine in ENGINES:
            problem = Problem.build(case[0], case[1], engine=engine, space_kind="engine")
            every = tuple(f.name for f in problem.space.capability.features)
            if problem.space.config_index(case[2], every) is not None:
                ran += 1
        assert ran, case
        multi += case[2].pp * case[2].group > 8
    assert multi >= 2


def test_workload_flags_follow_the_problem() -> None:
    for engine in ENGINES:
        problem, plan = case_plan(engine, *CASES[3])
        problem = Problem.build(
            "deepseek-v3",
            "h100x32",
            engine=engine,
            space_kind="engine",
            kv_dtype="fp8",
            draft_tokens=2,
            acceptance=0.7,
            max_tokens=4096,
        )
        launch = build_launch(problem, plan, model_path="org/model")
        check_flags(engine, launch)
        text = " ".join(c.shell() for c in launch.commands) + " ".join(
            content for _, content in launch.files
        )
        assert {"vllm": '"mtp"', "sglang": "EAGLE", "trtllm": "MTP"}[engine] in text
        assert "fp8" in text


def test_cli_launch_writes_nothing_unasked_and_names_what_it_replaces(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """TensorRT-LLM's options file: without --out nothing is written where shardlab runs
    (the printed commands write it on the node, with a here-document that makes the
    same file); with --out it is written beside launch.sh, and a second launch into the
    folder says which files it replaced."""
    plan = tmp_path / "plan.json"
    args = ["solve", "--model", "mixtral-8x7b", "--cluster", "h100x8", "--engine", "trtllm"]
    code, _, _ = run_cli([*args, "--space", "engine", "--out", str(plan)], capsys, monkeypatch)
    assert code == 0
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    node = tmp_path / "node"
    args = ["launch", "--plan", str(plan), "--config-dir", str(node)]
    code, out, err = run_cli(args, capsys, monkeypatch)
    assert code == 0, err
    assert list(here.iterdir()) == [] and not node.exists()
    code, text, _ = run_cli([*args, "--format", "json"], capsys, monkeypatch)
    (f,) = json.loads(text)["files"]
    lines = out.splitlines()
    start = lines.index(f"cat > {node}/extra-llm-api-config.yaml <<'EOF'")
    heredoc = "\n".join(lines[start : lines.index("EOF", start) + 1])
    node.mkdir()
    subprocess.run(["bash", "-c", heredoc], check=True)
    assert (node / "extra-llm-api-config.yaml").read_text() == f["content"]
    assert out.index(heredoc) < out.index("trtllm-serve")  # written before it is read
    for said in ("wrote", "replaced"):
        code, out, err = run_cli(
            ["launch", "--plan", str(plan), "--out", "deploy"], capsys, monkeypatch
        )
        assert code == 0, err
        assert f"note: {said} deploy/launch.sh" in out
        assert f"note: {said} deploy/extra-llm-api-config.yaml" in out
        assert "cat >" not in out  # the script reads the file written beside it
    assert sorted(p.name for p in here.iterdir()) == ["deploy"]


def test_cli_refuses_a_plan_the_engine_cannot_run(tmp_path: Path, capsys, monkeypatch) -> None:
    problem = Problem.build("mixtral-8x7b", "h100x4")
    plan = problem.space.megatron_plan(Degrees(tp=4, ep=2, etp=2))  # EP over half the group
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json(problem.model, cluster="h100x4"))
    code, out, err = run_cli(
        ["launch", "--plan", str(path), "--engine", "vllm"], capsys, monkeypatch
    )
    assert code == 2 and not out
    assert err.strip().count("\n") == 0 and "expert parallel over 2 of the 4" in err
    assert list(tmp_path.iterdir()) == [path]


ENGINE_PYTHON = {e: os.environ.get(f"SHARDLAB_{e.upper()}_PYTHON") for e in ("vllm", "sglang")}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_engines_own_parser_takes_the_commands(engine: str) -> None:
    """Opt-in (a Python with the engine installed, e.g. SHARDLAB_VLLM_PYTHON): the
    engines' parsers need their wheels, which CI does not install."""
    python = ENGINE_PYTHON[engine]
    if not python:
        pytest.skip(f"set SHARDLAB_{engine.upper()}_PYTHON to a Python with {engine} installed")
    commands, expected = [], []
    for case in CASES:
        found = runnable_plan(engine, *case)
        if found is None:
            continue
        problem, plan = found
        for c in build_launch(problem, plan, model_path="org/model").commands:
            commands.append(list(c.argv))
            d = plan.degrees
            expected.append((d.tp if engine == "vllm" else d.group, d.pp, d.dp_attn))
    script = Path(__file__).with_name("engine_argparse.py")
    run = subprocess.run(
        [python, str(script), engine],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    parsed = json.loads(run.stdout.strip().splitlines()[-1])  # engines log to stdout too
    assert [(p["tp"], p["pp"], p["dp"]) for p in parsed] == expected


def test_servers_sharing_a_node_get_ports_apart() -> None:
    for engine in ENGINES:
        problem, plan = case_plan(engine, *CASES[0])  # 4 replicas of 2 GPUs on a node
        commands = build_launch(problem, plan, model_path="org/model").commands
        ports = [int(values(c.argv, "--port")) for c in commands]
        assert ports == [8000, 8010, 8020, 8030]
        visible = [dict(c.env)["CUDA_VISIBLE_DEVICES"] for c in commands]
        assert visible == ["0,1", "2,3", "4,5", "6,7"]


def test_cli_launch_with_draft_tokens(tmp_path: Path, capsys, monkeypatch) -> None:
    path = tmp_path / "plan.json"
    for engine, marker in (("vllm", '"mtp"'), ("sglang", "EAGLE"), ("trtllm", "MTP")):
        problem = Problem.build("deepseek-v3", "h200x8", engine=engine, space_kind="engine")
        plan = problem.space.megatron_plan(Degrees(tp=8, ep=8, etp=1))  # as it runs them
        path.write_text(plan.to_json(problem.model, cluster="h200x8"))
        args = ["launch", "--plan", str(path), "--engine", engine, "--draft-tokens", "2"]
        code, out, err = run_cli([*args, "--config-dir", str(tmp_path)], capsys, monkeypatch)
        assert code == 0, err
        text = out + "".join(p.read_text() for p in tmp_path.glob("*.yaml"))
        assert marker in text
    problem = Problem.build("minimax-m2", "h100x8", engine="sglang", space_kind="engine")
    plan = problem.space.megatron_plan(Degrees(tp=8, ep=8, etp=1))
    path.write_text(plan.to_json(problem.model, cluster="h100x8"))
    args = ["launch", "--plan", str(path), "--engine", "sglang", "--draft-tokens", "2"]
    code, out, err = run_cli(args, capsys, monkeypatch)
    assert code == 2 and err.strip().count("\n") == 0 and "minimax_m2" in err


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_disaggregated_plan_launches_both_pools_and_a_router(engine: str) -> None:
    from shardlab.launch.servers import build_disagg_launch
    from shardlab.solvers import Budget
    from shardlab.solvers.cpsat.disagg import solve_disagg

    problem = Problem.build(
        "llama-3.1-70b",
        "h100x16",
        "chat",
        engine=engine,
        space_kind="engine",
        input_len=8192,
        ttft_ms=2000.0,
        tpot_ms=50.0,
    )
    r = solve_disagg(problem, budget=Budget(max_evals=None, seconds=600.0))
    assert r.status == "optimal" and r.plan is not None
    plan = r.plan
    launch = build_disagg_launch(problem, plan, model_path="m")
    check_flags(engine, launch)
    for role in ("prefill", "decode"):
        servers = {c.replica for c in launch.commands if c.role == role}
        assert servers == set(range(getattr(plan, f"{role}_instances")))
    heads = [c for c in launch.commands if c.node_rank == 0]
    assert len({(c.node, values(c.argv, "--port")) for c in heads}) == len(heads)
    gpus: dict[int, set[str]] = {}
    for c in heads:
        seen = gpus.setdefault(c.node, set())
        mine = set(dict(c.env).get("CUDA_VISIBLE_DEVICES", "all").split(","))
        assert not seen & mine  # no GPU given to two servers
        seen |= mine
    router = launch.router
    if engine == "sglang":
        assert router.count("--prefill") == plan.prefill_instances
        assert router.count("--decode") == plan.decode_instances
        for c in heads:
            mode = values(c.argv, "--disaggregation-mode")
            assert mode == c.role
    else:
        n = plan.prefill_instances
        at = router.index("--prefiller-ports")
        assert router[at + 1 : at + 1 + n] == tuple(
            values(c.argv, "--port") for c in heads if c.role == "prefill"
        )
        for c in heads:
            kv = json.loads(values(c.argv, "--kv-transfer-config"))
            assert kv["kv_role"] == ("kv_producer" if c.role == "prefill" else "kv_consumer")
    with pytest.raises(ShardlabError, match="TensorRT-LLM"):
        build_disagg_launch(
            Problem.build("llama-3.1-70b", "h100x16", "chat", engine="trtllm"), plan, model_path="m"
        )
