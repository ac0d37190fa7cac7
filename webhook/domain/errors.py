"""The errors a user fixes by changing a file, a flag or a setting.

Raised where the problem is found (the policy loader, the snapshot reader, the certificate files, the
options of `serve`); only the commands turn them into `gpupool <command>: error: <message>` with exit
status 2, never a traceback. Every message names the file or flag and what is wrong with it.

Errors about one admission request (a malformed Pod, a bad annotation, a malformed AdmissionReview)
are not here: they belong to the layer that answers the request, and become answers, not exits.
"""

from __future__ import annotations

from typing import Any


class ConfigError(Exception):
    """A bad file, flag or setting; the message says which and what is accepted."""


def yaml_problem(exc: Any) -> str:
    """`line 3, column 7: found unexpected end of stream`, instead of PyYAML's multi-line report."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem


def read_user_file(path: str, error: type[ConfigError], what: str) -> tuple[bytes, str]:
    """The bytes of the file a user named and their UTF-8 text; `error` naming the file (as `what`, say
    "policy file") when it cannot be read or is not UTF-8 text."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return data, data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text") from None
