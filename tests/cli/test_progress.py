"""Progress on stderr: a bar when stderr is a terminal, nothing when it is a log or a
pipe, and never a byte on stdout (JSON stays clean)."""

from __future__ import annotations

import contextlib
import io
import json
import time

from shardlab.cli import main
from shardlab.cli.render import task_progress
from tests.cli.test_size_cli import SMALL


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_terminal_no_progress() -> None:
    log = io.StringIO()
    with contextlib.redirect_stderr(log), task_progress("work", 2, unit="rows") as report:
        report(1, "first")
        time.sleep(0.5)  # the display thread would have drawn by now
        report(2, "second")
    assert log.getvalue() == ""


def test_a_terminal_shows_a_bar_filled_at_the_end() -> None:
    screen = Terminal()
    with contextlib.redirect_stderr(screen), task_progress("work", unit="rows") as report:
        report(1, "first row", total=4)  # a total learnt after the start
        time.sleep(0.5)
        report(3, "third row")
    text = screen.getvalue()
    assert "work" in text and "3/4 rows" in text and "third row, done" in text


def test_size_draws_its_bar_on_stderr_and_keeps_stdout_json() -> None:
    screen, stdout = Terminal(), io.StringIO()
    argv = [*SMALL, "--gpus", "h100", "--max-gpus", "1", "--rate", "5", "--format", "json"]
    code: object = 0
    with contextlib.redirect_stderr(screen), contextlib.redirect_stdout(stdout):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code
    assert code == 0, screen.getvalue()[-2000:]
    assert json.loads(stdout.getvalue())["status"] == "proven"
    text = screen.getvalue()
    assert "size" in text and "capacities solved" in text and "done" in text
