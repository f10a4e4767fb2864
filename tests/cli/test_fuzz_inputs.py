"""Bad inputs, fuzzed (the inputs that describe a problem: config.json,
clusters, workload flags, plan files): every one is refused in one line on stderr
with status 2.

Hypothesis draws inputs that are wrong by construction (a config.json, a cluster, a
workload, a plan, an output path, a storage URL, a numeric flag) and runs the command
line in-process on each, in a fresh empty folder. Each must end with ``SystemExit(2)``
(any other exception fails the test with its traceback), print exactly one line on
stderr, starting ``error:``, and leave the folder as it found it. What the strategies
cover is listed with each; argv never holds a NUL (no shell can pass one).
"""

from __future__ import annotations

import copy
import dataclasses
import json

from hypothesis import given
from hypothesis import strategies as st

from shardlab.problems import Problem
from shardlab.problems.limits import MAX_BATCH, MAX_GPUS, MAX_LAYERS
from tests.cli.conftest import (
    BAD_COUNTS,
    FUZZ,
    MODEL_DIR,
    NON_FINITE,
    json_text,
    refused,
    write,
)

# -- config.json ---------------------------------------------------------------------------

CONFIGS = {
    "dense": "meta-llama--Meta-Llama-3.1-8B.json",
    "moe": "mistralai--Mixtral-8x7B-v0.1.json",
    "mla": "deepseek-ai--DeepSeek-V3.json",
}
# Keys each config is read by, every one required to be a positive integer (a count of
# experts is not: 0 experts is a dense model, as Qwen's configs write it).
REQUIRED = {
    "dense": (
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
    ),
    "moe": (
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "num_experts_per_tok",
        "intermediate_size",
    ),
    "mla": (
        "num_hidden_layers",
        "kv_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
        "moe_intermediate_size",
        "num_experts_per_tok",
    ),
}


def base_config(kind: str) -> dict:
    return json.loads((MODEL_DIR / CONFIGS[kind]).read_text())


@st.composite
def bad_configs(draw: st.DrawFn) -> str | bytes:
    """A real config with one required key made wrong, or a file that is no config."""
    kind = draw(st.sampled_from(sorted(CONFIGS)))
    cfg = base_config(kind)
    how = draw(st.sampled_from(["value", "non-finite", "layers", "structure", "bytes"]))
    if how == "value":
        cfg[draw(st.sampled_from(REQUIRED[kind]))] = draw(BAD_COUNTS)
    elif how == "non-finite":
        cfg[draw(st.sampled_from(REQUIRED[kind]))] = draw(NON_FINITE)
    elif how == "layers":
        cfg["num_hidden_layers"] = draw(st.integers(MAX_LAYERS + 1, 10**18))
    elif how == "structure":
        return draw(
            st.sampled_from(
                [
                    "[]",
                    '"config"',
                    "42",
                    json.dumps({**cfg, "text_config": "x"}),
                    # more experts per token than experts (a dense config has none)
                    json.dumps({**cfg, "num_experts_per_tok": 999, "n_routed_experts": 8})
                    if kind != "dense"
                    else "{",
                    json.dumps({**cfg, "quantization_config": {"quant_method": "awq"}}),
                    json.dumps(
                        {k: v for k, v in cfg.items() if k != "quantization_config"}
                        | {"torch_dtype": "int4"}
                    ),
                    "[" * 100_000 + "]" * 100_000,  # deeper than the parser recurses
                    '{"num_hidden_layers": ' + "9" * 5000 + "}",  # past int()'s digit limit
                    json.dumps(cfg)[: draw(st.integers(1, 200))],  # truncated
                ]
            )
        )
    else:
        return draw(st.binary(min_size=1, max_size=256).filter(_not_utf8))
    return json_text(cfg)


def _not_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return True
    return False


@FUZZ
@given(bad_configs())
def test_bad_config_json_is_refused(content: str | bytes) -> None:
    refused(
        ["space", "--model", "config.json", "--cluster", "h100x64"], write("config.json", content)
    )


