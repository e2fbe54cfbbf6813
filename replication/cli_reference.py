"""The command line reference in Markdown, generated from the argparse parsers.

    python -m replication.cli_reference -o docs/cli.md

writes it; ``docs/cli.md`` is that output (``tests/test_docs.py`` keeps the two equal), so
the reference cannot drift from what ``python -m replication`` accepts: every subcommand,
usage line, option and help text comes from ``replication.cli.build_parser``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from .cli import build_parser

WIDTH = 80
"""Usage lines are wrapped here, whatever the terminal (the output is committed)."""


def _own_parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    """Subcommands that hand the rest of the line to a parser of their own."""
    from .deploy.__main__ import build_parser as infra_parameters

    return {"infra-parameters": infra_parameters}


class _Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=WIDTH)

    def invocation(self, action: argparse.Action) -> str:
        return self._format_action_invocation(action)

    def help_text(self, action: argparse.Action) -> str:
        return self._expand_help(action) if action.help else ""


def markdown_reference(parser: argparse.ArgumentParser | None = None) -> str:
    parser = parser or build_parser()
    out = [
        "# Command line",
        "",
        "Generated from the argparse parsers by `python -m replication.cli_reference -o "
        "docs/cli.md`; do not edit by hand. Every command also prints its own help: "
        "`python -m replication COMMAND --help` (`-h`).",
        "",
        *_usage(parser),
        "| command | what it does |",
        "|---|---|",
    ]
    commands = list(_subcommands(parser))
    for name, summary, _ in commands:
        out.append(f"| [`{name}`](#{name}) | {_inline(summary)} |")
    out.append("")
    out += _options(parser)
    own = _own_parsers()
    for name, _, sub in commands:
        sub = own[name]() if name in own else sub
        out += [f"## `{name}`", ""]
        if sub.description:
            out += [_inline(sub.description), ""]
        out += _usage(sub)
        out += _options(sub)
    return _local("\n".join(out).rstrip() + "\n")


def _subcommands(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, summaries.get(name, ""), sub


def _usage(parser: argparse.ArgumentParser) -> list[str]:
    parser.formatter_class = _Formatter
    usage = parser.format_usage().strip()
    return ["```text", usage, "```", ""]


def _options(parser: argparse.ArgumentParser) -> list[str]:
    formatter = _Formatter(parser.prog)
    out: list[str] = []
    for group in parser._action_groups:
        actions = [
            action
            for action in group._group_actions
            if action.help != argparse.SUPPRESS
            and not isinstance(action, argparse._SubParsersAction | argparse._HelpAction)
        ]
        if not actions:
            continue
        out += [f"**{_inline(group.title or '')}**", ""]
        for action in actions:
            line = f"- `{formatter.invocation(action)}`"
            text = formatter.help_text(action)
            out.append(f"{line}: {_inline(text)}" if text else line)
        out.append("")
    return out


_CODE = re.compile(r"(`[^`]*`)")
_SPECIAL = re.compile(r"([\\*_\[\]|])")


def _inline(text: str) -> str:
    """Help text as Markdown: one line, code spans kept, the rest taken literally."""
    parts = _CODE.split(" ".join(text.split()))
    for i in range(0, len(parts), 2):  # outside the code spans
        escaped = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        parts[i] = _SPECIAL.sub(r"\\\1", escaped)
    return "".join(parts)


def _local(text: str) -> str:
    """The same output on every machine: the home folder (the broker's default data dir)."""
    return text.replace(str(Path.home()), "~")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m replication.cli_reference",
        description="Write the command line reference (Markdown).",
    )
    parser.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write it to FILE (default: stdout)"
    )
    args = parser.parse_args(argv)
    text = markdown_reference()
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
