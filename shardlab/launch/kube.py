"""Plain Kubernetes objects for a plan's pod groups (``launch --target k8s``).

A group of one-pod servers is a Deployment (``replicas``: the plan's replicas; every
pod the same command); a group of multi-node servers a LeaderWorkerSet (``replicas``:
the servers, ``size``: the nodes of one); each group a Service in front of the pods
that serve requests (a LeaderWorkerSet's leaders). Config files a server takes are a
ConfigMap mounted at :data:`~shardlab.launch.pods.POD_CONFIG_DIR`.

Formats written (pinned; fields as documented there):

- ``apps/v1`` Deployment, ``v1`` Service and ConfigMap: Kubernetes API reference
  1.33, validated in the tests against its OpenAPI schemas (``kubernetes-validate``).
- ``leaderworkerset.x-k8s.io/v1`` LeaderWorkerSet: kubernetes-sigs/lws v0.10.0 (Apache-2.0),
  ``config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml`` (kept in
  ``tests/data/schemas/``); the variables it sets in each pod
  (``LWS_LEADER_ADDRESS``, ``LWS_WORKER_INDEX``) and the leader's label
  (``leaderworkerset.sigs.k8s.io/worker-index: "0"``) from its docs
  (``site/content/en/docs/reference/labels-annotations-and-environment-variables``), as
  is the label every pod of one group shares (``leaderworkerset.sigs.k8s.io/group-key``).
- ``resource.nvidia.com/v1beta1`` ComputeDomain: NVIDIA's DRA driver for GPUs
  (NVIDIA/k8s-dra-driver-gpu, now kubernetes-sigs/dra-driver-nvidia-gpu; Apache-2.0) tag
  v0.4.0 (commit 6910a2bea298), ``api/nvidia.com/resource/v1beta1/computedomain.go`` and
  the CRD ``deployments/helm/dra-driver-nvidia-gpu/crds/resource.nvidia.com_computedomains.yaml``
  (kept in ``tests/data/schemas/``). Pods on different trays of one NVL72 reach each
  other over NVLink only through an IMEX channel; a ComputeDomain makes one for the pods
  that claim its ``channel.resourceClaimTemplate`` (``numNodes: 0``, the driver's
  recommended value), as the driver's ``docs/install.md`` example does. Each group's
  pods also keep to one NVLink partition: a required pod affinity on the clique label
  GPU feature discovery sets (``nvidia.com/gpu.clique``), matched per group by LWS's
  group key (``matchLabelKeys``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from shardlab.errors import ShardlabError
from shardlab.launch.hardware import gpu_resource, image, spans_nvlink_hosts
from shardlab.launch.pods import POD_CONFIG_DIR, PORT, PodGroup
from shardlab.launch.servers import NodeCommand, shell_quote
from shardlab.problems.cluster import Accelerator
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_LEADER_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
COMPUTE_DOMAIN_API = "resource.nvidia.com/v1beta1"
CLIQUE_LABEL = "nvidia.com/gpu.clique"
MNNVL_CLAIM = "mnnvl-channel"  # the pods' name for their IMEX channel claim
DEFAULT_SHM = "16Gi"
DEFAULT_NAMESPACE = "default"

# The node label NVIDIA's GPU feature discovery sets to the GPU's product, and its value
# for each built-in accelerator: the NVML device name with its spaces as '-'
# (NVIDIA/k8s-device-plugin, internal/lm/resource.go, ``productLabel``), the names
# ``nvidia-smi -L`` reports for the SXM parts the catalog describes ("NVIDIA H100 80GB
# HBM3", "NVIDIA H200", "NVIDIA B200", "NVIDIA A100-SXM4-80GB"; the H200 and B200 values
# as ai-dynamo/dynamo's recipes select them). GB200 and GB300 as NVIDIA's own cluster
# tools select them (NVIDIA-GB200, NVIDIA-GB300: nvsentinel's and the GPU cluster
# certification's node selectors); L40S and L4 as deployments select them. Left out,
# unverified: B300 (both NVIDIA-B300 and NVIDIA-B300-SXM6-AC are in use), H100 PCIe,
# RTX PRO 6000, and AMD's GPUs (AMD's node labeller has labels of its own). A GPU without
# a known value, or from a cluster file, is not pinned, and the output says so.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_PRODUCTS = {
    "h100": "NVIDIA-H100-80GB-HBM3",
    "h200": "NVIDIA-H200",
    "b200": "NVIDIA-B200",
    "a100": "NVIDIA-A100-SXM4-80GB",
    "gb200": "NVIDIA-GB200",
    "gb300": "NVIDIA-GB300",
    "l40s": "NVIDIA-L40S",
    "l4": "NVIDIA-L4",
}


@dataclass(frozen=True, kw_only=True)
class PodOptions:
    """What a pod needs that is not the plan's (the CLI's flags, with their defaults)."""

    name: str  # the objects' name prefix (a DNS-1035 label)
    namespace: str = DEFAULT_NAMESPACE
    image: str | None = None  # None: the engine's image for the GPU (hardware.image)
    shm: str = DEFAULT_SHM  # /dev/shm for NCCL and the engines' shared-memory queues
    hf_token_secret: str | None = None  # a Secret whose key HF_TOKEN the pods read
    model_volume: str | None = None  # a PersistentVolumeClaim mounted at /models

    def __post_init__(self) -> None:
        check_name(self.name)
        check_name(self.namespace, field="namespace")

    def image_of(self, engine: str, acc: Accelerator) -> str:
        return self.image or image(engine, acc)


def check_name(name: str, *, field: str = "name") -> str:
    """Kubernetes object names (DNS-1035 labels, room left for the suffixes)."""
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", name):
        raise ShardlabError(
            f"{field} {name!r}: not a Kubernetes name (lowercase letters, digits and '-', "
            "starting with a letter, at most 40 characters)",
            field=field,
            fix="give a name like 'llama-70b'",
        )
    return name


def mnnvl(group: PodGroup) -> bool:
    """Whether the group's pods claim an IMEX channel: its servers span hosts of one
    NVLink domain, or it is a pool handing the KV cache over one."""
    return group.kv_over_nvlink or (
        group.nodes > 1
        and spans_nvlink_hosts(group.server.problem.cluster, group.nodes * group.gpus_per_pod)
    )


def domain_name(opts: PodOptions, group: PodGroup) -> str:
    """The group's ComputeDomain: its own, or the one the pools share that hand the KV
    cache over NVLink."""
    return f"{opts.name}-{'pools' if group.kv_over_nvlink else group.name}"


def channel_template(opts: PodOptions, group: PodGroup) -> str:
    """The ResourceClaimTemplate the group's ComputeDomain makes (and its pods claim)."""
    return f"{domain_name(opts, group)}-channel"


