"""The command-line reference in docs/operations.md says what `--help` says: each command's usage block
names exactly the flags its parser has, each with its metavar or its `-o` choices, and the positional
arguments. (tests/test_docs.py checks the other way, that every flag is at least mentioned.)"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from webhook.commands.cli import SUBCOMMANDS, build_parser

REPO = Path(__file__).resolve().parents[2]
# The commands whose reference is a usage block (serve and certs document their flags in tables).
COMMANDS = ("explain", "inventory", "quota", "queue", "release", "version")


def usage_block(command: str) -> str:
    """The first paragraph of the first code block of the section headed `gpupool <command>`."""
    text = (REPO / "docs" / "operations.md").read_text("utf-8")
    section = re.search(rf"^## `gpupool {command}`\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, f"docs/operations.md has no section `gpupool {command}`"
    block = re.search(r"^```\n(.*?)^```", section.group(1), re.S | re.M)
    assert block, f"the section `gpupool {command}` has no code block"
    usage = block.group(1).split("\n\n", 1)[0]
    assert usage.startswith(f"gpupool {command}"), usage
    return usage


def command_parser(command: str) -> argparse.ArgumentParser:
    parser = build_parser([command])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = sub.choices[command]
    return found


def shown_value(action: argparse.Action) -> str:
    """What follows the flag in a usage line: its choices as a|b|c, or its metavar."""
    if action.choices:
        return "|".join(str(c) for c in action.choices)
    return str(action.metavar or action.dest.upper())


@pytest.mark.parametrize("command", COMMANDS)
def test_the_usage_block_names_exactly_the_commands_flags(command: str) -> None:
    usage = usage_block(command)
    documented = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", usage.removeprefix(f"gpupool {command}")))
    actions = [a for a in command_parser(command)._actions if "--help" not in a.option_strings]
    flags = {o for a in actions for o in a.option_strings}
    assert documented == flags, f"in the docs only: {documented - flags}; in --help only: {flags - documented}"


@pytest.mark.parametrize("command", COMMANDS)
def test_each_flag_is_shown_with_its_value_and_each_argument_named(command: str) -> None:
    usage = " ".join(usage_block(command).split())
    for action in command_parser(command)._actions:
        if "--help" in action.option_strings:
            continue
        if not action.option_strings:  # a positional argument, shown after the command
            assert re.match(rf"gpupool {command} {re.escape(str(action.metavar))}(\.\.\.)? ", usage), usage
        elif action.nargs != 0:
            value = re.escape(shown_value(action))
            options = "|".join(re.escape(o) for o in action.option_strings)
            assert re.search(rf"(?:{options}) {value}(?=[\] ]|$)", usage), f"{action.option_strings} {value}"


def test_every_command_with_a_usage_block_is_covered() -> None:
    """A new read-only command (the queue, say) gets its usage block and a place in COMMANDS."""
    assert set(COMMANDS) == set(SUBCOMMANDS) - {"serve", "certs"}
