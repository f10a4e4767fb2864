"""The package data tables load validated: a bad entry is refused naming the file and
the field, and the shipped tables hold what the code used to define."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardlab.errors import ShardlabError
from shardlab.problems.datafile import load_records
from shardlab.problems.families import FAMILIES, Family
from shardlab.problems.suite import INSTANCES, SIZES, Instance
from shardlab.problems.workload import PRESETS, Workload


def table(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "table.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "cls", "field", "words"),
    [
        ("chat:\n  batch: 8\n  nope: 1\n", Workload, "chat.nope", "unknown field 'nope'"),
        ("chat:\n  batch: eight\n", Workload, "chat.batch", "must be an integer"),
        ("chat:\n  batch: true\n", Workload, "chat.batch", "must be an integer"),
        ("chat:\n  phase: lunch\n", Workload, "chat.phase", "must be one of"),
        ("chat:\n  ttft_ms: fast\n", Workload, "chat.ttft_ms", "a number or null"),
        (
            "x:\n  model: m\n  cluster: c\n  size: small\n  split: train\n",
            Instance,
            "x.workload",
            "missing field 'workload'",
        ),
        ("llama:\n  defaults: [1]\n", Family, "llama.defaults", "must be a mapping"),
        ("llama:\n  name: x\n", Family, "llama.name", "unknown field 'name'"),
    ],
)
def test_a_bad_entry_is_refused_naming_file_and_field(
    tmp_path: Path, text: str, cls: type, field: str, words: str
) -> None:
    path = table(tmp_path, text)
    with pytest.raises(ShardlabError) as info:
        load_records(path, cls)
    assert info.value.field == field
    assert str(path) in str(info.value) and words in str(info.value)


def test_the_dataclass_own_checks_name_the_file(tmp_path: Path) -> None:
    path = table(tmp_path, "chat:\n  batch: 0\n")
    with pytest.raises(ShardlabError, match=r"table\.yaml: entry 'chat'"):
        load_records(path, Workload)


@pytest.mark.parametrize("text", ["- a\n- b\n", "chat: [\n", "chat: 3\n", "no: {}\n"])
def test_a_file_that_is_no_table_is_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(ShardlabError, match=r"table\.yaml"):
        load_records(table(tmp_path, text), Workload)


def test_entries_keep_their_order_types_and_names(tmp_path: Path) -> None:
    path = table(tmp_path, "b:\n  ttft_ms: 5\n  batch: 3\na: {}\n")
    loaded = load_records(path, Workload)
    assert list(loaded) == ["b", "a"]
    assert loaded["b"] == Workload(name="b", ttft_ms=5.0, batch=3)
    assert isinstance(loaded["b"].ttft_ms, float)
    assert loaded["a"] == Workload(name="a")


def test_overrides_are_written_as_a_mapping(tmp_path: Path) -> None:
    text = (
        "x:\n  model: m\n  cluster: c\n  workload: chat\n  size: slo\n  split: heldout\n"
        "  overrides: {batch: 4096, ttft_ms: 2000.0}\n"
    )
    inst = load_records(table(tmp_path, text), Instance)["x"]
    assert inst.overrides == (("batch", 4096), ("ttft_ms", 2000.0))


def test_loading_is_cached() -> None:
    assert load_records("workloads.yaml", Workload) is load_records("workloads.yaml", Workload)
    assert load_records("workloads.yaml", Workload) is PRESETS


def test_the_shipped_tables() -> None:
    assert list(PRESETS) == [
        "chat",
        "interactive",
        "long-context",
        "batch-offline",
        "prefill",
        "decode",
        "latency",
    ]
    assert PRESETS["interactive"] == Workload(
        name="interactive", batch=32, ttft_ms=1000.0, tpot_ms=25.0
    )
    assert PRESETS["latency"].objective == "latency" and PRESETS["latency"].batch == 1
    assert len(INSTANCES) == len({i.name for i in INSTANCES}) == 32
    assert {i.size for i in INSTANCES} == set(SIZES)  # every size has instances
    gemma3, gemma4 = FAMILIES["gemma3_text"], FAMILIES["gemma4_text"]
    assert gemma3.defaults["vocab_size"] == 262208 and gemma4.defaults["vocab_size"] == 262144
    assert gemma4.norms_per_layer == gemma3.norms_per_layer == 4
    assert FAMILIES["llama4_text"].qk_norm_weights == "none"
    assert FAMILIES["llama"] == Family()