@FUZZ
@given(st.sampled_from(["", " ", "llama-9000", "no/such/dir", "missing.json"]))
def test_unknown_model_is_refused(name: str) -> None:
    refused(["space", "--model", name])


# -- clusters ----------------------------------------------------------------------------

GPU_NAMES = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True).filter(
    lambda s: (
        s not in {"h100", "h200", "b200", "a100", "gb200", "h20", "l40s", "mi300x"}
        and not s.startswith(("h100", "h200", "b200", "a100"))
    )
)


@st.composite
def bad_cluster_specs(draw: st.DrawFn) -> str:
    how = draw(st.sampled_from(["gpu", "count", "nodes", "form"]))
    if how == "gpu":
        return f"{draw(GPU_NAMES)}x{draw(st.integers(1, 64))}"
    if how == "count":
        n = draw(st.one_of(st.just(0), st.integers(MAX_GPUS + 1, 10**60)))
        return f"h100x{n}"
    if how == "nodes":  # more than a node, not whole nodes of 8
        return f"h100x{8 * draw(st.integers(1, 100)) + draw(st.integers(1, 7))}"
    return draw(
        st.text(st.characters(blacklist_characters="\x00", codec="utf-8"), max_size=20).filter(
            lambda s: "x" not in s.lower()
        )
    )


@FUZZ
@given(bad_cluster_specs())
def test_bad_cluster_spec_is_refused(spec: str) -> None:
    refused(["space", "--model", "llama-3.1-8b", "--cluster", spec])


ACCELERATOR = {
    "name": "X1",
    "bf16_tflops": 900.0,
    "fp8_tflops": 1800.0,
    "fp4_tflops": 0.0,
    "hbm_gb": 80.0,
    "hbm_gbps": 3350.0,
    "nvlink_gbps": 450.0,
    "nvlink_latency_us": 3.0,
    "net_gbps": 50.0,
    "net_latency_us": 8.0,
}


@st.composite
def bad_cluster_files(draw: st.DrawFn) -> str | bytes:
    how = draw(st.sampled_from(["spec", "count", "per-node", "keys", "document", "bytes"]))
    doc: dict = {"accelerator": dict(ACCELERATOR), "num_gpus": 8}
    if how == "spec":
        field = draw(st.sampled_from(sorted(set(ACCELERATOR) - {"name"})))
        bad = draw(st.one_of(NON_FINITE, st.sampled_from([-1.0, "fast", [], {}])))
        doc["accelerator"][field] = bad
    elif how == "count":
        doc["num_gpus"] = draw(st.one_of(BAD_COUNTS, st.integers(MAX_GPUS + 1, 10**30)))
    elif how == "per-node":
        doc["gpus_per_node"] = draw(BAD_COUNTS)
    elif how == "keys":
        choice = draw(st.sampled_from(["unknown", "missing", "gpu"]))
        if choice == "unknown":
            doc["colour"] = "blue"
        elif choice == "missing":
            del doc[draw(st.sampled_from(["accelerator", "num_gpus"]))]
        else:
            doc["accelerator"] = draw(GPU_NAMES)
    elif how == "document":
        return draw(st.sampled_from(["[1, 2]", "just text", "accelerator: [h100", "", "~"]))
    else:
        return draw(st.binary(min_size=1, max_size=256).filter(_not_utf8))
    return json_text(doc)  # JSON is YAML


@FUZZ
@given(bad_cluster_files())
def test_bad_cluster_file_is_refused(content: str | bytes) -> None:
    refused(
        ["space", "--model", "llama-3.1-8b", "--cluster", "cluster.yaml"],
        write("cluster.yaml", content),
    )


# -- workload flags ----------------------------------------------------------------------

NOT_NUMBERS = st.sampled_from(["abc", "", "1,5", "0x10", "--", "1e3e"])
WORDS = st.from_regex(r"[a-z_]{1,12}", fullmatch=True)


