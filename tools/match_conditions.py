"""Write the GPU resources of both webhook configurations' matchConditions from the default policy.

`make match-conditions` runs it after the vendors of webhook/domain/default_policy.yaml change; `--check`
(tests/manifests/test_match_resources.py) fails when a file is out of step. In each file, the line after
every line ending in `.exists(r,` is the predicate (webhook.domain.match_conditions); only that line is
rewritten, keeping its indentation and what closes it. (A block scalar has no comments to mark it with.)
"""

from __future__ import annotations

import sys
from pathlib import Path

from webhook.domain.match_conditions import gpu_resource_cel
from webhook.domain.policy_build import default_policy_text, load_policy_text

REPO = Path(__file__).resolve().parents[1]
FILES = (REPO / "manifests/base/webhook.yaml", REPO / "manifests/base/validating-webhook.yaml")
MARK = ".exists(r,"


def rewrite(text: str, cel: str) -> tuple[str, int]:
    """`text` with the line after every MARK line set to `cel`; and how many lines it set."""
    lines = text.split("\n")
    count = 0
    for i, line in enumerate(lines[:-1]):
        if line.endswith(MARK):
            lines[i + 1] = _predicate_line(lines[i + 1], cel)
            count += 1
    return "\n".join(lines), count


def _predicate_line(line: str, cel: str) -> str:
    """`line` with its predicate replaced by `cel`: the same indentation, and the same parentheses the
    predicate's line closes (those it has beyond its own) and `||` after them."""
    indent = line[: len(line) - len(line.lstrip())]
    tail = " ||" if line.rstrip().endswith("||") else ""
    closes = line.count(")") - line.count("(")
    return f"{indent}{cel}{')' * closes}{tail}"


def main(argv: list[str]) -> int:
    cel = gpu_resource_cel(load_policy_text(default_policy_text()))
    stale = []
    for path in FILES:
        text = path.read_text()
        new, count = rewrite(text, cel)
        if count == 0:
            print(f"{path}: no `{MARK}` line", file=sys.stderr)
            return 2
        if new != text:
            stale.append(path)
            if "--check" not in argv:
                path.write_text(new)
    if stale and "--check" in argv:
        print("out of step with the policy's GPU resources (run `make match-conditions`):", file=sys.stderr)
        for path in stale:
            print(f"  {path.relative_to(REPO)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
