"""The GPUs a model is spread over: accelerator profile, node size, interconnect.

A cluster is written ``h100x64`` (64 H100 in nodes of 8) or read from a YAML file::

    accelerator: h100          # a built-in name, or a mapping with every Accelerator field
    num_gpus: 64
    gpus_per_node: 8           # optional; defaults to the accelerator's node size
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from shardlab.errors import ShardlabError
from shardlab.problems.limits import MAX_GPUS, MAX_GPUS_PER_NODE, check_count, check_finite


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    """One GPU's peaks and links. Units as in ``data/accelerators.yaml``."""

    key: str
    name: str
    bf16_tflops: float
    fp8_tflops: float  # 0: no FP8 tensor cores
    fp4_tflops: float  # 0: no FP4 tensor cores
    hbm_gb: float
    hbm_gbps: float
    nvlink_gbps: float  # intra-node, per GPU, one direction
    nvlink_latency_us: float
    net_gbps: float  # inter-node, per GPU, one direction
    net_latency_us: float
    gpus_per_node: int

    def __post_init__(self) -> None:
        positive = ("bf16_tflops", "hbm_gb", "hbm_gbps", "nvlink_gbps", "net_gbps")
        for f in fields(self):
            if f.name in ("key", "name", "gpus_per_node"):
                continue
            check_finite(
                getattr(self, f.name),
                what=f"accelerator {self.key!r}: {f.name}",
                positive=f.name in positive,
            )
        check_count(
            self.gpus_per_node,
            MAX_GPUS_PER_NODE,
            what=f"accelerator {self.key!r}: gpus_per_node",
        )

    def peak_tflops(self, dtype: str) -> float:
        """Dense tensor-core peak for a GEMM whose weights are stored as ``dtype``.

        A format without tensor-core support on this GPU runs at the bf16 rate: the
        weights are upcast before the multiply (weight-only quantization, as vLLM's
        Marlin and Triton MoE kernels do for fp8 on A100 and mxfp4 on Hopper).
        """
        if dtype == "fp4" and self.fp4_tflops:
            return self.fp4_tflops
        if dtype == "fp8" and self.fp8_tflops:
            return self.fp8_tflops
        return self.bf16_tflops


@dataclass(frozen=True, kw_only=True)
class Cluster:
    accelerator: Accelerator
    num_gpus: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        check_count(self.num_gpus, MAX_GPUS, what="cluster: num_gpus")
        check_count(self.gpus_per_node, MAX_GPUS_PER_NODE, what="cluster: gpus_per_node")
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise ShardlabError(
                f"cluster: {self.num_gpus} GPUs do not fill whole nodes of "
                f"{self.gpus_per_node}; use a multiple of {self.gpus_per_node}"
            )

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def node_size(self) -> int:
        """GPUs that share one NVLink domain in this cluster."""
        return min(self.num_gpus, self.gpus_per_node)

    @property
    def name(self) -> str:
        return f"{self.accelerator.key}x{self.num_gpus}"

    @property
    def total_hbm_gb(self) -> float:
        return self.accelerator.hbm_gb * self.num_gpus

    def describe(self) -> str:
        a = self.accelerator
        return (
            f"{self.num_gpus} x {a.name} ({self.num_nodes} node(s) of {self.node_size}; "
            f"{a.hbm_gb:g} GB HBM, NVLink {a.nvlink_gbps:g} GB/s, network {a.net_gbps:g} GB/s "
            "per GPU)"
        )


@cache
def builtin_accelerators() -> dict[str, Accelerator]:
    text = (resources.files("shardlab.problems") / "data" / "accelerators.yaml").read_text()
    raw = yaml.safe_load(text)
    return {key: Accelerator(key=key, **spec) for key, spec in raw.items()}