def compute_domain(opts: PodOptions, group: PodGroup) -> dict[str, Any]:
    """The ComputeDomain whose IMEX channel the group's pods claim."""
    meta = _meta(opts, domain_name(opts, group), group)
    if group.kv_over_nvlink:  # both pools'
        meta["labels"]["app.kubernetes.io/component"] = "pools"
    return {
        "apiVersion": COMPUTE_DOMAIN_API,
        "kind": "ComputeDomain",
        "metadata": meta,
        "spec": {
            "numNodes": 0,
            "channel": {"resourceClaimTemplate": {"name": channel_template(opts, group)}},
        },
    }


def clique_affinity(opts: PodOptions, group: PodGroup) -> dict[str, Any]:
    """Every pod of one server in one NVLink partition (its group's pods share LWS's
    group key); none for a server larger than a domain, which spans partitions."""
    cluster = group.server.problem.cluster
    if group.nodes * group.gpus_per_pod > cluster.gpus_per_domain:
        return {}
    term = {
        "labelSelector": {"matchLabels": labels(opts, group)},
        "matchLabelKeys": [LWS_GROUP_KEY],
        "topologyKey": CLIQUE_LABEL,
    }
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def node_selector(group: PodGroup) -> dict[str, str]:
    """The pods' node selector: the group's GPU type (empty if the type has no known
    product label)."""
    product = GPU_PRODUCTS.get(group.gpu)
    return {GPU_PRODUCT_LABEL: product} if product else {}


