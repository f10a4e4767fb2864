"""NVIDIA Dynamo's graph deployment of a plan (``launch --target dynamo``).

One ``DynamoGraphDeployment`` (``nvidia.com/v1alpha1``): a ``Frontend`` (Dynamo's
OpenAI-compatible router, ``python3 -m dynamo.frontend``) and one worker service per
pod group: aggregated, ``worker``; disaggregated, ``prefill`` and ``decode`` with
``subComponentType`` so, the KV cache moving over NIXL. A worker's arguments are the
engine's own flags for the server as on one node (its degrees and per-rank limits,
exactly the shell target's), given to Dynamo's engine wrapper (``dynamo.vllm``,
``dynamo.sglang``, ``dynamo.trtllm``); ``multinode.nodeCount`` spreads a server over
nodes: the operator adds the engine's multi-node flags (vLLM: Ray for TP/PP over nodes,
the ``--data-parallel-*`` flags for DP over nodes; SGLang: ``--dist-init-addr``,
``--nnodes``, ``--node-rank``; TensorRT-LLM: ``mpirun`` over SSH it sets up;
``docs/kubernetes/deployment/multinode-deployment.md``), and ``resources.limits.gpu``
is per node.

Format pinned to ai-dynamo/dynamo at commit df888f6860e2 (2026-04-21, 1.1.0-dev;
Apache-2.0): the CRD ``deploy/operator/config/crd/bases/
nvidia.com_dynamographdeployments.yaml`` (kept in ``tests/data/schemas/``) and the
disaggregated examples ``examples/backends/{vllm,sglang,trtllm}/deploy/disagg.yaml``;
images default to the stable release's runtimes (1.0.1). A server over hosts of one
NVLink domain (GB200/GB300 NVL72) claims the IMEX channel of a ComputeDomain, as in
``--target k8s`` (:func:`~shardlab.launch.kube.compute_domain`; the CRD's
``resources.claims`` and ``extraPodSpec.resourceClaims``). AMD GPUs are refused: the
runtime images are CUDA builds. vLLM workers take
``--disaggregation-mode prefill|decode`` with ``--kv-transfer-config
{"kv_connector":"NixlConnector","kv_role":"kv_both"}``; SGLang workers
``--disaggregation-mode``, ``--disaggregation-transfer-backend nixl`` and
``--disaggregation-bootstrap-port``; TensorRT-LLM workers ``--model-path``,
``--served-model-name`` and ``--extra-engine-args`` (the LLM API options file).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from shardlab.errors import ShardlabError
from shardlab.launch.engines import TRTLLM_CONFIG
from shardlab.launch.kube import (
    MNNVL_CLAIM,
    PodOptions,
    channel_template,
    compute_domain,
    mnnvl,
    node_selector,
)
from shardlab.launch.pods import POD_CONFIG_DIR, PodGroup
from shardlab.launch.servers import TRTLLM_DISAGG

DYNAMO_API = "nvidia.com/v1alpha1"
DYNAMO_VERSION = "1.0.1"  # the runtime images' tag
RUNTIME_IMAGES = {
    "vllm": f"nvcr.io/nvidia/ai-dynamo/vllm-runtime:{DYNAMO_VERSION}",
    "sglang": f"nvcr.io/nvidia/ai-dynamo/sglang-runtime:{DYNAMO_VERSION}",
    "trtllm": f"nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:{DYNAMO_VERSION}",
}
WRAPPERS = {"vllm": "dynamo.vllm", "sglang": "dynamo.sglang", "trtllm": "dynamo.trtllm"}
NIXL_KV = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, separators=(",", ":"))
SGLANG_BOOTSTRAP = "12345"
FRONTEND_PORT = 8000
# Flags of the shell target that Dynamo sets itself: where the server listens, and the
# shell target's own KV transfer (Dynamo's is NIXL with both roles).
_DROPPED = {"--port": 1, "--kv-transfer-config": 1, "--disaggregation-transfer-backend": 1}
_DROPPED_ENV = {"VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"}


def _drop(argv: list[str], flags: dict[str, int]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        if argv[i] in flags:
            i += 1 + flags[argv[i]]
            continue
        out.append(argv[i])
        i += 1
    return out


def worker_args(group: PodGroup) -> tuple[list[str], dict[str, str]]:
    """The engine wrapper's arguments for one group's servers, and the files they
    read (TensorRT-LLM: the LLM API options, with the degrees and limits)."""
    argv = list(group.flat.argv)
    engine, role = group.engine, group.role
    model = group.server.model_path
    if engine == "vllm":
        assert argv[:3] == ["vllm", "serve", model]
        args = ["--model", model, *_drop(argv[3:], {**_DROPPED, "--host": 1})]
        if role != "serve":
            args += ["--disaggregation-mode", role, "--kv-transfer-config", NIXL_KV]
        return args, {}
    if engine == "sglang":
        assert argv[:5] == ["python", "-m", "sglang.launch_server", "--model-path", model]
        args = ["--model-path", model, *_drop(argv[5:], _DROPPED)]
        args = _drop(args, {"--disaggregation-bootstrap-port": 1, "--disaggregation-mode": 1})
        if role != "serve":
            args += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "nixl"]
            args += ["--disaggregation-bootstrap-port", SGLANG_BOOTSTRAP]
        return args, {}
    if role != "serve":
        raise ShardlabError(TRTLLM_DISAGG, field="engine", fix="launch it on vllm or sglang")
    return _trtllm(group)


def _trtllm(group: PodGroup) -> tuple[list[str], dict[str, str]]:
    """trtllm-serve's flags become the LLM API options they stand for (its
    ``--tp_size`` is ``tensor_parallel_size`` and so on: tensorrt_llm/commands/serve.py)."""
    argv = list(group.flat.argv)
    model = group.server.model_path
    names = {
        "--tp_size": "tensor_parallel_size",
        "--pp_size": "pipeline_parallel_size",
        "--ep_size": "moe_expert_parallel_size",
        "--max_batch_size": "max_batch_size",
        "--max_num_tokens": "max_num_tokens",
    }
    options: dict[str, Any] = {"backend": "pytorch"}
    for flag, key in names.items():
        if flag in argv:
            options[key] = int(argv[argv.index(flag) + 1])
    files = dict(group.files)
    path = next(p for p in files if p.endswith(TRTLLM_CONFIG))
    options.update(yaml.safe_load(files[path]) or {})
    config = f"{POD_CONFIG_DIR}/{TRTLLM_CONFIG}"
    args = ["--model-path", model, "--served-model-name", model, "--extra-engine-args", config]
    return args, {config: yaml.safe_dump(options, sort_keys=False)}


def _service_name(group: PodGroup) -> str:
    return "worker" if group.role == "serve" else group.role


def dynamo_objects(groups: list[PodGroup], opts: PodOptions) -> list[dict[str, Any]]:
    """The graph deployment (and a ConfigMap when a worker reads a file)."""
    engines = {g.engine for g in groups}
    other = sorted(
        {g.gpu for g in groups if g.server.problem.cluster.accelerator.vendor != "nvidia"}
    )
    if other:
        raise ShardlabError(
            f"target dynamo: {', '.join(other)} is not an NVIDIA GPU, and Dynamo's runtime "
            f"images (nvcr.io/nvidia/ai-dynamo, {DYNAMO_VERSION}) are CUDA builds; its AMD "
            "and Intel support is not checked",
            field="target",
            fix="use target k8s or llm-d (vLLM's and SGLang's ROCm images)",
        )
    if len(groups) > 2 or len({_service_name(g) for g in groups}) < len(groups):
        raise ShardlabError(
            "plan: Dynamo serves one aggregated pool or one prefill and one decode pool; "
            "this deployment mixes instance shapes",
            field="target",
            fix="use target k8s (an aggregated mix), or size it with serving disagg",
        )
    engine = engines.pop()
    image = opts.image or RUNTIME_IMAGES[engine]
    services: dict[str, Any] = {
        "Frontend": {
            "componentType": "frontend",
            "replicas": 1,
            "extraPodSpec": {
                "mainContainer": {
                    "image": image,
                    "command": ["python3", "-m", "dynamo.frontend"],
                    "args": ["--http-port", str(FRONTEND_PORT)],
                }
            },
        }
    }
    objects: list[dict[str, Any]] = []
    for g in groups:
        args, files = worker_args(g)
        name = _service_name(g)
        container: dict[str, Any] = {
            "image": image,
            "command": ["python3", "-m", WRAPPERS[engine]],
            "args": args,
        }
        service: dict[str, Any] = {
            "componentType": "worker",
            "replicas": g.instances,
            "resources": {"limits": {"gpu": str(g.gpus_per_pod)}},
            "sharedMemory": {"size": opts.shm},
            "extraPodSpec": {"mainContainer": container},
        }
        if selector := node_selector(g):  # each pool on the GPU type it was priced on
            service["extraPodSpec"]["nodeSelector"] = selector
        if g.role != "serve":
            service["subComponentType"] = g.role
        if g.nodes > 1:
            service["multinode"] = {"nodeCount": g.nodes}
        if mnnvl(g):  # its nodes' IMEX channel, as in target k8s
            domain = compute_domain(opts, g)
            if domain not in objects:  # pools sharing one write it once
                objects.append(domain)
            service["resources"]["claims"] = [{"name": MNNVL_CLAIM}]
            service["extraPodSpec"]["resourceClaims"] = [
                {"name": MNNVL_CLAIM, "resourceClaimTemplateName": channel_template(opts, g)}
            ]
        env = [{"name": k, "value": v} for k, v in g.flat.env if k not in _DROPPED_ENV]
        if env:
            service["envs"] = env
        if opts.hf_token_secret:
            service["envFromSecret"] = opts.hf_token_secret
        if files:
            cm = f"{opts.name}-{name}"
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": cm, "namespace": opts.namespace},
                    "data": {p.rsplit("/", 1)[-1]: text for p, text in files.items()},
                }
            )
            container["volumeMounts"] = [
                {"name": "config", "mountPath": POD_CONFIG_DIR, "readOnly": True}
            ]
            service["extraPodSpec"]["volumes"] = [{"name": "config", "configMap": {"name": cm}}]
        if opts.model_volume:
            container.setdefault("volumeMounts", []).append(
                {"name": "models", "mountPath": "/models", "readOnly": True}
            )
            service["extraPodSpec"].setdefault("volumes", []).append(
                {
                    "name": "models",
                    "persistentVolumeClaim": {"claimName": opts.model_volume, "readOnly": True},
                }
            )
        services[name] = service
    objects.append(
        {
            "apiVersion": DYNAMO_API,
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": opts.name, "namespace": opts.namespace},
            "spec": {"backendFramework": engine, "services": services},
        }
    )
    return objects