def _accelerator(value: Any, *, where: str) -> Accelerator:
    known = builtin_accelerators()
    if isinstance(value, str):
        acc = known.get(value.lower())
        if acc is None:
            raise ShardlabError(
                f"{where}: unknown GPU {value!r}; built-in GPUs: {', '.join(known)} "
                "(or describe it in a cluster YAML file)"
            )
        return acc
    if isinstance(value, dict):
        expected = {f.name for f in fields(Accelerator)} - {"key"}
        missing = sorted(expected - set(value) - {"gpus_per_node"})
        unknown = sorted(set(value) - expected)
        if missing or unknown:
            raise ShardlabError(
                f"{where}: accelerator "
                + (f"misses {', '.join(missing)}" if missing else "")
                + ("; " if missing and unknown else "")
                + (f"has unknown keys {', '.join(unknown)}" if unknown else "")
            )
        spec = {"gpus_per_node": 8, **value}
        try:
            return Accelerator(key=str(value["name"]).lower().replace(" ", "-"), **spec)
        except ShardlabError as exc:
            raise ShardlabError(f"{where}: {exc}") from None
    raise ShardlabError(f"{where}: 'accelerator' must be a GPU name or a mapping of its specs")


_SPEC = re.compile(r"^(?P<gpu>[a-z0-9]+?)x(?P<n>\d+)$")


def parse_cluster(spec: str) -> Cluster:
    """``h100x64`` -> 64 H100 in nodes of 8; a path ending in .yaml/.yml -> that file."""
    if spec.endswith((".yaml", ".yml")) or Path(spec).is_file():
        return load_cluster_yaml(spec)
    match = _SPEC.match(spec.lower())
    if match is None:
        raise ShardlabError(
            f"cluster {spec!r}: write it as GPUxCOUNT (e.g. h100x64) or give a YAML file"
        )
    acc = _accelerator(match["gpu"], where=f"cluster {spec!r}")
    if len(match["n"]) > len(str(MAX_GPUS)):  # not parsed: int() refuses 4,300 digits
        raise ShardlabError(
            f"cluster {spec!r}: more GPUs than shardlab takes ({MAX_GPUS:,}); give fewer"
        )
    n = int(match["n"])
    if n < 1:
        raise ShardlabError(f"cluster {spec!r}: the GPU count must be at least 1")
    try:
        return Cluster(accelerator=acc, num_gpus=n, gpus_per_node=acc.gpus_per_node)
    except ShardlabError as exc:
        raise ShardlabError(f"cluster {spec!r}: {str(exc).removeprefix('cluster: ')}") from None


def load_cluster_yaml(path: str | Path) -> Cluster:
    where = str(path)
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ShardlabError(f"{where}: cannot read the cluster file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ShardlabError(f"{where}: not a text file; a cluster is a YAML file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ShardlabError(f"{where}: malformed YAML{at}") from None
    if not isinstance(raw, dict):
        raise ShardlabError(f"{where}: a cluster file must be a mapping with accelerator, num_gpus")
    unknown = sorted(set(raw) - {"accelerator", "num_gpus", "gpus_per_node"})
    if unknown:
        raise ShardlabError(f"{where}: unknown keys {', '.join(unknown)}")
    if "accelerator" not in raw or "num_gpus" not in raw:
        raise ShardlabError(f"{where}: missing key 'accelerator' or 'num_gpus'")
    acc = _accelerator(raw["accelerator"], where=where)
    n, per_node = raw["num_gpus"], raw.get("gpus_per_node", acc.gpus_per_node)
    for key, value in (("num_gpus", n), ("gpus_per_node", per_node)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ShardlabError(f"{where}: key {key!r} must be an integer, got {value!r}")
    try:
        return Cluster(accelerator=acc, num_gpus=n, gpus_per_node=per_node)
    except ShardlabError as exc:
        raise ShardlabError(f"{where}: {str(exc).removeprefix('cluster: ')}") from None


def parse_accelerators(spec: str) -> dict[str, Accelerator]:
    """``h100,h200,b200`` (built-in names, or cluster YAML files whose accelerator and
    node size are taken) -> accelerators by key, in the order given."""
    out: dict[str, Accelerator] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            raise ShardlabError(
                f"GPU types {spec!r}: an empty entry; list them as h100,h200,b200", field="gpus"
            )
        if item.endswith((".yaml", ".yml")) or Path(item).is_file():
            cluster = load_cluster_yaml(item)
            acc = replace(cluster.accelerator, gpus_per_node=cluster.gpus_per_node)
        else:
            acc = _accelerator(item, where=f"GPU type {item!r}")
        if acc.key in out:
            raise ShardlabError(f"GPU types {spec!r}: {acc.key} is listed twice", field="gpus")
        out[acc.key] = acc
    return out
