"""The `gpupool` command: one subcommand per module, each imported only when it runs.

A subcommand module provides `configure(parser)` (its arguments) and `run(args) -> int` (exit code).
Modules are imported lazily so `gpupool certs` does not pay for Flask, and `gpupool explain` does not
pay for gunicorn.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping, Sequence

from webhook.domain.errors import ConfigError

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "explain": ("webhook.commands.explain", "show the placement decision and patch for a Pod manifest"),
    "serve": ("webhook.commands.serve", "serve the admission webhook over TLS (gunicorn)"),
    "certs": ("webhook.commands.certs", "create or renew the CA and serving certificate"),
    "inventory": ("webhook.commands.inventory", "show the GPU pools, their capacity and quota warnings"),
    "quota": ("webhook.commands.quota", "show every quota gpupool checks: used, pending, hard, who enforces it"),
}


def build_parser(
    argv: Sequence[str], prog: str = "gpupool", commands: Sequence[str] = tuple(SUBCOMMANDS), epilog: str = ""
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Place GPU Pods on the best-fitting free GPUs of a mixed fleet.",
        epilog=epilog or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Only the chosen subcommand's module is imported; the others get a bare parser for --help.
    chosen = next((a for a in argv if a in commands), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        if name not in commands:
            continue
        sp = sub.add_parser(name, help=help_text, description=help_text)
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
    """Parse and run one subcommand. `settings` are set on the parsed arguments (how `kubectl gpupool`
    passes what kubectl's conventions decided)."""
    parser = build_parser(args_list, prog, commands, epilog)
    args = parser.parse_args(args_list)
    for key, value in (settings or {}).items():
        setattr(args, key, value)
    try:
        return int(args._run(args))
    except ConfigError as exc:
        print(f"{prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
