"""The one markdown table renderer reproduces the committed reports byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardlab.compare.report import summary_markdown
from shardlab.files import markdown_table
from shardlab.sizing.suite import aiconfigurator_answers, load_suite
from shardlab.sizing.suite import summary_markdown as sizing_markdown

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"


def test_a_table_is_a_header_a_rule_and_its_rows() -> None:
    assert markdown_table(["a", "b \\| c", "n"], "llr", [["x", "", 3], ("y", "z", 4.5)]) == [
        "| a | b \\| c | n |",
        "|---|---|---:|",
        "| x |  | 3 |",
        "| y | z | 4.5 |",
    ]
    assert markdown_table(["only"], "r", []) == ["| only |", "|---:|"]


@pytest.mark.parametrize(
    ("head", "align", "rows"),
    [(["a", "b"], "l", []), (["a"], "c", []), (["a", "b"], "lr", [["1"]])],
)
def test_a_table_whose_shapes_disagree_is_refused(
    head: list[str], align: str, rows: list[list[str]]
) -> None:
    with pytest.raises(ValueError):
        markdown_table(head, align, rows)


def test_the_committed_comparison_summary_is_reproduced() -> None:
    """results/paper/summary.md (the main table and the one per budget), rendered again
    from the rows its results.json holds."""
    data = json.loads((RESULTS / "paper" / "results.json").read_text())
    committed = (RESULTS / "paper" / "summary.md").read_text()
    timing = "silicon timing (trtllm measurements)"  # its header's, not kept in the json
    again = summary_markdown(data["name"], data["command"], data["summary"], timing, data["runs"])
    assert "Ratio to best by budget" in again
    assert again == committed


def test_the_committed_sizing_summary_is_reproduced() -> None:
    """results/sizing/summary.md (two tables, the second beside AIConfigurator's answers),
    rendered again from its results.json."""
    rows = json.loads((RESULTS / "sizing" / "results.json").read_text())
    committed = (RESULTS / "sizing" / "summary.md").read_text()
    command = committed.splitlines()[2].split("`")[1]
    aic = aiconfigurator_answers(ROOT / "tests" / "data" / "aiconfigurator_sizing.csv")
    assert sizing_markdown(load_suite(), rows, command, aic) == committed
