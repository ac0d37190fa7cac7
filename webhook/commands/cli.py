"""The `gpupool` command: one subcommand per module, each imported only when it runs.

A subcommand module provides `configure(parser)` (its arguments) and `run(args) -> int` (exit code).
Modules are imported lazily so `gpupool certs` does not pay for Flask, and `gpupool explain` does not
pay for gunicorn. `kubectl gpupool` (webhook.commands.kubectl) is this same command under another name
with the read-only subcommands, so both take the same flags and print the same.

As kubectl: flags are never abbreviated (`--pol` is not `--policy`, so adding a flag never changes
what an old command line means), a mistyped flag or command is answered with the nearest one, and
kubectl's own flags (`-n`, `-A`, `--context`, `--kubeconfig`) may come before the command too.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Mapping, Sequence

from webhook.commands.version import version_line
from webhook.domain.errors import ConfigError

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "explain": ("webhook.commands.explain", "show the placement decision and patch for each Pod a manifest creates"),
    "serve": ("webhook.commands.serve", "serve the admission webhook over TLS (gunicorn)"),
    "certs": ("webhook.commands.certs", "create or renew the CA and serving certificate"),
    "inventory": ("webhook.commands.inventory", "show the GPU pools, their capacity and quota warnings"),
    "quota": ("webhook.commands.quota", "show every quota gpupool checks: used, pending, hard, who enforces it"),
    "queue": ("webhook.commands.queue", "show the Pods waiting in gpupool's queue: position, wait time, what for"),
    "release": (
        "webhook.commands.release",
        "release one queued Pod by hand, as the queue's leader would, or say why not",
    ),
    "version": ("webhook.commands.version", "print the version of gpupool"),
}
# kubectl's flags that may also come before the command (`kubectl gpupool -n team-a quota`), with
# whether they take a value.
LEADING_FLAGS: dict[str, bool] = {
    "-n": True,
    "--namespace": True,
    "-A": False,
    "--all-namespaces": False,
    "--context": True,
    "--kubeconfig": True,
}


def build_parser(
    argv: Sequence[str], prog: str = "gpupool", commands: Sequence[str] = tuple(SUBCOMMANDS), epilog: str = ""
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Place GPU Pods on the best-fitting free GPUs of a mixed fleet.",
        epilog=epilog or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=version_line(prog), help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Only the chosen subcommand's module is imported; the others get a bare parser for --help.
    chosen = next((a for a in argv if a in commands), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        if name not in commands:
            continue
        sp = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.configure(sp)
            sp.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(list(sys.argv[1:] if argv is None else argv))


def run_command(
    args_list: list[str],
    prog: str = "gpupool",
    commands: Sequence[str] = tuple(SUBCOMMANDS),
    settings: Mapping[str, object] | None = None,
    epilog: str = "",
) -> int:
    """Parse and run one subcommand. `settings` are set on the parsed arguments."""
    args_list = hoist_leading_flags(args_list, commands)
    parser = build_parser(args_list[:1], prog, commands, epilog)
    first = next((a for a in args_list if not a.startswith("-")), None)
    if first is not None and first not in commands and args_list and args_list[0] == first:
        parser.error(f"unknown command {first!r}{_did_you_mean(first, commands)}; accepted: {', '.join(commands)}")
    args, extras = parser.parse_known_args(args_list)
    command_parser = _subparser(parser, args.command)
    if extras:
        command_parser.error(_unrecognized(extras, command_parser))
    args.prog = f"{prog} {args.command}"
    for key, value in (settings or {}).items():
        setattr(args, key, value)
    try:
        status = int(args._run(args))
        sys.stdout.flush()  # here, where a reader that has left is caught below, not at the exit
        return status
    except ConfigError as exc:
        print(f"{prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `gpupool inventory -o name | head -1`: the reader left; say nothing more, as kubectl does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def hoist_leading_flags(args_list: list[str], commands: Sequence[str]) -> list[str]:
    """`-n team-a quota -o json` as `quota -n team-a -o json`: kubectl's flags given before the command
    are moved after it, where the command's parser reads them. Anything else is left where it is."""
    i = 0
    while i < len(args_list):
        flag, has_value, _ = args_list[i].partition("=")
        if flag not in LEADING_FLAGS:
            break
        i += 2 if LEADING_FLAGS[flag] and not has_value else 1
    if i == 0 or i >= len(args_list) or args_list[i] not in commands:
        return args_list
    return [args_list[i], *args_list[:i], *args_list[i + 1 :]]


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub: argparse.ArgumentParser = action.choices[command]
    return sub


def _unrecognized(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """`unknown flag --polcy (did you mean --policy?)`, for each argument the command does not take."""
    options = [o for a in parser._actions for o in a.option_strings]
    problems = []
    after_flag = False  # the word after an unknown flag is taken as its value, not reported again
    for extra in extras:
        flag = extra.partition("=")[0]
        if flag.startswith("-"):
            problems.append(f"unknown flag {flag}{_did_you_mean(flag, options)}")
            after_flag = "=" not in extra
        elif not after_flag:
            problems.append(f"unexpected argument {extra!r}")
        else:
            after_flag = False
    return "; ".join(problems) + f" (see {parser.prog} --help)"


def _did_you_mean(word: str, accepted: Sequence[str]) -> str:
    near = difflib.get_close_matches(word, accepted, n=1, cutoff=0.6)
    return f" (did you mean {near[0]}?)" if near else ""
