"""The ``shardlab`` command line's root: the app, its output formats and ``main``.

Every command prints rich tables for people or, with ``--format json``, one JSON
object for machines. A mistake in the input prints one line and exits with status 2:
the library's errors name the input at fault, and only here does it become a flag.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from enum import StrEnum
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from shardlab.cli.render import (
    err,
    out,
)
from shardlab.errors import ShardlabError, interrupted

# When the command started (this module's import): --time-limit counts from here.
STARTED = time.perf_counter()


def plain_help(text: str | None) -> str | None:
    """Help as a reader should see it: a docstring's paragraphs each on one line (its
    line breaks are the source's; the terminal wraps), and its reST literals (two
    backticks each side) as Markdown's (one), as the other help texts write them."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs).replace("``", "`")


def _tidy_option(param: Any) -> None:
    """A parameter's help made plain; a flag shown without a value's type (``<bool>``):
    it takes none. (Typer's parameters are click's, or since typer 0.2x its own copy of
    click's: read by their attributes.)"""
    if getattr(param, "param_type_name", None) == "option":
        param.help = plain_help(param.help)
        if param.is_flag:
            param.metavar = ""


def _tidy(command: Any) -> None:
    """The help of ``command`` and of its options, as :func:`plain_help` and
    :func:`_tidy_option` make them."""
    command.help = plain_help(command.help)
    for param in command.params:
        _tidy_option(param)
    make = command.get_help_option

    # typer makes the --help option when a help is first printed, not with the command
    def get_help_option(ctx: Any) -> Any:
        option = make(ctx)
        if option is not None:
            _tidy_option(option)
        return option

    command.get_help_option = get_help_option  # type: ignore[method-assign]


class _Group(TyperGroup):
    """The root command, whose commands' help reads as prose (:func:`_tidy`): every
    command gets it here, none on its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in (self, *self.commands.values()):
            _tidy(command)


app = typer.Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    help="Find how to spread an LLM over a GPU cluster for inference.",
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from shardlab import __version__

        out.print(f"shardlab {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Find how to spread an LLM over a GPU cluster for inference."""


class Format(StrEnum):
    table = "table"
    json = "json"


FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="table or json.")]


def _usage_error(exc: typer.TyperException) -> str:
    """A command-line error (bad flag, bad value, missing option) as one line."""
    fmt = getattr(exc, "format_message", None)
    text = " ".join((fmt() if fmt is not None else str(exc)).split())
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else "shardlab"
    return f"{text} (see '{path} --help')"


def command_line(prog: str, **options: object) -> str:
    """The command a report says made it: ``prog`` and the options given (a flag for
    ``True``; ``None`` and ``False`` left out), in the order given."""
    parts = [prog]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif value is not None and value is not False:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def flag_advice(exc: ShardlabError, args: list[str]) -> str:
    """The library's error as one line, with the flag that sets the input at fault: the
    library names its inputs (``cluster``, ``workload.ttft_ms``), the CLI its flags."""
    text = " ".join(str(exc).splitlines())
    flag = _flag_of(args, exc.field) if exc.field else None
    return f"{text} (set by {flag})" if flag and flag not in text else text


def _flag_of(args: list[str], field: str) -> str | None:
    """The flag of the command in ``args`` whose parameter is ``field``."""
    commands = getattr(typer.main.get_command(app), "commands", {})
    name = next((a for a in args if not a.startswith("-")), None)
    command = commands.get(name) if name else None
    key = field.rsplit(".", 1)[-1]
    for param in command.params if command is not None else ():
        longs = [o for o in param.opts if o.startswith("--")]
        if longs and (param.name == key or longs[0] == "--" + key.replace("_", "-")):
            return longs[0]
    return None


def main(argv: list[str] | None = None) -> None:
    """The console script: a mistake in the input prints one line and exits with 2."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        code = app(args=args or ["--help"], prog_name="shardlab", standalone_mode=False)
    except typer.Abort:
        err.print("interrupted")
        raise SystemExit(130) from None
    except typer.TyperException as exc:
        err.print(f"error: {_usage_error(exc)}", markup=False, soft_wrap=True)
        raise SystemExit(2) from None
    except ShardlabError as exc:
        err.print(f"error: {flag_advice(exc, args)}", markup=False, soft_wrap=True)
        raise SystemExit(2) from None
    except (KeyboardInterrupt, ImportError) as exc:
        if not interrupted(exc):
            raise
        err.print("interrupted")
        raise SystemExit(130) from None
    except BrokenPipeError:  # the reader left (`shardlab models | head`)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until the exit
        raise SystemExit(1) from None
    if code == 130:  # typer's own stop on a Ctrl-C while it parsed or called the command
        err.print("interrupted")
    raise SystemExit(code or 0)  # as click's standalone mode ends, success included
