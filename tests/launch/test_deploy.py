"""``shardlab launch --target k8s|llm-d|dynamo``: every manifest valid against the
Kubernetes API schemas and the published CRD and chart schemas
(``tests/data/schemas/SOURCES.md``), every container command the shell target's, with
the plan's degrees and per-rank limits, for single-node, multi-node and disaggregated
plans on the three engines; what a target cannot express refused in one line."""

from __future__ import annotations

import copy
import functools
import json
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from shardlab.cli.app import flag_advice
from shardlab.errors import ShardlabError
from shardlab.launch.dynamo import dynamo_objects
from shardlab.launch.kube import LWS_LEADER_LABEL, PodOptions, k8s_objects
from shardlab.launch.llmd import llmd_values
from shardlab.launch.pods import POD_CONFIG_DIR, disagg_groups, plan_groups
from shardlab.launch.servers import build_launch
from shardlab.launch.targets import dump
from shardlab.problems.disagg import DisaggPlan
from shardlab.problems.engines import ENGINES
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from tests.conftest import DATA_DIR, run_cli
from tests.launch.test_launch import CASES, check_flags, runnable_plan, values

SCHEMAS = DATA_DIR / "schemas"
LWS_CRD = "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
COMPUTE_DOMAIN_CRD = "resource.nvidia.com_computedomains.yaml"
K8S_VERSION = "1.33"
OPTS = PodOptions(name="shard", hf_token_secret="hf", model_volume="weights")
MODEL = "m"


def _strict(node: Any) -> Any:
    """A CRD schema that refuses unknown fields (kubectl apply --validate=strict)."""
    if isinstance(node, dict):
        if (
            node.get("type") == "object"
            and "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for v in node.values():
            _strict(v)
    elif isinstance(node, list):
        for v in node:
            _strict(v)
    return node


@functools.cache
def crd_validator(file: str) -> jsonschema.Validator:
    crd = yaml.safe_load((SCHEMAS / file).read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(_strict(copy.deepcopy(schema)))


def _pod(template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": template["spec"]}


def check_k8s(obj: dict) -> None:
    """Valid against its schema, or raise."""
    kind = obj["kind"]
    if kind == "LeaderWorkerSet":
        errors = list(
            crd_validator("leaderworkerset.x-k8s.io_leaderworkersets.yaml").iter_errors(obj)
        )
        assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
        lwt = obj["spec"]["leaderWorkerTemplate"]
        for t in (lwt["leaderTemplate"], lwt["workerTemplate"]):
            kubernetes_validate.validate(_pod(t), K8S_VERSION, strict=True)
    elif kind == "DynamoGraphDeployment":
        errors = list(crd_validator("nvidia.com_dynamographdeployments.yaml").iter_errors(obj))
        assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
        for service in obj["spec"]["services"].values():  # the pod spec Dynamo extends
            pod = service.get("extraPodSpec", {})
            spec = {k: v for k, v in pod.items() if k != "mainContainer"}
            spec["containers"] = [{"name": "main", **pod.get("mainContainer", {})}]
            kubernetes_validate.validate(_pod({"spec": spec}), K8S_VERSION, strict=True)
    elif kind == "ComputeDomain":
        errors = list(crd_validator(COMPUTE_DOMAIN_CRD).iter_errors(obj))
        assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _merged(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: _merged(base.get(k), over[k]) if k in base else over[k] for k in over} | {
            k: v for k, v in base.items() if k not in over
        }
    return over


def check_llmd(values_doc: dict) -> None:
    """Helm validates the chart's defaults merged with the values given."""
    schema = json.loads((SCHEMAS / "llm-d-modelservice-values.schema.json").read_text())
    defaults = yaml.safe_load((SCHEMAS / "llm-d-modelservice-values.yaml").read_text())
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(_merged(defaults, values_doc)))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def argv_of(container: dict) -> list[str]:
    """A container's engine argv (through ``sh -c`` when it reads the pod's variables)."""
    command = [*container.get("command", []), *container.get("args", [])]
    if command[:2] == ["/bin/sh", "-c"]:
        script = command[2].split("; ")[-1]
        assert script.startswith("exec ")
        return shlex.split(script[len("exec ") :], posix=True)
    return command


def _runnable(engine: str, case: tuple):
    found = runnable_plan(engine, *case)
    if found is None:
        pytest.skip(f"{engine} does not run {case[2].short()}")
    return found


def _or_skip(build, *args):
    try:
        return build(*args)
    except ShardlabError as exc:  # what a target cannot express: one line, naming the fix
        assert "\n" not in str(exc) and exc.fix
        pytest.skip(str(exc))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2].short()}")
