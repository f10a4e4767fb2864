"""llm-d's model service Helm values for a plan (``launch --target llm-d``).

Values of the ``llm-d-modelservice`` chart v0.4.12 (llm-d-incubation/llm-d-modelservice,
Apache-2.0; ``charts/llm-d-modelservice/values.yaml`` and ``values.schema.json``, the
schema kept in ``tests/data/schemas/``), installed with ``helm install NAME
llm-d-modelservice/llm-d-modelservice -f values.yaml``. llm-d serves vLLM only.

- ``decode`` (and, disaggregated, ``prefill``) run the shell target's vLLM command as
  ``modelCommand: custom``: the plan's degrees, partition and per-rank limits exactly;
  ``parallelism`` states the same degrees (the chart derives ``DP_SIZE``/``TP_SIZE``
  from them, and an LWS group's size from ``workers``). The chart has no pipeline
  degree and gives a pod ``tensor x dataLocal`` GPUs: plans with pipeline stages, or
  with a tensor-parallel group over several pods, are refused.
- Each role's ``nodeSelector`` pins the GPU type the plan was priced on
  (:data:`~shardlab.launch.kube.GPU_PRODUCTS`); ``accelerator.type`` is the GPU's vendor
  (``nvidia`` or ``amd``: the chart's resource names), the container requests
  ``nvidia.com/gpu`` or ``amd.com/gpu``, and on AMD the image is vLLM's ROCm build.
- A server over hosts of one NVLink domain (GB200/GB300 NVL72) claims the IMEX channel
  of a ComputeDomain in the role's ``resourceClaims`` (the chart's field for "IMEX
  channels"); the ComputeDomain itself is not a chart value: the notes give it to apply
  first (:func:`~shardlab.launch.kube.compute_domain`).
- A server over several nodes is a LeaderWorkerSet group (``multinode: true``, for
  both roles: the chart's switch is global); every pod of a group runs one command,
  so the leader's and the workers' are chosen on ``LWS_WORKER_INDEX``.
- Disaggregated, the routing sidecar (``routing.proxy``, connector ``nixlv2``) sits in
  front of each decode pod on the service port and the decode server listens on
  ``routing.proxy.targetPort``; both roles move the KV cache with vLLM's
  ``NixlConnector`` (``kv_both``, the side channel on the pod's IP), as the chart's
  ``examples/values-pd.yaml``.
"""

from __future__ import annotations

import json
from typing import Any

from shardlab.errors import ShardlabError
from shardlab.launch.hardware import gpu_resource, image
from shardlab.launch.kube import (
    MNNVL_CLAIM,
    PodOptions,
    channel_template,
    mnnvl,
    node_selector,
)
from shardlab.launch.pods import PORT, PodGroup
from shardlab.launch.servers import shell_quote

CHART = "llm-d-modelservice"
CHART_VERSION = "v0.4.12"
IMAGE = "ghcr.io/llm-d/llm-d-cuda:v0.4.0"  # the chart's appVersion
PROXY_PORT = 8200  # routing.proxy.targetPort: the decode server behind the sidecar
NIXL_SIDE_PORT = "5600"
NIXL_KV = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, separators=(",", ":"))
MODEL_MOUNT = "/model-cache"
# the chart's accelerator.type per vendor (Intel's by its xe driver, as its resource)
LLMD_ACCELERATORS = {"nvidia": "nvidia", "amd": "amd", "intel": "intel-xe"}


def _argv(group: PodGroup, argv: list[str], disagg: bool) -> list[str]:
    out = list(argv)
    if "--kv-transfer-config" in out:  # llm-d's form: both roles, as its examples
        out[out.index("--kv-transfer-config") + 1] = NIXL_KV
    if disagg and group.role == "decode" and "--port" in out:
        out[out.index("--port") + 1] = str(PROXY_PORT)
    return out


def _command(group: PodGroup, disagg: bool) -> list[str]:
    """One command for every pod of a server: the leader's on worker index 0."""
    leader = " ".join(shell_quote(a) for a in _argv(group, list(group.leader.argv), disagg))
    if group.worker is None:
        return ["/bin/sh", "-c", f"exec {leader}"]
    worker = " ".join(shell_quote(a) for a in _argv(group, list(group.worker.argv), disagg))
    return [
        "/bin/sh",
        "-c",
        f'if [ "${{LWS_WORKER_INDEX:-0}}" = 0 ]; then exec {leader}; else exec {worker}; fi',
    ]


