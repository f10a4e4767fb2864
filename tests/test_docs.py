"""The docs stay true: the site builds strictly, every command they show parses against
the real CLI, and the README's links resolve."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from shardlab.cli import app
from shardlab.cli.reference import reference

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOC_FILES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
# results/README.md holds no fenced blocks, but its table names the command of every
# committed result as a code span: those must parse too
RESULTS_README = ROOT / "results" / "README.md"

FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
SEPARATORS = {"&&", "||", ";", "|"}
REDIRECTS = {">", ">>", "<", "2>", "2>&1"}


def fenced_shell_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, logical line) of every shell code block, continuations joined."""
    fence: str | None = None
    pending = ""
    start = 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = FENCE.match(line.strip())
        if fence is None:
            if match:
                fence = match.group(1)
                in_shell = match.group(2).strip().lower() in SHELL_LANGS
            continue
        if match and line.strip().startswith(fence) and not match.group(2).strip():
            fence = None
            continue
        if not in_shell:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""


def code_span_lines(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for span in re.findall(r"`([^`]+)`", line):
            yield number, span


def shardlab_commands(lines: Iterator[tuple[int, str]]) -> Iterator[tuple[int, list[str]]]:
    """Every `shardlab ...` invocation, as its arguments after `shardlab`."""
    for number, line in lines:
        text = line.strip()
        if text.startswith("$ "):  # a transcript: the prompt's command, not its output
            text = text[2:]
        try:
            tokens = shlex.split(text, comments=True)
        except ValueError:
            continue  # not a command line (output, prose)
        segment: list[str] = []
        for token in [*tokens, ";"]:  # the trailing ";" flushes the last segment
            if token not in SEPARATORS:
                segment.append(token)
                continue
            if segment and segment[0] == "shardlab":
                yield number, strip_redirects(segment[1:])
            segment = []


def strip_redirects(args: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for token in args:
        if skip:
            skip = False
            continue
        if token in REDIRECTS:
            skip = token != "2>&1"
            continue
        out.append(token)
    return out


def parse_error(root: Any, args: list[str]) -> str | None:
    """Why ``shardlab ARGS`` would not parse (None: it parses). Nothing is run."""
    command, name, rest = root, "shardlab", list(args)
    while hasattr(command, "list_commands") and rest and not rest[0].startswith("-"):
        sub = command.get_command(None, rest[0])
        if sub is None:
            return f"no command {rest[0]!r}"
        command, name, rest = sub, rest[0], rest[1:]
    try:
        command.make_context(name, rest, resilient_parsing=False)
    except Exception as exc:  # typer vendors click: its UsageError is not click's
        if getattr(exc, "exit_code", None) == 0:  # --help, --version
            return None
        return f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"
    return None


def all_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in DOC_FILES:
        for number, args in shardlab_commands(fenced_shell_lines(path)):
            found.append((f"{path.relative_to(ROOT)}:{number}", args))
    for number, args in shardlab_commands(code_span_lines(RESULTS_README)):
        found.append((f"{RESULTS_README.relative_to(ROOT)}:{number}", args))
    return found


def test_mkdocs_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_documented_commands_parse() -> None:
    root = typer.main.get_command(app)
    commands = all_commands()
    # the README's tour alone has five; fewer means the extraction broke
    assert len(commands) >= 30, commands
    failures = [
        f"{where}: shardlab {shlex.join(args)}\n    {error}"
        for where, args in commands
        if (error := parse_error(root, args)) is not None
    ]
    assert not failures, "commands in the docs the CLI rejects:\n" + "\n".join(failures)


def test_parse_check_rejects_bad_commands() -> None:
    root = typer.main.get_command(app)
    assert parse_error(root, ["solve", "--method", "cpsat", "--out", "plan.json"]) is None
    assert parse_error(root, ["solve", "--no-such-flag"]) is not None
    assert parse_error(root, ["no-such-command"]) is not None
    # (a choice the CLI checks inside the command, not as a parameter type, parses here;
    # the command itself refuses it)
    assert parse_error(root, ["solve", "--out"]) is not None
    assert parse_error(root, ["solve", "--max-evals", "many"]) is not None


def test_readme_relative_links_resolve() -> None:
    text = README.read_text()
    targets = re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)
    relative = [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:|^#", t)]
    assert relative, "the README links its docs"
    missing = [t for t in relative if not (ROOT / t.split("#", 1)[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_cli_reference_is_generated_from_the_cli() -> None:
    """docs/cli.md is what the generator writes from the command tree: it cannot drift."""
    assert (ROOT / "docs" / "cli.md").read_text() == reference(), (
        "docs/cli.md is stale: run `python -m shardlab.cli.reference > docs/cli.md`"
    )


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _table_rows(section: str) -> list[set[str]]:
    """The flags of each row of a section's options table."""
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [set(re.findall(r"`(-[^`]+)`", row.split(" | ")[0])) for row in rows]


def test_each_command_section_documents_exactly_its_flags() -> None:
    """Read as a user reads it: a section's own table, plus the shared groups it points
    to minus the flags it says it lacks, are the command's flags, no more, no fewer."""
    sections = _sections((ROOT / "docs" / "cli.md").read_text())
    groups = {
        anchor: _table_rows(sections[title])
        for title, anchor in (
            ("Problem options", "problem-options"),
            ("Plan options", "plan-options"),
        )
    }
    root = typer.main.get_command(app)
    wrong = []
    for name in root.list_commands(None):
        section = sections.get(name)
        if section is None:
            wrong.append(f"no section '## {name}'")
            continue
        documented = set().union(*_table_rows(section))
        for also in re.findall(r"^Also .*$", section, flags=re.M):
            but = set(
                re.findall(r"`(-[^`]+)`", also.split(" but ", 1)[1] if " but " in also else "")
            )
            for anchor in re.findall(r"\(#([a-z-]+)\)", also):
                documented |= set().union(*(row for row in groups[anchor] if not row & but))
        flags = {
            f
            for param in root.get_command(None, name).params
            for f in (*param.opts, *param.secondary_opts)
            if f.startswith("-") and f not in ("--format", "-f")
        }
        if documented != flags:
            wrong.append(
                f"{name}: extra {sorted(documented - flags)}, missing {sorted(flags - documented)}"
            )
    assert not wrong, "docs/cli.md: " + "; ".join(wrong)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "pip install -e . && shardlab solve --method cpsat  # note",
            [["solve", "--method", "cpsat"]],
        ),
        (
            "$ shardlab launch --plan plan.json --engine sglang",
            [["launch", "--plan", "plan.json", "--engine", "sglang"]],
        ),
        ("shardlab solve --format json > front.json", [["solve", "--format", "json"]]),
        ("python -m sglang.launch_server --tp-size 16", []),
    ],
)
def test_command_extraction(line: str, expected: list[list[str]]) -> None:
    found = [args for _, args in shardlab_commands(iter([(1, line)]))]
    assert found == expected


def test_the_landing_page_tours_every_command() -> None:
    """A newcomer reads docs/index.md first: a command it never shows is one they will
    not find (``size`` and ``launch --target`` were missing once)."""
    import typer.main

    from shardlab.cli.app import app

    page = (ROOT / "docs" / "index.md").read_text()
    commands = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    missing = [c for c in commands if not re.search(rf"^shardlab {re.escape(c)}\b", page, re.M)]
    assert not missing, f"docs/index.md shows no command line of: {missing}"
    assert re.search(r"^shardlab launch .*--target ", page, re.M)