def test_k8s_objects_are_valid_and_run_the_shell_command(engine: str, case: tuple) -> None:
    problem, plan = _runnable(engine, case)
    groups = plan_groups(problem, plan, model_path=MODEL)
    (g,) = groups
    d = plan.degrees
    objects = _or_skip(k8s_objects, groups, OPTS)
    for obj in objects:
        check_k8s(obj)
    assert yaml.safe_load_all(dump(objects))  # the YAML round-trips, no anchors
    assert "&id" not in dump(objects)
    shell = build_launch(problem, plan, model_path=MODEL, config_dir=POD_CONFIG_DIR)
    check_flags(engine, shell)
    kinds = [o["kind"] for o in objects]
    head = shell.commands[0]
    if g.nodes == 1:
        (dep,) = [o for o in objects if o["kind"] == "Deployment"]
        assert dep["spec"]["replicas"] == d.replicas
        pod = dep["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        # the shell target's first server, less the GPUs it was pinned to
        assert argv_of(c) == list(head.argv)
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        assert {k: v for k, v in head.env if k != "CUDA_VISIBLE_DEVICES"}.items() <= env.items()
        assert c["resources"]["limits"]["nvidia.com/gpu"] == d.pp * d.group
    else:
        assert "LeaderWorkerSet" in kinds and "Deployment" not in kinds
        (lws,) = [o for o in objects if o["kind"] == "LeaderWorkerSet"]
        lwt = lws["spec"]["leaderWorkerTemplate"]
        assert lws["spec"]["replicas"] == d.replicas and lwt["size"] == g.nodes
        leader = argv_of(lwt["leaderTemplate"]["spec"]["containers"][0])
        worker = argv_of(lwt["workerTemplate"]["spec"]["containers"][0])
        # the shell target's head command, the head's address LWS's
        want = [a.replace("${NODE0_ADDR}", "${LWS_LEADER_ADDRESS}") for a in head.argv]
        assert leader == want
        second = next(c for c in shell.commands if c.node_rank == 1)
        theirs = [a.replace("${NODE0_ADDR}", "${LWS_LEADER_ADDRESS}") for a in second.argv]
        for k, (a, b) in enumerate(zip(worker, theirs, strict=True)):
            if a != b:  # only the address and the node rank are the pod's
                assert a == "${LWS_WORKER_INDEX}" or a.startswith("$((LWS_WORKER_INDEX*"), (k, a, b)
        for t in (lwt["leaderTemplate"], lwt["workerTemplate"]):
            gpus = t["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
            assert gpus == problem.cluster.host_size
    (svc,) = [o for o in objects if o["kind"] == "Service"]
    if g.nodes > 1:
        assert svc["spec"]["selector"][LWS_LEADER_LABEL] == "0"
    if engine == "trtllm":
        (cm,) = [o for o in objects if o["kind"] == "ConfigMap"]
        assert set(cm["data"]) == {"extra-llm-api-config.yaml"}


def _degrees_in_args(engine: str, args: list[str], files: dict, d: Degrees, moe: bool) -> None:
    if engine == "vllm":
        assert values(args, "--tensor-parallel-size") == str(d.tp)
        assert values(args, "--pipeline-parallel-size", "1") == str(d.pp)
        assert values(args, "--data-parallel-size", "1") == str(d.dp_attn)
        assert values(args, "--max-num-seqs") == "16"
    elif engine == "sglang":
        assert values(args, "--tp-size") == str(d.group)
        assert values(args, "--pp-size", "1") == str(d.pp)
        assert values(args, "--dp-size", "1") == str(d.dp_attn)
        assert values(args, "--ep-size", "1") == str(d.ep)
        assert values(args, "--max-running-requests") == str(16 * d.dp_attn)
    else:
        (text,) = files.values()
        options = yaml.safe_load(text)
        assert options["tensor_parallel_size"] == d.group
        assert options["pipeline_parallel_size"] == d.pp
        assert options["enable_attention_dp"] == (d.dp_attn > 1)
        assert options["max_batch_size"] == -(-16 // d.pp)
        if moe:
            assert options["moe_expert_parallel_size"] == d.ep


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2].short()}")
def test_dynamo_graph_is_valid_and_carries_the_degrees(engine: str, case: tuple) -> None:
    problem, plan = _runnable(engine, case)
    groups = plan_groups(problem, plan, model_path=MODEL)
    objects = dynamo_objects(groups, OPTS)  # the operator starts every node: all expressible
    for obj in objects:
        check_k8s(obj)
    (dgd,) = [o for o in objects if o["kind"] == "DynamoGraphDeployment"]
    files = {
        name: text for o in objects if o["kind"] == "ConfigMap" for name, text in o["data"].items()
    }
    worker = dgd["spec"]["services"]["worker"]
    (g,) = groups
    assert worker["replicas"] == plan.degrees.replicas
    assert worker["resources"]["limits"]["gpu"] == str(g.gpus_per_pod)
    assert worker.get("multinode", {"nodeCount": 1})["nodeCount"] == g.nodes
    args = worker["extraPodSpec"]["mainContainer"]["args"]
    _degrees_in_args(engine, args, files, plan.degrees, problem.model.is_moe)


def _disagg(engine: str) -> tuple[Problem, DisaggPlan]:
    """Prefill on one node's half, decode over two nodes (a LeaderWorkerSet)."""
    pre = runnable_plan(engine, "llama-3.1-70b", "h100x4", Degrees(replicas=1, tp=4, etp=4), ())
    dec = runnable_plan(
        engine, "llama-3.1-70b", "h100x16", Degrees(replicas=1, pp=2, tp=8, etp=8), ()
    )
    assert pre is not None and dec is not None
    problem = Problem.build("llama-3.1-70b", "h100x24", "chat", engine=engine)
    return problem, DisaggPlan(
        prefill=pre[1], prefill_instances=2, decode=dec[1], decode_instances=1
    )


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_disaggregated_plans_on_dynamo(engine: str) -> None:
    problem, plan = _disagg(engine)
    groups = disagg_groups(problem, plan, model_path=MODEL)
    objects = dynamo_objects(groups, OPTS)
    for obj in objects:
        check_k8s(obj)
    services = objects[-1]["spec"]["services"]
    assert services["Frontend"]["componentType"] == "frontend"
    for role, n, nodes in (("prefill", 2, 1), ("decode", 1, 2)):
        s = services[role]
        assert s["subComponentType"] == role and s["replicas"] == n
        assert s.get("multinode", {"nodeCount": 1})["nodeCount"] == nodes
        args = s["extraPodSpec"]["mainContainer"]["args"]
        assert values(args, "--disaggregation-mode") == role
        _degrees_in_args(engine, args, {}, getattr(plan, role).degrees, False)
        if engine == "vllm":
            assert json.loads(values(args, "--kv-transfer-config"))["kv_role"] == "kv_both"
        else:
            assert values(args, "--disaggregation-transfer-backend") == "nixl"


def _llmd_disagg() -> tuple[Problem, DisaggPlan]:
    """What llm-d can express: prefill on one node, decode's data-parallel ranks over
    two nodes (a LeaderWorkerSet), no pipeline stages."""
    model = "qwen3-235b-a22b"
    pre = runnable_plan("vllm", model, "h200x8", Degrees(replicas=1, tp=8, ep=8, etp=1), ())
    dec = runnable_plan(
        "vllm", model, "h200x16", Degrees(replicas=1, tp=1, dp_attn=16, ep=16, etp=1), ("deepep",)
    )
    assert pre is not None and dec is not None
    problem = Problem.build(model, "h200x24", "chat", engine="vllm")
    return problem, DisaggPlan(
        prefill=pre[1], prefill_instances=1, decode=dec[1], decode_instances=1
    )


def test_disaggregated_plan_on_llmd_is_valid_helm_values() -> None:
    problem, plan = _llmd_disagg()
    doc = llmd_values(disagg_groups(problem, plan, model_path=MODEL), OPTS)
    check_llmd(doc)
    assert doc["multinode"] is True and doc["routing"]["proxy"]["enabled"] is True
    for role in ("prefill", "decode"):
        r = doc[role]
        d = getattr(plan, role).degrees
        p = r["parallelism"]
        assert r["replicas"] == 1 and p["tensor"] == d.tp and p["data"] == d.dp_attn
        (c,) = r["containers"]
        gpus = c["resources"]["limits"]["nvidia.com/gpu"]
        # the chart's own count of a pod's GPUs is the one requested
        assert gpus == str(min(d.num_gpus, 8)) == str(p["tensor"] * p["dataLocal"])
        assert r["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
        script = c["command"][2]
        assert f"--tensor-parallel-size {d.tp}" in script and "--max-num-seqs 16" in script
        if role == "decode":  # behind the routing sidecar; leader and workers by index
            assert "--port 8200" in script and "LWS_WORKER_INDEX" in script


def test_llmd_refuses_what_its_parallelism_cannot_state() -> None:
    """The chart has no pipeline degree and gives a pod tensor x dataLocal GPUs: a plan
    with pipeline stages (tensor 8, dataLocal 1 for a pod of 16 GPUs' worth) or with a
    tensor group over two pods is refused in one line, naming the target."""
    problem, plan = _disagg("vllm")  # decode: pp=2 tp=8 over two nodes
    with pytest.raises(ShardlabError, match="no pipeline degree") as caught:
        llmd_values(disagg_groups(problem, plan, model_path=MODEL), OPTS)
    assert "\n" not in str(caught.value) and caught.value.field == "target"
    problem, plan = _runnable("vllm", CASES[5])  # qwen3 tp=16 over two nodes
    with pytest.raises(ShardlabError, match="tensor-parallel group of 16 spans 2 pods"):
        llmd_values(plan_groups(problem, plan, model_path=MODEL), OPTS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2].short()}")
def test_aggregated_plans_on_llmd_are_valid_helm_values(case: tuple) -> None:
    problem, plan = _runnable("vllm", case)
    doc = _or_skip(llmd_values, plan_groups(problem, plan, model_path=MODEL), OPTS)
    check_llmd(doc)
    assert (
        doc["prefill"] == {"create": False} and doc["decode"]["replicas"] == plan.degrees.replicas
    )


def test_what_a_target_cannot_express_is_refused_in_one_line() -> None:
    problem, plan = _runnable("sglang", CASES[0])
    groups = plan_groups(problem, plan, model_path=MODEL)
    with pytest.raises(ShardlabError, match="runs vLLM") as caught:
        llmd_values(groups, OPTS)
    assert "\n" not in str(caught.value)
    dp, dplan = _disagg("sglang")
    with pytest.raises(ShardlabError, match="router"):
        k8s_objects(disagg_groups(dp, dplan, model_path=MODEL), OPTS)


def test_trtllm_over_nodes_on_k8s_is_refused_with_what_works() -> None:
    """TensorRT-LLM starts a multi-node server by naming every node (MPI): the refusal
    names target dynamo (which runs it) and shell, the CLI's "(set by --target)" lands
    on the target, and one-node degrees are suggested only where the weights and a
    request's KV cache fit one node."""
    problem, plan = _runnable("trtllm", CASES[1])  # llama-3.1-70b pp=2 tp=8 on h100x16
    with pytest.raises(ShardlabError) as caught:
        k8s_objects(plan_groups(problem, plan, model_path=MODEL), OPTS)
    line = flag_advice(caught.value, ["launch", "--target", "k8s"])
    assert "\n" not in line and "target dynamo" in line
    assert line.endswith("or shell (set by --target)")
    assert "pp=1 tp=2 dp_attn=1 holds the weights" in line  # 141 GB of bf16 on 2 x 80 GB
    assert dynamo_objects(plan_groups(problem, plan, model_path=MODEL), OPTS)  # it works
    problem, plan = _runnable("trtllm", CASES[4])  # deepseek-v3 on h100: 8 x 80 GB < 671 GB
    with pytest.raises(ShardlabError) as caught:
        k8s_objects(plan_groups(problem, plan, model_path=MODEL), OPTS)
    assert "GPUs (" not in str(caught.value) and "solve for" not in str(caught.value)
    assert str(caught.value).endswith(
        "use target dynamo (its operator starts the MPI job) or shell"
    )


def _solved_plan(tmp_path: Path, capsys, monkeypatch) -> Path:
    """A vLLM plan of Llama-3.1-8B on 8 H100, solved through the CLI and written."""
    plan_file = tmp_path / "plan.json"
    code, _, err = run_cli(
        ["solve", "--model", "llama-3.1-8b", "--cluster", "h100x8", "--engine", "vllm",
         "--space", "engine", "--out", str(plan_file)], capsys, monkeypatch,
    )  # fmt: skip
    assert code == 0, err
    return plan_file


def test_cli_writes_the_manifests_and_a_refusal_leaves_nothing(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    plan_file = _solved_plan(tmp_path, capsys, monkeypatch)
    out = tmp_path / "deploy"
    for target, name in (("k8s", "manifests.yaml"), ("dynamo", "dynamo.yaml"),
                         ("llm-d", "values.yaml")):  # fmt: skip
        code, stdout, err = run_cli(
            ["launch", "--plan", str(plan_file), "--engine", "vllm", "--target", target,
             "--out", str(out)], capsys, monkeypatch,
        )  # fmt: skip
        assert code == 0, err
        docs = list(yaml.safe_load_all((out / name).read_text()))
        assert docs and stdout == ""
        if target != "llm-d":
            for d in docs:
                check_k8s(d)
    assert {
        o["metadata"]["name"] for o in yaml.safe_load_all((out / "manifests.yaml").read_text())
    } == {"llama-3-1-8b-serve"}
    code, stdout, err = run_cli(
        ["launch", "--plan", str(plan_file), "--engine", "trtllm", "--force-engine",
         "--out", str(tmp_path / "sh")], capsys, monkeypatch,
    )  # fmt: skip
    assert code == 0, err
    script = (tmp_path / "sh" / "launch.sh").read_text()
    config = tmp_path / "sh" / "extra-llm-api-config.yaml"
    assert script.startswith("#!/usr/bin/env bash") and config.is_file()
    assert script.count("trtllm-serve") == stdout.count("trtllm-serve") >= 1
    assert f"--config {config}" in script
    refused = tmp_path / "refused"
    code, stdout, err = run_cli(
        ["launch", "--plan", str(plan_file), "--engine", "sglang", "--force-engine",
         "--target", "llm-d", "--out", str(refused)], capsys, monkeypatch,
    )  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and "runs vLLM" in err
    assert not refused.exists()
    code, _, err = run_cli(
        ["launch", "--plan", str(plan_file), "--engine", "vllm", "--target", "helm"],
        capsys, monkeypatch,
    )  # fmt: skip
    assert code == 2 and "--target 'helm'" in err
    code, _, err = run_cli(
        ["launch", "--plan", str(plan_file), "--engine", "vllm", "--target", "k8s",
         "--name", "Bad_Name"], capsys, monkeypatch,
    )  # fmt: skip
    assert code == 2 and "not a Kubernetes name" in err and "(set by --name)" in err


def test_the_schema_checks_refuse_what_the_api_server_would() -> None:
    problem, plan = _runnable("sglang", CASES[1])  # a LeaderWorkerSet
    objects = k8s_objects(plan_groups(problem, plan, model_path=MODEL), OPTS)
    (lws,) = [o for o in objects if o["kind"] == "LeaderWorkerSet"]
    typo = copy.deepcopy(lws)
    typo["spec"]["leaderWorkerTemplate"]["sizee"] = 2
    with pytest.raises(AssertionError, match="sizee"):
        check_k8s(typo)
    pod = copy.deepcopy(lws)
    pod["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0][
        "imagePullPolicyy"
    ] = "x"
    with pytest.raises((AssertionError, kubernetes_validate.ValidationError)):
        check_k8s(pod)
    (svc,) = [o for o in objects if o["kind"] == "Service"]
    bad = copy.deepcopy(svc)
    bad["spec"]["ports"][0]["port"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        check_k8s(bad)
    dgd = dynamo_objects(plan_groups(problem, plan, model_path=MODEL), OPTS)[-1]
    dgd["spec"]["services"]["worker"]["resources"]["limits"]["gpu"] = 8  # a string in the CRD
    with pytest.raises(AssertionError, match="gpu"):
        check_k8s(dgd)


def test_k8s_without_out_prints_what_it_says_to_apply(tmp_path: Path, capsys, monkeypatch) -> None:
    """Without --out the manifests go to standard output and the advice pipes them
    (``kubectl apply -f -``, ``helm install ... -f -``): no file is named that was not
    written, and nothing is written in the current folder."""
    plan_file = _solved_plan(tmp_path, capsys, monkeypatch)
    monkeypatch.chdir(tmp_path)
    for target, apply in (("k8s", "kubectl apply -n default -f -"),
                          ("dynamo", "kubectl apply -n default -f -"),
                          ("llm-d", "-f - (helm repo add")):  # fmt: skip
        code, stdout, err = run_cli(
            ["launch", "--plan", str(plan_file), "--target", target], capsys, monkeypatch
        )
        assert code == 0, err
        assert list(yaml.safe_load_all(stdout)) and apply in err and "pipe this output" in err
        assert ".yaml" not in err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    code, _, err = run_cli(
        ["launch", "--plan", str(plan_file), "--target", "k8s", "--out", "d"], capsys, monkeypatch
    )
    assert (
        code == 0
        and "wrote d/manifests.yaml" in err
        and "kubectl apply -n default -f d/manifests.yaml" in err
    )


def _gpus_selected(spec: dict) -> str:
    return spec["nodeSelector"]["nvidia.com/gpu.product"]


def test_every_pod_pins_its_gpu_type(tmp_path: Path) -> None:
    """k8s, Dynamo and llm-d pods select the GPU product their plan was priced on; in a
    deployment sized over two GPU types each pool selects its own, and the objects stay
    valid against their schemas."""
    from shardlab.launch.pods import sized_groups
    from shardlab.launch.servers import PoolLaunch

    pools = []
    for gpu, d in (("h100", Degrees(tp=2, etp=2)), ("h200", Degrees(tp=1, etp=1))):
        problem = Problem.build("llama-3.1-8b", f"{gpu}x{d.num_gpus}", engine="vllm")
        plan = problem.with_space("engine").space.megatron_plan(d)
        pools.append(PoolLaunch(role="agg", problem=problem, plan=plan, instances=2))
    groups = sized_groups(pools, model_path=MODEL)
    objects = k8s_objects(groups, OPTS)
    for obj in objects:
        check_k8s(obj)
    picked = {
        o["metadata"]["name"]: _gpus_selected(o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] == "Deployment"
    }
    assert picked == {
        "shard-serve-h100-x2": "NVIDIA-H100-80GB-HBM3",
        "shard-serve-h200-x1": "NVIDIA-H200",
    }
    # multi-node servers: the leader's and the workers' pods alike; Dynamo and llm-d too
    problem, plan = _runnable("sglang", CASES[1])
    (lws,) = [o for o in k8s_objects(plan_groups(problem, plan, model_path=MODEL), OPTS)
              if o["kind"] == "LeaderWorkerSet"]  # fmt: skip
    lwt = lws["spec"]["leaderWorkerTemplate"]
    for t in (lwt["leaderTemplate"], lwt["workerTemplate"]):
        assert _gpus_selected(t["spec"]) == "NVIDIA-H100-80GB-HBM3"
    dgd = dynamo_objects(plan_groups(problem, plan, model_path=MODEL), OPTS)[-1]
    check_k8s(dgd)
    assert _gpus_selected(dgd["spec"]["services"]["worker"]["extraPodSpec"]) == (
        "NVIDIA-H100-80GB-HBM3"
    )
    problem, plan = _runnable("vllm", CASES[0])
    doc = llmd_values(plan_groups(problem, plan, model_path=MODEL), OPTS)
    check_llmd(doc)
    assert _gpus_selected(doc["decode"]) == "NVIDIA-H100-80GB-HBM3"
