"""The small sizing problem the size tests share: Llama-3.1-8B on vLLM's space, tight
SLOs, so that instances of one to four H100/H200 GPUs differ in what they serve."""

from __future__ import annotations

import pytest

from shardlab.problems.problem import Problem


def small_problem() -> Problem:
    return Problem.build(
        "llama-3.1-8b",
        "h100x4",
        "chat",
        engine="vllm",
        space_kind="engine",
        input_len=2048,
        output_len=128,
        ttft_ms=600,
        tpot_ms=20,
        rate=1.0,
    )


@pytest.fixture(scope="module")
def problem() -> Problem:
    return small_problem()
