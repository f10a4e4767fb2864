"""The sizing suite: its problems, AIConfigurator's answers beside them, its summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardlab.errors import ShardlabError
from shardlab.sizing.suite import (
    aiconfigurator_answers,
    check_suite_options,
    load_suite,
    summary_markdown,
)

AIC = Path(__file__).parents[1] / "data" / "aiconfigurator_sizing.csv"


def test_the_suite_is_at_least_three_models_three_rates_two_slo_levels() -> None:
    suite = load_suite()
    assert len({c.model for c in suite.cases}) >= 3
    assert len({(c.ttft_ms, c.tpot_ms) for c in suite.cases}) >= 2
    assert len(suite.rates) >= 3


def test_aiconfigurator_sits_beside_the_matching_problems() -> None:
    suite = load_suite()
    aic = aiconfigurator_answers(AIC)
    llama = next(c for c in suite.cases if c.model == "llama-3.1-70b" and c.tpot_ms == 50)
    row = {
        "case": llama.name, "model": llama.model, "ttft_ms": llama.ttft_ms,
        "tpot_ms": llama.tpot_ms, "rate_rps": 20.0, "best": "4 x 1 b200", "best_mode": "agg",
        "best_gpus": 4, "curve_solves": 1, "curve_seconds": 1.0,
    }  # fmt: skip
    for g in suite.gpus:
        row |= {f"{g}_gpus": 8, f"{g}_mode": "agg", f"{g}_agg_gpus": 8, f"{g}_agg": "x",
                f"{g}_disagg_gpus": None, f"{g}_disagg": None}  # fmt: skip
    text = summary_markdown(suite, [row], "test", aic)
    # AIConfigurator's 10 H200 (5 x TP2) for Llama-3.1-70B at 20/s, beside ours
    assert "| llama-3.1-70b | 20 | h200 | agg | 10 | 5 x 2 GPUs" in text
    assert "| llama-3.1-70b | 20 | h200 | disagg | 12 |" in text


def test_options_the_suite_ignores_are_refused() -> None:
    check_suite_options(methods=None, vs_free=False)
    with pytest.raises(ShardlabError, match="takes no methods"):
        check_suite_options(methods="random", vs_free=False)
