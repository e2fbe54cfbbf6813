"""The documentation: a short README, every page in the nav, the generated command line
reference up to date, and every ``python -m replication ...`` the docs show a command line the
parser accepts. ``mkdocs build --strict`` itself: test_docs_build.py."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from replication import cli
from replication.cli_reference import markdown_reference
from replication.deploy.__main__ import build_parser as infra_parameters_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CLI_DOC = ROOT / "docs" / "cli.md"
QUICK_START = (
    "python3.11 dev.py start   # creates .venv, installs, runs the demo: pipelines moving real "
    "messages",
    "python3.11 dev.py test    # creates .venv, installs, runs ruff, mypy and the whole test suite",
)
INCLUDED = ("replication/pipeline/README.md", "replication/spark/README.md", "infra/README.md")
"""Files that docs/ pages include (pymdownx.snippets): their commands are the docs' too."""


def documents() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), *(ROOT / p for p in INCLUDED)]


def test_the_readme_is_short_and_starts_quickly() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 150
    for command in QUICK_START:
        assert command in text, command


def test_the_command_line_reference_is_the_generated_one() -> None:
    assert CLI_DOC.read_text(encoding="utf-8") == markdown_reference(), (
        "docs/cli.md is stale: python -m replication.cli_reference -o docs/cli.md"
    )


def test_the_reference_has_every_command_and_option() -> None:
    text = markdown_reference()
    parsers = dict(_subparsers())
    assert parsers  # the parser's shape is what the generator walks
    for name, parser in parsers.items():
        assert f"\n## `{name}`\n" in text, name
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in text or f", {option}" in text, (name, option)


def test_every_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(items: list[object]) -> Iterator[str]:
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                yield from pages(value)
            else:
                yield str(value)

    in_nav = list(pages(config["nav"]))
    on_disk = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(in_nav) == on_disk
    assert config["theme"]["font"] is False  # nothing loaded from Google Fonts


def _subparsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in cli.build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, parser in action.choices.items():
                yield name, infra_parameters_parser() if name == "infra-parameters" else parser


MENTION = re.compile(r"python -m replication\s+([a-z][a-z-]*)")
SPAN = re.compile(r"`((?:\.venv/bin/)?python -m replication [a-z][^`]*)`")


def test_every_subcommand_named_in_the_docs_exists() -> None:
    commands = {name for name, _ in _subparsers()}
    for path in documents():
        for name in MENTION.findall(path.read_text(encoding="utf-8")):
            assert name in commands, f"{path.relative_to(ROOT)}: python -m replication {name}"


def _command_lines() -> Iterator[tuple[str, str, bool]]:
    """(where, command line, whole) for each ``python -m replication ...`` in a code block
    (whole: a full command line) or an inline code span (maybe only the start of one)."""
    for path in documents():
        text = path.read_text(encoding="utf-8")
        where = str(path.relative_to(ROOT))
        fence, pending = False, ""
        for line in text.splitlines():
            stripped = line.strip()
            if stripped.startswith("```"):
                fence = not fence
                continue
            if not fence:
                continue
            if pending or ("python -m replication " in stripped and "usage:" not in stripped):
                pending = f"{pending} {stripped}".strip()
                if pending.endswith("\\"):
                    pending = pending[:-1]
                    continue
                if pending.count("python -m replication ") == 1:  # not the README's picture
                    yield where, pending, True
                pending = ""
        for span in SPAN.findall(text):
            yield where, " ".join(span.split()), False


def _argv(line: str) -> list[str]:
    """The arguments after ``python -m replication``: no comment, redirection or the
    synopsis' brackets (``[--fsync]``, ``[PATH ...]``)."""
    command = line.split("python -m replication ", 1)[1]
    command = re.split(r"\s(?:>|\|)\s", command)[0]
    return [
        word
        for word in shlex.split(command.replace("[", " ").replace("]", " "), comments=True)
        if word != "..."
    ]


@pytest.mark.parametrize(
    ("where", "line", "whole"), list(_command_lines()), ids=lambda value: str(value)[:60]
)
def test_documented_command_lines_parse(where: str, line: str, whole: bool) -> None:
    """Each documented command line uses options its subcommand has; a full one (in a code
    block) is one the parser accepts as it stands."""
    argv = _argv(line)
    parsers = dict(_subparsers())
    assert argv and argv[0] in parsers, f"{where}: {line}"
    options = {o for action in parsers[argv[0]]._actions for o in action.option_strings}
    for word in argv[1:]:
        if word.startswith("-") and word != "-1":
            assert word.split("=", 1)[0] in options, f"{where}: {line}: no option {word}"
    if whole:
        parser = parsers[argv[0]]
        try:
            parser.parse_args(argv[1:])
        except SystemExit as exc:
            pytest.fail(f"{where}: {line}: argparse refused it ({exc})")


@pytest.mark.parametrize("argv", [["validate"], ["schema"], ["test"]])
def test_the_cheap_commands_run(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m replication validate``, ``schema`` and ``test`` as Getting started shows
    them, from the repository root (in-process: no other process)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))  # validate/test add the pipeline's folder
    assert cli.main(argv) == 0, capsys.readouterr()
