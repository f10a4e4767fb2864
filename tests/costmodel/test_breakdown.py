"""Where one plan's time and memory go (shardlab.costmodel.breakdown), and the units a
plan is priced in (shardlab.costmodel.units)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from shardlab import Degrees, Problem
from shardlab.costmodel.engines import serving_costs
from shardlab.costmodel.pricing import evaluate, evaluate_batch
from shardlab.costmodel.units import units_of_codes, units_of_plan
from shardlab.problems.operators import layer_ops

PROBLEM = Problem.build(
    "llama-3.1-8b", "h100x8", "chat", timing="roofline", input_len=1000, output_len=200
)
ONE_STAGE = Degrees(replicas=4, tp=2, etp=2)
TWO_STAGES = Degrees(replicas=2, pp=2, tp=2, etp=2)


def rows(metrics, step: str):
    return [b for b in metrics.breakdown if b.step == step]


def test_one_stages_round_is_its_rows_plus_the_engines_iteration() -> None:
    m = evaluate(PROBLEM, PROBLEM.space.megatron_plan(ONE_STAGE))
    iteration_ms = serving_costs(PROBLEM).iteration_ns / 1e6
    decode = rows(m, "decode")  # in flight: with the round's share of whole prompts
    assert sum(b.time_ms for b in decode) + iteration_ms == pytest.approx(m.tpot_ms, rel=1e-12)
    for b in decode:  # each row's time is at least its own kernels' bound
        assert b.time_ms >= max(b.compute_ms, b.memory_ms) * (b.layers > 0) - 1e-12


def test_a_pipelines_round_is_at_least_its_stages_in_a_row() -> None:
    m = evaluate(PROBLEM, PROBLEM.space.megatron_plan(TWO_STAGES))
    iteration_ms = serving_costs(PROBLEM).iteration_ns / 1e6
    decode = rows(m, "decode")
    assert m.tpot_ms >= sum(b.time_ms for b in decode) + iteration_ms - 1e-9
    (send,) = [b for b in decode if b.name == "pipeline.p2p"]
    assert send.time_ms == send.comm_ms > 0


@pytest.mark.parametrize("d", [ONE_STAGE, TWO_STAGES])
def test_memory_rows_add_up_to_the_fullest_gpu(d: Degrees) -> None:
    m = evaluate(PROBLEM, PROBLEM.space.megatron_plan(d))
    for step in ("decode", "prefill"):
        r = rows(m, step)
        assert sum(b.weight_gb for b in r) == pytest.approx(m.weights_gb, rel=1e-12)
        assert sum(b.kv_gb for b in r) == pytest.approx(m.kv_cache_gb, rel=1e-12)


def test_every_operator_has_one_row_a_step_over_all_its_layers() -> None:
    m = evaluate(PROBLEM, PROBLEM.space.megatron_plan(ONE_STAGE))
    model = PROBLEM.model
    for step in ("decode", "prefill"):
        r = rows(m, step)
        names = Counter(b.name for b in r)
        assert set(names.values()) == {1}
        for op in layer_ops(model, "dense"):
            (row,) = [b for b in r if b.name == f"dense.{op.name}"]
            assert row.layers == model.num_layers
            assert row.option in {o.name for o in op.options}
        assert {b.name for b in r if b.name.startswith("head.")} == {
            "head.embedding", "head.final_norm", "head.lm_head", "head.sampler",
        }  # fmt: skip
    assert {b.timing for b in m.breakdown} == {"roofline"}


def test_a_plan_and_its_code_are_the_same_units() -> None:
    space = PROBLEM.space
    codes = space.sample(6, seed=11)
    by_codes = units_of_codes(PROBLEM, codes)
    batch = evaluate_batch(PROBLEM, codes)
    for i, code in enumerate(codes):
        plan = space.decode(code)
        by_plan = units_of_plan(PROBLEM, plan)
        # the same layers in each stage and the same degree slot
        np.testing.assert_array_equal(
            by_plan.starts[0, : plan.degrees.pp], by_codes.starts[i, : plan.degrees.pp]
        )
        assert by_plan.slot[0] == by_codes.slot[i]
        # a unit is the layers of one class (kind, mixer) with the same options
        m = PROBLEM.model
        pairs = {
            (m.layer_kinds[j], m.attention_layers[j], opts)
            for j, opts in enumerate(plan.layer_options)
        }
        assert len(by_plan.layout.unit_class) == len(pairs)
        assert len(by_plan.layout.layer_unit) == m.num_layers
        assert evaluate(PROBLEM, plan, breakdown=False).objective == pytest.approx(
            float(batch.objective[i]), rel=1e-9
        )
