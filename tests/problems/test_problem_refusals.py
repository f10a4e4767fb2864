"""A problem refuses bad input naming the library-level field at fault, never a
command-line flag."""

from __future__ import annotations

import pytest

from shardlab.errors import ShardlabError
from shardlab.problems.plan import Plan
from shardlab.problems.problem import Problem


@pytest.mark.parametrize(
    ("args", "overrides", "field"),
    [
        (("llama-3.1-8b", "h100x8"), {"max_batch": 0}, "max_batch"),
        (("llama-3.1-8b", "h100x8"), {"engine": "tgi"}, "engine"),
        (("llama-3.1-8b", "h100x8"), {"space_kind": "wide"}, "space_kind"),
        (("llama-3.1-405b", "h100x1"), {}, "cluster"),
        (("llama-3.1-8b", "h100x8"), {"input_len": 200_000}, "workload"),
        (("llama-3.1-8b", "h100x8"), {"draft_tokens": 1, "acceptance": 0.7}, None),
    ],
)
def test_refusals_name_the_field(args: tuple, overrides: dict, field: str | None) -> None:
    with pytest.raises(ShardlabError) as info:
        _ = Problem.build(*args, **overrides).space
    assert "--" not in str(info.value)
    if field is not None:
        assert info.value.field == field and info.value.fix


def test_a_plan_for_another_cluster_names_the_cluster_field() -> None:
    problem = Problem.build("llama-3.1-8b", "h100x8")
    plan = problem.space.megatron_plan(problem.space.degree_tuples[-1])
    data = plan.to_dict(problem.model, cluster="h100x8")
    assert Plan.from_dict(data, problem.model, cluster="h100x8") == plan
    with pytest.raises(ShardlabError) as info:
        Plan.from_dict(data, problem.model, cluster="a100x8")
    assert info.value.field == "cluster" and "h100x8" in str(info.value.fix)
