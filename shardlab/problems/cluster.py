"""The GPUs a model is spread over: accelerator profile, hosts, NVLink domains.

Two sizes describe where GPUs sit, and they differ on rack-scale systems: a *host*
(``gpus_per_node``) is what one server, and one pod, holds; a *domain*
(``gpus_per_domain``) is the GPUs that share one scale-up fabric (NVLink, xGMI, or a
host's PCIe). An HGX H100 board is both, 8 GPUs; a GB200 NVL72 rack is 18 hosts of 4
GPUs on one 72-GPU NVLink domain. Collectives and pipeline hops are priced on the
domain; launch and placement count hosts.

A cluster is written ``h100x64`` (64 H100 in hosts and domains of 8) or read from a
YAML file::

    accelerator: gb200         # a built-in name, or a mapping with every Accelerator field
    num_gpus: 144
    gpus_per_node: 4           # optional; defaults to the accelerator's host size
    gpus_per_domain: 72        # optional; defaults to the accelerator's domain size
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, fields, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from shardlab.errors import ShardlabError
from shardlab.problems.limits import MAX_GPUS, MAX_GPUS_PER_NODE, check_count, check_finite

VENDORS = ("nvidia", "amd", "intel")


def check_domain(per_host: int, per_domain: int, *, where: str) -> None:
    """A domain is whole hosts: refused, naming ``where``, if not."""
    check_count(per_domain, MAX_GPUS_PER_NODE, what=f"{where}: gpus_per_domain")
    if per_domain % per_host:
        raise ShardlabError(
            f"{where}: an NVLink domain of {per_domain} GPUs is not whole hosts of "
            f"{per_host}; give gpus_per_domain as a multiple of gpus_per_node"
        )


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
    gpus_per_node: int  # GPUs per host
    gpus_per_domain: int  # GPUs per scale-up fabric (NVLink, xGMI, PCIe), whole hosts
    vendor: str  # nvidia, amd or intel

    def __post_init__(self) -> None:
        positive = ("bf16_tflops", "hbm_gb", "hbm_gbps", "nvlink_gbps", "net_gbps")
        for f in fields(self):
            if f.name in ("key", "name", "vendor", "gpus_per_node", "gpus_per_domain"):
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
        check_domain(self.gpus_per_node, self.gpus_per_domain, where=f"accelerator {self.key!r}")
        if self.vendor not in VENDORS:
            raise ShardlabError(
                f"accelerator {self.key!r}: vendor must be one of {', '.join(VENDORS)}, "
                f"got {self.vendor!r}"
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
    gpus_per_node: int  # GPUs per host
    gpus_per_domain: int = 0  # GPUs per NVLink domain; 0: the accelerator's

    def __post_init__(self) -> None:
        check_count(self.num_gpus, MAX_GPUS, what="cluster: num_gpus")
        check_count(self.gpus_per_node, MAX_GPUS_PER_NODE, what="cluster: gpus_per_node")
        if not self.gpus_per_domain:
            object.__setattr__(self, "gpus_per_domain", self._default_domain)
        check_domain(self.gpus_per_node, self.gpus_per_domain, where="cluster")
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise ShardlabError(
                f"cluster: {self.num_gpus} GPUs do not fill whole hosts of "
                f"{self.gpus_per_node}; use a multiple of {self.gpus_per_node}"
            )

    @property
    def _default_domain(self) -> int:
        # where the accelerator's fabric is its host's (HGX, PCIe cards), a host of
        # another size brings its own fabric; a rack's domain spans its hosts
        acc = self.accelerator
        rack = acc.gpus_per_domain > acc.gpus_per_node
        return acc.gpus_per_domain if rack else self.gpus_per_node

    @property
    def host_size(self) -> int:
        """GPUs of this cluster in one host (one server, one pod)."""
        return min(self.num_gpus, self.gpus_per_node)

    @property
    def num_hosts(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def domain_size(self) -> int:
        """GPUs of this cluster on one NVLink domain: collectives inside it run on the
        scale-up fabric, across domains on the network."""
        return min(self.num_gpus, self.gpus_per_domain)

    @property
    def num_domains(self) -> int:
        return -(-self.num_gpus // self.gpus_per_domain)

    @property
    def name(self) -> str:
        """``gb200x72``; a host or domain other than the accelerator's is named too
        (``gb200x72-domain36``), so that runs, caches and plan files keyed by the name
        never mistake one shape for another."""
        acc, name = self.accelerator, f"{self.accelerator.key}x{self.num_gpus}"
        if self.gpus_per_node != acc.gpus_per_node:
            name += f"-host{self.gpus_per_node}"
        if self.gpus_per_domain != self._default_domain:
            name += f"-domain{self.gpus_per_domain}"
        return name

    @property
    def total_hbm_gb(self) -> float:
        return self.accelerator.hbm_gb * self.num_gpus

    def describe(self) -> str:
        a = self.accelerator
        hosts = f"{self.num_hosts} host(s) of {self.host_size}"
        if self.domain_size > self.host_size:
            hosts += f", {self.num_domains} NVLink domain(s) of {self.domain_size}"
        return (
            f"{self.num_gpus} x {a.name} ({hosts}; {a.hbm_gb:g} GB memory, scale-up "
            f"{a.nvlink_gbps:g} GB/s, network {a.net_gbps:g} GB/s per GPU)"
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
            close = difflib.get_close_matches(value.lower(), known, n=3, cutoff=0.5)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            raise ShardlabError(
                f"{where}: unknown GPU {value!r}; {hint}built-in GPUs: {', '.join(known)} "
                "(shardlab clusters lists them; or describe it in a cluster YAML file)"
            )
        return acc
    if isinstance(value, dict):
        expected = {f.name for f in fields(Accelerator)} - {"key"}
        missing = sorted(expected - set(value) - {"gpus_per_node", "gpus_per_domain", "vendor"})
        unknown = sorted(set(value) - expected)
        if missing or unknown:
            raise ShardlabError(
                f"{where}: accelerator "
                + (f"misses {', '.join(missing)}" if missing else "")
                + ("; " if missing and unknown else "")
                + (f"has unknown keys {', '.join(unknown)}" if unknown else "")
            )
        per_node = value.get("gpus_per_node", 8)
        spec = {"gpus_per_node": 8, "gpus_per_domain": per_node, "vendor": "nvidia", **value}
        try:
            return Accelerator(key=str(value["name"]).lower().replace(" ", "-"), **spec)
        except ShardlabError as exc:
            raise ShardlabError(f"{where}: {exc}") from None
    raise ShardlabError(f"{where}: 'accelerator' must be a GPU name or a mapping of its specs")


_SPEC = re.compile(r"^(?P<gpu>[a-z0-9]+?)x(?P<n>\d+)$")


def parse_cluster(spec: str) -> Cluster:
    """``h100x64`` -> 64 H100 in hosts of 8; a path ending in .yaml/.yml -> that file."""
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
    unknown = sorted(set(raw) - {"accelerator", "num_gpus", "gpus_per_node", "gpus_per_domain"})
    if unknown:
        raise ShardlabError(f"{where}: unknown keys {', '.join(unknown)}")
    if "accelerator" not in raw or "num_gpus" not in raw:
        raise ShardlabError(f"{where}: missing key 'accelerator' or 'num_gpus'")
    acc = _accelerator(raw["accelerator"], where=where)
    n, per_node = raw["num_gpus"], raw.get("gpus_per_node", acc.gpus_per_node)
    per_domain = raw.get("gpus_per_domain", 0)
    sizes = (("num_gpus", n), ("gpus_per_node", per_node), ("gpus_per_domain", per_domain))
    for key, value in sizes:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ShardlabError(f"{where}: key {key!r} must be an integer, got {value!r}")
    if "gpus_per_domain" in raw and per_domain < 1:
        raise ShardlabError(f"{where}: key 'gpus_per_domain' must be at least 1")
    try:
        return Cluster(
            accelerator=acc, num_gpus=n, gpus_per_node=per_node, gpus_per_domain=per_domain
        )
    except ShardlabError as exc:
        raise ShardlabError(f"{where}: {str(exc).removeprefix('cluster: ')}") from None


def parse_accelerators(spec: str) -> dict[str, Accelerator]:
    """``h100,h200,b200`` (built-in names, or cluster YAML files whose accelerator and
    host and domain sizes are taken) -> accelerators by key, in the order given."""
    out: dict[str, Accelerator] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            raise ShardlabError(
                f"GPU types {spec!r}: an empty entry; list them as h100,h200,b200", field="gpus"
            )
        if item.endswith((".yaml", ".yml")) or Path(item).is_file():
            cluster = load_cluster_yaml(item)
            acc = replace(
                cluster.accelerator,
                gpus_per_node=cluster.gpus_per_node,
                gpus_per_domain=cluster.gpus_per_domain,
            )
        else:
            acc = _accelerator(item, where=f"GPU type {item!r}")
        if acc.key in out:
            raise ShardlabError(f"GPU types {spec!r}: {acc.key} is listed twice", field="gpus")
        out[acc.key] = acc
    return out
