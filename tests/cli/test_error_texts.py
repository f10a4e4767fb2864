"""Errors read as the user wrote the input: the preset's name as given (no internal
marks), the field named once, and the flag that sets it."""

from __future__ import annotations

import pytest

from tests.cli.conftest import refused
from tests.cli.test_size_cli import SMALL

EVALUATE = ["evaluate", "--model", "llama-3.1-8b", "--cluster", "h100x1", "--tp", "1"]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            [*EVALUATE, "--ttft-ms", "0"],
            "error: workload 'chat': ttft_ms must be a positive number, got 0.0 (set by --ttft-ms)",
        ),
        (
            [*EVALUATE, "--input-len", "0"],
            "error: workload 'chat': input_len must be at least 1, got 0 (set by --input-len)",
        ),
        (
            [*EVALUATE, "--acceptance", "2"],
            "error: workload 'chat': acceptance must be a number in [0, 1], got 2.0 "
            "(set by --acceptance)",
        ),
        (
            [*EVALUATE, "--workload", "batch-offline", "--rate", "-1"],
            "error: workload 'batch-offline': rate must be a positive number, got -1.0 "
            "(set by --rate)",
        ),
        (
            [*EVALUATE, "--max-batch", "0"],
            "error: max_batch must be a positive integer, got 0; give a positive integer, "
            "or none for the engine's own limit (set by --max-batch)",
        ),
        (
            [*SMALL, "--rate", "-1"],
            "error: rate must be a positive number, got -1.0 (set by --rate)",
        ),
        (
            [*SMALL, "--rates", "5,0"],
            "error: rates '5,0': rate must be a positive number, got 0.0 (set by --rates)",
        ),
    ],
)
def test_an_error_names_the_input_as_written(argv: list[str], line: str) -> None:
    assert refused(argv) == line