@st.composite
def bad_workload_flags(draw: st.DrawFn) -> list[str]:
    flag = draw(
        st.sampled_from(
            [
                "--batch",
                "--input-len",
                "--output-len",
                "--ttft-ms",
                "--tpot-ms",
                "--acceptance",
                "--draft-tokens",
                "--max-batch",
                "--max-tokens",
                "--phase",
                "--schedule",
                "--objective",
                "--weight-dtype",
                "--kv-dtype",
                "--tie",
                "--timing",
                "--engine",
                "--space",
                "--workload",
            ]
        )
    )
    if flag == "--batch":
        value = draw(st.one_of(st.integers(-(10**6), 0), st.integers(MAX_BATCH + 1, 10**30)))
        return [flag, draw(st.one_of(st.just(str(value)), NOT_NUMBERS))]
    if flag in ("--input-len", "--output-len"):
        # llama-3.1-8b reads 131,072 tokens at most
        value = draw(st.one_of(st.integers(-(10**6), 0), st.integers(131_073, 10**30)))
        return [flag, draw(st.one_of(st.just(str(value)), NOT_NUMBERS))]
    if flag in ("--ttft-ms", "--tpot-ms"):
        value = draw(st.sampled_from(["0", "-1", "nan", "inf", "-inf", "NaN", "1e999"]))
        return [flag, draw(st.one_of(st.just(value), NOT_NUMBERS))]
    if flag == "--acceptance":
        value = draw(st.sampled_from(["-0.1", "1.5", "nan", "inf"]))
        return ["--draft-tokens", "1", flag, value]
    if flag == "--draft-tokens":
        # llama-3.1-8b has no MTP layers; a negative count is wrong anywhere
        return [flag, draw(st.sampled_from(["1", "-1"])), "--acceptance", "0.7"]
    if flag in ("--max-batch", "--max-tokens"):
        return [flag, draw(st.sampled_from(["0", "-1", "x"]))]
    known = {
        "--phase": ("prefill", "decode", "request"),
        "--schedule": ("static", "inflight"),
        "--objective": ("throughput", "throughput_per_gpu", "latency", "pareto"),
        "--weight-dtype": ("bf16", "fp8", "fp4"),
        "--kv-dtype": ("bf16", "fp8"),
        "--tie": ("kind", "layer"),
        "--timing": ("roofline", "silicon"),
        "--engine": ("trtllm", "vllm", "sglang"),
        "--space": ("free", "engine"),
        "--workload": (
            "chat",
            "interactive",
            "long-context",
            "batch-offline",
            "prefill",
            "decode",
            "latency",
        ),
    }[flag]
    return [flag, draw(WORDS.filter(lambda w: w not in known))]


@FUZZ
@given(bad_workload_flags())
def test_bad_workload_flag_is_refused(flags: list[str]) -> None:
    refused(["space", "--model", "llama-3.1-8b", "--cluster", "h100x8", *flags])


# -- plan files ----------------------------------------------------------------------------

PLAN_PROBLEM = Problem.build("llama-3.1-8b", "h100x8")


def good_plan() -> dict:
    space = PLAN_PROBLEM.space
    plan = space.megatron_plan(space.degree_tuples[0])
    return plan.to_dict(PLAN_PROBLEM.model, cluster="h100x8")


