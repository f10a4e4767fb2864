"""What a server's GPUs ask of the machines and containers that run it: the engine's
image for the GPU's vendor and family, the Kubernetes device resource, the environment
of multi-node NVLink, and the container flags ROCm needs.

- **Images.** NVIDIA: the engines' release images (the versions shardlab's engine rules
  are read from: ``shardlab/problems/data/engines/``). ``vllm/vllm-openai:v<version>`` is a
  manifest of an x86_64 and an aarch64 image (vLLM's release script,
  ``.buildkite/scripts/annotate-release.sh``: ``docker manifest create
  vllm/vllm-openai:v${RELEASE_VERSION} ...-x86_64 ...-aarch64``), and so is
  ``lmsysorg/sglang:v<version>`` (sgl-project/sglang
  ``.github/workflows/_docker-build-and-publish.yml``: amd64, and arm64 built with
  ``GRACE_BLACKWELL=1``), so the same tags run on Grace hosts (GB200, GB300, arm64).
  AMD: vLLM's ROCm release image ``vllm/vllm-openai-rocm:v<version>`` (one image for
  gfx942 and gfx950), SGLang's ROCm images, one per GPU family:
  ``lmsysorg/sglang:v<version>-rocm720-mi30x`` (gfx942: MI300X, MI325X) and ``...-mi35x``
  (gfx950: MI350X, MI355X): the tag scheme of SGLang's AMD docs and of InferenceX's AMD
  runs (``amd-master.yaml``); the 0.5.14 tags as deployments pull them (e.g. a
  ``FROM lmsysorg/sglang:v0.5.14-rocm720-mi35x`` Dockerfile, a release table listing
  both families' tags).
- **Resources.** ``nvidia.com/gpu`` (NVIDIA's device plugin) or ``amd.com/gpu`` (AMD's,
  ROCm/k8s-device-plugin: "Exposes AMD GPUs as amd.com/gpu resources").
- **Multi-node NVLink** (GB200/GB300 NVL72: hosts of 4 GPUs on one 72-GPU NVLink
  domain). A server over several hosts of one domain reaches its peers over NVLink only
  with an IMEX channel (in Kubernetes: a ComputeDomain of NVIDIA's DRA driver, see
  :mod:`shardlab.launch.kube`) and NCCL's MNNVL transport:
  ``NCCL_MNNVL_ENABLE=1 NCCL_CUMEM_ENABLE=1``, as NVIDIA Dynamo's GB200 recipe sets them
  (docs.nvidia.com/dynamo, "Running DeepSeek-R1 Disaggregated with WideEP on GB200s").
  ``1`` rather than NCCL's automatic ``2``: a missing channel is an error at start, not a
  silent fall-back to the network the plan was not priced on.
"""

from __future__ import annotations

from shardlab.errors import ShardlabError
from shardlab.problems.cluster import Accelerator, Cluster

RELEASE_IMAGES = {
    "vllm": "vllm/vllm-openai:v0.24.0",
    "sglang": "lmsysorg/sglang:v0.5.14",
    "trtllm": "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc3",
}
# AMD Instinct families by the catalog's keys: the ISA each ROCm build targets.
AMD_FAMILIES = {"mi300x": "mi30x", "mi325x": "mi30x", "mi355x": "mi35x"}
ROCM_IMAGES = {
    ("vllm", "mi30x"): "vllm/vllm-openai-rocm:v0.24.0",
    ("vllm", "mi35x"): "vllm/vllm-openai-rocm:v0.24.0",
    ("sglang", "mi30x"): "lmsysorg/sglang:v0.5.14-rocm720-mi30x",
    ("sglang", "mi35x"): "lmsysorg/sglang:v0.5.14-rocm720-mi35x",
}
# Intel's device plugin (intel/intel-device-plugins-for-kubernetes) names a GPU by its
# kernel driver; the Arc Pro B60 (Battlemage) runs the xe driver.
GPU_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu", "intel": "gpu.intel.com/xe"}
MNNVL_ENV = (("NCCL_MNNVL_ENABLE", "1"), ("NCCL_CUMEM_ENABLE", "1"))
# What `docker run` needs to reach AMD GPUs (ROCm docs, "vLLM inference and serving on
# ROCm" and "SGLang inference and serving on ROCm"); in Kubernetes the device plugin
# mounts the devices.
ROCM_DOCKER = (
    "--device=/dev/kfd --device=/dev/dri --group-add video --ipc=host "
    "--cap-add=SYS_PTRACE --security-opt seccomp=unconfined"
)


def gpu_resource(acc: Accelerator) -> str:
    """The Kubernetes extended resource the GPU's device plugin exposes."""
    return GPU_RESOURCES[acc.vendor]


def image(engine: str, acc: Accelerator) -> str:
    """The engine's image for ``acc``: its release image on NVIDIA, the ROCm build for
    the GPU's family on AMD (refused for an AMD GPU whose family is not known, and on
    Intel, whose images are the user's to give)."""
    if acc.vendor == "nvidia":
        return RELEASE_IMAGES[engine]
    if acc.vendor == "intel":
        raise ShardlabError(
            f"accelerator {acc.key!r}: no image of {engine}'s XPU build is pinned here "
            "(none checked against a release)",
            field="image",
            fix=f"give {engine}'s XPU image for it",
        )
    family = AMD_FAMILIES.get(acc.key)
    if family is None:
        raise ShardlabError(
            f"accelerator {acc.key!r}: an AMD GPU whose family (gfx942 or gfx950) shardlab "
            "does not know, and ROCm images are built per family",
            field="image",
            fix="give the engine's ROCm image for it",
        )
    return ROCM_IMAGES[(engine, family)]


def spans_nvlink_hosts(cluster: Cluster, gpus: int) -> bool:
    """Whether a server of ``gpus`` GPUs spans hosts that share an NVLink domain
    (rack-scale systems): it then needs the MNNVL environment and, in Kubernetes, an
    IMEX channel."""
    return gpus > cluster.host_size and cluster.domain_size > cluster.host_size


def mnnvl_env(cluster: Cluster, gpus: int) -> list[tuple[str, str]]:
    """NCCL's multi-node NVLink switches for a server of ``gpus`` GPUs (none when it
    does not span hosts of one domain)."""
    return list(MNNVL_ENV) if spans_nvlink_hosts(cluster, gpus) else []


def rocm_note(engine: str, acc: Accelerator) -> list[str]:
    """How to run the printed commands on AMD GPUs (nothing on NVIDIA)."""
    if acc.vendor != "amd":
        return []
    try:
        where = f"the ROCm image {image(engine, acc)}"
    except ShardlabError:
        where = f"{engine}'s ROCm image for its GPU family"
    return [f"{acc.name}: run each command in {where} (docker run {ROCM_DOCKER} ...)"]
