"""The deployment targets of ``shardlab launch --target``: which objects each writes,
as YAML, and the file it goes to."""

from __future__ import annotations

import json
from typing import Any

import yaml

from shardlab.launch.dynamo import dynamo_objects
from shardlab.launch.kube import PodOptions, compute_domain, k8s_objects, mnnvl
from shardlab.launch.llmd import CHART, llmd_values
from shardlab.launch.pods import PodGroup

TARGETS = ("shell", "k8s", "llm-d", "dynamo")
FILES = {"k8s": "manifests.yaml", "llm-d": "values.yaml", "dynamo": "dynamo.yaml"}


class _Plain(yaml.SafeDumper):
    """YAML without anchors (a selector and a template share their labels)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(documents: list[Any]) -> str:
    return yaml.dump_all(documents, Dumper=_Plain, sort_keys=False, width=100)


def documents(target: str, groups: list[PodGroup], opts: PodOptions) -> list[Any]:
    """The target's YAML documents (objects to apply, or one Helm values document)."""
    if target == "k8s":
        return k8s_objects(groups, opts)
    if target == "dynamo":
        return dynamo_objects(groups, opts)
    if target == "llm-d":
        return [llmd_values(groups, opts)]
    raise ValueError(target)


def how_to_apply(target: str, path: str | None, opts: PodOptions, groups: list[PodGroup]) -> str:
    """The command that applies the target's file at ``path`` (None: the YAML went to
    standard output, and the command reads it from a pipe)."""
    source = path or "-"
    piped = "" if path else "pipe this output to: "
    if target == "llm-d":
        domains: list[dict] = []
        for g in groups:
            if mnnvl(g) and compute_domain(opts, g) not in domains:
                domains.append(compute_domain(opts, g))
        first = "".join(
            f"; first apply its ComputeDomain (NVIDIA's DRA driver): {json.dumps(d)}"
            for d in domains
        )
        return (
            f"{piped}helm install {opts.name} llm-d-modelservice/{CHART} -n {opts.namespace} "
            f"-f {source} (helm repo add llm-d-modelservice "
            f"https://llm-d-incubation.github.io/llm-d-modelservice/){first}"
        )
    needs = ""
    if target == "dynamo":
        needs = " (needs the Dynamo operator and its CRDs"
        if any(mnnvl(g) for g in groups):
            needs += "; and NVIDIA's DRA driver for their ComputeDomain"
        needs += ")"
    elif any(g.nodes > 1 for g in groups):
        needs = " (needs the LeaderWorkerSet controller: its multi-node servers are LWS groups"
        if any(mnnvl(g) for g in groups):
            needs += "; and NVIDIA's DRA driver for their ComputeDomain"
        needs += ")"
    return f"{piped}kubectl apply -n {opts.namespace} -f {source}{needs}"