def _parallelism(group: PodGroup) -> dict[str, int]:
    """The chart's ``parallelism``: it has no pipeline degree and counts ``tensor x
    dataLocal`` GPUs per pod (``DP_SIZE``/``TP_SIZE`` in the pods' environment), so a
    server with pipeline stages, or a tensor-parallel group over several pods, is
    refused rather than written with degrees that do not add up to its GPUs."""
    d = group.server.plan.degrees
    if d.pp > 1:
        raise ShardlabError(
            f"plan: llm-d's model service has no pipeline degree (its parallelism is "
            f"tensor, data, dataLocal and workers), and this plan has pp={d.pp}",
            field="target",
            fix="solve with pp = 1 for llm-d, or use target k8s or dynamo",
        )
    ranks_per_pod = max(d.dp_attn // group.nodes, 1)
    if d.tp * ranks_per_pod != group.gpus_per_pod:
        raise ShardlabError(
            f"plan: llm-d's model service gives a pod tensor x dataLocal GPUs, and this "
            f"server's tensor-parallel group of {d.tp} spans {group.nodes} pods of "
            f"{group.gpus_per_pod} GPUs",
            field="target",
            fix="use degrees whose tensor-parallel group fits one node, or target k8s or dynamo",
        )
    return {"tensor": d.tp, "data": d.dp_attn, "dataLocal": ranks_per_pod, "workers": group.nodes}


def _role(group: PodGroup, opts: PodOptions, disagg: bool) -> dict[str, Any]:
    env: list[dict[str, Any]] = [
        {"name": k, "value": v}
        for k, v in group.leader.env
        if k not in ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT")
    ]
    env.append({"name": "HF_HOME", "value": MODEL_MOUNT})
    ports = [{"containerPort": PROXY_PORT if disagg and group.role == "decode" else PORT}]
    if disagg:
        env += [
            {
                "name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
            },
            {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": NIXL_SIDE_PORT},
        ]
        ports.append({"containerPort": int(NIXL_SIDE_PORT)})
    acc = group.server.problem.cluster.accelerator
    gpus = {gpu_resource(acc): str(group.gpus_per_pod)}
    resources: dict[str, Any] = {"limits": dict(gpus), "requests": dict(gpus)}
    role: dict[str, Any] = {"nodeSelector": selector} if (selector := node_selector(group)) else {}
    if mnnvl(group):  # the role's IMEX channel: the chart's resourceClaims
        role["resourceClaims"] = [
            {"name": MNNVL_CLAIM, "resourceClaimTemplateName": channel_template(opts, group)}
        ]
        resources["claims"] = [{"name": MNNVL_CLAIM}]
    return role | {
        "create": True,
        "replicas": group.instances,
        "parallelism": _parallelism(group),
        "containers": [
            {
                "name": "vllm",
                "image": opts.image or (IMAGE if acc.vendor == "nvidia" else image("vllm", acc)),
                "modelCommand": "custom",
                "command": _command(group, disagg),
                "env": env,
                "ports": ports,
                "resources": resources,
                "mountModelVolume": True,
            }
        ],
    }


def llmd_values(groups: list[PodGroup], opts: PodOptions) -> dict[str, Any]:
    """The chart's values for an aggregated plan (decode only) or a disaggregated one."""
    engines = {g.engine for g in groups}
    if engines != {"vllm"}:
        raise ShardlabError(
            f"target llm-d: llm-d's model service runs vLLM, not {', '.join(sorted(engines))}",
            field="engine",
            fix="launch it on engine vllm, or use target dynamo or k8s",
        )
    roles = [g.role for g in groups]
    if sorted(roles) not in (["serve"], ["decode", "prefill"]):
        raise ShardlabError(
            "plan: llm-d's model service runs one decode pool (and one prefill pool); this "
            "deployment mixes instance shapes",
            field="target",
            fix="use target k8s for an aggregated mix",
        )
    disagg = "prefill" in roles
    by_role = {("decode" if g.role == "serve" else g.role): g for g in groups}
    model = groups[0].server.model_path
    weights = groups[0].server.problem.weight_bytes()
    uri = f"pvc://{opts.model_volume}/{model}" if opts.model_volume else f"hf://{model}"
    artifacts: dict[str, Any] = {
        "name": model,
        "uri": uri,
        # the download cache: the weights and a margin for the tokenizer and configs
        "size": f"{int(weights * 1.1 / 2**30) + 1}Gi",
        "mountPath": MODEL_MOUNT,
    }
    if opts.hf_token_secret:
        artifacts["authSecretName"] = opts.hf_token_secret
    values: dict[str, Any] = {
        "fullnameOverride": opts.name,
        "multinode": any(g.nodes > 1 for g in groups),
        # the chart's accelerator (its default resource names and environment)
        "accelerator": {
            "type": LLMD_ACCELERATORS[groups[0].server.problem.cluster.accelerator.vendor]
        },
        "modelArtifacts": artifacts,
        "routing": {
            "servicePort": PORT,
            "proxy": {
                "enabled": disagg,
                "targetPort": PROXY_PORT,
                "connector": "nixlv2",
                "secure": False,
            },
        },
        "decode": _role(by_role["decode"], opts, disagg),
        "prefill": _role(by_role["prefill"], opts, disagg) if disagg else {"create": False},
    }
    return values