@st.composite
def bad_plans(draw: st.DrawFn) -> str | bytes:
    plan = copy.deepcopy(good_plan())
    how = draw(
        st.sampled_from(
            ["degree", "degrees", "stages", "options", "ids", "concurrency", "document"]
        )
    )
    if how == "degree":
        plan["degrees"][draw(st.sampled_from(sorted(plan["degrees"])))] = draw(
            st.one_of(BAD_COUNTS, st.just(3), NON_FINITE)
        )
    elif how == "degrees":
        choice = draw(st.sampled_from(["unknown", "missing", "not a mapping"]))
        if choice == "unknown":
            plan["degrees"]["cp"] = 2
        elif choice == "missing":
            del plan["degrees"]
        else:
            plan["degrees"] = [1, 1, 8]
    elif how == "stages":
        plan["stage_layers"] = draw(
            st.sampled_from([[], [31], [33], [16, 16], [0, 32], [-1, 33], "32", [32.0], None])
        )
    elif how == "options":
        choice = draw(st.sampled_from(["kind", "operator", "option", "missing", "head"]))
        if choice == "kind":
            plan["options"]["moe"] = dict(plan["options"]["dense"])  # a dense model
        elif choice == "operator":
            plan["options"]["dense"]["router"] = "replicated"
        elif choice == "option":
            op = draw(st.sampled_from(sorted(plan["options"]["dense"])))
            plan["options"]["dense"][op] = draw(WORDS.filter(lambda w: w != "replicated"))
        elif choice == "missing":
            del plan["options"]["dense"][draw(st.sampled_from(sorted(plan["options"]["dense"])))]
        else:
            del plan["options"]["head"]
    elif how == "ids":
        key, value = draw(
            st.sampled_from(
                [("schema", "shardlab.plan/0"), ("model", "llama-3.1-70b"), ("cluster", "h100x16")]
            )
        )
        plan[key] = value
    elif how == "concurrency":
        plan["concurrency"] = draw(st.sampled_from([0, -1, "4", True, 2.5, 10**9]))
    else:
        return draw(
            st.one_of(
                st.sampled_from(["[]", "null", "{", json.dumps(plan)[:-1]]),
                st.binary(min_size=1, max_size=256).filter(_not_utf8),
            )
        )
    return json_text(plan)


@FUZZ
@given(bad_plans())
def test_bad_plan_file_is_refused(content: str | bytes) -> None:
    argv = ["evaluate", "--model", "llama-3.1-8b", "--cluster", "h100x8", "--plan", "plan.json"]
    refused(argv, write("plan.json", content))


DISAGG_PROBLEM = Problem.build("llama-3.1-8b", "h100x4")


def good_disagg_plan() -> dict:
    from shardlab.problems.disagg import DisaggPlan

    space = DISAGG_PROBLEM.with_space("free").space
    one = next(d for d in space.degree_tuples if d.num_gpus == 4 and d.replicas == 4)
    single = dataclasses.replace(
        space.megatron_plan(one), degrees=dataclasses.replace(one, replicas=1)
    )
    plan = DisaggPlan(prefill=single, prefill_instances=2, decode=single, decode_instances=2)
    return plan.to_dict(DISAGG_PROBLEM.model, cluster="h100x4")


@st.composite
def bad_disagg_plans(draw: st.DrawFn) -> str:
    plan = copy.deepcopy(good_disagg_plan())
    pool = draw(st.sampled_from(["prefill", "decode"]))
    how = draw(st.sampled_from(["instances", "gpus", "replicas", "missing", "cluster", "crowd"]))
    if how == "instances":
        plan[pool]["instances"] = draw(st.sampled_from([0, -1, "2", 2.5, True, None]))
    elif how == "gpus":
        plan[pool]["gpus_per_instance"] = draw(st.sampled_from([2, 0, "1"]))
    elif how == "replicas":
        plan[pool]["degrees"]["replicas"] = 2
    elif how == "missing":
        del plan[pool]
    elif how == "cluster":
        plan["cluster"] = "h100x16"
    else:  # more instances than GPUs
        plan[pool]["instances"] = draw(st.integers(4, 10**6))
    return json_text(plan)


@FUZZ
@given(bad_disagg_plans())
def test_bad_disaggregated_plan_file_is_refused(content: str) -> None:
    argv = ["evaluate", "--model", "llama-3.1-8b", "--cluster", "h100x4", "--plan", "plan.json"]
    refused(argv, write("plan.json", content))
