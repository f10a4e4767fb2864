"""A comparison's parts are checked before any run starts, each mistake naming its field."""

from __future__ import annotations

import pytest

from shardlab import Problem
from shardlab.compare import comparison
from shardlab.compare.spec import DEFAULT_METHODS
from shardlab.errors import ShardlabError

PROBLEM = Problem.build("llama-3.1-8b", "h100x2")


def test_default_methods_on_the_given_problem() -> None:
    c = comparison(PROBLEM)
    assert c.methods == tuple(DEFAULT_METHODS.split(","))
    assert c.cases == (PROBLEM,) and c.label == "custom" and c.budgets is None


def test_a_suite_names_the_comparison_and_options_make_variants() -> None:
    c = comparison(PROBLEM, suite="small", methods="cpsat,optuna:sampler=gp", budgets="2000,500")
    assert c.label == "small" and len(c.cases) > 1
    assert c.methods == ("cpsat",)
    assert c.variants == (("optuna:sampler=gp", "optuna", {"sampler": "gp"}),)
    assert c.budgets == (500, 2000)


def test_disaggregated_serving_runs_no_list_of_methods() -> None:
    assert comparison(PROBLEM, serving="disagg").methods == ()
    with pytest.raises(ShardlabError) as e:
        comparison(PROBLEM, serving="disagg", methods="random")
    assert e.value.field == "methods"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"budgets": "0,10"}, "budgets"),
        ({"budgets": "ten"}, "budgets"),
        ({"methods": " , "}, "methods"),
        ({"engines": ","}, "engines"),
        ({"vs_free": True}, "space"),
        ({"aiconfigurator": "x.csv"}, "aiconfigurator"),
    ],
)
def test_each_mistake_names_its_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ShardlabError) as e:
        comparison(PROBLEM, **kwargs)
    assert e.value.field == field
    assert "--" not in str(e.value)  # the CLI, not the library, names flags


def test_an_unknown_engine_or_method_fails_here() -> None:
    with pytest.raises(ShardlabError):
        comparison(PROBLEM, engines="trtllm,tgi")
    with pytest.raises(ShardlabError):
        comparison(PROBLEM, methods="cpsat,simplex")
