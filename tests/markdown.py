"""Reading the Markdown of the README and docs/ as GitHub renders it: headings' anchors and links."""

from __future__ import annotations

import re
from pathlib import Path


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def prose_lines(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for line in prose_lines(path):
        heading = re.match(r"#{1,6} (.+)", line)
        if heading:
            base = slug(heading.group(1))
            anchor, n = base, 0
            while anchor in found:  # GitHub numbers repeated headings: name, name-1, name-2
                n += 1
                anchor = f"{base}-{n}"
            found.add(anchor)
    return found


def links(path: Path) -> list[str]:
    text = "\n".join(prose_lines(path))
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    return re.findall(r"\]\(([^)\s]+)\)", text)
