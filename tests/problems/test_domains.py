"""NVLink domains apart from hosts: a rack's 72 GPUs share one fabric over 18 hosts of
4, and every consumer reads the size it means (collectives the domain, placement and
launch the host). The search on a small domain is checked against enumeration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from shardlab import Problem
from shardlab.costmodel.collectives import collective_time, hop_is_inter_node, span
from shardlab.errors import ShardlabError
from shardlab.problems.cluster import builtin_accelerators, load_cluster_yaml, parse_cluster
from shardlab.problems.degrees import Degrees
from shardlab.problems.disagg import fits, in_one_domain, instance_sizes
from shardlab.sizing.capacity import instance_sizes as sizing_instance_sizes
from shardlab.solvers import Budget, solve

ROUNDING = 1e-4  # as tests/solvers/test_cpsat.py: the tables' rounding

# A small rack: hosts of 1 GPU on a 2-GPU NVLink domain, so that domains and hosts
# part on clusters small enough to enumerate.
SMALL_RACK = {
    "name": "rack4",
    "bf16_tflops": 989,
    "fp8_tflops": 1979,
    "fp4_tflops": 0,
    "hbm_gb": 80,
    "hbm_gbps": 3350,
    "nvlink_gbps": 450,
    "nvlink_latency_us": 3.1,
    "net_gbps": 12.5,
    "net_latency_us": 10.0,
    "gpus_per_node": 1,
    "gpus_per_domain": 2,
}


def _cluster_file(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(fields))
    return path


def test_a_rack_is_hosts_of_four_on_one_domain_of_72() -> None:
    c = parse_cluster("gb200x72")
    assert (c.host_size, c.num_hosts, c.domain_size, c.num_domains) == (4, 18, 72, 1)
    two = parse_cluster("gb300x144")
    assert (two.host_size, two.num_hosts, two.domain_size, two.num_domains) == (4, 36, 72, 2)
    hgx = parse_cluster("b300x16")
    assert (hgx.host_size, hgx.domain_size, hgx.num_domains) == (8, 8, 2)
    assert "18 host(s) of 4, 1 NVLink domain(s) of 72" in c.describe()


def test_every_catalog_gpu_states_its_host_domain_and_vendor() -> None:
    accs = builtin_accelerators()
    expected = {
        "h100", "h200", "b200", "a100", "b300", "gb200", "gb300",
        "h100pcie", "l40s", "l4", "rtxpro6000", "mi300x", "mi325x", "mi355x", "b60",
    }  # fmt: skip
    assert set(accs) == expected
    for a in accs.values():
        assert a.gpus_per_domain % a.gpus_per_node == 0
        assert a.vendor in ("nvidia", "amd", "intel")
    assert {k for k, a in accs.items() if a.vendor == "amd"} == {"mi300x", "mi325x", "mi355x"}
    assert {k for k, a in accs.items() if a.gpus_per_domain > a.gpus_per_node} == {
        "gb200",
        "gb300",
    }


def test_a_yaml_cluster_states_its_domain(tmp_path: Path) -> None:
    nvl36 = load_cluster_yaml(
        _cluster_file(tmp_path, accelerator="gb200", num_gpus=72, gpus_per_domain=36)
    )
    assert (nvl36.host_size, nvl36.domain_size, nvl36.num_domains) == (4, 36, 2)
    # a host of another size on a board whose fabric is the host: the host is the domain
    h100 = load_cluster_yaml(
        _cluster_file(tmp_path, accelerator="h100", num_gpus=8, gpus_per_node=4)
    )
    assert (h100.host_size, h100.domain_size) == (4, 4)
    rack = load_cluster_yaml(_cluster_file(tmp_path, accelerator=SMALL_RACK, num_gpus=8))
    assert (rack.host_size, rack.domain_size, rack.num_domains) == (1, 2, 4)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"accelerator": "gb200", "num_gpus": 72, "gpus_per_domain": 70}, "not whole hosts of 4"),
        ({"accelerator": "gb200", "num_gpus": 72, "gpus_per_domain": 0}, "at least 1"),
        ({"accelerator": "gb200", "num_gpus": 72, "gpus_per_domain": "72"}, "must be an integer"),
        ({"accelerator": "gb200", "num_gpus": 70}, "whole hosts of 4"),
        ({"accelerator": "gb20", "num_gpus": 72}, "did you mean gb200"),
    ],
)
def test_a_bad_cluster_is_refused_naming_the_fix(
    tmp_path: Path, fields: dict[str, object], says: str
) -> None:
    with pytest.raises(ShardlabError, match=says):
        load_cluster_yaml(_cluster_file(tmp_path, **fields))


def test_an_unknown_gpu_is_refused_with_close_matches() -> None:
    with pytest.raises(ShardlabError, match="did you mean mi300x"):
        parse_cluster("mi300x8")  # read as 8 of "mi300"
    with pytest.raises(ShardlabError, match="did you mean l40s"):
        parse_cluster("l40x8")


def test_collectives_inside_the_domain_run_on_nvlink_across_hosts() -> None:
    rack, hgx = parse_cluster("gb200x72"), parse_cluster("b200x72")
    # a 16-way group spans 4 trays of the rack, all on its NVLink; on HGX, two boards
    assert span(16, 1, rack).nodes == 1 and span(16, 1, hgx).nodes == 2
    assert span(72, 1, rack).nodes == 1 and span(72, 1, hgx).nodes == 9
    d = Degrees(replicas=1, pp=2, tp=36, ep=1, etp=36)
    assert not hop_is_inter_node(0, d, rack) and hop_is_inter_node(0, d, hgx)
    assert in_one_domain(rack, 72) and not in_one_domain(hgx, 16)


def test_placement_counts_hosts() -> None:
    rack = parse_cluster("gb200x72")
    sizes = instance_sizes(rack)
    assert sizes[:4] == (1, 2, 4, 8) and 12 in sizes  # whole trays
    assert fits(rack, {4: 18}) and not fits(rack, {8: 9, 4: 1})
    gb200 = builtin_accelerators()["gb200"]
    assert sizing_instance_sizes(gb200, 256) == (1, 2, 4, 8, 16, 32, 64, 72, 144)


def test_a_wide_group_is_cheaper_on_the_rack_than_over_the_network() -> None:
    """A 16-way all-to-all (DeepSeek-class experts over 16 GPUs): on the rack it stays
    on NVLink, on two HGX boards of the same GPU speed it crosses the network."""
    rack, hgx = parse_cluster("gb200x16"), parse_cluster("b200x16")
    nbytes = np.array([1e6, 1e8])
    on_rack = collective_time("all_to_all", span(16, 1, rack), nbytes, rack)
    over_net = collective_time("all_to_all", span(16, 1, hgx), nbytes, hgx)
    assert np.all(on_rack < over_net / 2)


@pytest.mark.slow
@pytest.mark.parametrize("gpus", [4])
def test_cpsat_equals_enumeration_on_a_small_rack(tmp_path: Path, gpus: int) -> None:
    cluster = load_cluster_yaml(_cluster_file(tmp_path, accelerator=SMALL_RACK, num_gpus=gpus))
    assert (cluster.host_size, cluster.domain_size) == (1, 2)
    problem = Problem.build("llama-3.1-8b", cluster, "chat")
    exact = solve(problem, "cpsat", budget=Budget(max_evals=None, seconds=300))
    truth = solve(problem, "exhaustive", budget=Budget(max_evals=None))
    assert exact.status == truth.status == "optimal"
    assert exact.metrics is not None and truth.metrics is not None
    assert exact.metrics.objective == pytest.approx(truth.metrics.objective, rel=ROUNDING)
    # and the domain is what the answer depends on: the same GPUs, each its own domain
    narrow = load_cluster_yaml(
        _cluster_file(tmp_path, accelerator={**SMALL_RACK, "gpus_per_domain": 1}, num_gpus=gpus)
    )
    other = solve(Problem.build("llama-3.1-8b", narrow, "chat"), "cpsat")
    assert other.metrics is not None
    assert other.metrics.objective < exact.metrics.objective


def test_tensorrt_llm_is_refused_on_amd_and_the_rocm_engines_build() -> None:
    with pytest.raises(ShardlabError, match="engine trtllm does not run on Instinct MI355X"):
        Problem.build("llama-3.1-70b", "mi355xx8", "chat", engine="trtllm")
    for engine in ("vllm", "sglang"):
        assert Problem.build("llama-3.1-70b", "mi300xx8", "chat", engine=engine).engine == engine


def test_a_cluster_of_another_shape_has_another_name(tmp_path: Path) -> None:
    """Runs, caches and plan files are keyed by the cluster's name: NVL36 must not pass
    for NVL72, nor hosts of 4 H100 for HGX boards of 8."""
    names = {
        load_cluster_yaml(_cluster_file(tmp_path, accelerator="gb200", num_gpus=72, **extra)).name
        for extra in ({}, {"gpus_per_domain": 36}, {"gpus_per_domain": 4}, {"gpus_per_node": 2})
    }
    assert len(names) == 4 and "gb200x72" in names
    assert parse_cluster("h100x8").name == "h100x8"
    h100 = load_cluster_yaml(
        _cluster_file(tmp_path, accelerator="h100", num_gpus=8, gpus_per_node=4)
    )
    assert h100.name == "h100x8-host4"


@pytest.mark.slow
def test_disaggregated_optimum_equals_enumeration_on_a_small_rack(tmp_path: Path) -> None:
    """Pools placed by hosts, the handoff over NVLink inside a domain: CP-SAT's pair of
    pools is the best of every pair of pools and plans, enumerated."""
    from shardlab.solvers.cpsat.disagg import solve_disagg
    from tests.solvers.test_disagg import brute_force

    cluster = load_cluster_yaml(_cluster_file(tmp_path, accelerator=SMALL_RACK, num_gpus=4))
    problem = Problem.build("llama-3.1-8b", cluster, "chat", input_len=4096, output_len=128)
    r = solve_disagg(problem, budget=Budget(max_evals=None, seconds=600.0))
    truth = brute_force(problem)
    assert truth > 0 and r.status == "optimal" and r.metrics is not None
    assert r.metrics.request_rate == pytest.approx(truth, rel=1e-9)


def test_the_intel_card_runs_vllm_only() -> None:
    with pytest.raises(ShardlabError, match="INTEL GPUs are served by vllm"):
        Problem.build("llama-3.1-8b", "b60x4", "chat", engine="sglang")
    assert Problem.build("llama-3.1-8b", "b60x4", "chat", engine="vllm").engine == "vllm"
