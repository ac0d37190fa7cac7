"""`gpupool version`: the version of this gpupool (also `gpupool --version`), as `kubectl version --client`
says its own: text, or `-o json|yaml` for scripts."""

from __future__ import annotations

import argparse
import platform
import sys

from webhook import __version__
from webhook.commands.output import add_output_arguments, print_document


def configure(parser: argparse.ArgumentParser) -> None:
    add_output_arguments(parser, ("text", "json", "yaml"), "text")


def run(args: argparse.Namespace) -> int:
    if args.output == "text":
        sys.stdout.write(f"{version_line(args.prog.rpartition(' ')[0] or 'gpupool')}\n")
    else:
        print_document({"gpupoolVersion": __version__, "pythonVersion": platform.python_version()}, args.output)
    return 0


def version_line(prog: str) -> str:
    """What `--version` and `version` print: `gpupool 0.1.0`."""
    return f"{prog} {__version__}"
