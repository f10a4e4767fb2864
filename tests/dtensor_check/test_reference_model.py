"""The check's reference model, module by module: tiny configs, fused projections laid
out in head groups, routed experts, and the whole model's size and output."""

from __future__ import annotations

import pytest
import torch

from shardlab.dtensor_check.experts import Experts
from shardlab.dtensor_check.mixers import mixer_parts
from shardlab.dtensor_check.tiny_configs import override_options, tiny_config, tiny_problem
from shardlab.dtensor_check.transformer import MAX_PARAMS, TinyTransformer, _group_rows
from shardlab.errors import ShardlabError
from shardlab.problems.hf_config import model_from_config
from shardlab.problems.plan import Degrees

KINDS = ("dense", "moe", "gemma4", "gdn", "kda", "dsa")


@pytest.mark.parametrize("kind", KINDS)
def test_each_tiny_config_is_a_small_model_of_its_kind(kind: str) -> None:
    config = tiny_config(kind)  # type: ignore[arg-type]
    model = model_from_config(config, name=f"tiny-{kind}", source="test")
    assert model.num_layers == (4 if kind == "gemma4" else 2)
    assert model.hidden_size == 64 and model.vocab_size == 256
    assert (model.moe is not None) == (kind == "moe")
    assert tiny_config(kind, num_layers=6)["num_hidden_layers"] == 6  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ("dense", "gemma4", "gdn", "kda"))
def test_the_fused_projection_is_the_mixers_parts(kind: str) -> None:
    model = tiny_problem(kind).model  # type: ignore[arg-type]
    for a in model.attention_layers:
        assert sum(mixer_parts(model, a)) == model.qkv_width(a)


def test_grouped_rows_hold_a_slice_of_every_part_in_order() -> None:
    w = torch.arange(12.0).reshape(12, 1)  # parts of 4 and 8 rows
    grouped = _group_rows(w, (4, 8), 2).flatten().tolist()
    assert grouped == [0, 1, 4, 5, 6, 7, 2, 3, 8, 9, 10, 11]


def test_unsharded_experts_sum_each_tokens_chosen_experts() -> None:
    torch.manual_seed(0)
    experts = Experts(num_experts=4, top_k=2, hidden=8, width=6)
    for p in experts.parameters():
        torch.nn.init.normal_(p)
    x, logits = torch.randn(1, 5, 8), torch.randn(1, 5, 4)
    out = experts(x, logits)
    for t in range(5):
        weights = logits[0, t].topk(2).values.softmax(-1)
        chosen = logits[0, t].topk(2).indices.tolist()
        expected = sum(
            w * experts.expert(e, x[0, t : t + 1]) for w, e in zip(weights, chosen, strict=True)
        )
        torch.testing.assert_close(out[0, t : t + 1], expected)


def test_the_reference_model_returns_the_last_positions_logits() -> None:
    problem = tiny_problem("moe")
    net = TinyTransformer(problem.model, groups=2, seed=1)
    ids = torch.randint(0, 256, (3, 8))
    assert net(ids).shape == (3, 1, 256)
    again = TinyTransformer(problem.model, groups=2, seed=1)
    torch.testing.assert_close(again(ids), net(ids))


def test_a_model_that_is_not_scaled_down_is_refused() -> None:
    config = tiny_config("dense") | {"vocab_size": MAX_PARAMS // 64 + 1}
    model = model_from_config(config, name="big", source="test")
    with pytest.raises(ShardlabError, match="scaled-down"):
        TinyTransformer(model)


def test_override_options_refuses_an_unknown_operator() -> None:
    problem = tiny_problem("dense")
    plan = problem.space.megatron_plan(Degrees(tp=2, etp=2))
    with pytest.raises(ShardlabError, match="unknown operator"):
        override_options(problem, plan, {"no_such_op": "column"})
