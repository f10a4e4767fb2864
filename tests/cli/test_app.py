"""The CLI's own logic: which flag sets a library field, and the command a report says
made it."""

from __future__ import annotations

import inspect

from shardlab.cli.app import command_line, flag_advice
from shardlab.errors import ShardlabError
from shardlab.solvers.choices import listed


def test_a_field_becomes_the_flag_of_the_command_that_was_run() -> None:
    e = ShardlabError("no such GPU 'x100'", field="cluster", fix="name a built-in one")
    assert flag_advice(e, ["solve", "--cluster", "x100x8"]) == (
        "no such GPU 'x100'; name a built-in one (set by --cluster)"
    )
    # a dotted field is the workload's: its last part is the flag's name
    e = ShardlabError("bad TTFT SLO", field="workload.ttft_ms")
    assert flag_advice(e, ["solve"]) == "bad TTFT SLO (set by --ttft-ms)"


def test_no_flag_where_the_command_has_none_or_the_text_names_it() -> None:
    e = ShardlabError("storage is not a database", field="storage")
    assert flag_advice(e, ["models"]) == "storage is not a database"
    e = ShardlabError("--out is a folder", field="out")
    assert flag_advice(e, ["solve"]) == "--out is a folder"
    assert flag_advice(ShardlabError("plain"), ["solve"]) == "plain"


def test_command_line_keeps_the_options_given_in_order() -> None:
    assert command_line(
        "shardlab calibrate", measurements=None, hold_out="family", engines=True
    ) == ("shardlab calibrate --hold-out family --engines")
    assert command_line("shardlab validate", out=None, engines=False) == "shardlab validate"


def test_listed_marks_the_default() -> None:
    assert listed(("tpe", "gp", "random"), "tpe") == "tpe (default), gp or random"
    assert listed(("bf16",)) == "bf16"


def test_help_shows_paragraphs_without_rest_literals_or_flag_types() -> None:
    import typer
    from typer.testing import CliRunner

    from shardlab.cli.app import app

    root = typer.main.get_command(app)
    for name in [None, *root.list_commands(None)]:
        args = [name, "--help"] if name else ["--help"]
        text = CliRunner().invoke(app, args, env={"COLUMNS": "3000"}).output
        assert "``" not in text, f"{name}: reST literal in its help"
        assert "<bool>" not in text, f"{name}: a flag shown with a value type"
        command = root if name is None else root.get_command(None, name)
        # each paragraph of the docstring is one line of the help, however it was wrapped
        for paragraph in inspect.cleandoc(command.help or "").split("\n\n")[:3]:
            start = " ".join(paragraph.replace("``", "`").split())
            assert any(start in line for line in text.splitlines()), (name, start)
