"""Launch on the GPUs of 2026: rack-scale NVLink domains (GB200 NVL72: hosts of 4 GPUs,
one 72-GPU domain), AMD Instinct GPUs, and deployments that mix GPU types; a plan made
for one GPU refused on another."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from shardlab.errors import ShardlabError
from shardlab.launch.dynamo import dynamo_objects
from shardlab.launch.hardware import MNNVL_ENV, ROCM_DOCKER, image
from shardlab.launch.kube import (
    CLIQUE_LABEL,
    LWS_GROUP_KEY,
    MNNVL_CLAIM,
    PodOptions,
    k8s_objects,
    unpinned_note,
)
from shardlab.launch.llmd import llmd_values
from shardlab.launch.pods import disagg_groups, plan_groups, sized_groups
from shardlab.launch.servers import (
    PoolLaunch,
    build_disagg_launch,
    build_launch,
    build_pools_launch,
)
from shardlab.launch.targets import how_to_apply
from shardlab.problems.cluster import builtin_accelerators
from shardlab.problems.disagg import DisaggPlan
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from tests.conftest import run_cli
from tests.launch.test_deploy import argv_of, check_k8s, check_llmd
from tests.launch.test_launch import CASES, case_plan, check_degrees, check_flags, values

OPTS = PodOptions(name="ds")
MODEL = "m"
DSV3 = "deepseek-v3"
# (cluster, degrees, features): one 72-GPU replica of 9 stages over 18 trays; attention
# DP 64 + EP 64 over 16 trays (DeepSeek-V3's 256 experts do not split over 72 GPUs);
# a TP/EP-16 decode worker over 4 trays
RACK_CASES = [
    ("gb200x72", Degrees(replicas=1, pp=9, tp=1, dp_attn=8, ep=8, etp=1), ("deepep", "dense-tp1")),
    ("gb200x64", Degrees(replicas=1, tp=1, dp_attn=64, ep=64, etp=1), ("deepep", "dense-tp1")),
    ("gb200x16", Degrees(replicas=1, tp=16, ep=16, etp=1), ()),
]
RACK_IDS = ["72-pp9-dep8", "64-dep64", "16-tep16"]


def _objects_of(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("case", RACK_CASES, ids=RACK_IDS)
def test_a_rack_replica_is_one_lws_of_4_gpu_pods_in_a_compute_domain(
    engine: str, case: tuple
) -> None:
    """A replica over trays of one NVL72 is one LeaderWorkerSet of GPUs / 4 pods of 4
    GPUs, each with the engine's multi-node flags and NCCL's MNNVL switches, claiming the
    IMEX channel of a ComputeDomain (valid against the DRA driver's CRD) in one NVLink
    partition."""
    cluster, d, feats = case
    problem, plan = case_plan(engine, DSV3, cluster, d, feats)
    gpus = d.pp * d.group
    shell = build_launch(problem, plan, model_path=MODEL)
    check_degrees(engine, shell, problem, plan)
    check_flags(engine, shell)
    assert len(shell.commands) == gpus // 4
    for c in shell.commands:
        assert set(MNNVL_ENV) <= set(c.env)
    objects = k8s_objects(plan_groups(problem, plan, model_path=MODEL), OPTS)
    for obj in objects:
        check_k8s(obj)
    assert [o["kind"] for o in objects] == ["ComputeDomain", "LeaderWorkerSet", "Service"]
    (cd,) = _objects_of(objects, "ComputeDomain")
    template = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
    (lws,) = _objects_of(objects, "LeaderWorkerSet")
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lws["spec"]["replicas"] == 1 and lwt["size"] == gpus // 4
    for t, rank in ((lwt["leaderTemplate"], "0"), (lwt["workerTemplate"], "${LWS_WORKER_INDEX}")):
        pod = t["spec"]
        (c,) = pod["containers"]
        assert c["resources"]["limits"] == {"nvidia.com/gpu": 4}
        assert c["resources"]["claims"] == [{"name": MNNVL_CLAIM}]
        assert pod["resourceClaims"] == [
            {"name": MNNVL_CLAIM, "resourceClaimTemplateName": template}
        ]
        (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == CLIQUE_LABEL and term["matchLabelKeys"] == [LWS_GROUP_KEY]
        assert term["labelSelector"]["matchLabels"] == t["metadata"]["labels"]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-GB200"}
        assert _env(c).items() >= dict(MNNVL_ENV).items()
        argv = argv_of(c)
        if engine == "sglang" or d.tp * d.pp > 4:  # a rank's GPUs over trays: --nnodes
            assert values(argv, "--nnodes") == str(gpus // 4)
            assert values(argv, "--node-rank") == rank
        else:  # DP ranks spread over the trays, 4 a tray
            assert values(argv, "--data-parallel-size-local") == "4"
            assert values(argv, "--data-parallel-start-rank", "0") == (
                "0" if rank == "0" else "$((LWS_WORKER_INDEX*4))"
            )


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_dynamo_and_llmd_claim_the_channel_too(engine: str) -> None:
    """The TP/EP-16 worker over 4 trays on Dynamo: 4 nodes of 4 GPUs, the channel claimed
    in its pod spec and the ComputeDomain beside the graph; on llm-d (vLLM): the role's
    resourceClaims, the ComputeDomain in the advice."""
    cluster, d, feats = RACK_CASES[2]
    problem, plan = case_plan(engine, DSV3, cluster, d, feats)
    groups = plan_groups(problem, plan, model_path=MODEL)
    objects = dynamo_objects(groups, OPTS)
    for obj in objects:
        check_k8s(obj)
    (cd,) = _objects_of(objects, "ComputeDomain")
    template = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
    worker = objects[-1]["spec"]["services"]["worker"]
    assert worker["multinode"] == {"nodeCount": 4} and worker["resources"]["limits"]["gpu"] == "4"
    assert worker["resources"]["claims"] == [{"name": MNNVL_CLAIM}]
    assert worker["extraPodSpec"]["resourceClaims"][0]["resourceClaimTemplateName"] == template
    assert {e["name"] for e in worker["envs"]} >= {name for name, _ in MNNVL_ENV}
    if engine == "vllm":  # a TP group over pods: llm-d cannot state it; DP ranks it can
        d2 = RACK_CASES[1]
        p2, plan2 = case_plan("vllm", DSV3, d2[0], d2[1], d2[2])
        g2 = plan_groups(p2, plan2, model_path=MODEL)
        doc = llmd_values(g2, OPTS)
        check_llmd(doc)
        assert doc["decode"]["resourceClaims"][0]["name"] == MNNVL_CLAIM
        (c,) = doc["decode"]["containers"]
        assert c["resources"]["claims"] == [{"name": MNNVL_CLAIM}]
        advice = how_to_apply("llm-d", None, OPTS, g2)
        assert '"kind": "ComputeDomain"' in advice


def test_no_compute_domain_where_hosts_are_the_domain() -> None:
    """Servers over HGX hosts (domain = host) reach each other over the network: no
    ComputeDomain, claim or MNNVL environment; nor for a server inside one tray."""
    problem, plan = case_plan("sglang", *CASES[1])  # llama-70b pp=2 tp=8 on h100x16
    objects = k8s_objects(plan_groups(problem, plan, model_path=MODEL), OPTS)
    assert "ComputeDomain" not in [o["kind"] for o in objects]
    text = json.dumps(objects)
    assert "NCCL_MNNVL_ENABLE" not in text and "resourceClaims" not in text
    problem, plan = case_plan(
        "sglang", "llama-3.1-8b", "gb200x8", Degrees(replicas=2, tp=4, etp=4), ()
    )
    shell = build_launch(problem, plan, model_path=MODEL)
    assert all(not c.env or "NCCL_MNNVL_ENABLE" not in dict(c.env) for c in shell.commands)
    assert "ComputeDomain" not in json.dumps(
        k8s_objects(plan_groups(problem, plan, model_path=MODEL), OPTS)
    )


def test_the_compute_domain_schema_check_can_fail() -> None:
    cluster, d, feats = RACK_CASES[2]
    problem, plan = case_plan("sglang", DSV3, cluster, d, feats)
    (cd, *_) = k8s_objects(plan_groups(problem, plan, model_path=MODEL), OPTS)
    for edit in (
        lambda o: o["spec"].update(numNode=0),  # misspelled
        lambda o: o["spec"]["channel"].pop("resourceClaimTemplate"),  # required
        lambda o: o["spec"]["channel"].update(allocationMode="Many"),  # not in its enum
    ):
        bad = copy.deepcopy(cd)
        edit(bad)
        with pytest.raises(AssertionError):
            check_k8s(bad)


AMD_IMAGES = {
    ("sglang", "mi300x"): "lmsysorg/sglang:v0.5.14-rocm720-mi30x",
    ("sglang", "mi325x"): "lmsysorg/sglang:v0.5.14-rocm720-mi30x",
    ("sglang", "mi355x"): "lmsysorg/sglang:v0.5.14-rocm720-mi35x",
    ("vllm", "mi300x"): "vllm/vllm-openai-rocm:v0.24.0",
    ("vllm", "mi355x"): "vllm/vllm-openai-rocm:v0.24.0",
}


@pytest.mark.parametrize(("engine", "gpu"), AMD_IMAGES, ids=lambda x: x)
def test_amd_gpus_get_rocm_images_and_amd_resources(engine: str, gpu: str) -> None:
    """An AMD plan: the engine's ROCm image for the GPU's family, ``amd.com/gpu`` (never
    ``nvidia.com/gpu``), MoRI for the expert dispatch DeepEP does on NVIDIA, no NVIDIA
    node label; the shell target says how to run the ROCm container."""
    problem, plan = case_plan(engine, DSV3, f"{gpu}x8", Degrees(tp=1, dp_attn=8, ep=8), ("deepep",))
    objects = k8s_objects(plan_groups(problem, plan, model_path=MODEL), OPTS)
    for obj in objects:
        check_k8s(obj)
    (dep,) = _objects_of(objects, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == AMD_IMAGES[(engine, gpu)]
    assert c["resources"]["limits"] == {"amd.com/gpu": 8}
    assert "nvidia" not in json.dumps(objects).lower()
    argv = argv_of(c)
    if engine == "sglang":
        assert values(argv, "--moe-a2a-backend") == "mori"
    else:
        assert values(argv, "--all2all-backend") == "mori_high_throughput"
    shell = build_launch(problem, plan, model_path=MODEL)
    check_flags(engine, shell)  # mori is one of the pinned versions' choices
    assert not any(c.env for c in shell.commands)
    assert any(ROCM_DOCKER in n and AMD_IMAGES[(engine, gpu)] in n for n in shell.notes)
    with pytest.raises(ShardlabError, match="not an NVIDIA GPU") as caught:
        dynamo_objects(plan_groups(problem, plan, model_path=MODEL), OPTS)
    assert caught.value.field == "target" and "\n" not in str(caught.value)
    if engine == "vllm":
        doc = llmd_values(plan_groups(problem, plan, model_path=MODEL), OPTS)
        check_llmd(doc)
        assert doc["accelerator"] == {"type": "amd"}
        (lc,) = doc["decode"]["containers"]
        assert lc["resources"]["limits"] == {"amd.com/gpu": "8"}
        assert lc["image"] == AMD_IMAGES[(engine, gpu)]
    assert unpinned_note(plan_groups(problem, plan, model_path=MODEL))  # AMD: not pinned


def test_an_intel_gpu_runs_vllm_with_the_image_given_and_intels_resource() -> None:
    """The Arc Pro B60: vLLM only (its XPU backend), no pinned image (the user's to
    give), ``gpu.intel.com/xe`` in every manifest, and Dynamo refused."""
    problem, plan = case_plan("vllm", "llama-3.1-8b", "b60x4", Degrees(tp=4, etp=4), ())
    groups = plan_groups(problem, plan, model_path=MODEL)
    with pytest.raises(ShardlabError, match="XPU") as caught:
        k8s_objects(groups, OPTS)
    assert caught.value.field == "image"
    given = dataclasses.replace(OPTS, image="my/vllm-xpu:1")
    objects = k8s_objects(groups, given)
    for obj in objects:
        check_k8s(obj)
    (dep,) = _objects_of(objects, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "my/vllm-xpu:1"
    assert c["resources"]["limits"] == {"gpu.intel.com/xe": 4}
    doc = llmd_values(groups, given)
    check_llmd(doc)
    assert doc["accelerator"] == {"type": "intel-xe"}
    with pytest.raises(ShardlabError, match="not an NVIDIA GPU"):
        dynamo_objects(groups, OPTS)


def test_an_amd_gpu_of_unknown_family_needs_an_image() -> None:
    acc = builtin_accelerators()["mi300x"]
    other = dataclasses.replace(acc, key="mi250x", name="MI250X")
    with pytest.raises(ShardlabError, match="family") as caught:
        image("vllm", other)
    assert caught.value.field == "image"


def _pool(role: str, gpu: str, d: Degrees, feats: tuple, instances: int) -> PoolLaunch:
    problem, plan = case_plan("vllm", DSV3, f"{gpu}x{d.num_gpus}", d, feats)
    return PoolLaunch(role=role, problem=problem, plan=plan, instances=instances)


def test_a_deployment_mixing_gpu_types_launches_every_pool() -> None:
    """Prefill on B200 (hosts of 8), decode on GB200 (hosts of 4 in one NVLink domain):
    every pool's servers, each on its own GPU's hosts with its own resource and image;
    only the decode servers over trays get the MNNVL environment and the channel."""
    pools = [
        _pool("prefill", "b200", Degrees(tp=1, dp_attn=8, ep=8), ("deepep",), 2),
        _pool("decode", "gb200", Degrees(tp=1, dp_attn=16, ep=16), ("deepep",), 1),
    ]
    shell = build_pools_launch(pools, model_path=MODEL)
    check_flags("vllm", shell)
    by_role: dict[str, list] = {"prefill": [], "decode": []}
    for c in shell.commands:
        by_role[c.role].append(c)
    # 2 prefill servers on nodes 0 and 1, the decode server over nodes 2-5 (4 trays)
    assert [c.node for c in by_role["prefill"]] == [0, 1]
    assert [c.node for c in by_role["decode"]] == [2, 3, 4, 5]
    for c in by_role["prefill"]:
        assert "NCCL_MNNVL_ENABLE" not in dict(c.env)
    for c in by_role["decode"]:
        assert dict(c.env).items() >= dict(MNNVL_ENV).items()
        assert values(c.argv, "--data-parallel-size-local") == "4"
    assert len(shell.router) > 0  # one router in front of both pools
    groups = sized_groups(pools, model_path=MODEL)
    doc = llmd_values(groups, OPTS)
    check_llmd(doc)
    assert doc["prefill"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-B200"}
    assert doc["decode"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-GB200"}
    assert doc["prefill"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert doc["decode"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert "resourceClaims" not in doc["prefill"] and doc["decode"]["resourceClaims"]
    objects = dynamo_objects(groups, OPTS)
    for obj in objects:
        check_k8s(obj)
    services = objects[-1]["spec"]["services"]
    assert services["prefill"]["resources"]["limits"]["gpu"] == "8"
    assert services["decode"]["multinode"] == {"nodeCount": 4}


def test_an_aggregated_mix_of_vendors_on_k8s() -> None:
    """Aggregated pools on H200 and MI325X: each Deployment with its own GPU's resource,
    image and (where known) node label."""
    pools = []
    for gpu in ("h200", "mi325x"):
        problem, plan = case_plan("sglang", "llama-3.1-70b", f"{gpu}x2", Degrees(tp=2, etp=2), ())
        pools.append(PoolLaunch(role="agg", problem=problem, plan=plan, instances=3))
    objects = k8s_objects(sized_groups(pools, model_path=MODEL), OPTS)
    for obj in objects:
        check_k8s(obj)
    pods = {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objects
            if o["kind"] == "Deployment"}  # fmt: skip
    h200, amd = pods["ds-serve-h200-x2"], pods["ds-serve-mi325x-x2"]
    assert h200["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 2}
    assert h200["containers"][0]["image"] == "lmsysorg/sglang:v0.5.14"
    assert h200["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert amd["containers"][0]["resources"]["limits"] == {"amd.com/gpu": 2}
    assert amd["containers"][0]["image"] == "lmsysorg/sglang:v0.5.14-rocm720-mi30x"
    assert "nodeSelector" not in amd


def test_disaggregated_pools_in_one_rack_share_a_compute_domain() -> None:
    """A disaggregated plan inside one NVL72 was priced to hand the KV cache over NVLink:
    every pod of both pools claims the channel of one shared ComputeDomain (Dynamo), the
    shell target forces Mooncake onto NVLink and says where to run the pools; on HGX
    hosts (domain = host) none of it."""
    pre = case_plan("sglang", DSV3, "gb200x8", Degrees(tp=8, ep=8), ())[1]
    dec = case_plan("sglang", DSV3, "gb200x16", Degrees(tp=16, ep=16), ())[1]
    problem = Problem.build(DSV3, "gb200x32", "chat", engine="sglang")
    plan = DisaggPlan(prefill=pre, prefill_instances=2, decode=dec, decode_instances=1)
    objects = dynamo_objects(disagg_groups(problem, plan, model_path=MODEL), OPTS)
    for obj in objects:
        check_k8s(obj)
    (cd,) = _objects_of(objects, "ComputeDomain")
    assert cd["metadata"]["name"] == "ds-pools"
    services = objects[-1]["spec"]["services"]
    for role in ("prefill", "decode"):
        (claim,) = services[role]["extraPodSpec"]["resourceClaims"]
        assert claim["resourceClaimTemplateName"] == "ds-pools-channel"
    shell = build_disagg_launch(problem, plan, model_path=MODEL)
    for c in shell.commands:
        assert dict(c.env)["MC_FORCE_MNNVL"] == "1"
    assert any("one NVLink domain" in n for n in shell.notes)
    hgx = Problem.build(DSV3, "b200x32", "chat", engine="sglang")
    pre = case_plan("sglang", DSV3, "b200x8", Degrees(tp=8, ep=8), ())[1]
    dec = case_plan("sglang", DSV3, "b200x16", Degrees(tp=16, ep=16), ())[1]
    plan = DisaggPlan(prefill=pre, prefill_instances=2, decode=dec, decode_instances=1)
    objects = dynamo_objects(disagg_groups(hgx, plan, model_path=MODEL), OPTS)
    assert not _objects_of(objects, "ComputeDomain")
    shell = build_disagg_launch(hgx, plan, model_path=MODEL)
    assert all("MC_FORCE_MNNVL" not in dict(c.env) for c in shell.commands)


def _plan_file(tmp_path: Path, capsys, monkeypatch, cluster: str) -> Path:
    plan_file = tmp_path / "plan.json"
    code, _, err = run_cli(
        ["solve", "--model", "llama-3.1-8b", "--cluster", cluster, "--engine", "vllm",
         "--space", "engine", "--out", str(plan_file)], capsys, monkeypatch,
    )  # fmt: skip
    assert code == 0, err
    return plan_file


def test_a_plan_made_for_one_gpu_is_refused_on_another(tmp_path: Path, capsys, monkeypatch) -> None:
    """One line naming both GPUs, exit 2, for every target; a plan file written before
    files recorded the GPU is held to its cluster's name."""
    plan_file = _plan_file(tmp_path, capsys, monkeypatch, "h100x8")
    for target in ("shell", "k8s"):
        code, out, err = run_cli(
            ["launch", "--plan", str(plan_file), "--cluster", "b200x8", "--target", target],
            capsys, monkeypatch,
        )  # fmt: skip
        assert code == 2 and out == ""
        assert len(err.strip().splitlines()) == 1
        assert "made for h100 GPUs, not b200" in err and "(set by --cluster)" in err
    old = json.loads(plan_file.read_text())
    del old["accelerator"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    code, _, err = run_cli(
        ["launch", "--plan", str(tmp_path / "old.json"), "--cluster", "gb200x8"],
        capsys, monkeypatch,
    )  # fmt: skip
    assert code == 2 and "made for h100 GPUs, not gb200" in err
    # the same GPU, more of them: launched
    code, out, err = run_cli(
        ["launch", "--plan", str(plan_file), "--cluster", "h100x8"], capsys, monkeypatch
    )
    assert code == 0, err


def test_rack_gpus_are_pinned_where_their_label_is_known() -> None:
    problem, plan = case_plan("vllm", "llama-3.1-8b", "b300x8", Degrees(replicas=8, tp=1), ())
    assert unpinned_note(plan_groups(problem, plan, model_path=MODEL)) == [
        "GPU type b300 has no known nvidia.com/gpu.product value: add a nodeSelector for "
        "its nodes, or its pods may land on another GPU type"
    ]
    problem, plan = case_plan("vllm", "llama-3.1-8b", "gb300x4", Degrees(replicas=4, tp=1), ())
    assert not unpinned_note(plan_groups(problem, plan, model_path=MODEL))
