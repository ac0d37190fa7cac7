"""How the commands print, the way kubectl does: `-o table|wide|json|yaml|name`, `--no-headers`, data
on stdout and everything said to a person (warnings, notes, "nothing found") on stderr.

A listing command (`inventory`, `quota`, `queue`) describes its rows once, as `Column`s and a
name, and hands them to `print_listing` with the document `-o json|yaml` prints; a command that prints
one document (`explain`, `version`) calls `print_document`. Keeping stdout to data is what lets
`-o name | xargs` and `-o json | jq` work while warnings stay visible.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson
import yaml

Row = TypeVar("Row")
DOCUMENT_FORMATS = ("json", "yaml")
TABLE_FORMATS = ("table", "wide")
COLUMN_GAP = "   "  # kubectl's table separator


@dataclass(frozen=True, slots=True)
class Column(Generic[Row]):
    """One column of a table: its header and how a row's cell is written. `wide` columns show with
    `-o wide` only."""

    header: str
    cell: Callable[[Row], str]
    wide: bool = False


def add_output_arguments(parser: argparse.ArgumentParser, formats: Sequence[str], default: str) -> None:
    """`-o/--output` with `formats` (the first kubectl has of table, wide, json, yaml, name, or `text`
    for a report), and `--no-headers` where there is a table."""
    parser.add_argument(
        "-o",
        "--output",
        choices=formats,
        default=default,
        metavar="|".join(formats),
        help=f"output format (default {default})",
    )
    if any(f in TABLE_FORMATS for f in formats):
        parser.add_argument("--no-headers", action="store_true", help="tables: leave out the header line")


def say(args: argparse.Namespace, kind: str, message: str) -> None:
    """A line for the person at the terminal, never for a pipe: `gpupool inventory: note: ...`."""
    print(f"{getattr(args, 'prog', 'gpupool')}: {kind}: {message}", file=sys.stderr)


def warn(messages: Sequence[str]) -> None:
    """Warnings as kubectl prints the API server's: `Warning: ...` on stderr."""
    for message in messages:
        print(f"Warning: {message}", file=sys.stderr)


def print_document(document: Mapping[str, Any] | Sequence[Any], output: str) -> None:
    """One JSON (indented) or YAML document on stdout."""
    if output == "json":
        sys.stdout.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))


def print_listing(  # noqa: PLR0913 (every listing command's output options, by keyword)
    args: argparse.Namespace,
    rows: Sequence[Row],
    columns: Sequence[Column[Row]],
    *,
    document: Callable[[], Mapping[str, Any]],
    name: Callable[[Row], str] | None = None,
    empty: str,
    warnings: Sequence[str] = (),
) -> None:
    """Print `rows` in the format `args.output` asks for: a table (wide columns with `wide`), one name
    per line, or `document()` as JSON or YAML. With no rows, a table or name listing prints nothing on
    stdout and `empty` on stderr, as kubectl's "No resources found"; a document is printed anyway."""
    warn(warnings)
    output = args.output
    if output in DOCUMENT_FORMATS:
        print_document(document(), output)
        return
    if not rows:
        print(empty, file=sys.stderr)
        return
    if output == "name":
        if name is None:  # the parser's choices keep this from happening
            raise ValueError("this listing has no names")
        sys.stdout.write("".join(f"{name(row)}\n" for row in rows))
        return
    shown = [c for c in columns if output == "wide" or not c.wide]
    table = [[c.cell(row) for c in shown] for row in rows]
    if not getattr(args, "no_headers", False):
        table.insert(0, [c.header for c in shown])
    sys.stdout.write(render_table(table))


def age(seconds: float | None) -> str:
    """A duration as kubectl's AGE column writes it (apimachinery's HumanDuration): `45s`, `119s`,
    `3m10s`, `70m`, `3h1m`, `47h`, `2d1h`, `367d`, `2y1d`, `8y`; `0s` up to 2 s early (clocks differ),
    `<invalid>` beyond; `<unknown>` when there is no time to count from."""
    if seconds is None:
        return "<unknown>"
    whole = int(seconds)  # toward zero, as Go's int(d.Seconds())
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes, hours = whole // 60, whole // 3600
    days = hours // 24
    if minutes < 10:
        return f"{minutes}m{whole % 60}s" if whole % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    if hours < 24 * 365 * 8:
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{days // 365}y"


def render_table(table: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns as wide as their widest cell, kubectl's three spaces apart."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "".join(
        COLUMN_GAP.join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in table
    )