def unpinned_note(groups: list[PodGroup]) -> list[str]:
    """What to do about groups whose GPU type the pods do not select."""
    loose = sorted({g.gpu for g in groups if not node_selector(g)})
    if not loose:
        return []
    return [
        f"GPU type {', '.join(loose)} has no known {GPU_PRODUCT_LABEL} value: add a "
        "nodeSelector for its nodes, or its pods may land on another GPU type"
    ]


def labels(opts: PodOptions, group: PodGroup) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": opts.name,
        "app.kubernetes.io/component": group.name,
        "app.kubernetes.io/managed-by": "shardlab",
    }


def _env(command: NodeCommand, opts: PodOptions) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in command.env]
    if opts.hf_token_secret:
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": opts.hf_token_secret, "key": "HF_TOKEN"}},
            }
        )
    return env


def container(group: PodGroup, command: NodeCommand, opts: PodOptions, *, serves: bool) -> dict:
    """The engine's container for one pod: its command (through a shell when it reads
    LWS's variables, ``$((LWS_WORKER_INDEX*n))`` being shell arithmetic), GPUs, shared
    memory, model and config volumes. The environment is plain values (the pod's own
    address is only disaggregated serving's, which this target refuses)."""
    argv = list(command.argv)
    run: dict[str, Any] = {"command": argv}
    if any("$" in a for a in argv):
        run = {"command": ["/bin/sh", "-c"], "args": ["exec " + " ".join(map(shell_quote, argv))]}
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if group.files:
        mounts.append({"name": "config", "mountPath": POD_CONFIG_DIR, "readOnly": True})
    if opts.model_volume:
        mounts.append({"name": "models", "mountPath": "/models", "readOnly": True})
    acc = group.server.problem.cluster.accelerator
    gpus = {gpu_resource(acc): group.gpus_per_pod}
    resources: dict[str, Any] = {"limits": dict(gpus), "requests": dict(gpus)}
    if mnnvl(group):
        resources["claims"] = [{"name": MNNVL_CLAIM}]
    out: dict[str, Any] = {
        "name": "engine",
        "image": opts.image_of(group.engine, acc),
        **run,
        "env": _env(command, opts),
        "resources": resources,
        "volumeMounts": mounts,
    }
    if serves:
        out["ports"] = [{"name": "http", "containerPort": PORT, "protocol": "TCP"}]
        out["readinessProbe"] = {
            "httpGet": {"path": "/health", "port": PORT},
            "periodSeconds": 10,
            "failureThreshold": 3,
        }
    if not out["env"]:
        del out["env"]
    return out


def pod_spec(group: PodGroup, command: NodeCommand, opts: PodOptions, *, serves: bool) -> dict:
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": opts.shm}}
    ]
    if group.files:
        volumes.append({"name": "config", "configMap": {"name": f"{opts.name}-{group.name}"}})
    if opts.model_volume:
        volumes.append(
            {
                "name": "models",
                "persistentVolumeClaim": {"claimName": opts.model_volume, "readOnly": True},
            }
        )
    spec: dict[str, Any] = {
        "containers": [container(group, command, opts, serves=serves)],
        "volumes": volumes,
    }
    if selector := node_selector(group):  # the GPU type the plan was priced on
        spec["nodeSelector"] = selector
    if mnnvl(group):  # the IMEX channel of the group's ComputeDomain, in one partition
        spec["resourceClaims"] = [
            {"name": MNNVL_CLAIM, "resourceClaimTemplateName": channel_template(opts, group)}
        ]
        if affinity := clique_affinity(opts, group):
            spec["affinity"] = affinity
    return spec


def _meta(opts: PodOptions, name: str, group: PodGroup) -> dict[str, Any]:
    return {"name": name, "namespace": opts.namespace, "labels": labels(opts, group)}


def group_objects(group: PodGroup, opts: PodOptions) -> list[dict[str, Any]]:
    """The Deployment or LeaderWorkerSet of one group, its ConfigMap and its Service."""
    name = f"{opts.name}-{group.name}"
    lab = labels(opts, group)
    objects: list[dict[str, Any]] = []
    if group.files:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": _meta(opts, name, group),
                "data": {path.rsplit("/", 1)[-1]: text for path, text in group.files},
            }
        )
    if mnnvl(group):  # before the pods that claim its channel
        objects.append(compute_domain(opts, group))
    if group.nodes == 1:
        objects.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": _meta(opts, name, group),
                "spec": {
                    "replicas": group.instances,
                    "selector": {"matchLabels": lab},
                    "template": {
                        "metadata": {"labels": lab},
                        "spec": pod_spec(group, group.leader, opts, serves=True),
                    },
                },
            }
        )
        selector = lab
    else:
        assert group.worker is not None
        objects.append(
            {
                "apiVersion": LWS_API,
                "kind": "LeaderWorkerSet",
                "metadata": _meta(opts, name, group),
                "spec": {
                    "replicas": group.instances,
                    "startupPolicy": "LeaderCreated",
                    "leaderWorkerTemplate": {
                        "size": group.nodes,
                        "restartPolicy": "RecreateGroupOnPodRestart",
                        "leaderTemplate": {
                            "metadata": {"labels": lab},
                            "spec": pod_spec(group, group.leader, opts, serves=True),
                        },
                        "workerTemplate": {
                            "metadata": {"labels": lab},
                            "spec": pod_spec(group, group.worker, opts, serves=False),
                        },
                    },
                },
            }
        )
        selector = {**lab, LWS_LEADER_LABEL: "0"}
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(opts, name, group),
            "spec": {
                "selector": selector,
                "ports": [{"name": "http", "port": PORT, "targetPort": PORT, "protocol": "TCP"}],
            },
        }
    )
    return objects


def k8s_objects(groups: list[PodGroup], opts: PodOptions) -> list[dict[str, Any]]:
    """Every object of an aggregated plan or sized deployment; disaggregated pools need
    a router that finds every prefill and decode server, which plain objects do not
    give: llm-d and Dynamo do."""
    if any(g.role != "serve" for g in groups):
        raise ShardlabError(
            "plan: disaggregated pools need a router that pairs prefill and decode servers, "
            "which plain Kubernetes objects do not have",
            field="target",
            fix="use target llm-d (vLLM) or dynamo",
        )
    for g in groups:
        if g.refusal is not None and g.engine == "trtllm":
            raise _mpi_refusal(g)
    return [obj for g in groups for obj in group_objects(g, opts)]


def _mpi_refusal(group: PodGroup) -> ShardlabError:
    """TensorRT-LLM over several nodes in plain pods: what works instead. The fix ends
    on the target, the input the CLI names after it."""
    problem = group.server.problem
    node = problem.cluster.host_size
    fits = one_node_degrees(problem)
    instead = (
        f"solve for replicas of at most {node} GPUs ({_short(fits)} holds the weights "
        "and a request's KV cache), or "
        if fits is not None
        else ""
    )
    return ShardlabError(
        f"plan: TensorRT-LLM runs a server of {group.nodes} nodes as one MPI job that names "
        "every node, and a LeaderWorkerSet gives its pods only the leader's address",
        field="target",
        fix=f"{instead}use target dynamo (its operator starts the MPI job) or shell",
    )


def _short(d: Degrees) -> str:
    text = f"pp={d.pp} tp={d.tp} dp_attn={d.dp_attn}"
    return text + (f" ep={d.ep}" if d.ep > 1 else "")


def one_node_degrees(problem: Problem) -> Degrees | None:
    """The smallest replica of at most one node that the engine runs with the weights
    and one request's KV cache in memory, if any: what a refusal may suggest."""
    from shardlab.costmodel import evaluate

    node = problem.cluster.host_size
    try:  # a node too small for the weights is refused here
        one = dataclasses.replace(
            problem, cluster=dataclasses.replace(problem.cluster, num_gpus=node)
        ).with_space("engine")
        space = one.space
    except ShardlabError:
        return None
    # memory per GPU does not depend on the replicas filling the node
    for d in sorted(set(space.degree_tuples), key=lambda d: (d.pp * d.group, d.pp, d.tp)):
        plan = dataclasses.replace(space.megatron_plan(d), requests_per_rank=1)
        if "memory" not in evaluate(one, plan, breakdown=False).violations:
            return dataclasses.replace(d, replicas=1)
    return None
